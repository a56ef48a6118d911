//! `rsembed classify`.

use crate::cli::ClassifyArgs;
use crate::error::{Error, Result};

/// What a classification wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClassifySummary {
    /// Rows written.
    pub rows: u64,
}

impl ClassifySummary {
    /// The summary for a terminal.
    pub fn render(&self) -> String {
        format!("rsembed classify: {} rows\n", self.rows)
    }
}

/// Labels every chip of `args.index`.
pub async fn classify(_args: ClassifyArgs) -> Result<ClassifySummary> {
    Err(Error::Usage("rsembed classify: not built yet".into()))
}
