//! The distributed work queue on NATS JetStream: one stream for every job, one
//! durable pull consumer shared by every worker, task publishing deduplicated
//! by `Nats-Msg-Id`, the job-state KV bucket ([`state`]) and the stream that
//! keeps dead-letter advisories until a coordinator reads them.
//!
//! Tasks go to subject `rsembed.tasks.<job_id>` as the JSON of
//! [`rsembed_schemas::queue::TaskMessage`]; the message id is the task id, so
//! publishing a task again within the stream's duplicate window stores nothing
//! new and the publish ack says so.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use rsembed_schemas::queue::TaskMessage;

mod config;
mod connect;
pub mod state;

pub use config::{QueueConfig, QueueError, MIN_SERVER};

pub use connect::{
    connect, install_crypto_provider, redact_urls, server_supported, ConnectionProblem,
    ConnectionWatch, NatsArgs,
};

pub use jetstream::context::{PublishAckFuture, PublishError};
pub use jetstream::publish::PublishAck;

/// What publishing a task did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishOutcome {
    /// The task was already in the stream (same `Nats-Msg-Id` within the
    /// duplicate window): nothing new was stored.
    pub duplicate: bool,
}

/// Creates the task stream and the shared consumer, or finds them when they
/// exist (existing settings are left as they are), and returns the consumer.
pub async fn ensure_stream_and_consumer(
    js: &jetstream::Context,
    cfg: &QueueConfig,
) -> Result<consumer::Consumer<consumer::pull::Config>, QueueError> {
    let stream = js
        .get_or_create_stream(cfg.stream_config())
        .await
        .map_err(|source| QueueError::Stream {
            stream: cfg.stream.clone(),
            source,
        })?;
    stream
        .get_or_create_consumer(&cfg.consumer, cfg.consumer_config())
        .await
        .map_err(|source| QueueError::Consumer {
            stream: cfg.stream.clone(),
            consumer: cfg.consumer.clone(),
            source,
        })
}

/// The subject of a job's tasks.
pub fn task_subject(job_id: &str) -> String {
    format!("rsembed.tasks.{job_id}")
}

/// Publishes a task with `Nats-Msg-Id: <msg_id>` and waits for JetStream's
/// ack, which says whether the task was a duplicate. `msg_id` is the task id,
/// or the task id with a retry suffix when `submit --retry-failed` requeues a
/// task whose first message id is still in the duplicate window.
pub async fn publish_task(
    js: &jetstream::Context,
    msg: &TaskMessage,
    msg_id: &str,
) -> Result<PublishOutcome, QueueError> {
    let ack = send_task(js, msg, msg_id).await?;
    let ack = ack.await.map_err(|source| QueueError::Publish {
        task_id: msg.task.task_id.clone(),
        source,
    })?;
    Ok(PublishOutcome {
        duplicate: ack.duplicate,
    })
}

/// Sends a task and returns the future of its ack without waiting, so a
/// submitter can keep many publishes in flight.
pub async fn send_task(
    js: &jetstream::Context,
    msg: &TaskMessage,
    msg_id: &str,
) -> Result<jetstream::context::PublishAckFuture, QueueError> {
    let payload = serde_json::to_vec(msg).map_err(|source| QueueError::Json {
        task_id: msg.task.task_id.clone(),
        source,
    })?;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id);
    js.publish_with_headers(task_subject(&msg.task.job_id), headers, payload.into())
        .await
        .map_err(|source| QueueError::Publish {
            task_id: msg.task.task_id.clone(),
            source,
        })
}

/// The queue's JetStream objects, created when missing.
pub struct Queue {
    /// The JetStream context.
    pub js: jetstream::Context,
    /// The task stream.
    pub stream: stream::Stream,
    /// The shared consumer.
    pub consumer: consumer::Consumer<consumer::pull::Config>,
    /// Job state.
    pub state: state::JobState,
    /// The settings used.
    pub config: QueueConfig,
}

impl Queue {
    /// Finds or creates the stream, the consumer, the state bucket and the
    /// dead-letter stream. With `update`, the consumer's settings are set to
    /// `cfg`'s (submit's flags); without, existing settings are kept (workers).
    pub async fn open(
        client: async_nats::Client,
        cfg: &QueueConfig,
        update: bool,
    ) -> Result<Queue, QueueError> {
        let js = jetstream::new(client);
        // Advisories are published from the consumer's creation on; the
        // stream that keeps them must exist first.
        js.get_or_create_stream(cfg.deadletter_config())
            .await
            .map_err(|source| QueueError::Stream {
                stream: cfg.deadletter_stream.clone(),
                source,
            })?;
        let consumer = if update {
            let stream = js
                .get_or_create_stream(cfg.stream_config())
                .await
                .map_err(|source| QueueError::Stream {
                    stream: cfg.stream.clone(),
                    source,
                })?;
            stream
                .create_consumer(cfg.consumer_config())
                .await
                .map_err(|source| QueueError::Consumer {
                    stream: cfg.stream.clone(),
                    consumer: cfg.consumer.clone(),
                    source,
                })?
        } else {
            ensure_stream_and_consumer(&js, cfg).await?
        };
        let stream = js
            .get_stream(&cfg.stream)
            .await
            .map_err(|e| QueueError::State {
                bucket: cfg.stream.clone(),
                message: e.to_string(),
            })?;
        let state = state::JobState::open(&js, cfg).await?;
        Ok(Queue {
            js,
            stream,
            consumer,
            state,
            config: cfg.clone(),
        })
    }
}

/// Parses a duration: `250ms`, `30s`, `5m`, `2h`, `1d`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (e.g. 30s, 5m, 250ms)"))?;
    let secs = match unit.trim() {
        "" | "s" => v,
        "ms" => v / 1000.0,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        "d" => v * 86400.0,
        u => return Err(format!("`{s}`: unknown unit `{u}` (ms, s, m, h, d)")),
    };
    if !(0.0..=1e9).contains(&secs) {
        return Err(format!("`{s}` is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_and_consumer_settings() {
        let cfg = QueueConfig {
            backoff: vec![Duration::from_secs(1), Duration::from_secs(5)],
            ..Default::default()
        };
        let s = cfg.stream_config();
        assert_eq!(s.subjects, vec!["rsembed.tasks.>".to_string()]);
        assert_eq!(s.retention, stream::RetentionPolicy::WorkQueue);
        assert_eq!(s.storage, stream::StorageType::File);
        let c = cfg.consumer_config();
        assert_eq!(c.durable_name.as_deref(), Some("rsembed-workers"));
        assert_eq!(c.backoff.len(), 2);
        assert_eq!(task_subject("j1"), "rsembed.tasks.j1");
        let d = cfg.deadletter_config();
        assert_eq!(
            d.subjects[0],
            "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.RSEMBED_TASKS.rsembed-workers"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
