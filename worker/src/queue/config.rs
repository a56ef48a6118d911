//! The queue's configuration and errors, which its connection, its job state
//! and the queue itself all take: below each of them.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};

/// The subjects of the task stream: `rsembed.tasks.<job_id>`.
pub(crate) const SUBJECTS: &str = "rsembed.tasks.>";

/// The oldest nats-server the queue runs on (async-nats 0.51's KV and the
/// consumer features used here need 2.10).
pub const MIN_SERVER: (u64, u64) = (2, 10);

/// Errors of the queue.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The server cannot be reached, or refused the credentials or the
    /// TLS handshake.
    #[error("cannot connect to NATS at {url}: {cause}")]
    Connect {
        /// The URL tried.
        url: String,
        /// What the failure means for the user (authorization, TLS, ...).
        cause: &'static str,
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
    /// The job-state bucket cannot be created or used.
    #[error("JetStream KV bucket {bucket}: {message}")]
    State {
        /// The bucket.
        bucket: String,
        /// What failed, with the client's reason.
        message: String,
    },
    /// A connection option cannot be used (an unreadable credentials file).
    #[error("NATS option {option}: {message}")]
    Option {
        /// The flag.
        option: &'static str,
        /// Why.
        message: String,
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
    /// The KV bucket of job state (done, failed, running tasks; job records).
    pub state_bucket: String,
    /// The stream that keeps the consumer's dead-letter advisories.
    pub deadletter_stream: String,
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
            state_bucket: "RSEMBED_STATE".into(),
            deadletter_stream: "RSEMBED_DEADLETTERS".into(),
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

    /// The dead-letter stream: JetStream publishes advisories as plain
    /// messages that nobody hears when no coordinator is running, so a stream
    /// keeps them (a week) until `status`, `finalize` or `submit` reads them.
    pub(crate) fn deadletter_config(&self) -> stream::Config {
        let tail = format!("{}.{}", self.stream, self.consumer);
        stream::Config {
            name: self.deadletter_stream.clone(),
            subjects: vec![
                format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{tail}"),
                format!("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{tail}"),
            ],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            num_replicas: self.replicas,
            max_age: Duration::from_secs(7 * 24 * 3600),
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
