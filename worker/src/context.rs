//! What the readers of a task and the task around them share: the job's
//! context and the live counters. Below both `task` and `input`, so neither
//! imports the other for them.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use rsembed_raster::scale::ScaleSpec;
use rsembed_schemas::meta::FileMeta;

use crate::store::Location;

/// Live counters a progress display can read while tasks run.
#[derive(Debug, Default)]
pub struct Counters {
    /// Inputs finished, good or bad.
    pub inputs: AtomicU64,
    /// Chip rows produced.
    pub chips: AtomicU64,
    /// Inputs recorded as failed.
    pub failed: AtomicU64,
    /// Chips left out because their cloud fraction exceeds `--max-cloud`.
    pub cloudy_dropped: AtomicU64,
    /// Bytes read from storage (shared with range readers).
    pub bytes_read: Arc<AtomicU64>,
}

/// What one job's tasks share: where they go and how chips are cut and
/// recorded. Embedded mode has one; a pull worker makes one per job it serves.
#[derive(Clone)]
pub struct JobContext {
    /// The output root.
    pub output: Location,
    /// Parsed `--scale`.
    pub scale: ScaleSpec,
    /// Job id, model and tiling, as recorded in each file.
    pub file_meta: FileMeta,
}
