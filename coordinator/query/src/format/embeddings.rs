//! The `embedding` column of a batch, as stored.

use arrow_array::{Array, FixedSizeListArray, Float16Array, Float32Array, Int8Array, RecordBatch};
use rsembed_schemas::chip::col;
use rsembed_schemas::embedding::SCALE_COLUMN;

use crate::{Error, Result};

/// The embeddings of a batch, as stored: `rows × dim` values, row-major.
#[derive(Debug, Clone, Copy)]
pub enum Embeddings<'a> {
    /// Float32 rows, unit length.
    F32(&'a [f32]),
    /// Float16 rows.
    F16(&'a [half::f16]),
    /// Int8 rows and each row's scale: value = e · scale.
    Int8 {
        /// The quantised values.
        values: &'a [i8],
        /// One scale per row.
        scales: &'a [f32],
    },
}

/// The embeddings of a batch, or an error naming the file when the column
/// is not a FixedSizeList of `dim` Float32, Float16 or Int8 (with its
/// `embedding_scale`), or has nulls.
pub fn embeddings<'a>(batch: &'a RecordBatch, dim: usize, uri: &str) -> Result<Embeddings<'a>> {
    let c = batch
        .column_by_name(col::EMBEDDING)
        .ok_or_else(|| Error::MissingColumn {
            uri: uri.to_owned(),
            column: col::EMBEDDING.to_owned(),
        })?;
    let list = c
        .as_any()
        .downcast_ref::<FixedSizeListArray>()
        .ok_or_else(|| Error::column(uri, col::EMBEDDING, "a fixed-size list"))?;
    if list.null_count() > 0 || list.value_length() as usize != dim {
        return Err(Error::dataset(
            uri,
            format!("embedding column has nulls or a dimension other than {dim}"),
        ));
    }
    let (start, n) = (list.offset() * dim, list.len() * dim);
    let short = || Error::dataset(uri, "embedding values are short");
    let values = list.values().as_any();
    if let Some(v) = values.downcast_ref::<Float32Array>() {
        return Ok(Embeddings::F32(
            v.values().get(start..start + n).ok_or_else(short)?,
        ));
    }
    if let Some(v) = values.downcast_ref::<Float16Array>() {
        return Ok(Embeddings::F16(
            v.values().get(start..start + n).ok_or_else(short)?,
        ));
    }
    if let Some(v) = values.downcast_ref::<Int8Array>() {
        let scales = batch
            .column_by_name(SCALE_COLUMN)
            .ok_or_else(|| Error::MissingColumn {
                uri: uri.to_owned(),
                column: SCALE_COLUMN.to_owned(),
            })?
            .as_any()
            .downcast_ref::<Float32Array>()
            .filter(|a| a.null_count() == 0)
            .ok_or_else(|| Error::column(uri, SCALE_COLUMN, "float32 without nulls"))?;
        return Ok(Embeddings::Int8 {
            values: v.values().get(start..start + n).ok_or_else(short)?,
            scales: scales.values(),
        });
    }
    Err(Error::column(
        uri,
        "embedding values",
        "float32, float16 or int8",
    ))
}
