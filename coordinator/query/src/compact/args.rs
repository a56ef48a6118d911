//! `rsembed compact`'s flags, as the command line gives them.

use std::path::PathBuf;

use clap::Args;
use rsembed_schemas::embedding::EmbeddingType;
use rsembed_schemas::units::parse_byte_size;

/// `rsembed compact`.
#[derive(Debug, Clone, Args)]
pub struct CompactArgs {
    /// A finished job's output (it must have `manifest.json`).
    #[arg(long, env = "RSEMBED_INDEX")]
    pub index: String,
    /// Where the compacted dataset goes: `chips/part-*.parquet`, `job.json`, `manifest.json`.
    #[arg(long, env = "RSEMBED_OUTPUT")]
    pub output: String,
    /// Target size of one output file, e.g. `256MB`, `1GiB`.
    #[arg(long, env = "RSEMBED_TARGET_SIZE", default_value = "256MB", value_parser = parse_byte_size)]
    pub target_size: u64,
    /// Local folder for the sort's spill files, which hold the whole dataset
    /// (uncompressed) for a while. Default: the system temp dir.
    #[arg(long, env = "RSEMBED_SPILL_DIR")]
    pub spill_dir: Option<PathBuf>,
    /// Replace a dataset already at `--output`: its manifest.json, job.json,
    /// chips/ and errors/ are deleted first (the manifest first). Default:
    /// refuse, so a typo cannot delete a job's output.
    #[arg(long, env = "RSEMBED_OVERWRITE")]
    pub overwrite: bool,
    /// Rows per row group of the output files, the unit a `--bbox` filter
    /// skips. Default: 8192, as in job files; smaller groups prune a
    /// Hilbert-sorted file more finely, for more footer and more requests.
    #[arg(long, env = "RSEMBED_ROW_GROUP_ROWS", default_value_t = 8192, value_parser = clap::value_parser!(u32).range(1..))]
    pub row_group_rows: u32,
    /// Store the compacted embeddings as `f32`, `f16` or `int8` (see `rsembed
    /// run --help`). Default: as the source stores them. int8 from f32 or
    /// f16 quantises; the reverse only changes the type, not the precision.
    #[arg(long, env = "RSEMBED_EMBEDDING_TYPE")]
    pub embedding_type: Option<EmbeddingType>,
    /// An IVF layout of N lists (at most 65536): spherical k-means on a
    /// sample of the embeddings, every row's nearest list in a `list`
    /// column, files sorted by list then Hilbert key, no row group holding
    /// two lists, and `centroids.parquet`; `search --nprobe` then reads the
    /// nearest lists only. About √rows is usual (1000 for a million chips).
    /// Default: no lists.
    #[arg(long, env = "RSEMBED_LISTS", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub lists: Option<u32>,
    /// Rows k-means trains on, picked by a hash of the chip id (the same
    /// rows whatever the file order). Default: 64 per list, at most the
    /// dataset and at most 256 MiB of embeddings (87 381 rows at D = 768).
    #[arg(long, env = "RSEMBED_SAMPLE", requires = "lists", value_parser = clap::value_parser!(u64).range(1..))]
    pub sample: Option<u64>,
    /// Seed of the k-means initialisation: the same seed, flags and source
    /// give byte-identical files. Default: 0.
    #[arg(long, env = "RSEMBED_SEED", requires = "lists")]
    pub seed: Option<u64>,
    /// Print the summary as JSON.
    #[arg(long, env = "RSEMBED_JSON")]
    pub json: bool,
}
