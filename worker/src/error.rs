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
    /// A backend that is not ONNX Runtime (the simulated device of tests and
    /// benchmarks) failed; `message` is worded as ONNX Runtime words the same
    /// failure, so [`is_out_of_memory`] classifies both alike.
    #[error("device: {context}: {message}")]
    Device {
        /// What was being done.
        context: String,
        /// The device's own reason.
        message: String,
    },
    /// Even a batch of one image ran out of device memory. The request fails,
    /// the engine stays up and usable; retrying later (when memory has been
    /// freed, or on another worker) can succeed, so this error is retryable.
    #[error("out of device memory even for a batch of 1 image (retryable)")]
    OutOfMemory {
        /// The backend's out-of-memory error for the one-image run.
        #[source]
        source: Box<Error>,
    },
    /// The inference thread has gone away.
    #[error("inference engine stopped: {0}")]
    EngineGone(String),
    /// A flag or setting that cannot be used.
    #[error("{0}")]
    Usage(String),
    /// An input could not be read from its store (missing, the store failed
    /// after its own retries, or it refused our credentials): not a fault of
    /// its content, so the task fails, with the store error's retry hint,
    /// rather than recording a "bad input" row.
    #[error("input {uri} cannot be read now")]
    InputUnavailable {
        /// The input.
        uri: String,
        /// The read's error, with the store error in its chain.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
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

/// Texts by which ONNX Runtime reports an allocation failure. No error code
/// distinguishes it (it is `ORT_RUNTIME_EXCEPTION` or `ORT_FAIL`, like any
/// failing kernel), so the message is all there is:
/// - `Failed to allocate memory for requested buffer of size N`: the BFC arena
///   (CPU and CUDA) could not extend;
/// - `Available memory of N is smaller than requested bytes of M`: the arena
///   reached its `max_mem` / `gpu_mem_limit`;
/// - `out of memory`: CUDA's `cudaErrorMemoryAllocation` text
///   (`CUDA failure 2: out of memory`);
/// - `CUBLAS_STATUS_ALLOC_FAILED`: cuBLAS could not get its workspace;
/// - `std::bad_alloc`: a host allocation outside any arena (the CPU provider
///   with its arena disabled), which ORT reports by the exception's text.
pub(crate) const OUT_OF_MEMORY_TEXTS: [&str; 5] = [
    "Failed to allocate memory",
    "Available memory of",
    "out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "std::bad_alloc",
];

/// Whether `err` is a device (or host arena) out-of-memory failure, by the
/// text of ONNX Runtime's own message. Only the backend's message is read
/// ([`Error::Ort`]'s source, [`Error::Device`]'s message), never our context
/// string or input errors, so a file named `out of memory.png` is not an OOM.
pub fn is_out_of_memory(err: &Error) -> bool {
    let text = match err {
        Error::Ort { source, .. } => source.message(),
        Error::Device { message, .. } => message.as_str(),
        Error::OutOfMemory { .. } => return true,
        _ => return false,
    };
    OUT_OF_MEMORY_TEXTS.iter().any(|t| text.contains(t))
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

impl From<rsembed_store::Error> for Error {
    fn from(e: rsembed_store::Error) -> Error {
        match e {
            rsembed_store::Error::Location { url, reason } => Error::Location { url, reason },
            rsembed_store::Error::Store(e) => Error::Store(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::{Retry, RetryHint};

    fn device(message: &str) -> Error {
        Error::Device {
            context: "vision run of 64 images".into(),
            message: message.into(),
        }
    }

    #[test]
    fn out_of_memory_is_recognised_by_ort_texts() {
        for m in [
            "Non-zero status code returned while running MatMul node. Name:'/m' Status Message: \
             /onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:359 void* \
             onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*) \
             Failed to allocate memory for requested buffer of size 67108864",
            "Available memory of 1048576 is smaller than requested bytes of 4194304",
            "CUDA failure 2: out of memory ; GPU=0 ; hostname=h ; file=cuda_allocator.cc ; line=47",
            "CUBLAS failure 3: CUBLAS_STATUS_ALLOC_FAILED ; GPU=0",
        ] {
            assert!(is_out_of_memory(&device(m)), "{m}");
        }
    }

    #[test]
    fn other_errors_are_not_out_of_memory() {
        assert!(!is_out_of_memory(&device(
            "Got invalid dimensions for input: pixel_values"
        )));
        // Our own context never counts, nor do input errors.
        let ctx = Error::Device {
            context: "out of memory".into(),
            message: "shape mismatch".into(),
        };
        assert!(!is_out_of_memory(&ctx));
        let input = Error::Input {
            uri: "file:///out of memory.png".into(),
            stage: ErrorStage::Decode,
            message: "Failed to allocate memory".into(),
        };
        assert!(!is_out_of_memory(&input));
    }

    #[test]
    fn one_image_out_of_memory_is_retryable_and_names_it() {
        let e = Error::OutOfMemory {
            source: Box::new(device("Failed to allocate memory for requested buffer")),
        };
        assert_eq!(e.retry_hint(), RetryHint::Later);
        assert!(is_out_of_memory(&e));
        let text = chain(&e);
        assert!(text.contains("retryable"), "{text}");
        assert!(text.contains("Failed to allocate memory"), "{text}");
        assert!(!is_out_of_memory(&device("x")));
    }
}
