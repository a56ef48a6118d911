//! The worker's error type.

use std::path::PathBuf;

use rsembed_schemas::chip::ErrorStage;

/// Errors of the worker library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A URL or path that cannot name a store location.
    #[error("invalid location `{url}`: {reason}")]
    Location {
        /// What was given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// An object store operation failed.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// A file of the model directory is missing or unreadable.
    #[error("model directory: cannot read `{}`", path.display())]
    ModelFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A model directory file that is present but says something wrong.
    #[error("model directory: `{}`: {reason}", path.display())]
    ModelInvalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The ONNX Runtime shared library could not be found or loaded.
    #[error("{0}")]
    OrtLibrary(String),
    /// ONNX Runtime refused an operation.
    #[error("onnx runtime: {context}")]
    Ort {
        /// What was being done.
        context: String,
        /// ORT's own reason.
        #[source]
        source: ort::Error,
    },
    /// The inference thread has gone away.
    #[error("inference engine stopped: {0}")]
    EngineGone(String),
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Writing Parquet failed.
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// Building Arrow arrays failed.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// One input failed; recorded in `errors/`, never fatal for the task.
    #[error("{uri}: {stage:?}: {message}")]
    Input {
        /// The input.
        uri: String,
        /// Where it failed.
        stage: ErrorStage,
        /// Why, with the source chain flattened.
        message: String,
    },
    /// A local I/O error outside the model directory.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// JSON that does not parse.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    /// Wraps an ORT error with what was being done.
    pub fn ort(context: impl Into<String>, source: impl Into<ort::Error>) -> Error {
        Error::Ort {
            context: context.into(),
            source: source.into(),
        }
    }
}

/// The worker's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Formats an error with its whole source chain, as `a: b: c`.
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let msg = e.to_string();
        if !s.contains(&msg) {
            s.push_str(": ");
            s.push_str(&msg);
        }
        cur = e.source();
    }
    s
}
