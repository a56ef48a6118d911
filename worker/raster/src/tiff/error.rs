//! The single error type of the TIFF reader.

use std::error::Error as StdError;

/// Everything that can go wrong while opening a TIFF or reading a window.
///
/// Hostile or damaged input always ends up here, never in a panic.
#[derive(Debug, thiserror::Error)]
pub enum TiffError {
    /// The underlying range read failed.
    #[error("I/O error reading bytes {start}..{end}")]
    Io {
        /// First byte requested.
        start: u64,
        /// One past the last byte requested.
        end: u64,
        /// The reader's error.
        #[source]
        source: std::io::Error,
    },
    /// A structure or block lies (partly) past the end of the object.
    #[error("truncated file: bytes {start}..{end} requested from a {size}-byte object")]
    Truncated {
        /// First byte requested.
        start: u64,
        /// One past the last byte requested.
        end: u64,
        /// Object size.
        size: u64,
    },
    /// The byte-order mark or magic number is wrong.
    #[error("not a TIFF file: {0}")]
    NotTiff(String),
    /// The file is structurally invalid (bad tag, inconsistent layout, IFD loop, ...).
    #[error("malformed TIFF: {0}")]
    Malformed(String),
    /// A claimed size exceeds one of the [`super::TiffLimits`].
    #[error("limit exceeded: {what} is {value}, limit {limit}")]
    Limit {
        /// Which quantity.
        what: &'static str,
        /// The value the file (or request) asked for.
        value: u64,
        /// The configured limit.
        limit: u64,
    },
    /// The compression scheme is not implemented; `name` names the encoding.
    #[error("unsupported compression {code} ({name})")]
    UnsupportedCompression {
        /// TIFF Compression tag value.
        code: u16,
        /// Human-readable name of the encoding.
        name: &'static str,
    },
    /// The sample layout is not one of [`super::SampleType`].
    #[error("unsupported sample type: {0}")]
    UnsupportedSampleType(String),
    /// A feature of the file that this reader does not implement.
    #[error("unsupported TIFF feature: {0}")]
    Unsupported(String),
    /// A codec failed on a block.
    #[error("{codec} decoding failed for block {block}")]
    Decode {
        /// Codec name.
        codec: &'static str,
        /// Block (tile/strip) index.
        block: usize,
        /// The codec's error.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
    /// A block decompressed to a different size than its layout requires.
    #[error("{codec} block {block}: expected {expected} decoded bytes, {detail}")]
    BlockSize {
        /// Codec name.
        codec: &'static str,
        /// Block (tile/strip) index.
        block: usize,
        /// Expected decoded size in bytes.
        expected: usize,
        /// What happened instead.
        detail: String,
    },
    /// The caller asked for something invalid (bad level, band, window).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

impl TiffError {
    pub(crate) fn malformed(msg: impl Into<String>) -> Self {
        TiffError::Malformed(msg.into())
    }

    pub(crate) fn limit(what: &'static str, value: u64, limit: u64) -> Result<(), Self> {
        if value > limit {
            Err(TiffError::Limit { what, value, limit })
        } else {
            Ok(())
        }
    }
}
