//! The distributed work queue on NATS JetStream: one stream for every job, one
//! durable pull consumer shared by every worker, and task publishing
//! deduplicated by `Nats-Msg-Id`.
//!
//! Tasks go to subject `rsembed.tasks.<job_id>` as the JSON of
//! [`rsembed_schemas::task::Task`]; the message id is the task id, so
//! publishing a task again within the stream's duplicate window stores nothing
//! new and the publish ack says so.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use rsembed_schemas::task::Task;

/// The subjects of the task stream: `rsembed.tasks.<job_id>`.
pub const SUBJECTS: &str = "rsembed.tasks.>";

/// The oldest nats-server the queue runs on (async-nats 0.51's KV and the
/// consumer features used here need 2.10).
pub const MIN_SERVER: (u64, u64) = (2, 10);

/// Errors of the queue.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The server cannot be reached.
    #[error("cannot connect to NATS at {url}")]
    Connect {
        /// The URL tried.
        url: String,
        /// Why.
        #[source]
        source: async_nats::ConnectError,
    },
    /// The server is too old for JetStream features rsembed needs.
    #[error(
        "nats-server {version} at {url} is too old: rsembed needs nats-server >= {}.{}",
        MIN_SERVER.0,
        MIN_SERVER.1
    )]
    OldServer {
        /// The URL.
        url: String,
        /// The version the server reported.
        version: String,
    },
    /// The task stream cannot be created or read.
    #[error("JetStream stream {stream}")]
    Stream {
        /// The stream name.
        stream: String,
        /// Why.
        #[source]
        source: jetstream::context::CreateStreamError,
    },
    /// The shared consumer cannot be created or read.
    #[error("JetStream consumer {consumer} on stream {stream}")]
    Consumer {
        /// The stream name.
        stream: String,
        /// The consumer name.
        consumer: String,
        /// Why.
        #[source]
        source: jetstream::stream::ConsumerError,
    },
    /// A task cannot be published (no stream, or no ack from the server).
    #[error("publishing task {task_id}")]
    Publish {
        /// The task.
        task_id: String,
        /// Why.
        #[source]
        source: jetstream::context::PublishError,
    },
    /// A task cannot be serialized.
    #[error("task {task_id} as JSON")]
    Json {
        /// The task.
        task_id: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// The stream and consumer settings (`rsembed submit` and the worker flags).
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    /// The stream holding every job's tasks.
    pub stream: String,
    /// The durable pull consumer every worker shares.
    pub consumer: String,
    /// Stream replicas (1 on a single server, 3 on a cluster).
    pub replicas: usize,
    /// How long a delivered task may go without an ack or progress before
    /// JetStream redelivers it.
    pub ack_wait: Duration,
    /// Deliveries before a task is dead-lettered.
    pub max_deliver: i64,
    /// Redelivery delays after missed acks; empty for `ack_wait` each time.
    pub backoff: Vec<Duration>,
    /// Tasks delivered and not yet acked, over all workers.
    pub max_ack_pending: i64,
    /// How long JetStream remembers message ids for deduplication.
    pub duplicate_window: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            stream: "RSEMBED_TASKS".into(),
            consumer: "rsembed-workers".into(),
            replicas: 1,
            ack_wait: Duration::from_secs(60),
            max_deliver: 5,
            backoff: Vec::new(),
            max_ack_pending: 1000,
            // Resubmitting a job is deduplicated within this window; after it
            // the completion record makes submit skip finished tasks.
            duplicate_window: Duration::from_secs(24 * 3600),
        }
    }
}

impl QueueConfig {
    /// The stream's configuration.
    pub fn stream_config(&self) -> stream::Config {
        stream::Config {
            name: self.stream.clone(),
            subjects: vec![SUBJECTS.into()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            num_replicas: self.replicas,
            duplicate_window: self.duplicate_window,
            ..Default::default()
        }
    }

    /// The shared consumer's configuration.
    pub fn consumer_config(&self) -> consumer::pull::Config {
        consumer::pull::Config {
            durable_name: Some(self.consumer.clone()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            max_deliver: self.max_deliver,
            backoff: self.backoff.clone(),
            max_ack_pending: self.max_ack_pending,
            ..Default::default()
        }
    }
}

/// What publishing a task did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishOutcome {
    /// The task was already in the stream (same `Nats-Msg-Id` within the
    /// duplicate window): nothing new was stored.
    pub duplicate: bool,
}

/// Connects to NATS, reconnecting forever after a connection loss, and refuses
/// a server older than [`MIN_SERVER`].
pub async fn connect(url: &str) -> Result<async_nats::Client, QueueError> {
    let client = async_nats::ConnectOptions::new()
        .max_reconnects(None)
        .connect(url)
        .await
        .map_err(|source| QueueError::Connect {
            url: url.into(),
            source,
        })?;
    let version = client.server_info().version;
    if !server_supported(&version) {
        return Err(QueueError::OldServer {
            url: url.into(),
            version,
        });
    }
    Ok(client)
}

/// Whether a nats-server version string (`2.10.3`, `v2.15.1`, `2.11.0-beta.1`)
/// is at least [`MIN_SERVER`]. A version that does not parse is refused.
pub fn server_supported(version: &str) -> bool {
    let mut parts = version.trim().trim_start_matches('v').split(['.', '-']);
    let mut num = || parts.next().and_then(|p| p.parse::<u64>().ok());
    match (num(), num()) {
        (Some(major), Some(minor)) => (major, minor) >= MIN_SERVER,
        _ => false,
    }
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

/// Publishes a task with `Nats-Msg-Id: <task_id>` and waits for JetStream's
/// ack, which says whether the task was a duplicate.
pub async fn publish_task(
    js: &jetstream::Context,
    task: &Task,
) -> Result<PublishOutcome, QueueError> {
    let payload = serde_json::to_vec(task).map_err(|source| QueueError::Json {
        task_id: task.task_id.clone(),
        source,
    })?;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, task.task_id.as_str());
    let publish_err = |source| QueueError::Publish {
        task_id: task.task_id.clone(),
        source,
    };
    let ack = js
        .publish_with_headers(task_subject(&task.job_id), headers, payload.into())
        .await
        .map_err(publish_err)?
        .await
        .map_err(publish_err)?;
    Ok(PublishOutcome {
        duplicate: ack.duplicate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_versions() {
        for ok in ["2.10.0", "v2.15.1", "2.11.0-beta.1", "3.0.0", "2.10"] {
            assert!(server_supported(ok), "{ok}");
        }
        for old in ["2.9.25", "v2.9.0", "1.4.1", "", "dev", "2"] {
            assert!(!server_supported(old), "{old}");
        }
    }

    #[test]
    fn old_server_error_names_the_version() {
        let e = QueueError::OldServer {
            url: "nats://h:4222".into(),
            version: "2.9.25".into(),
        };
        assert_eq!(
            e.to_string(),
            "nats-server 2.9.25 at nats://h:4222 is too old: rsembed needs nats-server >= 2.10"
        );
    }

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
    }
}
