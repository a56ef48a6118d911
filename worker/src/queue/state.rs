//! Job state in one JetStream KV bucket, shared by every job.
//!
//! Keys are `<job_id>.<kind>.<task_id>` (and `<job_id>.job` and
//! `<job_id>.totals` for the job), so one job's whole state is one subject
//! filter:
//!
//! | key | value | written by |
//! | --- | --- | --- |
//! | `<job>.job` | [`JobRecord`] | `submit` |
//! | `<job>.d.<task>` | [`DoneRecord`] (compact) | the worker, after its files are written, before the ack; created once |
//! | `<job>.done.<task>` | [`TaskDone`] as JSON | workers of older versions (still read) |
//! | `<job>.run.<task>` | [`TaskRunning`] | the worker while it holds the task (purged after) |
//! | `<job>.lasterr.<task>` | [`TaskError`] | the worker, when a try fails and will be retried |
//! | `<job>.failed.<task>` | [`TaskFailed`] | the worker when it gives up, or the coordinator on a dead-letter advisory; created once |
//! | `<job>.totals` | [`JobTotals`] | whoever folds the records (`status`, `finalize`, workers) |
//!
//! Counting at a cost that does not grow with the job: done and failed
//! records are created once (a second delivery's write finds the key and
//! changes nothing), so folding them in stream order counts every task
//! exactly once. `<job>.totals` holds the fold up to a stream sequence;
//! [`JobState::totals`] folds what came after it and writes it back with a
//! compare-and-set, so a poll reads only what finished since the last one.
//! Taking a record out ([`JobState::clear_done`], [`JobState::clear_failed`])
//! purges its subject and then rewrites the totals (less the record, when it
//! was folded in): a fold that read the record before the purge then fails
//! its compare-and-set and folds again. Running marks are purged rather than
//! deleted, so a finished job leaves no tombstone per task.

use std::collections::HashMap;

use async_nats::jetstream::{self, consumer, kv, stream};
use futures::StreamExt;
use rsembed_schemas::queue::{
    DoneRecord, JobRecord, JobTotals, TaskDone, TaskError, TaskFailed, TaskRunning,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::config::{QueueConfig, QueueError};

/// The kinds of per-task records.
const DONE: &str = "d";
const DONE_JSON: &str = "done";
const RUN: &str = "run";
const LASTERR: &str = "lasterr";
const FAILED: &str = "failed";
/// The key of a job's totals, after the job id.
const TOTALS: &str = "totals";

/// How long a read waits for its next record before it fails. An ordered
/// consumer re-creates itself across a NATS restart and would otherwise wait
/// for the server forever; a failed read can be retried, a hung one cannot.
const SNAPSHOT_STALL: std::time::Duration = std::time::Duration::from_secs(30);

/// How often a fold tries again when another one wrote the totals first.
const FOLD_TRIES: usize = 8;

/// The most messages (of every job) a fold fetches one by one.
const FOLD_GETS_MAX: u64 = 1 << 14;

/// Fetches a fold keeps in flight.
const FOLD_GETS_IN_FLIGHT: usize = 32;

/// How far the stream moves on before a fold that counted nothing stores
/// its sequence anyway.
const FOLD_STORE_AFTER: u64 = 1 << 12;

/// One job's state, as the bucket holds it now. Reading it costs the whole
/// job: only `submit` (which holds its plan anyway) reads it whole;
/// `status` reads [`JobState::totals`] and [`JobState::running`].
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

/// One record read from the bucket.
struct Record {
    /// The job the record belongs to.
    job: String,
    /// `<kind>.<task>`, or `job` / `totals`.
    key: String,
    /// Its stream sequence.
    seq: u64,
    payload: bytes::Bytes,
    /// A delete or purge marker (older versions deleted with markers).
    deleted: bool,
}

/// A message of the bucket whose subjects start with `bucket_prefix`
/// (`$KV.<bucket>.`) as a [`Record`]; `None` for a subject outside it.
fn record_of(
    bucket_prefix: &str,
    subject: &str,
    seq: u64,
    headers: Option<&async_nats::HeaderMap>,
    payload: bytes::Bytes,
) -> Option<Record> {
    // `<job>.<rest>`: job ids hold no dot.
    let (job, key) = subject.strip_prefix(bucket_prefix)?.split_once('.')?;
    let deleted = headers
        .and_then(|h| h.get("KV-Operation"))
        .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE");
    Some(Record {
        job: job.to_owned(),
        key: key.to_owned(),
        seq,
        payload,
        deleted,
    })
}

/// A done record of either form, as a [`TaskDone`].
fn done_of(kind: &str, task: &str, payload: &[u8]) -> Option<TaskDone> {
    match kind {
        DONE => DoneRecord::decode(payload)
            .map_err(|e| tracing::warn!(task, error = %e, "unreadable done record; left out"))
            .ok()
            .map(|r| r.into_task_done(task)),
        // A value that does not parse (another version's) is left out rather
        // than failing the whole read.
        DONE_JSON => serde_json::from_slice(payload).ok(),
        _ => None,
    }
}

/// Counts a done or failed record into `t` (`sign` -1 takes it out);
/// records of other kinds count nothing.
fn count(t: &mut JobTotals, kind: &str, task: &str, payload: &[u8], sign: i64) {
    match kind {
        FAILED => t.add_failed(sign),
        DONE | DONE_JSON => {
            if let Some(d) = done_of(kind, task, payload) {
                t.add_done(&DoneRecord::of(&d), sign);
            }
        }
        _ => {}
    }
}

/// Adds a JSON record to `map`; a value that does not parse (another
/// version's) is left out rather than failing the whole read.
fn insert_json<T: DeserializeOwned>(map: &mut HashMap<String, T>, task: &str, v: &[u8]) {
    if let Ok(v) = serde_json::from_slice(v) {
        map.insert(task.to_owned(), v);
    }
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

    fn subject(&self, key: &str) -> String {
        format!("$KV.{}.{key}", self.bucket)
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

    /// Writes `key` unless it holds a value: records that are counted are
    /// written once, so a second delivery's write counts nothing twice.
    async fn create_once(&self, key: String, bytes: Vec<u8>) -> Result<(), QueueError> {
        match self.kv.create(&key, bytes.into()).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                tracing::debug!(key, "already recorded");
                Ok(())
            }
            Err(e) => Err(self.error(&key, &e)),
        }
    }

    async fn get_raw(&self, key: &str) -> Result<Option<bytes::Bytes>, QueueError> {
        self.kv.get(key).await.map_err(|e| self.error(key, &e))
    }

    async fn get<T: DeserializeOwned>(&self, key: String) -> Result<Option<T>, QueueError> {
        match self.get_raw(&key).await? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| self.error(&key, &e)),
        }
    }

    /// Removes every message of `key`, leaving no tombstone.
    async fn purge_key(&self, key: &str) -> Result<(), QueueError> {
        self.stream
            .purge()
            .filter(self.subject(key))
            .await
            .map(drop)
            .map_err(|e| self.error(key, &e))
    }

    /// Records a task as finished (once: a record already there stays).
    pub async fn put_done(&self, job: &str, task: &str, v: &TaskDone) -> Result<(), QueueError> {
        self.create_once(Self::key(job, DONE, task), DoneRecord::of(v).encode())
            .await
    }

    /// A finished task's record.
    pub async fn done(&self, job: &str, task: &str) -> Result<Option<TaskDone>, QueueError> {
        if let Some(b) = self.get_raw(&Self::key(job, DONE, task)).await? {
            return DoneRecord::decode(&b)
                .map(|r| Some(r.into_task_done(task)))
                .map_err(|message| QueueError::State {
                    bucket: self.bucket.clone(),
                    message,
                });
        }
        self.get(Self::key(job, DONE_JSON, task)).await
    }

    /// Forgets that a task finished (`submit --retry-failed` runs a task
    /// with failed inputs again: a worker would ack a task recorded done).
    pub async fn clear_done(&self, job: &str, task: &str) -> Result<(), QueueError> {
        self.forget(job, DONE, task).await?;
        self.forget(job, DONE_JSON, task).await
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

    /// Clears a task's running mark, leaving no tombstone.
    pub async fn clear_running(&self, job: &str, task: &str) -> Result<(), QueueError> {
        self.purge_key(&Self::key(job, RUN, task)).await
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

    /// Clears a task's last error (it finished after all).
    pub(crate) async fn clear_last_error(&self, job: &str, task: &str) -> Result<(), QueueError> {
        self.purge_key(&Self::key(job, LASTERR, task)).await
    }

    /// Records a task as given up on (once: a record already there stays).
    pub async fn put_failed(&self, job: &str, v: &TaskFailed) -> Result<(), QueueError> {
        let bytes = serde_json::to_vec(v).map_err(|e| self.error(&v.task_id, &e))?;
        self.create_once(Self::key(job, FAILED, &v.task_id), bytes)
            .await
    }

    /// Whether a task is recorded as given up on.
    pub async fn failed_one(&self, job: &str, task: &str) -> Result<bool, QueueError> {
        Ok(self.get_raw(&Self::key(job, FAILED, task)).await?.is_some())
    }

    /// Forgets that a task failed (it is being requeued).
    pub async fn clear_failed(&self, job: &str, task: &str) -> Result<(), QueueError> {
        self.forget(job, FAILED, task).await?;
        self.purge_key(&Self::key(job, LASTERR, task)).await
    }

    /// Records what `submit` planned.
    pub async fn put_record(&self, v: &JobRecord) -> Result<(), QueueError> {
        self.put(format!("{}.job", v.job_id), v).await.map(drop)
    }

    /// What `submit` planned for a job.
    pub async fn record(&self, job: &str) -> Result<Option<JobRecord>, QueueError> {
        self.get(format!("{job}.job")).await
    }

    /// The totals as last written, with the revision to compare-and-set.
    async fn stored_totals(&self, job: &str) -> Result<(u64, JobTotals), QueueError> {
        let key = format!("{job}.{TOTALS}");
        match self
            .kv
            .entry(&key)
            .await
            .map_err(|e| self.error(&key, &e))?
        {
            Some(e) if e.operation == kv::Operation::Put => {
                // Totals another version wrote in another form are folded again.
                Ok((
                    e.revision,
                    serde_json::from_slice(&e.value).unwrap_or_default(),
                ))
            }
            Some(e) => Ok((e.revision, JobTotals::default())),
            None => Ok((0, JobTotals::default())),
        }
    }

    /// Writes the totals if they are still at `revision`; `false` when
    /// another writer came first.
    async fn store_totals(
        &self,
        job: &str,
        revision: u64,
        t: &JobTotals,
    ) -> Result<bool, QueueError> {
        let key = format!("{job}.{TOTALS}");
        let bytes = serde_json::to_vec(t).map_err(|e| self.error(&key, &e))?;
        match self.kv.update(&key, bytes.into(), revision).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(false),
            Err(e) => Err(self.error(&key, &e)),
        }
    }

    /// The job's counts now: the stored totals plus every done and failed
    /// record written after them, which are then stored as the new totals.
    /// Costs what finished since the last fold, whatever the job's size.
    pub async fn totals(&self, job: &str) -> Result<JobTotals, QueueError> {
        let mut last = JobTotals::default();
        for _ in 0..FOLD_TRIES {
            let (revision, mut t) = self.stored_totals(job).await?;
            let from = t.seq;
            let counted = self.fold(job, &mut t).await?;
            // Storing totals that count nothing new would only add a message
            // for the next fold to read; they are stored once the stream has
            // moved on far enough that reading it again would cost.
            if revision > 0 && !counted && t.seq - from < FOLD_STORE_AFTER {
                return Ok(t);
            }
            if self.store_totals(job, revision, &t).await? {
                return Ok(t);
            }
            last = t;
        }
        // Writers keep coming first; what this fold read is still right.
        Ok(last)
    }

    /// Counts into `t` the job's records written after `t.seq`, moving
    /// `t.seq` to the stream's last sequence; whether any record was counted.
    ///
    /// The messages after `t.seq` are fetched by sequence from the stream's
    /// leader, whatever their job (the other jobs' are passed over here),
    /// without a consumer: nats-server counts a new consumer's pending
    /// messages from every subject of the bucket once the stream has one
    /// interior delete, and a bucket whose running marks are purged always
    /// has some (80 ms at 10⁶ keys, at every poll). Only a fold that finds
    /// more than [`FOLD_GETS_MAX`] messages to read (a job polled again after
    /// others ran) reads them through a consumer filtered on the job.
    async fn fold(&self, job: &str, t: &mut JobTotals) -> Result<bool, QueueError> {
        let last = self
            .stream
            .get_info()
            .await
            .map_err(|e| self.error("state stream info", &e))?
            .state
            .last_sequence;
        if last <= t.seq {
            return Ok(false);
        }
        let records = if last - t.seq > FOLD_GETS_MAX {
            let policy = consumer::DeliverPolicy::ByStartSequence {
                start_sequence: t.seq + 1,
            };
            let filter = self.subject(&format!("{job}.>"));
            self.records(vec![filter], policy).await?.1.left_stream()
        } else {
            self.by_sequence(t.seq + 1..=last).right_stream()
        };
        let mut records = std::pin::pin!(records);
        let mut counted = false;
        while let Some(r) = records.next().await {
            let r = r?;
            t.seq = t.seq.max(r.seq);
            if r.deleted || r.job != job {
                continue;
            }
            let Some((kind, task)) = r.key.split_once('.') else {
                continue;
            };
            if matches!(kind, DONE | DONE_JSON | FAILED) {
                count(t, kind, task, &r.payload, 1);
                counted = true;
            }
        }
        // What was read ends at `last`, wherever the job's last record is.
        t.seq = t.seq.max(last);
        Ok(counted)
    }

    /// The bucket's messages of sequences `seqs`, in order, fetched from the
    /// stream's leader (a direct get may be answered by a replica that has
    /// not caught up, which would pass over a record as deleted); sequences
    /// deleted or purged are left out.
    fn by_sequence(
        &self,
        seqs: std::ops::RangeInclusive<u64>,
    ) -> impl futures::Stream<Item = Result<Record, QueueError>> + '_ {
        futures::stream::iter(seqs)
            .map(move |seq| async move {
                match self.stream.get_raw_message(seq).await {
                    Ok(m) => {
                        Ok(self.record_of(m.subject.as_str(), seq, Some(&m.headers), m.payload))
                    }
                    Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {
                        Ok(None)
                    }
                    Err(e) => Err(self.error("reading job state", &e)),
                }
            })
            .buffered(FOLD_GETS_IN_FLIGHT)
            .filter_map(|r| async move { r.transpose() })
    }

    /// A message of the bucket as a [`Record`]; `None` for a subject outside
    /// it.
    fn record_of(
        &self,
        subject: &str,
        seq: u64,
        headers: Option<&async_nats::HeaderMap>,
        payload: bytes::Bytes,
    ) -> Option<Record> {
        record_of(
            &format!("$KV.{}.", self.bucket),
            subject,
            seq,
            headers,
            payload,
        )
    }

    /// Takes one counted record out: purges it, then rewrites the totals
    /// (less the record when it was folded in). Rewriting them even when it
    /// was not makes a fold that read the record before the purge fail its
    /// compare-and-set and read again.
    async fn forget(&self, job: &str, kind: &str, task: &str) -> Result<(), QueueError> {
        let key = Self::key(job, kind, task);
        let entry = self
            .kv
            .entry(&key)
            .await
            .map_err(|e| self.error(&key, &e))?;
        let Some(entry) = entry.filter(|e| e.operation == kv::Operation::Put) else {
            return Ok(());
        };
        self.purge_key(&key).await?;
        for _ in 0..FOLD_TRIES {
            let (revision, mut t) = self.stored_totals(job).await?;
            if entry.revision <= t.seq {
                count(&mut t, kind, task, &entry.value, -1);
            }
            if self.store_totals(job, revision, &t).await? {
                return Ok(());
            }
        }
        Err(QueueError::State {
            bucket: self.bucket.clone(),
            message: format!("{job}: the totals kept changing while {key} was taken out"),
        })
    }

    /// The running marks of a job: costs the tasks held now, not the job.
    pub async fn running(&self, job: &str) -> Result<HashMap<String, TaskRunning>, QueueError> {
        self.records_of(job, RUN).await
    }

    /// The failed records of the job (few: a task is given up on only
    /// after its deliveries ran out).
    pub async fn failed(&self, job: &str) -> Result<HashMap<String, TaskFailed>, QueueError> {
        self.records_of(job, FAILED).await
    }

    /// The JSON records of one kind of the job, by task; a value that does
    /// not parse (another version's) is left out.
    async fn records_of<T: DeserializeOwned>(
        &self,
        job: &str,
        kind: &str,
    ) -> Result<HashMap<String, T>, QueueError> {
        let mut out = HashMap::new();
        let filter = self.subject(&Self::key(job, kind, ">"));
        self.read(vec![filter], consumer::DeliverPolicy::LastPerSubject, |r| {
            if r.deleted {
                return;
            }
            if let Some((_, task)) = r.key.split_once('.') {
                insert_json(&mut out, task, &r.payload);
            }
        })
        .await?;
        Ok(out)
    }

    /// Every record of one job: the last value of each of its keys.
    pub async fn snapshot(&self, job: &str) -> Result<Snapshot, QueueError> {
        let mut snap = Snapshot::default();
        let filter = self.subject(&format!("{job}.>"));
        self.read(vec![filter], consumer::DeliverPolicy::LastPerSubject, |r| {
            if r.deleted {
                return;
            }
            if r.key == "job" {
                snap.record = serde_json::from_slice(&r.payload).ok();
                return;
            }
            let Some((kind, task)) = r.key.split_once('.') else {
                return;
            };
            match kind {
                DONE | DONE_JSON => {
                    if let Some(d) = done_of(kind, task, &r.payload) {
                        snap.done.insert(task.to_owned(), d);
                    }
                }
                RUN => insert_json(&mut snap.running, task, &r.payload),
                LASTERR => insert_json(&mut snap.last_errors, task, &r.payload),
                FAILED => insert_json(&mut snap.failed, task, &r.payload),
                _ => {}
            }
        })
        .await?;
        Ok(snap)
    }

    /// Reads the messages of `filters` that the stream holds when the read
    /// starts (an ordered consumer that stops at the count it had then, so it
    /// ends even while workers keep writing), passing each to `each` with
    /// its key relative to the job's prefix.
    async fn read(
        &self,
        filters: Vec<String>,
        deliver_policy: consumer::DeliverPolicy,
        mut each: impl FnMut(Record),
    ) -> Result<(), QueueError> {
        let (_, records) = self.records(filters, deliver_policy).await?;
        let mut records = std::pin::pin!(records);
        while let Some(r) = records.next().await {
            each(r?);
        }
        Ok(())
    }

    /// The messages of `filters` (none: every message) that the stream holds
    /// when the read starts, as a stream, with their count.
    async fn records(
        &self,
        filters: Vec<String>,
        deliver_policy: consumer::DeliverPolicy,
    ) -> Result<
        (
            u64,
            impl futures::Stream<Item = Result<Record, QueueError>> + use<>,
        ),
        QueueError,
    > {
        let what = "reading job state";
        let c = self
            .stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subjects: filters,
                deliver_policy,
                ..Default::default()
            })
            .await
            .map_err(|e| self.error(what, &e))?;
        let pending = c.cached_info().num_pending;
        let msgs = if pending == 0 {
            None
        } else {
            Some(c.messages().await.map_err(|e| self.error(what, &e))?)
        };
        let bucket = self.bucket.clone();
        let bucket_prefix = format!("$KV.{bucket}.");
        let fail = move |message: String| QueueError::State {
            bucket: bucket.clone(),
            message: format!("{what}: {message}"),
        };
        let records = futures::stream::unfold((msgs, 0u64), move |(msgs, mut read)| {
            let (bucket_prefix, fail) = (bucket_prefix.clone(), fail.clone());
            async move {
                let mut msgs = msgs?;
                loop {
                    if read >= pending {
                        return None;
                    }
                    let next = tokio::time::timeout(SNAPSHOT_STALL, msgs.next()).await;
                    let m = match next {
                        Err(_) => {
                            let e = fail(format!(
                                "no record for {} s with {} still to read (is NATS reachable?)",
                                SNAPSHOT_STALL.as_secs(),
                                pending - read
                            ));
                            return Some((Err(e), (None, pending)));
                        }
                        Ok(None) => return None,
                        Ok(Some(Err(e))) => {
                            let e = fail(crate::error::chain(&e));
                            return Some((Err(e), (None, pending)));
                        }
                        Ok(Some(Ok(m))) => m,
                    };
                    let seq = m.info().map(|i| i.stream_sequence).unwrap_or(0);
                    let Some(r) = record_of(
                        &bucket_prefix,
                        m.subject.as_str(),
                        seq,
                        m.headers.as_ref(),
                        m.payload.clone(),
                    ) else {
                        read += 1;
                        continue;
                    };
                    return Some((Ok(r), (Some(msgs), read + 1)));
                }
            }
        });
        Ok((pending, records))
    }

    /// Every done record of the job, as a stream in no particular order:
    /// costs the job's size in time, not in memory.
    pub async fn done_records(
        &self,
        job: &str,
    ) -> Result<
        impl futures::Stream<Item = Result<(String, TaskDone), QueueError>> + use<>,
        QueueError,
    > {
        // Done records of older workers (`done.`) first, then this
        // version's (`d.`): one filter a read, as nats-server (2.15)
        // delivers a consumer of several filters a few ms a message once a
        // job has many keys. Every key holds one message (history 1).
        let (_, legacy) = self
            .records(
                vec![self.subject(&Self::key(job, DONE_JSON, ">"))],
                consumer::DeliverPolicy::All,
            )
            .await?;
        let (_, current) = self
            .records(
                vec![self.subject(&Self::key(job, DONE, ">"))],
                consumer::DeliverPolicy::All,
            )
            .await?;
        let records = legacy.chain(current);
        Ok(records.filter_map(|r| async move {
            match r {
                Err(e) => Some(Err(e)),
                Ok(r) if r.deleted => None,
                Ok(r) => {
                    let (kind, task) = r.key.split_once('.')?;
                    done_of(kind, task, &r.payload).map(|d| Ok((task.to_owned(), d)))
                }
            }
        }))
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
