//! A decoded image and what decoding one may cost or fail of: what every
//! whole-image decoder (PNG, JPEG) and the scene reader hand back.

/// Bounds on what one image may make us allocate. Inputs are hostile: a 60-byte
/// PNG can claim to be 100 000 × 100 000 pixels.
#[derive(Debug, Clone, Copy)]
pub struct DecodeLimits {
    /// Largest width or height accepted.
    pub max_dimension: u32,
    /// Largest decoder allocation in bytes.
    pub max_alloc: u64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_dimension: 32_768,
            max_alloc: 1 << 30,
        }
    }
}

/// A decoded 8-bit RGB image, row-major, interleaved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb8 {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// `width * height * 3` bytes.
    pub data: Vec<u8>,
}

/// Why an image could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Zero bytes.
    #[error("empty file (0 bytes)")]
    Empty,
    /// Not a format we read.
    #[error("not a PNG, JPEG or TIFF image (unrecognized content)")]
    UnknownFormat,
    /// A format we recognize but do not read as a whole image.
    #[error("unsupported image format: {0}")]
    Unsupported(&'static str),
    /// The PNG decoder refused the file.
    #[error("PNG decode failed")]
    Png(#[source] ::png::DecodingError),
    /// A palette PNG without its `PLTE` chunk.
    #[error("PNG decode failed: palette image without a PLTE chunk")]
    PngPalette,
    /// A colour type and bit depth PNG does not allow.
    #[error("PNG decode failed: invalid layout {0}")]
    PngLayout(String),
    /// The JPEG decoder refused the file.
    #[error("JPEG decode failed: {0}")]
    Jpeg(String),
    /// The image would need more memory than the limit allows.
    #[error("{width}x{height} pixels is over the decode limit ({limit} bytes)")]
    TooLarge {
        /// Width from the header.
        width: usize,
        /// Height from the header.
        height: usize,
        /// The byte limit.
        limit: u64,
    },
    /// A side is longer than the limit allows.
    #[error("{width}x{height} pixels: a side is over the limit of {max}")]
    DimensionTooLarge {
        /// Width from the header.
        width: usize,
        /// Height from the header.
        height: usize,
        /// The largest side accepted.
        max: u32,
    },
}
