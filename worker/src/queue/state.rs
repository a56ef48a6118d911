//! Job state in one JetStream KV bucket, shared by every job.
//!
//! Keys are `<job_id>.<kind>.<task_id>` (and `<job_id>.job` for the job
//! record), so one job's whole state is one subject filter:
//!
//! | key | value | written by |
//! | --- | --- | --- |
//! | `<job>.job` | [`JobRecord`] | `submit` |
//! | `<job>.done.<task>` | [`TaskDone`] | the worker, after its files are written, before the ack |
//! | `<job>.run.<task>` | [`TaskRunning`] | the worker while it holds the task (deleted after) |
//! | `<job>.lasterr.<task>` | [`TaskError`] | the worker, when a try fails and will be retried |
//! | `<job>.failed.<task>` | [`TaskFailed`] | the worker when it gives up, or the coordinator on a dead-letter advisory |
//!
//! `status` reads a job's state with one ordered consumer (the last value of
//! every key); it never touches the task stream's consumer.

use std::collections::HashMap;

use async_nats::jetstream::{self, consumer, kv, stream};
use futures::StreamExt;
use rsembed_schemas::queue::{JobRecord, TaskDone, TaskError, TaskFailed, TaskRunning};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{QueueConfig, QueueError};

/// The kinds of per-task records.
const DONE: &str = "done";
const RUN: &str = "run";
const LASTERR: &str = "lasterr";
const FAILED: &str = "failed";

/// How long a snapshot waits for its next record before it fails. An ordered
/// consumer re-creates itself across a NATS restart and would otherwise wait
/// for the server forever; a failed read can be retried, a hung one cannot.
const SNAPSHOT_STALL: std::time::Duration = std::time::Duration::from_secs(30);

/// One job's state, as the bucket holds it now.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// What `submit` planned, once it has run.
    pub record: Option<JobRecord>,
    /// Finished tasks.
    pub done: HashMap<String, TaskDone>,
    /// Tasks a worker holds now (or held when it died).
    pub running: HashMap<String, TaskRunning>,
    /// Last errors of tasks being retried.
    pub last_errors: HashMap<String, TaskError>,
    /// Tasks given up on.
    pub failed: HashMap<String, TaskFailed>,
}

/// The job-state bucket.
#[derive(Clone)]
pub struct JobState {
    kv: kv::Store,
    stream: stream::Stream,
    bucket: String,
}

impl JobState {
    /// Finds the bucket, or creates it (history 1, file storage).
    pub async fn open(js: &jetstream::Context, cfg: &QueueConfig) -> Result<JobState, QueueError> {
        let bucket = cfg.state_bucket.clone();
        let err = |what: &str, e: &(dyn std::error::Error + 'static)| QueueError::State {
            bucket: bucket.clone(),
            message: format!("{what}: {}", crate::error::chain(e)),
        };
        let kv = match js.get_key_value(&bucket).await {
            Ok(kv) => kv,
            Err(_) => js
                .create_key_value(kv::Config {
                    bucket: bucket.clone(),
                    description: "rsembed job state".into(),
                    history: 1,
                    storage: stream::StorageType::File,
                    num_replicas: cfg.replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| err("create", &e))?,
        };
        let stream = js
            .get_stream(format!("KV_{bucket}"))
            .await
            .map_err(|e| err("stream", &e))?;
        Ok(JobState { kv, stream, bucket })
    }

    fn key(job: &str, kind: &str, task: &str) -> String {
        format!("{job}.{kind}.{task}")
    }

    fn error(&self, what: &str, e: &(dyn std::error::Error + 'static)) -> QueueError {
        QueueError::State {
            bucket: self.bucket.clone(),
            message: format!("{what}: {}", crate::error::chain(e)),
        }
    }

    async fn put<T: Serialize>(&self, key: String, v: &T) -> Result<u64, QueueError> {
        let bytes = serde_json::to_vec(v).map_err(|e| self.error(&key, &e))?;
        self.kv
            .put(&key, bytes.into())
            .await
            .map_err(|e| self.error(&key, &e))
    }

    async fn get<T: DeserializeOwned>(&self, key: String) -> Result<Option<T>, QueueError> {
        match self.kv.get(&key).await.map_err(|e| self.error(&key, &e))? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| self.error(&key, &e)),
        }
    }

    async fn delete(&self, key: String) -> Result<(), QueueError> {
        self.kv.delete(&key).await.map_err(|e| self.error(&key, &e))
    }

    /// Records a task as finished.
    pub async fn put_done(&self, job: &str, task: &str, v: &TaskDone) -> Result<(), QueueError> {
        self.put(Self::key(job, DONE, task), v).await.map(drop)
    }

    /// A finished task's record.
    pub async fn done(&self, job: &str, task: &str) -> Result<Option<TaskDone>, QueueError> {
        self.get(Self::key(job, DONE, task)).await
    }

    /// Forgets that a task finished (`submit --retry-failed` runs a task
    /// with failed inputs again: a worker would ack a task recorded done).
    pub async fn clear_done(&self, job: &str, task: &str) -> Result<(), QueueError> {
        self.delete(Self::key(job, DONE, task)).await
    }

    /// Marks a task as held by a worker.
    pub(crate) async fn put_running(
        &self,
        job: &str,
        task: &str,
        v: &TaskRunning,
    ) -> Result<(), QueueError> {
        self.put(Self::key(job, RUN, task), v).await.map(drop)
    }

    /// Clears a task's running mark.
    pub async fn clear_running(&self, job: &str, task: &str) -> Result<(), QueueError> {
        self.delete(Self::key(job, RUN, task)).await
    }

    /// Records the error of a try that will be retried.
    pub(crate) async fn put_last_error(
        &self,
        job: &str,
        task: &str,
        v: &TaskError,
    ) -> Result<(), QueueError> {
        self.put(Self::key(job, LASTERR, task), v).await.map(drop)
    }

    /// The last error a worker reported for a task.
    pub async fn last_error(&self, job: &str, task: &str) -> Result<Option<TaskError>, QueueError> {
        self.get(Self::key(job, LASTERR, task)).await
    }

    /// Records a task as given up on.
    pub async fn put_failed(&self, job: &str, v: &TaskFailed) -> Result<(), QueueError> {
        self.put(Self::key(job, FAILED, &v.task_id), v)
            .await
            .map(drop)
    }

    /// Forgets that a task failed (it is being requeued).
    pub async fn clear_failed(&self, job: &str, task: &str) -> Result<(), QueueError> {
        self.delete(Self::key(job, FAILED, task)).await?;
        self.delete(Self::key(job, LASTERR, task)).await
    }

    /// Records what `submit` planned.
    pub async fn put_record(&self, v: &JobRecord) -> Result<(), QueueError> {
        self.put(format!("{}.job", v.job_id), v).await.map(drop)
    }

    /// What `submit` planned for a job.
    pub async fn record(&self, job: &str) -> Result<Option<JobRecord>, QueueError> {
        self.get(format!("{job}.job")).await
    }

    /// Every record of one job: the last value of each of its keys, read by
    /// an ordered consumer that stops at the count the stream had when it
    /// started, so it ends even while workers keep writing.
    pub async fn snapshot(&self, job: &str) -> Result<Snapshot, QueueError> {
        let prefix = format!("$KV.{}.{job}.", self.bucket);
        let c = self
            .stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: format!("{prefix}>"),
                deliver_policy: consumer::DeliverPolicy::LastPerSubject,
                ..Default::default()
            })
            .await
            .map_err(|e| self.error("snapshot", &e))?;
        let pending = c.cached_info().num_pending;
        let mut snap = Snapshot::default();
        if pending == 0 {
            return Ok(snap);
        }
        let mut msgs = c.messages().await.map_err(|e| self.error("snapshot", &e))?;
        for read in 0..pending {
            let next = tokio::time::timeout(SNAPSHOT_STALL, msgs.next()).await;
            let Ok(next) = next else {
                return Err(QueueError::State {
                    bucket: self.bucket.clone(),
                    message: format!(
                        "snapshot: no record for {} s with {} still to read (is NATS reachable?)",
                        SNAPSHOT_STALL.as_secs(),
                        pending - read
                    ),
                });
            };
            let Some(m) = next else { break };
            let m = m.map_err(|e| self.error("snapshot", &e))?;
            let Some(key) = m.subject.as_str().strip_prefix(&prefix) else {
                continue;
            };
            let deleted = m
                .headers
                .as_ref()
                .and_then(|h| h.get("KV-Operation"))
                .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE");
            if deleted {
                continue;
            }
            if key == "job" {
                snap.record = serde_json::from_slice(&m.payload).ok();
                continue;
            }
            let Some((kind, task)) = key.split_once('.') else {
                continue;
            };
            // A value that does not parse (another version's) is left out
            // rather than failing the whole read.
            fn insert<T: DeserializeOwned>(map: &mut HashMap<String, T>, task: &str, v: &[u8]) {
                if let Ok(v) = serde_json::from_slice(v) {
                    map.insert(task.to_owned(), v);
                }
            }
            match kind {
                DONE => insert(&mut snap.done, task, &m.payload),
                RUN => insert(&mut snap.running, task, &m.payload),
                LASTERR => insert(&mut snap.last_errors, task, &m.payload),
                FAILED => insert(&mut snap.failed, task, &m.payload),
                _ => {}
            }
        }
        Ok(snap)
    }

    /// Removes every record of a job (`submit --force-new-job` on its output).
    pub async fn purge_job(&self, job: &str) -> Result<(), QueueError> {
        self.stream
            .purge()
            .filter(format!("$KV.{}.{job}.>", self.bucket))
            .await
            .map(drop)
            .map_err(|e| self.error("purge", &e))
    }
}
