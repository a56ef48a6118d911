//! The coordinator's error type.

/// Errors of the coordinator library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A worker-side failure: model, ORT, store, Parquet.
    #[error(transparent)]
    Worker(#[from] rsembed_worker::Error),
    /// An object store operation failed.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// The input cannot be listed.
    #[error("input: {0}")]
    Input(String),
    /// The output cannot be used.
    #[error("output: {0}")]
    Output(String),
    /// The output holds another job.
    #[error("output: {0}")]
    OtherJob(Box<crate::job::output::OtherJob>),
    /// The input holds nothing to embed.
    #[error("input: {0}")]
    NoInputs(String),
    /// A flag value that makes no sense.
    #[error("{0}")]
    Usage(String),
    /// `search`, `classify` or `compact` failed.
    #[error(transparent)]
    Query(#[from] crate::query::Error),
    /// The run stopped before finishing.
    #[error("cancelled")]
    Cancelled,
    /// The NATS queue or job state failed.
    #[error(transparent)]
    Queue(#[from] rsembed_worker::queue::QueueError),
    /// A JetStream request failed (the server or the stream unreachable).
    #[error("NATS: {doing}: {source}")]
    Nats {
        /// What was being done, e.g. `task stream info`.
        doing: String,
        /// The async-nats error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// NATS did not answer within the time given.
    #[error("NATS: no answer from NATS for {waited}")]
    NatsTimeout {
        /// How long, for a person.
        waited: String,
    },
    /// The connection to NATS is down.
    #[error("NATS: not connected to NATS")]
    NatsDisconnected,
    /// JSON that does not parse.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    /// A failed JetStream request: what was being done, and the client's error.
    pub(crate) fn nats(
        doing: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Error {
        Error::Nats {
            doing: doing.into(),
            source: source.into(),
        }
    }
}

/// The coordinator's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
