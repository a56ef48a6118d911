//! `rsembed submit`: plan the job and publish its tasks to the work queue.
//!
//! Order matters for resuming: `job.json` is written first; tasks are
//! published as the planner streams them (the listing is never held whole);
//! the plan's task ids go to `<output>/tasks.txt` as they are published, for
//! `finalize` to check against; the job record in the state bucket is written
//! last, with `planned: true`, so `status` knows the total.
//!
//! Submitting again is idempotent: tasks recorded done are skipped, tasks
//! still queued are deduplicated by JetStream (`Nats-Msg-Id` is the task id),
//! and failed tasks stay failed unless `--retry-failed` requeues them under a
//! fresh message id. `--retry-failed` also requeues done tasks with failed
//! inputs: their files are deleted first (workers create a task's files once
//! and would keep the old ones), then their done record, so the retry writes
//! them anew and every chip still lands once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures::StreamExt;

use rsembed_schemas::job::{ModelRef, TilingSpec};
use rsembed_schemas::queue::{JobRecord, TaskDone, TaskFailed, TaskMessage};
use rsembed_schemas::task::Task;
use rsembed_worker::now_rfc3339;
use rsembed_worker::queue::{self, Queue};
use serde::Serialize;
use tokio::io::AsyncWriteExt;

use crate::cli::SubmitArgs;
use crate::error::{Error, Result};
use crate::job::deadletter;
use crate::job::output::{Claim, JobOutput, Replace};
use crate::job::plan;
use crate::job::setup::{first_task, setup, JobFlags, JobSetup};

pub(crate) use crate::job::output::TASKS_FILE;

/// Publish acks awaited at once: enough to keep the connection busy, few
/// enough that a failed publish is noticed within a fraction of a second.
pub(crate) const ACKS_IN_FLIGHT: usize = 512;

/// What a submit did.
#[derive(Debug, Clone, Serialize)]
pub struct SubmitSummary {
    /// The job.
    pub job_id: String,
    /// Output URL.
    pub output: String,
    /// Tasks in the plan.
    pub tasks: u64,
    /// Inputs in the plan.
    pub inputs: u64,
    /// Tasks published and stored as new messages.
    pub published: u64,
    /// Tasks JetStream already had (an earlier submit's, not yet taken).
    pub duplicates: u64,
    /// Tasks skipped because they are done.
    pub done: u64,
    /// Tasks recorded as failed and left so (without `--retry-failed`).
    pub failed: u64,
    /// Failed tasks requeued (`--retry-failed`).
    pub requeued: u64,
    /// Done tasks with failed inputs requeued (`--retry-failed`).
    pub retried: u64,
    /// Failed inputs of the done tasks left as they are (listed in errors/).
    pub failed_inputs: u64,
    /// Done or failed tasks of an earlier plan that this one no longer has
    /// (an input changed since): their records and files were removed.
    pub superseded: u64,
    /// A windowed job's items that no window holds.
    #[serde(skip_serializing_if = "is_zero")]
    pub outside_windows: u64,
    /// A windowed job's acquisitions left out of a task by `--max-scenes`.
    #[serde(skip_serializing_if = "is_zero")]
    pub dropped_past_max_scenes: u64,
    /// Seconds taken.
    pub seconds: f64,
}

impl SubmitSummary {
    /// One screen of text.
    pub fn render(&self) -> String {
        let mut s = format!(
            "rsembed submit: job {}\n  output     {}\n  tasks      {} ({} inputs)\n  published  {}\n  duplicates {} (already queued)\n  done       {} (skipped)\n  failed     {}{}\n",
            self.job_id,
            self.output,
            self.tasks,
            self.inputs,
            self.published,
            self.duplicates,
            self.done,
            self.failed,
            if self.requeued > 0 {
                format!(" ({} requeued)", self.requeued)
            } else if self.failed > 0 {
                " (not requeued)".into()
            } else {
                String::new()
            },
        );
        if self.retried > 0 {
            s += &format!(
                "  retried    {} done tasks with failed inputs requeued\n",
                self.retried
            );
        }
        if self.superseded > 0 {
            s += &format!(
                "  superseded {} tasks of an earlier plan removed (records and files)\n",
                self.superseded
            );
        }
        if self.outside_windows > 0 || self.dropped_past_max_scenes > 0 {
            s += &format!(
                "  windows    {} items outside every window, {} acquisitions past --max-scenes dropped\n",
                self.outside_windows, self.dropped_past_max_scenes
            );
        }
        if let Some(hint) =
            crate::job::summary::how_to_retry("submit", self.failed_inputs, self.failed)
        {
            s += &format!("  retry      {hint}\n");
        }
        s += &format!("  seconds    {:.1}\n", self.seconds);
        s
    }
}

/// Runs `rsembed submit`.
pub async fn submit(args: SubmitArgs) -> Result<SubmitSummary> {
    let started = Instant::now();
    super::log_config("submit", &super::redacted_submit(&args));
    // Flags of its own first, then the setup `run` shares.
    let qcfg = args.queue.config().map_err(Error::Usage)?;
    let JobSetup {
        stores,
        input,
        source,
        output,
        model_ref,
        out,
        spec,
        tiling,
        grouping,
        claim,
        mut created_dir,
        ..
    } = setup(JobFlags {
        input: &args.input,
        output: &args.output,
        model: &args.model,
        fp16: args.fp16,
        tiling: &args.tiling,
        replace: if args.force_new_job {
            Replace::OtherJob
        } else {
            Replace::No
        },
        replace_flag: "--force-new-job",
    })
    .await?;
    let job_id = spec.job_id.clone();

    let client = args.nats.connect("rsembed-submit").await?;
    let q = Queue::open(client, &qcfg, true).await?;

    let mut planner = plan::start(
        &stores,
        source,
        job_id.clone(),
        tiling.clone(),
        &grouping,
        256,
    );
    let first = first_task(&mut planner, &input.url).await?;
    if let Claim::Replace(old) = &claim {
        forget_job(&q, old).await?;
    }
    out.replace_if(&claim).await?;
    out.write_spec(&spec).await?;
    created_dir.keep();

    // Dead letters first, so the failed set below is current.
    deadletter::reconcile(&q).await?;
    let snap = q.state.snapshot(&job_id).await?;
    let prior = q.state.record(&job_id).await?;
    // Planning again: until it ends, `finalize` must not take the old plan
    // (tasks.txt is being rewritten) for a finished one.
    let record = |tasks, inputs, published, planned, windows: (u64, u64)| JobRecord {
        job_id: job_id.clone(),
        output: output.url.to_string(),
        tasks,
        inputs,
        published,
        submitted_at: now_rfc3339(),
        planned,
        outside_windows: windows.0,
        dropped_past_max_scenes: windows.1,
    };
    let prior_published = prior.as_ref().map_or(0, |p| p.published);
    q.state
        .put_record(&record(
            prior.as_ref().map_or(0, |p| p.tasks),
            prior.as_ref().map_or(0, |p| p.inputs),
            prior_published,
            false,
            prior
                .as_ref()
                .map_or((0, 0), |p| (p.outside_windows, p.dropped_past_max_scenes)),
        ))
        .await?;

    let mut s = SubmitSummary {
        job_id: job_id.clone(),
        output: output.url.to_string(),
        tasks: 0,
        inputs: 0,
        published: 0,
        duplicates: 0,
        done: 0,
        failed: 0,
        requeued: 0,
        retried: 0,
        failed_inputs: 0,
        superseded: 0,
        outside_windows: 0,
        dropped_past_max_scenes: 0,
        seconds: 0.0,
    };
    let first = futures::stream::once(std::future::ready(first));
    let mut tasks = std::pin::pin!(first.chain(crate::job::plan::receiver_stream(planner.tasks)));
    let published = publish_tasks(
        &PublishJob {
            job_id: &job_id,
            queue: &q,
            output: &out,
            model: &model_ref,
            tiling: &tiling,
            done: &snap.done,
            failed: &snap.failed,
            retry_failed: args.retry_failed,
        },
        &mut tasks,
        &mut s,
    )
    .await;
    if let Err(e) = published {
        planner.done.abort();
        return Err(e);
    }
    planner.done.await.map_err(|source| Error::Panicked {
        what: "planner",
        source,
    })??;
    s.inputs = planner.stats.inputs.load(Ordering::Relaxed);
    s.outside_windows = planner.stats.outside_windows.load(Ordering::Relaxed);
    s.dropped_past_max_scenes = planner.stats.dropped_past_max_scenes();
    q.state
        .put_record(&record(
            s.tasks,
            s.inputs,
            s.published + prior_published,
            true,
            (s.outside_windows, s.dropped_past_max_scenes),
        ))
        .await?;
    s.seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        job_id = %job_id, tasks = s.tasks, published = s.published, duplicates = s.duplicates,
        done = s.done, failed = s.failed, "submitted"
    );
    Ok(s)
}

/// Everything the publishing stage needs besides the tasks.
pub struct PublishJob<'a> {
    /// The job.
    pub job_id: &'a str,
    /// The queue.
    pub queue: &'a Queue,
    /// The job's output (gets `tasks.txt`; its manifest is deleted before
    /// the first task is queued).
    pub output: &'a JobOutput,
    /// The job's model.
    pub model: &'a ModelRef,
    /// The job's tiling.
    pub tiling: &'a TilingSpec,
    /// Tasks recorded done: skipped, or requeued with `retry_failed` when
    /// some of their inputs failed.
    pub done: &'a HashMap<String, TaskDone>,
    /// Tasks recorded failed: skipped, or requeued with `retry_failed`.
    pub failed: &'a HashMap<String, TaskFailed>,
    /// `--retry-failed`.
    pub retry_failed: bool,
}

/// Publishes every task `tasks` yields, with up to `ACKS_IN_FLIGHT` acks
/// awaited at once, and writes the plan's task ids to `tasks.txt`; counts go
/// into `s`. The planner streams into `tasks`, so the plan is never held.
pub async fn publish_tasks(
    job: &PublishJob<'_>,
    tasks: &mut (impl futures::Stream<Item = Task> + Unpin),
    s: &mut SubmitSummary,
) -> Result<()> {
    let q = job.queue;
    let out = &job.output.loc;
    let path = out.child(TASKS_FILE);
    let mut tasks_file = object_store::buffered::BufWriter::new(out.store.clone(), path.clone());
    let fingerprint = job.model.fingerprint();
    let output = out.url.to_string();
    // A resubmit that queues nothing leaves a finished job's manifest be;
    // one that queues work reopens the job first.
    let mut reopened = false;
    let mut acks: VecDeque<(String, queue::PublishAckFuture)> = VecDeque::new();
    // Records of this plan's tasks; the others are an earlier plan's. Holds
    // no more than the records submit has read anyway.
    let mut planned_records: HashSet<String> = HashSet::new();
    let result: Result<()> = async {
        while let Some(task) = tasks.next().await {
            s.tasks += 1;
            if job.done.contains_key(&task.task_id) || job.failed.contains_key(&task.task_id) {
                planned_records.insert(task.task_id.clone());
            }
            tasks_file
                .write_all(format!("{}\n", task.task_id).as_bytes())
                .await
                .map_err(|source| Error::WriteOutput {
                    path: path.to_string(),
                    source,
                })?;
            let mut msg_id = task.task_id.clone();
            if let Some(d) = job.done.get(&task.task_id) {
                let failed_inputs = d.errors_file.as_ref().map_or(0, |f| f.rows);
                if !job.retry_failed || failed_inputs == 0 {
                    s.done += 1;
                    s.failed_inputs += failed_inputs;
                    continue;
                }
                if !reopened {
                    job.output.delete_manifest().await?;
                    reopened = true;
                }
                msg_id = format!("{}.retry.{}", task.task_id, d.finished_at);
                forget_done(job, &task.job_id, &task.task_id).await?;
                s.retried += 1;
            }
            if let Some(f) = job.failed.get(&task.task_id) {
                if !job.retry_failed {
                    s.failed += 1;
                    continue;
                }
                // The first id may still be in the duplicate window, where a
                // republish would be dropped as a duplicate.
                msg_id = format!("{}.retry.{}", task.task_id, f.failed_at);
                q.state.clear_failed(&task.job_id, &task.task_id).await?;
                s.requeued += 1;
            }
            if !reopened {
                job.output.delete_manifest().await?;
                reopened = true;
            }
            let msg = TaskMessage {
                format: TaskMessage::format_for(job.tiling),
                model_fingerprint: fingerprint.clone(),
                model_name: job.model.name.clone(),
                output: output.clone(),
                tiling: job.tiling.clone(),
                task,
            };
            let ack = queue::send_task(&q.js, &msg, &msg_id).await?;
            acks.push_back((msg.task.task_id, ack));
            while acks.len() >= ACKS_IN_FLIGHT {
                let (id, ack) = acks.pop_front().expect("not empty");
                count(s, &id, ack.await)?;
            }
        }
        while let Some((id, ack)) = acks.pop_front() {
            count(s, &id, ack.await)?;
        }
        // Tasks of an earlier plan: counted as done or failed they would
        // stand for tasks of this one, and their chips may be in this plan's
        // files too.
        for id in job.done.keys() {
            if !planned_records.contains(id) {
                forget_done(job, job.job_id, id).await?;
                s.superseded += 1;
            }
        }
        for id in job.failed.keys() {
            if !planned_records.contains(id) {
                q.state.clear_failed(job.job_id, id).await?;
                s.superseded += 1;
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        let _ = tasks_file.abort().await;
        return Err(e);
    }
    tasks_file
        .shutdown()
        .await
        .map_err(|source| Error::WriteOutput {
            path: path.to_string(),
            source,
        })
}

/// Takes a done task with failed inputs back to "not run": its files go
/// first (a worker creates a task's files once, so it would keep these), then
/// its done record (a worker acks a task recorded done without running it).
/// Cut off between the two, the record still names the errors file, and the
/// next `--retry-failed` does it again.
async fn forget_done(job: &PublishJob<'_>, job_id: &str, task_id: &str) -> Result<()> {
    let out = &job.output.loc;
    let task = Task {
        job_id: job_id.to_owned(),
        task_id: task_id.to_owned(),
        inputs: vec![],
        window: None,
        cells: None,
    };
    crate::job::output::delete_if_present(out, &task.chips_path()).await?;
    crate::job::output::delete_if_present(out, &task.errors_path()).await?;
    job.queue.state.clear_done(job_id, task_id).await?;
    Ok(())
}

fn count(
    s: &mut SubmitSummary,
    task_id: &str,
    ack: std::result::Result<queue::PublishAck, queue::PublishError>,
) -> Result<()> {
    let ack = ack.map_err(|source| queue::QueueError::Publish {
        task_id: task_id.to_owned(),
        source,
    })?;
    if ack.duplicate {
        s.duplicates += 1;
    } else {
        s.published += 1;
    }
    Ok(())
}

/// Removes another job's queued tasks and state from NATS; its files go with
/// [`JobOutput::replace_if`]. Only `--force-new-job` calls this.
async fn forget_job(q: &Queue, old_job: &str) -> Result<()> {
    tracing::warn!(
        old_job,
        "--force-new-job: deleting the other job's tasks, state and files"
    );
    q.stream
        .purge()
        .filter(queue::task_subject(old_job))
        .await
        .map_err(|e| Error::nats(format!("purging job {old_job}'s tasks"), e))?;
    q.state.purge_job(old_job).await?;
    Ok(())
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
