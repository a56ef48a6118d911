//! rsembed's query side: reading a finished dataset back.
//!
//! In layers, each importing only those below it:
//! - [`kernels`]: dot products over stored embedding values, the nearest
//!   centroid of a row, and the best `k` hits;
//! - [`Error`]: what failed, naming the file or flag.

mod error;
pub mod kernels;

pub use error::{BoxError, Error};
