//! `rsembed change`'s flags, as the command line gives them.

use clap::Args;
use rsembed_schemas::units::parse_byte_size;

/// `rsembed change`.
#[derive(Debug, Clone, Args)]
pub struct ChangeArgs {
    /// The output of a window job (`rsembed run --windows`, or its compaction).
    #[arg(long, env = "RSEMBED_INDEX")]
    pub index: String,
    /// The GeoParquet file to write (local path or object store URL): one row
    /// per cell and pair of windows, largest distance first.
    #[arg(long, env = "RSEMBED_OUTPUT")]
    pub output: String,
    /// Compare from the window holding this date or RFC 3339 instant. With
    /// `--to`: compare only the window holding `--from` with the one holding
    /// `--to`. Alone: consecutive windows from this one on.
    #[arg(long, env = "RSEMBED_FROM", value_name = "DATE")]
    pub from: Option<String>,
    /// Compare up to the window holding this date or instant (see `--from`).
    #[arg(long, env = "RSEMBED_TO", value_name = "DATE")]
    pub to: Option<String>,
    /// Print the K largest changes.
    #[arg(long, env = "RSEMBED_TOP", value_name = "K")]
    pub top: Option<usize>,
    /// Replace the file at `--output` when there is one.
    #[arg(long, env = "RSEMBED_OVERWRITE")]
    pub overwrite: bool,
    /// Embeddings held at once, e.g. `1GiB`: a larger output is read in as
    /// many passes as it needs, each holding the cells of one hash range.
    #[arg(long, env = "RSEMBED_CHANGE_MEMORY", default_value = "1GiB", value_parser = parse_byte_size)]
    pub memory: u64,
    /// Row groups read at once. Default: twice the number of cores.
    #[arg(long, env = "RSEMBED_SCAN_CONCURRENCY")]
    pub concurrency: Option<usize>,
    /// Print the summary as JSON.
    #[arg(long, env = "RSEMBED_JSON")]
    pub json: bool,
}
