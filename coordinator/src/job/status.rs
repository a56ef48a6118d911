//! `rsembed status`: a job's progress from its job state and the task stream's
//! per-subject count. It never pulls from the workers' consumer.
//!
//! A poll costs the same at 10⁷ tasks as at 10⁴: the counts come from the
//! job's running totals (folded from the done and failed records written
//! since the last fold, see `rsembed_worker::queue::state`), the queue's
//! subject count and the consumer's counts; the only records read whole are
//! the running marks, one per task held now.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use std::collections::HashMap;

use rsembed_schemas::job::{JobSpec, JOB_FILE};
use rsembed_schemas::queue::{JobRecord, JobTotals, TaskRunning};

use crate::job::summary::WindowCounts;
use rsembed_worker::queue::{self, Queue, QueueConfig};
use rsembed_worker::store::{Location, StoreCache};
use serde::Serialize;

use crate::cli::StatusArgs;
use crate::error::{Error, Result};
use crate::job::deadletter;
use crate::job::holders::{self, SilentHolder};
use crate::job::output::read_json;

/// Where a job stands.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JobStatus {
    /// The job.
    pub(crate) job_id: String,
    /// Output URL.
    pub(crate) output: String,
    /// Tasks in the plan (known once `submit` has finished planning).
    pub(crate) tasks: Option<u64>,
    /// Tasks whose files are written.
    pub(crate) done: u64,
    /// Tasks a worker holds now (silent holders included, until JetStream
    /// takes their tasks back).
    pub(crate) in_flight: u64,
    /// Of those, tasks whose holder has sent no heartbeat for over two
    /// heartbeat intervals (two thirds of the ack wait): dead or stuck.
    pub(crate) silent: u64,
    /// Tasks whose holder has been silent past the ack wait: JetStream gives
    /// them to the next worker that pulls (counted pending).
    pub(crate) redelivery_due: u64,
    /// The silent holders (both kinds), the longest silent first, at most ten.
    pub(crate) silent_holders: Vec<SilentHolder>,
    /// The consumer's ack wait, in seconds.
    pub(crate) ack_wait_s: f64,
    /// Tasks queued and not yet taken.
    pub(crate) pending: u64,
    /// Tasks given up on.
    pub(crate) failed: u64,
    /// Chip rows written.
    pub(crate) chips: u64,
    /// Inputs recorded in errors/.
    pub(crate) failed_inputs: u64,
    /// A windowed job's cells with no clear pixel in their window (no row),
    /// items outside every window and acquisitions past `--max-scenes`.
    #[serde(flatten)]
    pub(crate) windows: WindowCounts,
    /// Chips per second over the last minutes of finished tasks.
    pub(crate) chips_per_s: Option<f64>,
    /// Seconds until every task is done at that rate.
    pub(crate) eta_s: Option<f64>,
    /// Every planned task is done or failed, and nothing is queued.
    pub(crate) finished: bool,
    /// Pull requests of idle workers waiting at the shared consumer (all jobs).
    pub(crate) workers_waiting: u64,
    /// Tasks delivered and not acked, over all jobs, as the consumer counts them.
    pub(crate) ack_pending: u64,
    /// Why work waits, when nothing is taking it (no worker is pulling, or the
    /// tasks marked running are held by no one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) note: Option<String>,
}

/// What the shared consumer says about the workers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ConsumerState {
    /// Pull requests waiting (idle workers).
    pub(crate) waiting: u64,
    /// Delivered, not yet acked (all jobs).
    pub(crate) ack_pending: u64,
    /// The consumer's ack wait.
    pub(crate) ack_wait: Duration,
    /// Its `--backoff` (the ack wait of each delivery), when it has one.
    pub(crate) backoff: Vec<Duration>,
}

impl JobStatus {
    /// One line per figure.
    pub fn render(&self) -> String {
        let total = self.tasks.map_or_else(
            || "? (submit has not finished planning)".into(),
            |t| t.to_string(),
        );
        let rate = self
            .chips_per_s
            .map_or_else(|| "-".into(), |r| format!("{r:.1}"));
        let eta = self.eta_s.map_or_else(|| "-".into(), fmt_secs);
        let silent = holders::describe(self.silent, self.redelivery_due, &self.silent_holders)
            .map_or_else(String::new, |s| format!("  silent     {s}\n"));
        format!(
            "rsembed status: job {}\n  output     {}\n  tasks      {total}\n  done       {}\n  in flight  {}\n{silent}  pending    {}\n  failed     {}\n  chips      {} ({} failed inputs)\n{}  chips/s    {rate}\n  ETA        {eta}\n  workers    {} waiting for work\n  finished   {}\n{}",
            self.job_id,
            self.output,
            self.done,
            self.in_flight,
            self.pending,
            self.failed,
            self.chips,
            self.failed_inputs,
            self.windows.line(),
            self.workers_waiting,
            if self.finished { "yes" } else { "no" },
            self.note
                .as_ref()
                .map_or_else(String::new, |n| format!("  note       {n}\n"))
        )
    }
}

impl JobStatus {
    /// ` (1 held by a silent worker, 52 s, redelivered in about 8 s)` after
    /// the in-flight count of a `--watch` line; empty without a silent holder.
    fn silent_note(&self) -> String {
        let Some(first) = self.silent_holders.first() else {
            return String::new();
        };
        let n = self.silent + self.redelivery_due;
        let next = self
            .silent_holders
            .iter()
            .map(|h| h.redelivery_in_s)
            .fold(f64::INFINITY, f64::min);
        let when = if next > 0.0 {
            format!("redelivered in about {} s", next.ceil() as u64)
        } else {
            "redelivery due".to_owned()
        };
        format!(
            " ({n} held by a silent worker, {} s, {when})",
            first.silent_s.ceil() as u64
        )
    }
}

/// `s` seconds as `H:MM:SS`.
pub(crate) fn fmt_secs(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// The job of an output, from its `job.json`.
pub(crate) async fn job_of(output: &Location) -> Result<JobSpec> {
    read_json(output, JOB_FILE).await?.ok_or_else(|| {
        Error::Output(format!(
            "{} has no {JOB_FILE}: no job was submitted to this output",
            output.url
        ))
    })
}

/// Tasks of `job` stored in the task stream (pending and in flight).
pub(crate) async fn queued(q: &Queue, job: &str) -> Result<u64> {
    use futures::TryStreamExt;
    let mut info = q
        .stream
        .info_with_subjects(queue::task_subject(job))
        .await
        .map_err(|e| Error::nats("task stream info", e))?;
    let mut n = 0;
    while let Some((_, count)) = info
        .try_next()
        .await
        .map_err(|e| Error::nats("task stream info", e))?
    {
        n += count as u64;
    }
    Ok(n)
}

/// What a poll reads of a job's state.
pub(crate) struct StateView {
    /// What `submit` planned, once it has run.
    pub(crate) record: Option<JobRecord>,
    /// The job's counts.
    pub(crate) totals: JobTotals,
    /// Running marks of tasks not recorded done.
    pub(crate) running: HashMap<String, TaskRunning>,
}

/// Counts from a job's state and its queued messages.
pub(crate) fn summarize(
    spec: &JobSpec,
    state: &StateView,
    queued: u64,
    consumer: ConsumerState,
) -> JobStatus {
    let t = &state.totals;
    let (done, failed) = (t.done, t.failed);
    // A running mark is cleared after the ack; one left by a killed worker
    // stays until the task is delivered again (see `holders`). Older
    // workers' marks have no heartbeat: they count as live, and the
    // consumer's count of unacked deliveries bounds them below.
    let now = time::OffsetDateTime::now_utc();
    let marks = state.running.iter().map(|(t, r)| {
        let age = r
            .heartbeat_at
            .as_deref()
            .and_then(parse_time)
            .map(|t| Duration::try_from(now - t).unwrap_or(Duration::ZERO));
        (t, r, age)
    });
    let h = holders::classify(marks, consumer.ack_wait, &consumer.backoff);
    let in_flight = (h.live + h.silent).min(queued).min(consumer.ack_pending);
    let silent = h.silent.min(in_flight);
    let chips = t.chips;
    let failed_inputs = t.failed_inputs;
    let tasks = state.record.as_ref().filter(|r| r.planned).map(|r| r.tasks);
    let chips_per_s = t.chips_per_s();
    let eta_s = match (tasks, chips_per_s) {
        (Some(t), Some(r)) if r > 0.0 && done > 0 => {
            let left = t.saturating_sub(done + failed) as f64;
            Some(left * (chips as f64 / done as f64) / r)
        }
        _ => None,
    };
    // A silent holder's task cannot finish before it goes back to a worker.
    let back = h
        .listed
        .iter()
        .map(|s| s.redelivery_in_s)
        .fold(0.0, f64::max);
    let eta_s = eta_s.map(|e| e.max(back));
    JobStatus {
        job_id: spec.job_id.clone(),
        output: spec.output.clone(),
        tasks,
        done,
        in_flight,
        silent,
        redelivery_due: h.due.min(queued),
        silent_holders: h.listed,
        ack_wait_s: consumer.ack_wait.as_secs_f64(),
        pending: queued.saturating_sub(in_flight),
        failed,
        chips,
        failed_inputs,
        windows: WindowCounts::of(t, state.record.as_ref()),
        chips_per_s,
        eta_s,
        finished: tasks.is_some_and(|t| done + failed >= t) && queued == 0,
        workers_waiting: consumer.waiting,
        ack_pending: consumer.ack_pending,
        note: note(h.due.min(queued), in_flight, queued, &consumer),
    }
}

fn note(due: u64, in_flight: u64, queued: u64, c: &ConsumerState) -> Option<String> {
    if queued == 0 {
        return None;
    }
    let mut parts = Vec::new();
    if due > 0 && c.waiting == 0 {
        parts.push(format!(
            "{due} tasks marked running have had no heartbeat for over the ack wait ({}): \
             no worker holds them, and JetStream delivers them again when a worker pulls",
            fmt_secs(c.ack_wait.as_secs_f64())
        ));
    }
    if in_flight == 0 && c.waiting == 0 {
        parts.push(format!(
            "no worker holds a task of this job or is waiting for one: {queued} tasks wait; \
             is rsembed-worker running?"
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

fn parse_time(s: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
}

/// The shared consumer's waiting pulls and unacked deliveries.
pub(crate) async fn consumer_state(q: &Queue) -> Result<ConsumerState> {
    let mut c = q.consumer.clone();
    let info = c
        .info()
        .await
        .map_err(|e| Error::nats("consumer info", e))?;
    Ok(ConsumerState {
        waiting: info.num_waiting as u64,
        ack_pending: info.num_ack_pending as u64,
        ack_wait: info.config.ack_wait,
        backoff: info.config.backoff.clone(),
    })
}

/// Errors a later try may not have: NATS or the object store unreachable
/// (status's outage grace waits for anything the hint says may pass).
fn transient(e: &Error) -> bool {
    e.retry_hint() != rsembed_worker::retry::RetryHint::Never
}

/// Returns once the client has lost its connection to NATS.
async fn disconnected(client: &async_nats::Client) {
    while client.connection_state() == async_nats::connection::State::Connected {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Opens the queue for reading a job's state.
pub(crate) async fn open(nats: &queue::NatsArgs, name: &str) -> Result<Queue> {
    let client = nats.connect(name).await?;
    Ok(Queue::open(client, &QueueConfig::default(), false).await?)
}

/// What a poll reads of the job's state: its record, its totals and its
/// running marks (less those of tasks recorded done: a worker killed between
/// the done record and clearing its mark leaves one).
pub(crate) async fn state_view(q: &Queue, job: &str) -> Result<StateView> {
    let record = q.state.record(job).await?;
    let totals = q.state.totals(job).await?;
    let mut running = q.state.running(job).await?;
    let mut finished = Vec::new();
    for task in running.keys() {
        if q.state.done(job, task).await?.is_some() {
            finished.push(task.clone());
        }
    }
    for task in finished {
        running.remove(&task);
    }
    Ok(StateView {
        record,
        totals,
        running,
    })
}

/// Where the job of `output` stands now.
pub(crate) async fn status_once(q: &Queue, output: &Location) -> Result<JobStatus> {
    let spec = job_of(output).await?;
    deadletter::reconcile(q).await?;
    let state = state_view(q, &spec.job_id).await?;
    let queued = queued(q, &spec.job_id).await?;
    let consumer = consumer_state(q).await?;
    Ok(summarize(&spec, &state, queued, consumer))
}

/// One `--watch` line for logs (no terminal): elapsed time, task counts,
/// chips, rate and ETA.
pub(crate) fn watch_line(s: &JobStatus, elapsed: Duration) -> String {
    format!(
        "[{}] {}/{} done, {} in flight{}, {} pending, {} failed, {} chips, {} chips/s, ETA {}",
        fmt_secs(elapsed.as_secs_f64()),
        s.done,
        s.tasks.map_or("?".into(), |t| t.to_string()),
        s.in_flight,
        s.silent_note(),
        s.pending,
        s.failed,
        s.chips,
        s.chips_per_s.map_or("-".into(), |r| format!("{r:.1}")),
        s.eta_s.map_or("-".into(), fmt_secs)
    )
}

/// Runs `rsembed status`.
pub async fn status(args: StatusArgs) -> Result<JobStatus> {
    if args.watch {
        super::log_config("status", &super::redacted_status(&args));
    }
    let stores = StoreCache::default();
    let output = stores.location(&args.output)?;
    let q = open(&args.nats, "rsembed-status").await?;
    if !args.watch {
        return status_once(&q, &output).await;
    }
    let bar = (!args.json && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {bar:40} {pos}/{len} tasks  {msg}")
                .expect("progress template is valid"),
        );
        b
    });
    let client = q.js.client();
    let started = Instant::now();
    let mut failing_since: Option<Instant> = None;
    loop {
        // A JetStream request made while the client reconnects is buffered
        // and waits for the server rather than timing out, so a poll stops
        // when the connection drops, and the grace bounds every poll.
        let limit = failing_since.map_or(args.outage_grace, |t| {
            args.outage_grace.saturating_sub(t.elapsed())
        });
        let poll_start = Instant::now();
        let poll = tokio::select! {
            r = tokio::time::timeout(limit.max(Duration::from_secs(1)), status_once(&q, &output)) => {
                r.unwrap_or_else(|_| {
                    Err(Error::NatsTimeout {
                        waited: fmt_secs(limit.as_secs_f64()),
                    })
                })
            }
            () = disconnected(&client) => Err(Error::NatsDisconnected),
        };
        let s = match poll {
            Ok(s) => {
                failing_since = None;
                s
            }
            // A watch drives a Kubernetes Job: a NATS restart must not fail it.
            Err(e) if transient(&e) => {
                let since = *failing_since.get_or_insert(poll_start);
                if since.elapsed() >= args.outage_grace {
                    return Err(e);
                }
                tracing::warn!(cause = %e, "status failed; trying again");
                eprintln!(
                    "rsembed status: {e} (trying again for {} more)",
                    fmt_secs((args.outage_grace - since.elapsed()).as_secs_f64())
                );
                tokio::time::sleep(args.interval.max(Duration::from_millis(100))).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        match &bar {
            Some(b) => {
                b.set_length(s.tasks.unwrap_or(0));
                b.set_position(s.done + s.failed);
                b.set_message(format!(
                    "{} in flight{}, {} pending, {} failed, {} chips, {} chips/s, ETA {}",
                    s.in_flight,
                    s.silent_note(),
                    s.pending,
                    s.failed,
                    s.chips,
                    s.chips_per_s.map_or("-".into(), |r| format!("{r:.1}")),
                    s.eta_s.map_or("-".into(), fmt_secs)
                ));
            }
            None if args.json => println!("{}", serde_json::to_string(&s)?),
            None => eprintln!("{}", watch_line(&s, started.elapsed())),
        }
        if s.finished {
            if let Some(b) = &bar {
                b.finish_and_clear();
            }
            return Ok(s);
        }
        tokio::time::sleep(args.interval.max(Duration::from_millis(100))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(silent: Vec<SilentHolder>) -> JobStatus {
        JobStatus {
            job_id: "j".into(),
            output: "file:///out".into(),
            tasks: Some(36),
            done: 34,
            in_flight: 2,
            silent: silent.len() as u64,
            redelivery_due: 0,
            silent_holders: silent,
            ack_wait_s: 60.0,
            pending: 0,
            failed: 0,
            chips: 34,
            failed_inputs: 0,
            windows: WindowCounts::default(),
            chips_per_s: Some(1.0),
            eta_s: Some(1.0),
            finished: false,
            workers_waiting: 0,
            ack_pending: 2,
            note: None,
        }
    }

    #[test]
    fn a_watch_line_shows_a_silent_holder_beside_the_tasks_in_flight() {
        let quiet = watch_line(&status(vec![]), Duration::from_secs(5));
        assert!(
            quiet.contains("34/36 done, 2 in flight, 0 pending"),
            "{quiet}"
        );
        let held = status(vec![SilentHolder {
            task_id: "t".into(),
            worker: "w2".into(),
            delivery: 1,
            silent_s: 52.0,
            redelivery_in_s: 8.0,
        }]);
        let line = watch_line(&held, Duration::from_secs(5));
        assert!(
            line.contains(
                "2 in flight (1 held by a silent worker, 52 s, redelivered in about 8 s), 0 pending"
            ),
            "{line}"
        );
        assert!(held
            .render()
            .contains("  silent     1 task held by worker w2"));
    }
}
