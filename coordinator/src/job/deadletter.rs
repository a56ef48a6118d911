//! Dead letters: JetStream's advisories for tasks it gave up on, kept by the
//! dead-letter stream until a coordinator command reads them here.
//!
//! - `MAX_DELIVERIES`: a task was delivered `max_deliver` times without an ack
//!   (workers died, or ran past `ack_wait`, each time). JetStream stops
//!   delivering it but a WorkQueue stream keeps it; it is read back by its
//!   sequence, recorded as failed with the last error a worker reported, and
//!   deleted from the stream, so it no longer counts as pending.
//! - `MSG_TERMINATED`: a worker gave up on the task, and it recorded the
//!   failure itself before terminating, so there is nothing left to do.
//!
//! `submit`, `status` and `finalize` all call [`reconcile`]; each advisory is
//! handled once (a durable consumer), and handling one twice is harmless.

use std::time::Duration;

use async_nats::jetstream::consumer;
use futures::StreamExt;
use rsembed_schemas::queue::{TaskFailed, TaskMessage};
use rsembed_worker::queue::Queue;
use serde::Deserialize;

use crate::error::{Error, Result};
use rsembed_worker::now_rfc3339;

/// The durable consumer coordinator commands share on the dead-letter stream.
const CONSUMER: &str = "rsembed-coordinator";

#[derive(Debug, Deserialize)]
struct Advisory {
    #[serde(rename = "type")]
    kind: String,
    stream_seq: u64,
    #[serde(default)]
    deliveries: u64,
}

/// Records every dead letter not yet handled; returns how many it recorded.
pub(crate) async fn reconcile(q: &Queue) -> Result<u64> {
    let dl =
        q.js.get_stream(&q.config.deadletter_stream)
            .await
            .map_err(|e| Error::nats("dead-letter stream", e))?;
    let c = dl
        .get_or_create_consumer(
            CONSUMER,
            consumer::pull::Config {
                durable_name: Some(CONSUMER.into()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| Error::nats("dead-letter consumer", e))?;
    // Nothing to read, most of the time: a fetch would wait out its expiry
    // (300 ms on every status poll) to say so.
    let mut c = c;
    let info = c
        .info()
        .await
        .map_err(|e| Error::nats("dead-letter consumer", e))?;
    if info.num_pending == 0 && info.num_ack_pending == 0 {
        return Ok(0);
    }
    let mut recorded = 0;
    loop {
        let mut batch = c
            .fetch()
            .max_messages(256)
            .expires(Duration::from_millis(300))
            .messages()
            .await
            .map_err(|e| Error::nats("reading dead letters", e))?;
        let mut got = 0;
        while let Some(m) = batch.next().await {
            let m = m.map_err(|e| Error::nats("reading dead letters", e))?;
            got += 1;
            match serde_json::from_slice::<Advisory>(&m.payload) {
                Ok(a) if a.kind.ends_with(".max_deliver") => {
                    if dead_task(q, &a).await? {
                        recorded += 1;
                    }
                }
                Ok(a) => {
                    tracing::debug!(kind = %a.kind, seq = a.stream_seq, "advisory needs nothing")
                }
                Err(e) => tracing::warn!(error = %e, "unreadable advisory; skipped"),
            }
            m.double_ack()
                .await
                .map_err(|e| Error::nats("acking a dead letter", e))?;
        }
        if got == 0 {
            break;
        }
    }
    Ok(recorded)
}

/// Records the task of a `MAX_DELIVERIES` advisory as failed and takes it out
/// of the stream. `false` when there was nothing to record.
async fn dead_task(q: &Queue, a: &Advisory) -> Result<bool> {
    let raw = match q.stream.get_raw_message(a.stream_seq).await {
        Ok(m) => m,
        // Already gone: acked late by a slow worker, or handled before.
        Err(_) => return Ok(false),
    };
    let Ok(msg) = serde_json::from_slice::<TaskMessage>(&raw.payload) else {
        let _ = q.stream.delete_message(a.stream_seq).await;
        return Ok(false);
    };
    let (job, task) = (&msg.task.job_id, &msg.task.task_id);
    if q.state.done(job, task).await?.is_none() {
        let last = q.state.last_error(job, task).await?;
        let error = match last {
            Some(l) => format!(
                "{} (delivery {} on {}; {} deliveries in all)",
                l.error, l.delivery, l.worker, a.deliveries
            ),
            None => format!(
                "delivered {} times without an ack: the workers holding it died or ran past ack_wait each time",
                a.deliveries
            ),
        };
        tracing::warn!(job_id = %job, task_id = %task, %error, "task dead-lettered");
        q.state
            .put_failed(
                job,
                &TaskFailed {
                    task_id: task.clone(),
                    error,
                    deliveries: a.deliveries,
                    reason: "max_deliveries".into(),
                    failed_at: now_rfc3339(),
                    message: String::from_utf8_lossy(&raw.payload).into_owned(),
                },
            )
            .await?;
    }
    let _ = q.state.clear_running(job, task).await;
    q.stream
        .delete_message(a.stream_seq)
        .await
        .map_err(|e| Error::nats(format!("removing dead task {task}"), e))?;
    Ok(true)
}
