//! `rsembed compact`: a finished job's per-task files merged into large,
//! Hilbert-sorted files, every row exactly once, with a new manifest.

use crate::cli::CompactArgs;
use crate::error::{Error, Result};

/// What a compaction did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompactSummary {
    /// The compacted dataset's URL.
    pub output: String,
    /// Rows written (equal to the source manifest's).
    pub rows: u64,
    /// Files written.
    pub files: usize,
}

impl CompactSummary {
    /// The summary for a terminal.
    pub fn render(&self) -> String {
        format!(
            "rsembed compact: {} rows in {} files at {}\n",
            self.rows, self.files, self.output
        )
    }
}

/// Compacts `args.index` into `args.output`.
pub async fn compact(_args: CompactArgs) -> Result<CompactSummary> {
    Err(Error::Usage("rsembed compact: not built yet".into()))
}
