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
    OtherJob(Box<OtherJob>),
    /// The input holds nothing to embed.
    #[error("input: {0}")]
    NoInputs(String),
    /// A flag value that makes no sense.
    #[error("{0}")]
    Usage(String),
    /// `search`, `classify` or `compact` failed.
    #[error(transparent)]
    Query(#[from] rsembed_query::Error),
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
    /// `manifest.json` or a list of the manifest (`manifest/*.parquet`)
    /// that cannot be written or read.
    #[error("{url}: {source}")]
    ManifestList {
        /// The file.
        url: String,
        /// Why.
        #[source]
        source: rsembed_schemas::manifest::ListError,
    },
    /// JSON that does not parse.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// A STAC input that cannot be used: not STAC, a document over its size
    /// cap, a page whose paging loops, a search the server cannot run.
    #[error("STAC: {url}: {reason}")]
    Stac {
        /// The document, page or API.
        url: String,
        /// Why, for a person.
        reason: String,
    },
    /// A STAC document or API page that cannot be fetched (connection,
    /// timeout, object store).
    #[error("STAC: {url}: {source}")]
    StacFetch {
        /// The document or page.
        url: String,
        /// The HTTP client's or the store's error.
        #[source]
        source: BoxError,
    },
    /// A STAC API that answered with an HTTP error status.
    #[error("STAC: {url}: HTTP {status}: {body}")]
    StacStatus {
        /// The page asked for.
        url: String,
        /// The status code.
        status: u16,
        /// The start of the answer's body (what the server said was wrong).
        body: String,
    },
}

/// A location that cannot be reached reads as the worker's, whose messages
/// and retry hints it always had.
impl From<rsembed_store::Error> for Error {
    fn from(e: rsembed_store::Error) -> Error {
        Error::Worker(e.into())
    }
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

impl Error {
    /// When trying again can succeed (`rsembed_worker::retry`): wrapped
    /// worker, store and queue errors answer with their own hint; a NATS
    /// request that failed is an outage that may pass; everything else is the
    /// user's input, flags or output, which no wait changes.
    pub fn retry_hint(&self) -> rsembed_worker::retry::RetryHint {
        use rsembed_worker::retry::{Retry, RetryHint};
        match self {
            Error::Worker(e) => e.retry_hint(),
            Error::Store(e) => e.retry_hint(),
            Error::Queue(e) => e.retry_hint(),
            Error::Nats { .. } | Error::NatsTimeout { .. } | Error::NatsDisconnected => {
                RetryHint::Later
            }
            // Throttling and server errors pass; any other status is the
            // request (a bad search, a missing page), which no wait changes.
            Error::StacStatus { status, .. } => match status {
                408 | 429 | 500..=599 => RetryHint::Later,
                _ => RetryHint::Never,
            },
            // A store error answers for itself; an HTTP client error is the
            // connection (refused, reset, timed out), an outage that may pass.
            Error::StacFetch { source, .. } => {
                rsembed_worker::retry::hint_in_chain(&**source).unwrap_or(RetryHint::Later)
            }
            // The typed variants that keep a cause (reading `job.json`, a
            // HEAD of an http input, deleting an old output) answer with the
            // store error in their chain; without one it is the user's input,
            // flags or output, which no wait changes.
            _ => rsembed_worker::retry::hint_in_chain(self).unwrap_or(RetryHint::Never),
        }
    }
}

/// Another job holds the output: what differs, and how to go on.
#[derive(Debug, Clone)]
pub struct OtherJob {
    /// The output.
    pub(crate) output: String,
    /// The other job's id; `None` when the output holds task files without a
    /// `job.json`.
    pub(crate) theirs: Option<String>,
    /// What differs, by flag.
    pub(crate) differences: Vec<rsembed_schemas::job::Difference>,
    /// The flag that replaces the other job.
    pub(crate) remedy: &'static str,
}

impl std::fmt::Display for OtherJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.theirs {
            Some(id) => write!(
                f,
                "{} holds job {id}, and this command is another job",
                self.output
            )?,
            None => write!(
                f,
                "{} holds chip or error files but no job.json, so they cannot be resumed",
                self.output
            )?,
        }
        if !self.differences.is_empty() {
            write!(f, "; it differs in")?;
            for (i, d) in self.differences.iter().enumerate() {
                write!(f, "{} {d}", if i == 0 { "" } else { ";" })?;
            }
        }
        write!(
            f,
            ". Rows of two jobs must not mix: repeat the job's own flags to resume it, \
             choose another --output, or give {} to delete it and start this one",
            self.remedy
        )
    }
}

#[cfg(test)]
mod retry_tests {
    use super::*;
    use rsembed_worker::queue::QueueError;
    use rsembed_worker::retry::RetryHint;

    #[test]
    fn each_coordinator_error_kind_has_its_hint() {
        let store = || object_store::Error::Generic {
            store: "S3",
            source: "503 Service Unavailable".into(),
        };
        let cases = [
            (
                Error::Worker(rsembed_worker::Error::Store(store())),
                RetryHint::Later,
            ),
            (
                Error::Worker(rsembed_worker::Error::Usage("bad".into())),
                RetryHint::Never,
            ),
            (Error::Store(store()), RetryHint::Later),
            (Error::Input("no such prefix".into()), RetryHint::Never),
            (Error::Output("not writable".into()), RetryHint::Never),
            (Error::NoInputs("nothing to embed".into()), RetryHint::Never),
            (Error::Usage("--interval 0".into()), RetryHint::Never),
            (Error::Cancelled, RetryHint::Never),
            (
                Error::Queue(QueueError::State {
                    bucket: "RSEMBED_STATE".into(),
                    message: "timed out".into(),
                }),
                RetryHint::Later,
            ),
            (
                Error::Queue(QueueError::OldServer {
                    url: "nats://x".into(),
                    version: "2.9.0".into(),
                }),
                RetryHint::Never,
            ),
            (
                Error::nats("reading the job state", "request timed out"),
                RetryHint::Later,
            ),
            (
                Error::NatsTimeout {
                    waited: "5 s".into(),
                },
                RetryHint::Later,
            ),
            (Error::NatsDisconnected, RetryHint::Later),
            (
                Error::ReadOutput {
                    path: "out/job.json".into(),
                    source: store(),
                },
                RetryHint::Later,
            ),
            (
                Error::Json(serde_json::from_str::<u8>("{").unwrap_err()),
                RetryHint::Never,
            ),
            (
                Error::Stac {
                    url: "http://api/search".into(),
                    reason: "exceeds 64 MiB".into(),
                },
                RetryHint::Never,
            ),
            (
                Error::StacStatus {
                    url: "http://api/search".into(),
                    status: 503,
                    body: String::new(),
                },
                RetryHint::Later,
            ),
            (
                Error::StacStatus {
                    url: "http://api/search".into(),
                    status: 429,
                    body: String::new(),
                },
                RetryHint::Later,
            ),
            (
                Error::StacStatus {
                    url: "http://api/search".into(),
                    status: 400,
                    body: "bad filter".into(),
                },
                RetryHint::Never,
            ),
            (
                Error::StacFetch {
                    url: "s3://b/catalog.json".into(),
                    source: Box::new(store()),
                },
                RetryHint::Later,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(e.retry_hint(), want, "{e:?}");
        }
    }
}
