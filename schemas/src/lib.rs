//! The contracts of rsembed, as Rust types.
//!
//! Everything that crosses a process or storage boundary is defined here: the
//! model directory's `rsembed-model.json`, task messages, the Arrow schema of
//! chip and error rows, the GeoParquet and `rsembed` file metadata, the job spec
//! (`job.json`) and the manifest (`manifest.json`). See `shared/DESIGN.md`; the
//! types here must keep those contracts exactly. No tokio and no ONNX Runtime.
#![warn(missing_docs)]

pub mod align;
pub mod chip;
#[cfg(feature = "arrow")]
pub mod chip_file;
pub mod datetime;
pub mod embedding;
pub mod extent;
pub mod ids;
pub mod job;
pub mod majortom;
#[cfg(feature = "arrow")]
pub mod manifest;
pub mod meta;
pub mod model;
pub mod queue;
pub mod task;
pub mod units;
pub mod window;

/// Version of the chip row schema of new jobs, written into every file's
/// `rsembed` metadata. A job keeps the version it started with
/// ([`job::TilingSpec::schema_version`]): a job of version 2 resumed by this
/// version still writes version 2 files.
///
/// 2 appended the STAC columns (`item_id`, `collection`, `datetime`,
/// `cloud_fraction`, `end_datetime`) to the 14 of version 1; 3 appended
/// `cell`, `grid_cell`, `window_start`, `window_end` and `scenes`.
pub const SCHEMA_VERSION: u32 = 3;

/// The schema version of jobs whose `job.json` records none: those written
/// before version 3 existed.
pub const SCHEMA_VERSION_UNRECORDED: u32 = 2;

/// The software version recorded in job specs and file metadata.
pub const SOFTWARE_VERSION: &str = concat!("rsembed ", env!("CARGO_PKG_VERSION"));
