//! JPEG decoder whose output is bit-identical to libjpeg-turbo's default
//! decode: `JDCT_ISLOW` integer IDCT, fancy upsampling, libjpeg's YCbCr→RGB
//! tables. Supports baseline, extended-sequential and progressive Huffman
//! coding with 8-bit samples, 1 or 3 components, integral sampling ratios,
//! restart intervals and TIFF-style abbreviated streams (`tables`).
//!
//! Policies that differ from libjpeg, which warns and carries on:
//! any entropy-coding error, truncated scan, wrong restart marker, garbage
//! between segments or extraneous bytes inside scan data is an error. A
//! sequential stream whose scans are complete may lack EOI; a progressive
//! one may not, since missing scans cannot be detected otherwise.
//!
//! Exactness is against libjpeg-turbo's C code. Its x86 SIMD IDCT agrees on
//! all data a real encoder produces but saturates where the C code's
//! range-limit table wraps (dequantized coefficients several times beyond
//! the 8-bit range), so crafted extreme files can differ from Pillow/GDAL.

mod color;
mod decoder;
mod error;
mod huffman;
mod idct;
mod markers;
mod progressive;
mod scan;
mod sequential;
mod state;
mod upsample;

pub use decoder::{decode, ColorTransform, Image};
pub use error::Error;
pub use markers::read_header;
pub use state::{Header, Limits};

#[cfg(test)]
mod tests;
