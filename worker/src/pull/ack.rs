//! Answering JetStream for a task: in-progress acks and heartbeats while it
//! runs, then ack, nak with a delay, or terminate after recording the
//! failure, and recording completion in the job-state bucket.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use rsembed_schemas::queue::{TaskDone, TaskError, TaskFailed, TaskMessage, TaskRunning};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::error::chain;
use crate::now_rfc3339;
use crate::pull::{Outcome, Worker};
use crate::retry::{with_patience, RetryHint};

impl Worker {
    /// Keeps a running task held: an in-progress ack every
    /// progress interval (JetStream restarts the task's `ack_wait` clock)
    /// and a heartbeat in the job state, until the guard drops.
    pub(super) fn heartbeat(
        &self,
        m: &jetstream::Message,
        job: &str,
        task: &str,
        mut running: TaskRunning,
    ) -> DropGuard {
        let every = self.progress;
        let stop = CancellationToken::new();
        let s = stop.clone();
        let m = m.clone();
        let state = self.queue.state.clone();
        let (job, task) = (job.to_owned(), task.to_owned());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {},
                    _ = s.cancelled() => return,
                }
                // JetStream restarts the task's ack_wait clock.
                if let Err(e) = m.ack_with(AckKind::Progress).await {
                    tracing::debug!(error = %e, "progress ack failed");
                }
                // `status` tells a live holder from a dead one by this.
                running.heartbeat_at = Some(now_rfc3339());
                if let Err(e) = state.put_running(&job, &task, &running).await {
                    tracing::debug!(error = %chain(&e), "heartbeat not recorded");
                }
            }
        });
        stop.drop_guard()
    }

    /// Records a finished task as done, trying again for up to
    /// [`RECORD_PATIENCE`] while the state bucket cannot take the write (a
    /// JetStream leader election on a cluster takes seconds): handing the task
    /// back instead would run all its work again on the next delivery.
    pub(super) async fn record_done(
        &self,
        job: &str,
        task: &str,
        done: &TaskDone,
        abandon: &CancellationToken,
    ) -> Result<(), crate::queue::QueueError> {
        let what = "completion not recorded yet";
        with_patience(
            RECORD_PATIENCE,
            abandon,
            what,
            |_| true,
            || self.queue.state.put_done(job, task, done),
        )
        .await
    }

    pub(super) async fn ack(&self, m: &jetstream::Message) -> Outcome {
        if let Err(e) = m.double_ack().await {
            // Redelivered later, then found done and acked.
            tracing::warn!(error = %e, "ack not confirmed");
        }
        Outcome::Done
    }

    pub(super) fn retry_delay(&self, delivered: u64) -> Duration {
        let exp = delivered.saturating_sub(1).min(16) as u32;
        (self.cfg.retry_delay * 2u32.pow(exp)).min(Duration::from_secs(300))
    }

    pub(super) async fn note_error(&self, job: &str, task: &str, why: &str, delivered: u64) {
        let v = TaskError {
            error: why.to_owned(),
            delivery: delivered,
            worker: self.cfg.name.clone(),
        };
        if let Err(e) = self.queue.state.put_last_error(job, task, &v).await {
            tracing::debug!(error = %chain(&e), "cannot record the error");
        }
    }

    /// Answers a failed try of `msg` as its hint says ([`answer`]).
    pub(super) async fn retry_or_give_up(
        &self,
        m: &jetstream::Message,
        msg: &TaskMessage,
        delivered: u64,
        last: bool,
        hint: RetryHint,
        why: String,
    ) -> Outcome {
        match answer(hint, last, self.retry_delay(delivered)) {
            Answer::Term => {
                tracing::warn!(retry = %hint, last, "no further try");
                self.give_up(m, msg, delivered, why).await
            }
            Answer::Nak(delay) => {
                let retry_in_s = delay.map_or(0.0, |d| d.as_secs_f64());
                tracing::warn!(error = %why, retry = %hint, retry_in_s, "task failed; will be retried");
                let (job, task) = (&msg.task.job_id, &msg.task.task_id);
                self.note_error(job, task, &why, delivered).await;
                let _ = m.ack_with(AckKind::Nak(delay)).await;
                Outcome::Retried
            }
        }
    }

    /// Records the task as failed, then terminates it.
    pub(super) async fn give_up(
        &self,
        m: &jetstream::Message,
        msg: &TaskMessage,
        delivered: u64,
        why: String,
    ) -> Outcome {
        tracing::error!(error = %why, "giving up on the task");
        let failed = TaskFailed {
            task_id: msg.task.task_id.clone(),
            error: why,
            deliveries: delivered,
            reason: "terminated".into(),
            failed_at: now_rfc3339(),
            message: String::from_utf8_lossy(&m.payload).into_owned(),
        };
        if let Err(e) = self.queue.state.put_failed(&msg.task.job_id, &failed).await {
            // Not terminated: a later delivery (or the dead-letter advisory)
            // records it.
            tracing::warn!(error = %chain(&e), "cannot record the failure; handing the task back");
            let _ = m
                .ack_with(AckKind::Nak(Some(self.retry_delay(delivered))))
                .await;
            return Outcome::Retried;
        }
        let _ = m.ack_with(AckKind::Term).await;
        Outcome::Failed
    }
}

/// How long a finished task keeps trying to record its completion before it
/// is handed back: longer than a JetStream leader election (about 5 s on a
/// 3-node cluster), while the progress acks keep the task held.
const RECORD_PATIENCE: Duration = Duration::from_secs(30);

/// What JetStream is told after a failed try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    /// Redeliver, after the delay when there is one (the error is recorded as
    /// the task's last error for `status`).
    Nak(Option<Duration>),
    /// Record the task as failed, then terminate it (dead-lettered).
    Term,
}

/// The pull worker's one mapping from a failure's [`RetryHint`] to JetStream:
/// [`RetryHint::Later`] → nak after `delay` (the exponential retry delay),
/// [`RetryHint::Now`] → nak without delay, so another worker takes it at once,
/// [`RetryHint::Never`] → terminate at once. The last delivery terminates
/// whatever the hint, so the `failed` record carries the last error (a nak
/// would dead-letter it too, by the advisory, with a poorer reason).
pub(super) fn answer(hint: RetryHint, last: bool, delay: Duration) -> Answer {
    match hint {
        _ if last => Answer::Term,
        RetryHint::Later => Answer::Nak(Some(delay)),
        RetryHint::Now => Answer::Nak(None),
        RetryHint::Never => Answer::Term,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_hint_maps_to_one_jetstream_answer() {
        let d = Duration::from_secs(5);
        assert_eq!(answer(RetryHint::Later, false, d), Answer::Nak(Some(d)));
        assert_eq!(answer(RetryHint::Now, false, d), Answer::Nak(None));
        assert_eq!(answer(RetryHint::Never, false, d), Answer::Term);
        for hint in [RetryHint::Later, RetryHint::Now, RetryHint::Never] {
            assert_eq!(
                answer(hint, true, d),
                Answer::Term,
                "{hint} on the last delivery"
            );
        }
    }
}
