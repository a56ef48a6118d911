use std::fmt;

/// Why a JPEG could not be decoded.
///
/// Every failure is reported; the decoder never substitutes grey samples for
/// damaged data the way libjpeg does after a warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The data ended before the image was complete.
    Truncated,
    /// The stream violates the JPEG syntax or is internally inconsistent.
    Corrupt(String),
    /// A valid JPEG feature this decoder does not implement.
    Unsupported(String),
    /// A header field asks for more than the caller's [`super::Limits`] allow.
    TooLarge {
        /// What was asked for (a dimension, an allocation).
        what: &'static str,
        /// The header's request.
        requested: u64,
        /// The caller's limit.
        limit: u64,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated => write!(f, "JPEG data is truncated"),
            Error::Corrupt(msg) => write!(f, "corrupt JPEG data: {msg}"),
            Error::Unsupported(what) => write!(f, "unsupported JPEG feature: {what}"),
            Error::TooLarge {
                what,
                requested,
                limit,
            } => write!(f, "JPEG {what} {requested} exceeds the limit of {limit}"),
        }
    }
}

impl std::error::Error for Error {}

pub(crate) fn corrupt(msg: impl Into<String>) -> Error {
    Error::Corrupt(msg.into())
}

pub(crate) fn coef_overflow() -> Error {
    corrupt("coefficient index past the end of a block")
}
