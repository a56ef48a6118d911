//! `rsembed search`'s flags, as the command line gives them: the
//! coordinator's CLI flattens them beside its own (`--model` and how the
//! text graph runs).

use std::path::PathBuf;

use clap::Args;

use crate::ivf::{parse_nprobe, NProbe};
use crate::scan::filter::{parse_bbox, parse_datetime, parse_fraction};

/// `rsembed search`.
#[derive(Debug, Clone, Args)]
pub struct SearchArgs {
    /// The dataset: an output of `run`/`finalize` or of `compact` (a folder with
    /// `chips/`), its `chips/` folder, or one Parquet file.
    #[arg(long, env = "RSEMBED_INDEX")]
    pub index: String,
    /// Results to print (at least 1).
    #[arg(long, env = "RSEMBED_TOP_K", default_value_t = 10, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub top_k: usize,
    /// Only chips whose footprint's bbox intersects W,S,E,N (lon/lat degrees).
    #[arg(long, env = "RSEMBED_BBOX", value_parser = parse_bbox, allow_hyphen_values = true)]
    pub bbox: Option<[f64; 4]>,
    /// Only chips acquired in this RFC 3339 instant or interval
    /// (`2024-06-01T00:00:00Z/2024-08-31T23:59:59Z`, open ends as `..`; dates
    /// such as `2024-06-01/2024-08-31` are whole days, UTC), ends
    /// included: those whose `datetime` (or `datetime`..`end_datetime` range)
    /// overlaps it. Chips without a `datetime` (inputs that were not STAC
    /// items, files of schema version 1) are excluded, and counted on stderr.
    #[arg(long, env = "RSEMBED_DATETIME", value_parser = parse_datetime)]
    pub datetime: Option<String>,
    /// Only chips whose `cloud_fraction` is at most this (0-1). Chips without
    /// one (no `--cloud-mask` in their job, schema version 1) are excluded,
    /// and counted on stderr.
    #[arg(long, env = "RSEMBED_MAX_CLOUD", value_parser = parse_fraction)]
    pub max_cloud: Option<f32>,
    /// Search by the embedding of this chip of the index instead of a text
    /// (the chip itself is left out of the results).
    #[arg(
        long,
        env = "RSEMBED_LIKE",
        value_name = "CHIP_ID",
        conflicts_with = "vector"
    )]
    pub like: Option<String>,
    /// Search by a query vector: a file holding one JSON array (as `rsembed text` prints).
    #[arg(long, env = "RSEMBED_VECTOR", value_name = "FILE")]
    pub vector: Option<PathBuf>,
    /// Many queries in one pass over the data: a JSON Lines file, one vector
    /// (JSON array) a line. Each result carries its query's line number as
    /// `query`; ranks count per query. At most 10,000 queries. `-` reads
    /// standard input and answers each line as it arrives, the index kept
    /// open: one JSON line a query, `{"query": N, "results": [...]}` (or
    /// `"error"`), until the input ends.
    #[arg(long, env = "RSEMBED_VECTORS", value_name = "FILE")]
    pub vectors: Option<PathBuf>,
    /// Many text queries in one pass over the data: one text a line, each its
    /// own query (positional texts are averaged into one instead). Needs
    /// `--model`. Results carry the line number as `query`. `-` reads
    /// standard input as `--vectors -` does, the text graph kept open too.
    #[arg(long, env = "RSEMBED_QUERIES", value_name = "FILE")]
    pub queries: Option<PathBuf>,
    /// Print one JSON object per result (JSON Lines).
    #[arg(long, env = "RSEMBED_JSON", conflicts_with = "geojson")]
    pub json: bool,
    /// Print a GeoJSON FeatureCollection of the results' footprints.
    #[arg(long, env = "RSEMBED_GEOJSON")]
    pub geojson: bool,
    /// Also write the results as one self-contained HTML page to this file:
    /// each hit's chip as the model saw it (read again from its source),
    /// its score, date, scene and centre, and the footprints on a lon/lat
    /// overview. The table or JSON is still printed.
    #[arg(long, env = "RSEMBED_HTML", value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Row groups scored at once. Default: twice the number of cores.
    #[arg(long, env = "RSEMBED_SCAN_CONCURRENCY")]
    pub concurrency: Option<usize>,
    /// On a dataset compacted with `--lists`: score only the rows of the P
    /// lists whose centroids are nearest the query, or `all` for an exact
    /// search. Default: one list in 16, at least 8 (recall@10 ≥ 0.95 on
    /// clustered data, docs/benchmarks.md). A number is refused on a dataset
    /// without lists.
    #[arg(long, env = "RSEMBED_NPROBE", value_name = "P|all", value_parser = parse_nprobe)]
    pub nprobe: Option<NProbe>,
    /// The query texts; several are averaged (prompt ensembling).
    pub texts: Vec<String>,
}
