//! The coordinator's error type.

/// A cause of any kind (file system, object store) kept as a source.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Errors of the coordinator library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A worker-side failure: model, ORT, store, Parquet.
    #[error(transparent)]
    Worker(#[from] rsembed_worker::Error),
    /// An object store operation failed.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// The input cannot be used (a validation, with no cause to keep).
    #[error("input: {0}")]
    Input(String),
    /// The output cannot be used (a validation, with no cause to keep).
    #[error("output: {0}")]
    Output(String),
    /// The local output folder cannot be created.
    #[error("output: cannot create output folder {}: {source}", dir.display())]
    CreateOutputDir {
        /// The folder.
        dir: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The output refuses the probe write made before any work.
    #[error("output: cannot write to {url}: {source}")]
    OutputNotWritable {
        /// The output.
        url: String,
        /// The file system's or the store's error.
        #[source]
        source: BoxError,
    },
    /// The probe written to the output cannot be deleted again.
    #[error("output: cannot delete in {url}: {source}")]
    OutputNotDeletable {
        /// The output.
        url: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// A file of the output cannot be read.
    #[error("output: cannot read {path}: {source}")]
    ReadOutput {
        /// The file.
        path: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// A file of the output cannot be written.
    #[error("output: {path}: {source}")]
    WriteOutput {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A finished task's file that does not read as Parquet.
    #[error("output: {path} exists but is not readable Parquet: {source}")]
    TaskFile {
        /// The file, relative to the output.
        path: String,
        /// The reader's error.
        #[source]
        source: rsembed_worker::Error,
    },
    /// A local input folder that cannot be walked.
    #[error("input: listing {url}: {source}")]
    ListInput {
        /// The input.
        url: String,
        /// The walk's error (it names the path).
        #[source]
        source: walkdir::Error,
    },
    /// An input object the store cannot describe.
    #[error("input: {url}: {source}")]
    InputStore {
        /// The input.
        url: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// The planner or its listing thread panicked or was cancelled.
    #[error("input: {what} panicked: {source}")]
    Panicked {
        /// Which: `planner` or `listing`.
        what: &'static str,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
    /// `--metrics-addr` cannot be bound.
    #[error("--metrics-addr {addr}: cannot listen: {source}")]
    MetricsListen {
        /// The address asked for.
        addr: String,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
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
        source: BoxError,
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
