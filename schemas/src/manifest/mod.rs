//! The manifest's lists: `manifest/files.parquet` and
//! `manifest/failures.parquet`, their Arrow schemas, a writer that streams
//! them row by row, and the one reader of a dataset's file list.
//!
//! A format 2 `manifest.json` ([`Manifest`]) keeps the job's totals and the
//! path, rows, bytes and sha256 of each list; the lists hold one row per
//! file and one row per failed or empty input. A format 1 manifest held the
//! same lists as JSON arrays: [`files`] and [`failures`] read both formats,
//! so no caller looks at `Manifest::files` itself.
//!
//! # `manifest/files.parquet`
//!
//! One row per file of the job, chip files and error files alike, in the
//! order the job's finalizer gave them (by task id: `finalize` and `run`
//! sort them, as format 1 did). See [`files_schema`] for the columns. The
//! file is GeoParquet 1.1: `footprint` is its primary geometry column, with
//! `bbox` as its covering, so that `SELECT path FROM
//! 'manifest/files.parquet' WHERE bbox.xmin < ...` finds the chip files of
//! a region without opening one.
//!
//! # `manifest/failures.parquet`
//!
//! One row per input, of three kinds (see [`failures_schema`]):
//! `failed_input` (an input recorded in an error file), `failed_task` (an
//! input of a task given up on) and `without_chips` (an input that gave
//! neither a chip nor an error row), so that `SELECT * FROM
//! 'manifest/failures.parquet' WHERE kind = 'failed_input'` reads as it says.
//!
//! # Bounds
//!
//! The writer holds at most [`BATCH_ROWS`] rows and one row group being
//! encoded ([`ROW_GROUP_ROWS`] rows at most), whatever the list's length.
//! The reader decodes [`BATCH_ROWS`] rows at a time, refuses a list whose
//! row groups declare more than [`MAX_ROW_GROUP_BYTES`] or a schema other
//! than the one written here, and bounds every value it turns into a Rust
//! type (paths, ids, footprints, sources).

use thiserror::Error;

pub use crate::job::{
    Manifest, ManifestFailedTask, ManifestFailure, ManifestFile, ManifestLists, MANIFEST_FORMAT,
};

mod failures;
mod files;
mod read;
pub mod wkb;
mod write;

pub use failures::{failures_schema, FailureKind, FailureRow};
pub use files::{files_schema, FileKind, ListedFile};
pub use read::{failures, files, parse_manifest};
pub use write::{extent_fits, FailuresWriter, FilesWriter, ListRow, ListWriter, Written};

/// The files list, relative to the output root.
pub const FILES_LIST: &str = "manifest/files.parquet";
/// The failures list, relative to the output root.
pub const FAILURES_LIST: &str = "manifest/failures.parquet";

/// Rows a writer buffers before it encodes them, and a reader decodes at once.
pub const BATCH_ROWS: usize = 4096;
/// Rows per row group of a list: flushed to the sink as each fills.
pub const ROW_GROUP_ROWS: usize = 64 * 1024;
/// The most bytes one row group of a list may declare, compressed or not:
/// a reader fetches a row group's column chunks whole.
pub const MAX_ROW_GROUP_BYTES: u64 = 256 << 20;
/// The longest path, task id, input URI or item id a list may hold, in
/// bytes. A writer refuses a longer one (no store or rsembed name comes
/// near it), so that what it writes reads back.
pub const MAX_NAME_BYTES: usize = 16 << 10;
/// The longest error message a failures list holds, in bytes: a writer
/// cuts a longer one there (at a character boundary).
pub const MAX_ERROR_BYTES: usize = 64 << 10;

/// What went wrong writing or reading a list.
#[derive(Debug, Error)]
pub enum ListError {
    /// The Parquet writer or reader failed (the store included).
    #[error(transparent)]
    Parquet(#[from] parquet::errors::ParquetError),
    /// Arrow refused a batch.
    #[error(transparent)]
    Arrow(#[from] arrow_schema::ArrowError),
    /// `manifest.json` does not parse.
    #[error("manifest.json: {0}")]
    Json(#[from] serde_json::Error),
    /// A list or manifest that is not what rsembed writes.
    #[error("{what}: {problem}")]
    Invalid {
        /// The list or manifest.
        what: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl ListError {
    pub(crate) fn invalid(what: impl Into<String>, problem: impl Into<String>) -> ListError {
        ListError::Invalid {
            what: what.into(),
            problem: problem.into(),
        }
    }
}

/// `Result` of the lists.
pub type Result<T, E = ListError> = std::result::Result<T, E>;

/// Checks a relative path read from a list: not empty, not absolute, no `.`
/// or `..` segment, at most [`MAX_NAME_BYTES`]. A path is joined to the
/// output root, and a hostile list must not name a file outside it.
pub fn check_relative_path(path: &str) -> Result<(), String> {
    if path.is_empty() || path.len() > MAX_NAME_BYTES {
        return Err(format!(
            "a path of {} bytes (1 to {MAX_NAME_BYTES})",
            path.len()
        ));
    }
    if path.starts_with('/') || path.contains('\\') || path.contains("://") {
        return Err(format!("{path:?} is not relative to the output"));
    }
    if path
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(format!("{path:?} has an empty, `.` or `..` segment"));
    }
    Ok(())
}

/// The task id of a task file's path: `chips/<task_id>.parquet` or
/// `errors/<task_id>.parquet` (and `chips/part-NNNNN.parquet` of a
/// compacted dataset): its file name less `.parquet`.
pub fn task_id_of(path: &str) -> &str {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.strip_suffix(".parquet").unwrap_or(name)
}

#[cfg(test)]
mod tests;
