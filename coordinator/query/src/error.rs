//! The query side's errors: what failed, naming the file or flag, with the
//! cause kept as the source.

use std::path::PathBuf;

use arrow_schema::ArrowError;
use parquet::errors::ParquetError;

/// A cause of any kind (object store, Parquet, I/O) kept as a source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Errors of `search`, `classify`, `compact` and the index they read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Parquet file, or a row group of it, that cannot be read.
    #[error("input: {uri}: {source}")]
    Read {
        /// The file.
        uri: String,
        /// Why.
        #[source]
        source: ParquetError,
    },
    /// A file whose footer does not read as Parquet.
    #[error("input: {uri}: not a readable Parquet file: {source}")]
    NotParquet {
        /// The file.
        uri: String,
        /// Why.
        #[source]
        source: ParquetError,
    },
    /// Rows of a file that Arrow cannot conform to the chip schema.
    #[error("input: {uri}: {source}")]
    Rows {
        /// The file.
        uri: String,
        /// Why.
        #[source]
        source: ArrowError,
    },
    /// A column the query needs is not in the file.
    #[error("input: {uri}: no column `{column}` in this chip file")]
    MissingColumn {
        /// The file.
        uri: String,
        /// The column.
        column: String,
    },
    /// A column of another type than the chip schema's.
    #[error("input: {uri}: `{column}` is not {expected}")]
    ColumnType {
        /// The file.
        uri: String,
        /// The column (or struct field).
        column: String,
        /// The type it should have.
        expected: &'static str,
    },
    /// A `manifest.json` that does not parse.
    #[error("input: {uri}: not a manifest: {source}")]
    Manifest {
        /// The manifest.
        uri: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A dataset that is not one consistent index: files that disagree with
    /// its manifest or with each other, a chip twice, no chip files.
    #[error("input: {uri}: {problem}")]
    Dataset {
        /// The dataset or file.
        uri: String,
        /// What is wrong, and what to do.
        problem: String,
    },
    /// An output that cannot be written.
    #[error("output: cannot write {path}: {source}")]
    Write {
        /// The output.
        path: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// An output refused before any work (it exists, it is a folder).
    #[error("output: {path} {problem}")]
    OutputRefused {
        /// The output.
        path: String,
        /// Why, and what to do.
        problem: String,
    },
    /// What was written is not what was read: nothing is published.
    #[error("output: {path}: {problem}")]
    Incomplete {
        /// The output.
        path: String,
        /// What differs.
        problem: String,
    },
    /// The local spill folder cannot be used.
    #[error("output: spill folder {}: {source}", path.display())]
    Spill {
        /// The folder or spill file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A spill file that does not read back as it was written.
    #[error("output: spill {}: {problem}", path.display())]
    SpillCorrupt {
        /// The spill file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A spill frame that cannot be encoded or decoded.
    #[error("output: spill {}: {source}", path.display())]
    SpillFrame {
        /// The spill file.
        path: PathBuf,
        /// Why (Parquet or Arrow).
        #[source]
        source: BoxError,
    },
    /// An object store operation failed.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// A path or URL that names no location, or a store that cannot be built.
    #[error(transparent)]
    Location(#[from] rsembed_store::Error),
    /// `manifest.json` or a list of the manifest (`manifest/*.parquet`)
    /// that cannot be read.
    #[error("{url}: {source}")]
    ManifestList {
        /// The file.
        url: String,
        /// Why.
        #[source]
        source: rsembed_schemas::manifest::ListError,
    },
    /// A flag value that makes no sense.
    #[error("{flag} {problem}")]
    Flag {
        /// The flag, e.g. `--top`.
        flag: &'static str,
        /// What is wrong with its value, and what would do.
        problem: String,
    },
    /// A query vector that cannot be normalized.
    #[error("the query vector has zero or non-finite length")]
    ZeroVector,
    /// A `--vector` file that is not one JSON array of numbers.
    #[error("--vector {}: want one JSON array of numbers (as `rsembed text` prints): {source}", path.display())]
    VectorFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A file named by a flag that cannot be read or does not parse.
    #[error("{flag} {}: {source}", path.display())]
    FlagFile {
        /// The flag.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// A flag or combination of flags that makes no sense, as the user
    /// should read it.
    #[error("{0}")]
    Usage(String),
    /// The model's text graph failed (it is the caller's: see [`crate::text`]).
    #[error(transparent)]
    Text(BoxError),
    /// Writing the results (standard output, a page) failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// JSON that does not parse or cannot be written.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// Writing Parquet failed.
    #[error("parquet: {0}")]
    Parquet(#[from] ParquetError),
    /// A scan or compaction thread that panicked or was cancelled.
    #[error("{what} failed: {source}")]
    Task {
        /// Which.
        what: &'static str,
        /// Why.
        #[source]
        source: tokio::task::JoinError,
    },
}

impl Error {
    /// A missing column or a column of the wrong type, as a closure for `ok_or_else`.
    pub fn column(uri: &str, column: &str, expected: &'static str) -> Error {
        Error::ColumnType {
            uri: uri.to_owned(),
            column: column.to_owned(),
            expected,
        }
    }

    /// A dataset problem at `uri`.
    pub fn dataset(uri: impl ToString, problem: impl Into<String>) -> Error {
        Error::Dataset {
            uri: uri.to_string(),
            problem: problem.into(),
        }
    }

    /// A flag whose value makes no sense.
    pub fn flag(flag: &'static str, problem: impl Into<String>) -> Error {
        Error::Flag {
            flag,
            problem: problem.into(),
        }
    }
}
