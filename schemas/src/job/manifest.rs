//! `manifest.json`'s records: what a finished job (or a compaction) wrote,
//! named by `rsembed_schemas::job` as before.

use serde::{Deserialize, Serialize};

/// A file of the output: a chip or error file (a row of the manifest's
/// files list), or a list itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// Path relative to the output root.
    pub path: String,
    /// Rows in the file.
    pub rows: u64,
    /// Hex SHA-256 of the file.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
    /// What a chip file's rows cover, as the worker that wrote it recorded
    /// it. Absent for error files and in records of older versions (whose
    /// chip files are read when it is needed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extent: Option<crate::extent::FileExtent>,
}

/// An input recorded as failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFailure {
    /// The input.
    pub source_uri: String,
    /// Stage that failed.
    pub stage: String,
    /// Reason.
    pub error: String,
}

/// A task given up on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFailedTask {
    /// The task.
    pub task_id: String,
    /// Its inputs' URIs.
    pub inputs: Vec<String>,
    /// The last error a worker reported.
    pub error: String,
    /// Deliveries before it was given up.
    pub deliveries: u64,
}

/// The manifest format [`Manifest`]s are written in: 2 keeps totals in
/// `manifest.json` and the lists in Parquet ([`ManifestLists`]). Format 1
/// held the lists as JSON arrays (`files`, `error_files`, `failures`,
/// `failed_tasks`, `without_chips`), about 200 bytes a task.
pub const MANIFEST_FORMAT: u32 = 2;

/// `manifest.json`: written last, only when every task of the plan is done,
/// after the lists it names. Its size does not grow with the job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Manifest format: [`MANIFEST_FORMAT`], or 1 in outputs of older versions.
    pub format: u32,
    /// The job.
    pub job_id: String,
    /// The job fingerprint.
    pub fingerprint: String,
    /// Tasks in the plan; each has a chip file, unless it failed.
    pub tasks: u64,
    /// Chip rows over all files.
    pub rows: u64,
    /// Inputs recorded in `errors/`.
    pub failed_inputs: u64,
    /// Chip files: the rows of kind `chips` of the files list. Format 2; a
    /// format 1 manifest has its count once read through
    /// [`crate::manifest::parse_manifest`].
    #[serde(default)]
    pub chip_file_count: u64,
    /// Error files: the rows of kind `errors` of the files list (format 2).
    #[serde(default)]
    pub error_file_count: u64,
    /// Tasks given up on (distributed mode: dead-lettered); a manifest is
    /// written with failed tasks only by `finalize --allow-failed` (format 2).
    #[serde(default)]
    pub failed_task_count: u64,
    /// Inputs that gave neither a chip nor an error row (every chip without a
    /// valid pixel, or below `--min-valid`); blocks of split scenes aside.
    #[serde(default)]
    pub inputs_without_chips: u64,
    /// Format 2: `manifest/files.parquet` and `manifest/failures.parquet`,
    /// each with its rows, bytes and sha256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lists: Option<ManifestLists>,
    /// Format 1: the chip files. Read them, in either format, through
    /// [`crate::manifest::files`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<ManifestFile>,
    /// Format 1: the error files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub error_files: Vec<ManifestFile>,
    /// Format 1: the first 1000 failed inputs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<ManifestFailure>,
    /// Format 1: the tasks given up on, with their last error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_tasks: Vec<ManifestFailedTask>,
    /// Format 1: the first 1000 inputs without chips.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub without_chips: Vec<String>,
    /// RFC 3339 time the manifest was written.
    pub finalized_at: String,
    /// Software that wrote it.
    pub software_version: String,
}

/// Where a format 2 manifest's lists are, relative to the output root.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestLists {
    /// `manifest/files.parquet`: one row per chip or error file.
    pub files: ManifestFile,
    /// `manifest/failures.parquet`: one row per failed input, input of a
    /// failed task, or input without chips.
    pub failures: ManifestFile,
}

/// `centroids.parquet` of a dataset compacted with `rsembed compact --lists N`.
pub const CENTROIDS_FILE: &str = "centroids.parquet";

/// The IVF layout of a compacted dataset, recorded as `ivf` in its
/// `manifest.json`: every row's nearest list (by dot product with the list
/// centroids, which are unit vectors) is its `list` column, the files are
/// sorted by list and no row group holds two lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IvfLayout {
    /// `centroids.parquet`: `list` Int32, `centroid` FixedSizeList<Float32, D>,
    /// `rows` Int64, one row per list in list order; `rows` of the entry
    /// counts the lists.
    pub centroids: ManifestFile,
    /// Lists.
    pub lists: u32,
    /// Lists that got no row.
    pub empty_lists: u32,
    /// How rows and centroids are compared: `dot` (the embeddings are unit vectors).
    pub metric: String,
    /// The k-means seed.
    pub seed: u64,
    /// Rows the k-means ran on.
    pub sample: u64,
    /// Lloyd iterations run.
    pub iterations: u32,
}
