//! The pull worker: takes tasks from the shared JetStream consumer, runs them
//! with the same [`TaskRunner`] as embedded mode, and acknowledges each only
//! after its files are written and its completion is recorded.
//!
//! Per message:
//!
//! 1. A message that does not parse, or of an unknown format, is terminated.
//! 2. A task of another model is nak'd with a delay and its reason recorded;
//!    on its last delivery it is recorded as failed and terminated, so a job no
//!    worker can serve ends dead-lettered with that reason.
//! 3. A task already recorded as done (its ack was lost) is acked again.
//! 4. Otherwise it runs, with an in-progress ack every `ack_wait / 3`, so a
//!    slow task is not redelivered while a dead worker's task is.
//! 5. Success: files (conditional creates), then the `done` record, then the
//!    double ack. Failure: the error's [`crate::retry::RetryHint`] decides, in
//!    one place (`ack.rs`, `answer`): nak with exponential delay (`Later`) or
//!    at once (`Now`) with the error recorded, or the `failed` record and a
//!    terminate (`Never`, and the last delivery of any failure).
//!
//! On shutdown it stops pulling, lets running tasks finish within the grace
//! period, and naks what is left without delay, so another worker takes it at
//! once instead of after `ack_wait`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, AckKind};
use futures::StreamExt;
use rsembed_raster::scale::ScaleSpec;
use rsembed_schemas::job::ModelRef;
use rsembed_schemas::meta::FileMeta;
use rsembed_schemas::queue::{TaskMessage, TaskRunning, MESSAGE_FORMAT, MESSAGE_FORMATS};
use rsembed_schemas::SOFTWARE_VERSION;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::chain;
use crate::now_rfc3339;
use crate::queue::Queue;
use crate::retry::Retry;
use crate::task::{JobContext, TaskRunner};

mod ack;

/// How the worker pulls and gives up.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// This worker's name in job state and logs.
    pub name: String,
    /// Tasks held at once (also the prefetch: a task is pulled only when a
    /// slot is free, so no task waits in this worker while another could run it).
    pub tasks_in_flight: usize,
    /// How long running tasks may take to finish after a shutdown signal.
    pub shutdown_grace: Duration,
    /// First redelivery delay after a failed try; doubles each try, up to 5 min.
    pub retry_delay: Duration,
    /// Redelivery delay for a task of another model.
    pub mismatch_delay: Duration,
    /// In-progress ack interval. Default: a third of the consumer's `ack_wait`.
    pub progress_interval: Option<Duration>,
    /// Stop after this many tasks (tests and one-shot jobs). Default: never.
    pub max_tasks: Option<u64>,
    /// Fault injection for the process tests: hold every task this long
    /// before running it (with progress acks, as a slow task), so a test can
    /// kill or stop a worker in the middle of one.
    pub hold: Option<Duration>,
    /// Fault injection for the process tests: abort the process once a
    /// task's files are written, before its completion is recorded or acked
    /// (the window a crash or an OOM kill can hit).
    pub crash_after_files: bool,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            name: default_name(),
            tasks_in_flight: 2,
            shutdown_grace: Duration::from_secs(30),
            retry_delay: Duration::from_secs(5),
            mismatch_delay: Duration::from_secs(30),
            progress_interval: None,
            max_tasks: None,
            hold: None,
            crash_after_files: false,
        }
    }
}

/// How often one worker folds a job's totals (see [`Worker::fold_totals`]).
const FOLD_EVERY: Duration = Duration::from_secs(2);

/// `<hostname>-<pid>`: unique among live workers, readable in `status`.
pub fn default_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".into());
    format!("{host}-{}", std::process::id())
}

/// What a worker did before it stopped.
#[derive(Debug, Default)]
pub struct ServeReport {
    /// Tasks finished and acked.
    pub done: u64,
    /// Tries that failed and were nak'd for a retry.
    pub retried: u64,
    /// Tasks given up on (terminated).
    pub failed: u64,
    /// Tasks of another model, nak'd.
    pub mismatched: u64,
    /// Tasks handed back at shutdown.
    pub handed_back: u64,
}

#[derive(Default)]
struct Tally {
    done: AtomicU64,
    retried: AtomicU64,
    failed: AtomicU64,
    mismatched: AtomicU64,
    handed_back: AtomicU64,
    /// Tasks taken, for `max_tasks`.
    taken: AtomicU64,
}

/// A pull worker for one model.
pub struct Worker {
    queue: Queue,
    runner: Arc<TaskRunner>,
    model: ModelRef,
    fingerprint: String,
    cfg: ServeConfig,
    jobs: Mutex<HashMap<(String, String), Arc<JobContext>>>,
    /// When this worker last folded each job's totals.
    folded: Mutex<HashMap<String, Instant>>,
    tally: Tally,
    max_deliver: i64,
    progress: Duration,
}

enum Outcome {
    Done,
    Retried,
    Failed,
    Mismatched,
    HandedBack,
}

impl Worker {
    /// A worker serving `model` (its fingerprint decides which tasks it runs).
    pub fn new(queue: Queue, runner: Arc<TaskRunner>, model: ModelRef, cfg: ServeConfig) -> Worker {
        let info = queue.consumer.cached_info();
        let max_deliver = info.config.max_deliver;
        let ack_wait = info.config.ack_wait;
        let progress = cfg
            .progress_interval
            .unwrap_or(ack_wait / 3)
            .max(Duration::from_millis(200));
        Worker {
            fingerprint: model.fingerprint(),
            queue,
            runner,
            model,
            cfg,
            jobs: Mutex::new(HashMap::new()),
            folded: Mutex::new(HashMap::new()),
            tally: Tally::default(),
            max_deliver,
            progress,
        }
    }

    /// Pulls and runs tasks until `stop` is cancelled (or `max_tasks` are
    /// taken), then drains as [`ServeConfig::shutdown_grace`] allows.
    pub async fn serve(self: Arc<Self>, stop: CancellationToken) -> ServeReport {
        tracing::info!(
            worker = %self.cfg.name, model = %self.model.name, fingerprint = %self.fingerprint,
            max_deliver = self.max_deliver, progress_ms = self.progress.as_millis() as u64,
            "pulling tasks"
        );
        let slots = Arc::new(tokio::sync::Semaphore::new(self.cfg.tasks_in_flight.max(1)));
        // Cancelled when the grace period is over: running tasks hand back.
        let abandon = CancellationToken::new();
        let mut running = JoinSet::new();
        while !stop.is_cancelled() {
            if let Some(max) = self.cfg.max_tasks {
                if self.tally.taken.load(Ordering::Relaxed) >= max {
                    break;
                }
            }
            while running.try_join_next().is_some() {}
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                _ = stop.cancelled() => break,
            };
            // A short expiry bounds how long a shutdown waits for the pull.
            let batch = self
                .queue
                .consumer
                .fetch()
                .max_messages(1)
                .expires(Duration::from_secs(2))
                .messages()
                .await;
            let mut batch = match batch {
                Ok(b) => b,
                Err(e) => {
                    // Disconnected or JetStream not ready (a server restart):
                    // the client reconnects by itself; try again shortly.
                    tracing::warn!(error = %chain(&e), "pull failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {},
                        _ = stop.cancelled() => break,
                    }
                    continue;
                }
            };
            // One message per pull: the batch ends after it, or empty at expiry.
            let m = match batch.next().await {
                Some(Ok(m)) => m,
                Some(Err(e)) => {
                    tracing::debug!(error = %chain(&*e), "pull ended");
                    continue;
                }
                None => continue,
            };
            if stop.is_cancelled() {
                // Pulled as the signal came: hand it back at once.
                let _ = m.ack_with(AckKind::Nak(None)).await;
                self.tally.handed_back.fetch_add(1, Ordering::Relaxed);
                break;
            }
            self.tally.taken.fetch_add(1, Ordering::Relaxed);
            let me = self.clone();
            let abandon = abandon.clone();
            running.spawn(async move {
                let _permit = permit;
                me.handle(m, abandon).await
            });
        }
        if !running.is_empty() {
            tracing::info!(
                tasks = running.len(),
                grace_s = self.cfg.shutdown_grace.as_secs_f64(),
                "draining"
            );
            let deadline = tokio::time::sleep(self.cfg.shutdown_grace);
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    r = running.join_next() => if r.is_none() { break },
                    _ = &mut deadline, if !abandon.is_cancelled() => abandon.cancel(),
                }
            }
        }
        // Acks and naks are buffered by the client: a nak that never leaves
        // the process hands nothing back.
        if let Err(e) = self.queue.js.client().flush().await {
            tracing::warn!(error = %e, "could not flush the last acks");
        }
        let t = &self.tally;
        ServeReport {
            done: t.done.load(Ordering::Relaxed),
            retried: t.retried.load(Ordering::Relaxed),
            failed: t.failed.load(Ordering::Relaxed),
            mismatched: t.mismatched.load(Ordering::Relaxed),
            handed_back: t.handed_back.load(Ordering::Relaxed),
        }
    }

    async fn handle(self: Arc<Self>, m: jetstream::Message, abandon: CancellationToken) {
        let (delivered, seq) = match m.info() {
            Ok(i) => (i.delivered.max(1) as u64, i.stream_sequence),
            Err(_) => (1, 0),
        };
        let outcome = match serde_json::from_slice::<TaskMessage>(&m.payload) {
            Err(e) => {
                tracing::error!(seq, error = %e, "not a task message; terminating it");
                let _ = m.ack_with(AckKind::Term).await;
                Outcome::Failed
            }
            Ok(msg) => {
                let span = tracing::info_span!(
                    "task", job_id = %msg.task.job_id, task_id = %msg.task.task_id, delivered
                );
                self.run_message(&m, msg, delivered, abandon)
                    .instrument(span)
                    .await
            }
        };
        let t = &self.tally;
        match outcome {
            Outcome::Done => t.done.fetch_add(1, Ordering::Relaxed),
            Outcome::Retried => t.retried.fetch_add(1, Ordering::Relaxed),
            Outcome::Failed => t.failed.fetch_add(1, Ordering::Relaxed),
            Outcome::Mismatched => t.mismatched.fetch_add(1, Ordering::Relaxed),
            Outcome::HandedBack => t.handed_back.fetch_add(1, Ordering::Relaxed),
        };
    }

    async fn run_message(
        &self,
        m: &jetstream::Message,
        msg: TaskMessage,
        delivered: u64,
        abandon: CancellationToken,
    ) -> Outcome {
        let job = msg.task.job_id.clone();
        let task = msg.task.task_id.clone();
        let last = self.max_deliver > 0 && delivered >= self.max_deliver as u64;
        if !MESSAGE_FORMATS.contains(&msg.format) {
            let why = format!(
                "task message format {} is not 1 to {MESSAGE_FORMAT}: this worker ({SOFTWARE_VERSION}) cannot read it",
                msg.format
            );
            return self.give_up(m, &msg, delivered, why).await;
        }
        if msg.model_fingerprint != self.fingerprint {
            let why = format!(
                "task wants model {} (fingerprint {}); worker {} serves {} (fingerprint {})",
                msg.model_name,
                msg.model_fingerprint,
                self.cfg.name,
                self.model.name,
                self.fingerprint
            );
            tracing::warn!(reason = %why, "not my model; handing the task back");
            if last {
                self.give_up(m, &msg, delivered, why).await;
                return Outcome::Mismatched;
            }
            self.note_error(&job, &task, &why, delivered).await;
            let _ = m
                .ack_with(AckKind::Nak(Some(self.cfg.mismatch_delay)))
                .await;
            return Outcome::Mismatched;
        }
        match self.queue.state.done(&job, &task).await {
            Ok(Some(_)) => {
                tracing::info!("already done (an ack was lost); acking again");
                // A worker killed between the record and clearing its mark
                // left the mark.
                let _ = self.queue.state.clear_running(&job, &task).await;
                return self.ack(m).await;
            }
            Ok(None) => {}
            Err(e) => {
                let why = format!("job state unreadable: {}", chain(&e));
                return self
                    .retry_or_give_up(m, &msg, delivered, last, e.retry_hint(), why)
                    .await;
            }
        }
        let ctx = match self.job_context(&msg) {
            Ok(c) => c,
            Err(why) => return self.give_up(m, &msg, delivered, why).await,
        };
        let running = TaskRunning {
            worker: self.cfg.name.clone(),
            started_at: now_rfc3339(),
            delivery: delivered,
            heartbeat_at: Some(now_rfc3339()),
        };
        if let Err(e) = self.queue.state.put_running(&job, &task, &running).await {
            tracing::debug!(error = %chain(&e), "cannot mark the task running");
        }

        let started = Instant::now();
        let ticker = self.heartbeat(m, &job, &task, running);
        let work = async {
            if let Some(d) = self.cfg.hold {
                tracing::info!(
                    hold_ms = d.as_millis() as u64,
                    "holding the task (fault injection)"
                );
                tokio::time::sleep(d).await;
            }
            self.runner.run(&ctx, &msg.task).await
        };
        let result = tokio::select! {
            r = work => Some(r),
            _ = abandon.cancelled() => None,
        };
        // Kept through recording a finished task's completion, which may wait
        // out a leader election of the state bucket.
        let ticker = match &result {
            Some(Ok(_)) => Some(ticker),
            _ => {
                drop(ticker);
                None
            }
        };
        let clear = self.queue.state.clear_running(&job, &task);
        match result {
            None => {
                let _ = clear.await;
                tracing::info!("shutdown grace is over; handing the task back");
                if let Err(e) = m.double_ack_with(AckKind::Nak(None)).await {
                    tracing::warn!(error = %e, "hand-back not confirmed; the task returns after ack_wait");
                }
                Outcome::HandedBack
            }
            Some(Ok(report)) => {
                if self.cfg.crash_after_files {
                    tracing::error!(task_id = %task, "aborting after the task's files (fault injection)");
                    std::process::abort();
                }
                let done = report.done(&self.cfg.name, started.elapsed().as_secs_f64());
                let recorded = self.record_done(&job, &task, &done, &abandon).await;
                drop(ticker);
                if let Err(e) = recorded {
                    // The files are written; the next delivery runs the task
                    // again, finds them and records completion then.
                    let why = format!("cannot record completion: {}", chain(&e));
                    return self
                        .retry_or_give_up(m, &msg, delivered, last, e.retry_hint(), why)
                        .await;
                }
                let _ = clear.await;
                if delivered > 1 {
                    // An earlier try's error is no longer this task's story.
                    let _ = self.queue.state.clear_last_error(&job, &task).await;
                }
                tracing::info!(
                    rows = done.chips_file.rows,
                    seconds = done.seconds,
                    "task done"
                );
                let outcome = self.ack(m).await;
                self.fold_totals(&job);
                outcome
            }
            Some(Err(e)) => {
                let _ = clear.await;
                self.retry_or_give_up(m, &msg, delivered, last, e.retry_hint(), chain(&e))
                    .await
            }
        }
    }

    /// Folds the job's new done records into its totals, at most every
    /// [`FOLD_EVERY`] per worker and in the background: `status` then reads
    /// a few seconds of records at most, however long since anyone polled.
    fn fold_totals(&self, job: &str) {
        {
            let mut folded = self.folded.lock().expect("fold lock");
            if folded.get(job).is_some_and(|t| t.elapsed() < FOLD_EVERY) {
                return;
            }
            if folded.len() > 1024 {
                folded.clear();
            }
            folded.insert(job.to_owned(), Instant::now());
        }
        let (state, job) = (self.queue.state.clone(), job.to_owned());
        tokio::spawn(async move {
            if let Err(e) = state.totals(&job).await {
                tracing::debug!(error = %chain(&e), "totals not folded");
            }
        });
    }

    fn job_context(&self, msg: &TaskMessage) -> Result<Arc<JobContext>, String> {
        let key = (msg.task.job_id.clone(), msg.output.clone());
        if let Some(c) = self.jobs.lock().expect("job cache lock").get(&key) {
            return Ok(c.clone());
        }
        let output = self
            .runner
            .stores
            .location(&msg.output)
            .map_err(|e| format!("output {}: {}", msg.output, chain(&e)))?;
        let scale: ScaleSpec = msg
            .tiling
            .scale
            .parse()
            .map_err(|e| format!("tiling scale `{}`: {e}", msg.tiling.scale))?;
        let ctx = Arc::new(JobContext {
            output,
            scale,
            file_meta: FileMeta::of_job(&msg.task.job_id, &self.model, &msg.tiling),
        });
        let mut jobs = self.jobs.lock().expect("job cache lock");
        // A worker serving for weeks sees many jobs; contexts are small, but
        // bounded all the same.
        if jobs.len() > 1024 {
            jobs.clear();
        }
        jobs.insert(key, ctx.clone());
        Ok(ctx)
    }
}
