//! Whether a failed piece of work is worth trying again, and when: one
//! [`RetryHint`] per error, decided where the error is made.
//!
//! Every error type of the worker implements [`Retry`]; an error that wraps
//! another (`Error::Store(e)`, a store error inside an I/O error) answers with
//! the inner error's hint, so the one place that knows what went wrong is the
//! one that decides. The callers only map the hint to what they do:
//!
//! - the pull worker: [`RetryHint::Later`] → nak with its exponential delay,
//!   [`RetryHint::Now`] → nak without delay, [`RetryHint::Never`] → record the
//!   task as failed and terminate it (`pull`'s one mapping);
//! - the batcher (pull workers): an input the store could not give us (a
//!   store error in its chain, [`hint_in_chain`]) fails its task with that
//!   error's hint
//!   instead of becoming an error row that calls the input bad;
//! - `rsembed status --watch`: anything but [`RetryHint::Never`] is an outage
//!   it waits out for its grace period.
//!
//! Modelled on the retry hints of Arroyo's `arroyo-rpc` errors, with a third
//! answer ([`RetryHint::Now`]) for failures of this process rather than of
//! the work (docs/decisions.md, "Retries: one RetryHint").

use std::error::Error as StdError;

use crate::error::Error;
use crate::queue::{ConnectionProblem, QueueError};

/// When trying the same work again can succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryHint {
    /// After a delay: a cause outside the work that time may fix (the object
    /// store answering 5xx or timing out, NATS unreachable or electing a
    /// leader, an object that was listed but is briefly missing, device memory
    /// that other work holds).
    Later,
    /// At once, elsewhere: this process cannot do the work but another can
    /// right away (the inference thread stopped, the process is shutting
    /// down). Waiting helps nothing.
    Now,
    /// Never: the task, the flags, the model or the data are wrong (a usage
    /// error, a location that cannot be parsed, bad JSON, an unsupported
    /// format, a Parquet or Arrow encoding failure, refused credentials).
    /// Every try fails the same way, so trying again only delays the report.
    Never,
}

impl RetryHint {
    /// Whether another try can succeed at all.
    pub fn is_retryable(self) -> bool {
        self != RetryHint::Never
    }

    /// The name logs and job state use.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryHint::Later => "later",
            RetryHint::Now => "now",
            RetryHint::Never => "never",
        }
    }
}

impl std::fmt::Display for RetryHint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error that knows whether the work that failed can be tried again.
pub trait Retry {
    /// When trying again can succeed.
    fn retry_hint(&self) -> RetryHint;
}

impl Retry for Error {
    fn retry_hint(&self) -> RetryHint {
        match self {
            // Nothing about the flags or the task changes between tries.
            Error::Location { .. } | Error::Usage(_) => RetryHint::Never,
            Error::Store(e) => e.retry_hint(),
            // The model directory and the runtime library are the worker's
            // set-up: every task on this worker fails the same way.
            Error::ModelFile { .. } | Error::ModelInvalid { .. } | Error::OrtLibrary(_) => {
                RetryHint::Never
            }
            // An ORT run failure other than out-of-memory is far more often the
            // device or its driver (a lost context, an illegal address after a
            // neighbour's fault) than the batch: the tasks name the model's
            // fingerprint, so every worker runs the same graph on the same
            // shapes. Retried later, bounded by max_deliver, it lands on a
            // healthy worker instead of being failed for good by a sick one.
            Error::Ort { .. } | Error::Device { .. } => RetryHint::Later,
            Error::OutOfMemory { .. } => RetryHint::Later,
            Error::EngineGone(_) => RetryHint::Now,
            // The store's own hint: a missing object or a failure that
            // outlasted the store's retries is Later, refused credentials
            // Never (the task is failed at once, and `submit --retry-failed`
            // runs it again once access is fixed).
            Error::InputUnavailable { source, .. } => {
                hint_in_chain(&**source).unwrap_or(RetryHint::Later)
            }
            Error::Tokenizer(_) | Error::Arrow(_) | Error::Json(_) | Error::Input { .. } => {
                RetryHint::Never
            }
            // Encoding is deterministic; only a store error inside (the async
            // reader over object_store) can pass.
            Error::Parquet(e) => hint_in_chain(e).unwrap_or(RetryHint::Never),
            Error::Io(e) => io_hint(e),
        }
    }
}

impl Retry for object_store::Error {
    fn retry_hint(&self) -> RetryHint {
        use object_store::Error as E;
        match self {
            // HTTP 5xx, timeouts and broken connections, after the store's own
            // retries: the store may be back later.
            E::Generic { .. } => RetryHint::Later,
            // Every object a task reads was listed when the job was planned;
            // one missing now is being replaced, or not yet visible everywhere.
            E::NotFound { .. } => RetryHint::Later,
            // The runtime cancelled the store's blocking task: it is shutting
            // down, another worker can take over at once. A panic is not the
            // data's fault either, and tries stay bounded by max_deliver.
            E::JoinError { source } if source.is_cancelled() => RetryHint::Now,
            E::JoinError { .. } => RetryHint::Later,
            // Conditional writes answer these deterministically: the object is
            // there (or changed) and will still be on the next try; our own
            // create-once commit handles the expected case before it gets here.
            E::Precondition { .. } | E::AlreadyExists { .. } | E::NotModified { .. } => {
                RetryHint::Never
            }
            // What the store can do and how it is configured does not change
            // between tries.
            E::NotImplemented { .. }
            | E::NotSupported { .. }
            | E::InvalidPath { .. }
            | E::UnknownConfigurationKey { .. } => RetryHint::Never,
            // Credentials and policies change only by an operator's hand;
            // redelivering burns the tries and hides the cause.
            E::Unauthenticated { .. } | E::PermissionDenied { .. } => RetryHint::Never,
            // A variant newer than this code: keep retrying, bounded by
            // max_deliver, as every store failure did before hints.
            _ => RetryHint::Later,
        }
    }
}

impl Retry for QueueError {
    fn retry_hint(&self) -> RetryHint {
        use async_nats::ConnectErrorKind as K;
        match self {
            QueueError::Connect { source, cause, .. } => {
                let refused = [
                    ConnectionProblem::Authorization.reason(),
                    ConnectionProblem::Tls.reason(),
                ]
                .contains(cause);
                match source.kind() {
                    K::ServerParse | K::Authentication | K::AuthorizationViolation | K::Tls => {
                        RetryHint::Never
                    }
                    _ if refused => RetryHint::Never,
                    // Unreachable, timed out, DNS: the server may come back.
                    _ => RetryHint::Later,
                }
            }
            // An operator must upgrade the server.
            QueueError::OldServer { .. } => RetryHint::Never,
            QueueError::Stream { source, .. } => {
                use async_nats::jetstream::context::CreateStreamErrorKind as S;
                match source.kind() {
                    S::EmptyStreamName | S::InvalidStreamName | S::DomainAndExternalSet => {
                        RetryHint::Never
                    }
                    _ => RetryHint::Later,
                }
            }
            QueueError::Consumer { source, .. } => {
                use async_nats::jetstream::stream::ConsumerErrorKind as C;
                match source.kind() {
                    C::InvalidName | C::InvalidConsumerType => RetryHint::Never,
                    _ => RetryHint::Later,
                }
            }
            QueueError::Publish { source, .. } => {
                use async_nats::jetstream::context::PublishErrorKind as P;
                match source.kind() {
                    // The same message is as large on every try.
                    P::MaxPayloadExceeded => RetryHint::Never,
                    _ => RetryHint::Later,
                }
            }
            // The bucket unreachable, a leader election, a stalled read.
            QueueError::State { .. } => RetryHint::Later,
            QueueError::Option { .. } | QueueError::Json { .. } => RetryHint::Never,
        }
    }
}

/// An I/O error's hint: a store error inside decides; otherwise its kind.
fn io_hint(e: &std::io::Error) -> RetryHint {
    use std::io::ErrorKind as K;
    if let Some(h) = hint_in_chain(e) {
        return h;
    }
    match e.kind() {
        // The file or its content is wrong, or this process may not read it.
        K::NotFound
        | K::PermissionDenied
        | K::InvalidInput
        | K::InvalidData
        | K::UnexpectedEof
        | K::Unsupported => RetryHint::Never,
        // Connections, timeouts, a full disk, memory: outside the work.
        _ => RetryHint::Later,
    }
}

/// The hint of the first error in `err`'s source chain that has one (a store
/// or queue error, or ours wrapping one), or `None` when the chain holds only
/// errors that say nothing about retrying (decoders, parsers).
///
/// `io::Error::other` hides the error it wraps from `source()` (it returns
/// the inner error's source), so the wrapped error is looked at too.
pub fn hint_in_chain(err: &(dyn StdError + 'static)) -> Option<RetryHint> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(s) = e.downcast_ref::<object_store::Error>() {
            return Some(s.retry_hint());
        }
        if let Some(q) = e.downcast_ref::<QueueError>() {
            return Some(q.retry_hint());
        }
        if let Some(ours) = e.downcast_ref::<Error>() {
            // Only our variants that wrap another error defer to the chain;
            // the others (an input's content, a decoder) say nothing here.
            match ours {
                Error::Store(s) => return Some(s.retry_hint()),
                Error::InputUnavailable { .. } | Error::OutOfMemory { .. } => {
                    return Some(ours.retry_hint())
                }
                _ => {}
            }
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(h) = hint_in_chain(inner) {
                return Some(h);
            }
        }
        cur = e.source();
    }
    None
}

/// Tries `attempt` until it succeeds, `retryable` refuses its error,
/// `patience` would run out before the next try, or `abandon` is cancelled
/// (then the last error is returned). Between tries it waits 250 ms,
/// doubling up to 4 s, and says so at info level with `what` (a JetStream
/// leader election on a cluster takes seconds, so the first waits are short).
pub async fn with_patience<T, E, Fut>(
    patience: std::time::Duration,
    abandon: &tokio_util::sync::CancellationToken,
    what: &str,
    retryable: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> Fut,
) -> Result<T, E>
where
    E: StdError + 'static,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    use std::time::Duration;
    let started = tokio::time::Instant::now();
    let mut delay = Duration::from_millis(250);
    loop {
        let e = match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if !retryable(&e) || started.elapsed() + delay > patience {
            return Err(e);
        }
        tracing::info!(error = %crate::error::chain(&e), retry_in_s = delay.as_secs_f64(), "{what}; trying again");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = abandon.cancelled() => return Err(e),
        }
        delay = (delay * 2).min(Duration::from_secs(4));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsembed_schemas::chip::ErrorStage;

    fn boxed(msg: &str) -> Box<dyn StdError + Send + Sync> {
        msg.into()
    }

    fn device(message: &str) -> Error {
        Error::Device {
            context: "vision run of 8 images".into(),
            message: message.into(),
        }
    }

    fn generic() -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: boxed("Server returned non-2xx status code: 503 Service Unavailable"),
        }
    }

    fn not_found() -> object_store::Error {
        object_store::Error::NotFound {
            path: "in/img_002.png".into(),
            source: boxed("No such file or directory"),
        }
    }

    fn ort_error(message: &str) -> ort::Error {
        ort::Error::new(message)
    }

    /// Every variant of the worker's `Error`, with the hint it must give.
    /// A new variant fails to compile in `Retry for Error` and is added here.
    fn worker_errors() -> Vec<(Error, RetryHint)> {
        use RetryHint::*;
        vec![
            (
                Error::Location {
                    url: "s4://x".into(),
                    reason: "unknown scheme".into(),
                },
                Never,
            ),
            (Error::Store(generic()), Later),
            (Error::Store(not_found()), Later),
            (
                Error::Store(object_store::Error::PermissionDenied {
                    path: "out/chips".into(),
                    source: boxed("403 Forbidden"),
                }),
                Never,
            ),
            (
                Error::ModelFile {
                    path: "model/vision.onnx".into(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                },
                Never,
            ),
            (
                Error::ModelInvalid {
                    path: "model/config.json".into(),
                    reason: "no image_size".into(),
                },
                Never,
            ),
            (
                Error::OrtLibrary("libonnxruntime.so not found".into()),
                Never,
            ),
            (
                Error::ort(
                    "vision run",
                    ort_error("CUDA failure 2: out of memory ; GPU=0"),
                ),
                Later,
            ),
            (
                Error::ort(
                    "vision run",
                    ort_error("CUDA failure 700: an illegal memory access was encountered"),
                ),
                Later,
            ),
            (
                device("Failed to allocate memory for requested buffer"),
                Later,
            ),
            (device("shape mismatch"), Later),
            (
                Error::OutOfMemory {
                    source: Box::new(device("Failed to allocate memory")),
                },
                Later,
            ),
            (Error::EngineGone("the inference thread exited".into()), Now),
            (
                Error::Usage("--batch-size must be at least 1".into()),
                Never,
            ),
            (
                Error::InputUnavailable {
                    uri: "s3://data/in/img_002.png".into(),
                    source: Box::new(Error::Store(generic())),
                },
                Later,
            ),
            (Error::Tokenizer("no vocabulary".into()), Never),
            (
                Error::Parquet(parquet::errors::ParquetError::General(
                    "cannot encode".into(),
                )),
                Never,
            ),
            (
                Error::Parquet(parquet::errors::ParquetError::External(Box::new(generic()))),
                Later,
            ),
            (
                Error::Arrow(arrow_schema::ArrowError::InvalidArgumentError(
                    "lengths differ".into(),
                )),
                Never,
            ),
            (
                Error::Input {
                    uri: "file:///in/a.png".into(),
                    stage: ErrorStage::Decode,
                    message: "not a PNG".into(),
                },
                Never,
            ),
            (
                Error::Io(std::io::Error::from(std::io::ErrorKind::TimedOut)),
                Later,
            ),
            (
                Error::Io(std::io::Error::from(std::io::ErrorKind::InvalidData)),
                Never,
            ),
            // A store error behind io::Error::other decides, not the kind.
            (Error::Io(std::io::Error::other(not_found())), Later),
            (
                Error::Json(serde_json::from_str::<u8>("{").unwrap_err()),
                Never,
            ),
        ]
    }

    #[test]
    fn every_worker_error_kind_has_its_hint() {
        for (e, want) in worker_errors() {
            assert_eq!(e.retry_hint(), want, "{e:?}");
        }
    }

    #[test]
    fn object_store_errors_by_variant() {
        use object_store::Error as E;
        use RetryHint::*;
        let path = || "out/chips/t1.parquet".to_owned();
        let cases: Vec<(E, RetryHint)> = vec![
            (generic(), Later),
            (not_found(), Later),
            (
                E::InvalidPath {
                    source: object_store::path::Path::parse("a//b").unwrap_err(),
                },
                Never,
            ),
            (
                E::NotSupported {
                    source: boxed("copy_if_not_exists"),
                },
                Never,
            ),
            (
                E::AlreadyExists {
                    path: path(),
                    source: boxed("exists"),
                },
                Never,
            ),
            (
                E::Precondition {
                    path: path(),
                    source: boxed("412"),
                },
                Never,
            ),
            (
                E::NotModified {
                    path: path(),
                    source: boxed("304"),
                },
                Never,
            ),
            (
                E::NotImplemented {
                    operation: "put_opts with mode Create".into(),
                    implementer: "HttpStore".into(),
                },
                Never,
            ),
            (
                E::PermissionDenied {
                    path: path(),
                    source: boxed("403"),
                },
                Never,
            ),
            (
                E::Unauthenticated {
                    path: path(),
                    source: boxed("401"),
                },
                Never,
            ),
            (
                E::UnknownConfigurationKey {
                    store: "S3",
                    key: "aws_regio".into(),
                },
                Never,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(e.retry_hint(), want, "{e:?}");
        }
    }

    #[tokio::test]
    async fn a_cancelled_store_task_is_retried_now_and_a_panicked_one_later() {
        let cancelled = tokio::spawn(std::future::pending::<()>());
        cancelled.abort();
        let e = object_store::Error::JoinError {
            source: cancelled.await.unwrap_err(),
        };
        assert_eq!(e.retry_hint(), RetryHint::Now);
        let panicked = tokio::spawn(async { panic!("store task") });
        let e = object_store::Error::JoinError {
            source: panicked.await.unwrap_err(),
        };
        assert_eq!(e.retry_hint(), RetryHint::Later);
    }

    #[test]
    fn every_queue_error_kind_has_its_hint() {
        use async_nats::jetstream::context::{
            CreateStreamError, CreateStreamErrorKind, PublishError, PublishErrorKind,
        };
        use async_nats::jetstream::stream::{ConsumerError, ConsumerErrorKind};
        use async_nats::{ConnectError, ConnectErrorKind};
        use RetryHint::*;
        let connect = |kind, cause: &'static str| QueueError::Connect {
            url: "nats://localhost:4222".into(),
            cause,
            source: ConnectError::new(kind),
        };
        let unreachable = ConnectionProblem::Unknown.reason();
        let cases: Vec<(QueueError, RetryHint)> = vec![
            (connect(ConnectErrorKind::Io, unreachable), Later),
            (connect(ConnectErrorKind::TimedOut, "timed out"), Later),
            (connect(ConnectErrorKind::Dns, unreachable), Later),
            (
                connect(
                    ConnectErrorKind::AuthorizationViolation,
                    ConnectionProblem::Authorization.reason(),
                ),
                Never,
            ),
            (
                connect(ConnectErrorKind::Tls, ConnectionProblem::Tls.reason()),
                Never,
            ),
            // A TLS failure the client reports as I/O, diagnosed from its source.
            (
                connect(ConnectErrorKind::Io, ConnectionProblem::Tls.reason()),
                Never,
            ),
            (
                QueueError::OldServer {
                    url: "nats://localhost:4222".into(),
                    version: "2.9.0".into(),
                },
                Never,
            ),
            (
                QueueError::Stream {
                    stream: "RSEMBED_TASKS".into(),
                    source: CreateStreamError::new(CreateStreamErrorKind::TimedOut),
                },
                Later,
            ),
            (
                QueueError::Stream {
                    stream: "RSEMBED.TASKS".into(),
                    source: CreateStreamError::new(CreateStreamErrorKind::InvalidStreamName),
                },
                Never,
            ),
            (
                QueueError::Consumer {
                    stream: "RSEMBED_TASKS".into(),
                    consumer: "rsembed-workers".into(),
                    source: ConsumerError::new(ConsumerErrorKind::Request),
                },
                Later,
            ),
            (
                QueueError::Consumer {
                    stream: "RSEMBED_TASKS".into(),
                    consumer: "a.b".into(),
                    source: ConsumerError::new(ConsumerErrorKind::InvalidName),
                },
                Never,
            ),
            (
                QueueError::Publish {
                    task_id: "t1".into(),
                    source: PublishError::new(PublishErrorKind::TimedOut),
                },
                Later,
            ),
            (
                QueueError::Publish {
                    task_id: "t1".into(),
                    source: PublishError::new(PublishErrorKind::MaxPayloadExceeded),
                },
                Never,
            ),
            (
                QueueError::State {
                    bucket: "RSEMBED_STATE".into(),
                    message: "put done: timed out".into(),
                },
                Later,
            ),
            (
                QueueError::Option {
                    option: "--nats-creds",
                    message: "cannot read /x.creds".into(),
                },
                Never,
            ),
            (
                QueueError::Json {
                    task_id: "t1".into(),
                    source: serde_json::from_str::<u8>("x").unwrap_err(),
                },
                Never,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(e.retry_hint(), want, "{e:?}");
        }
    }

    #[test]
    fn an_input_is_unavailable_only_when_a_store_error_is_in_its_chain() {
        // How the TIFF range reader reports a failed read: the store error
        // behind io::Error::other, inside the reader's own error.
        #[derive(Debug, thiserror::Error)]
        #[error("tiff: bytes 0..16")]
        struct Read(#[source] std::io::Error);
        let wrapped = Read(std::io::Error::other(generic()));
        assert_eq!(hint_in_chain(&wrapped), Some(RetryHint::Later));
        assert_eq!(
            hint_in_chain(&Error::Store(not_found())),
            Some(RetryHint::Later)
        );
        // Unreadable by us until access is fixed: still the store's fault,
        // never a row that calls the input bad, and not worth a retry.
        let denied = Error::Store(object_store::Error::PermissionDenied {
            path: "in/a.tif".into(),
            source: boxed("403"),
        });
        assert_eq!(hint_in_chain(&denied), Some(RetryHint::Never));
        let unavailable = Error::InputUnavailable {
            uri: "s3://data/in/a.tif".into(),
            source: Box::new(denied),
        };
        assert_eq!(unavailable.retry_hint(), RetryHint::Never);
        // Content errors never retry, even as I/O errors of a transient kind.
        let content = Error::Input {
            uri: "file:///in/a.png".into(),
            stage: ErrorStage::Decode,
            message: "Object at location x not found".into(),
        };
        assert_eq!(hint_in_chain(&content), None);
        let decode = std::io::Error::new(std::io::ErrorKind::TimedOut, "decoder");
        assert_eq!(hint_in_chain(&decode), None);
    }

    #[test]
    fn hints_read_as_their_names() {
        assert_eq!(RetryHint::Later.to_string(), "later");
        assert!(RetryHint::Now.is_retryable());
        assert!(!RetryHint::Never.is_retryable());
    }

    #[tokio::test]
    async fn patience_tries_again_only_while_the_error_allows() {
        use std::time::Duration;
        use tokio_util::sync::CancellationToken;
        let err = || std::io::Error::from(std::io::ErrorKind::TimedOut);
        let never = CancellationToken::new();
        let patience = Duration::from_secs(10);
        // Refused by `retryable`: one try.
        let mut tries = 0;
        let r: Result<(), _> = with_patience(
            patience,
            &never,
            "t",
            |_| false,
            || {
                tries += 1;
                std::future::ready(Err(err()))
            },
        )
        .await;
        assert!(r.is_err());
        assert_eq!(tries, 1);
        // Allowed: tried until it succeeds.
        let mut tries = 0;
        let r = with_patience(
            patience,
            &never,
            "t",
            |_| true,
            || {
                tries += 1;
                std::future::ready(if tries < 3 { Err(err()) } else { Ok(tries) })
            },
        )
        .await;
        assert_eq!(r.unwrap(), 3);
        // Abandoned: the wait ends with the last error.
        let stop = CancellationToken::new();
        stop.cancel();
        let mut tries = 0;
        let r: Result<(), _> = with_patience(
            patience,
            &stop,
            "t",
            |_| true,
            || {
                tries += 1;
                std::future::ready(Err(err()))
            },
        )
        .await;
        assert!(r.is_err());
        assert_eq!(tries, 1);
        // No patience: no second try.
        let mut tries = 0;
        let r: Result<(), _> = with_patience(
            Duration::ZERO,
            &never,
            "t",
            |_| true,
            || {
                tries += 1;
                std::future::ready(Err(err()))
            },
        )
        .await;
        assert!(r.is_err());
        assert_eq!(tries, 1);
    }
}
