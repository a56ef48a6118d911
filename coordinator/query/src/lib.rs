//! rsembed's query side: reading a finished dataset back.
//!
//! In layers, each importing only those below it:
//! - [`io`]: a dataset's bytes, from any store, and the column chunks a
//!   resident search keeps;
//! - [`format`](mod@format): the chip files as read: footers, statistics, the
//!   `embedding` column's pages read in place;
//! - [`kernels`]: dot products over stored embedding values, the nearest
//!   centroid of a row, and the best `k` hits;
//! - [`scan`]: row groups read in parallel, each folded into an
//!   accumulator, under the filters of a search;
//! - [`ivf`]: the IVF layout: k-means, `centroids.parquet`, and the lists a
//!   search probes;
//! - the commands on top: [`search`] (and its [`search::html`] page), [`classify`],
//!   [`compact`] and [`change`], each with its flags; what they need of a model
//!   ([`text`]) and of the imagery (the page's [`search::html::ChipImages`]) is
//!   lent by the caller as traits, so the crate runs no inference and
//!   reads no rasters;
//! - [`Error`]: what failed, naming the file or flag.

pub mod change;
pub mod classify;
pub mod compact;
mod error;
pub mod format;
pub mod io;
pub mod ivf;
pub mod kernels;
pub mod scan;
pub mod search;
pub mod text;

pub use error::{BoxError, Error};

/// The target of the query side's log events: the coordinator's, under
/// which they have always been filtered (`RSEMBED_LOG=rsembed_coordinator=debug`).
const LOG: &str = "rsembed_coordinator::query";

/// The query side's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
