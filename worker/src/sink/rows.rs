//! Error rows as Arrow record batches; chip rows are `rsembed-schemas`'
//! (`chip_file::rows`), re-exported here for the sink's callers.

use std::sync::Arc;

use arrow_array::builder::StringBuilder;
use arrow_array::{ArrayRef, RecordBatch};
use rsembed_schemas::chip::{error_schema, ErrorStage};

pub use rsembed_schemas::chip_file::rows::{
    chip_batch, chip_batch_version, extent, AsChipRow, CellColumns, CellRow, ChipRow, StacColumns,
};

use crate::error::Result;
use crate::retry::RetryHint;

/// One row of `errors/*.parquet`.
#[derive(Debug)]
pub struct ErrorRow {
    /// The input that failed.
    pub source_uri: String,
    /// Where it failed.
    pub stage: ErrorStage,
    /// Why.
    pub error: String,
    /// `Some` when the store, not the content, failed (a store error is in
    /// the chain: the object is missing, the store failed, or it refused our
    /// credentials), with that error's hint; `None` for a content error.
    /// Not written to the file.
    pub store: Option<RetryHint>,
    /// The error itself, kept only for a store failure: a pull worker fails
    /// the task with it as the source.
    pub cause: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// Builds a record batch of error rows.
pub(crate) fn error_batch(rows: &[ErrorRow]) -> Result<RecordBatch> {
    let mut uri = StringBuilder::new();
    let mut stage = StringBuilder::new();
    let mut error = StringBuilder::new();
    for r in rows {
        uri.append_value(&r.source_uri);
        stage.append_value(r.stage.as_str());
        error.append_value(&r.error);
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(uri.finish()),
        Arc::new(stage.finish()),
        Arc::new(error.finish()),
    ];
    Ok(RecordBatch::try_new(error_schema(), cols)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_error_batches_are_valid() {
        assert_eq!(error_batch(&[]).unwrap().num_rows(), 0);
    }
}
