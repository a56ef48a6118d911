//! The extent of a chip file whose manifest entry records none (written by
//! an older rsembed): read from the file's small columns, `bbox`,
//! `datetime`, `end_datetime`, `item_id` and `source_uri` (those present),
//! batch by batch, into the same [`ExtentBuilder`] the worker uses.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, TimestampMicrosecondType};
use arrow_array::{Array, RecordBatch, StringArray};
use arrow_schema::{DataType, TimeUnit};
use futures::StreamExt;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use rsembed_schemas::chip::col;
use rsembed_schemas::extent::FileExtent;
use rsembed_schemas::job::ManifestFile;
use rsembed_worker::sink::extent::ExtentBuilder;
use rsembed_worker::store::Location;

use crate::error::{Error, Result};
use rsembed_query::io::StoreReader;

/// Rows decoded at once: five small columns (the longest a source URL), so
/// memory stays about a MiB per file whatever row-group size it has.
const BATCH_ROWS: usize = 8192;

/// Reads the extent of one chip file, and the type of its embeddings.
pub(super) async fn read_extent(
    output: &Location,
    file: &ManifestFile,
) -> Result<(FileExtent, Option<String>)> {
    let bad = |source: parquet::errors::ParquetError| match source {
        // The store failed (a missing file, an outage): say so, with the
        // store's error and its retry hint, not that the file is not Parquet.
        parquet::errors::ParquetError::External(e) if e.is::<object_store::Error>() => {
            Error::ReadOutput {
                path: output.uri_of(&output.child(&file.path)),
                source: *e.downcast::<object_store::Error>().expect("checked by is"),
            }
        }
        source => Error::TaskFile {
            path: file.path.clone(),
            source: rsembed_worker::Error::Parquet(source),
        },
    };
    let reader = StoreReader::new(
        output.store.clone(),
        output.child(&file.path),
        file.bytes,
        Arc::default(),
    );
    let builder = ParquetRecordBatchStreamBuilder::new(reader)
        .await
        .map_err(bad)?;
    let schema = builder.schema().clone();
    let dtype = match schema
        .field_with_name(col::EMBEDDING)
        .map(|f| f.data_type())
    {
        Ok(DataType::FixedSizeList(item, _)) => Some(data_type_name(item.data_type())),
        _ => None,
    };
    let columns = [
        col::BBOX,
        col::DATETIME,
        col::END_DATETIME,
        col::ITEM_ID,
        col::SOURCE_URI,
    ];
    let roots: Vec<usize> = columns
        .iter()
        .filter_map(|c| schema.index_of(c).ok())
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let mut stream = rsembed_query::format::index::guarded(
        builder
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(bad)?,
    );
    let mut extent = ExtentBuilder::default();
    while let Some(batch) = stream.next().await {
        add_batch(&mut extent, &batch.map_err(bad)?).map_err(|why| {
            Error::Output(format!(
                "{}: {why}",
                output.uri_of(&output.child(&file.path))
            ))
        })?;
    }
    Ok((extent.finish(), dtype))
}

/// The STAC common-metadata `data_type` of an embedding element type.
fn data_type_name(t: &DataType) -> String {
    match t {
        DataType::Float16 => "float16",
        DataType::Float32 => "float32",
        DataType::Float64 => "float64",
        DataType::Int8 => "int8",
        DataType::UInt8 => "uint8",
        DataType::Int16 => "int16",
        DataType::UInt16 => "uint16",
        _ => "other",
    }
    .to_owned()
}

/// Adds one batch of the projected columns. A column of another type, or a
/// bbox that is not finite or has min > max, is an error: a chip file that
/// says something else than the schema is not described by a guess.
pub(super) fn add_batch(extent: &mut ExtentBuilder, batch: &RecordBatch) -> Result<(), String> {
    let bboxes = match batch.column_by_name(col::BBOX) {
        None => None,
        Some(c) => {
            Some(bboxes(c.as_struct_opt().ok_or_else(|| {
                format!("`bbox` is {}, not a struct", c.data_type())
            })?)?)
        }
    };
    let times = |name: &str| -> Result<Option<_>, String> {
        match batch.column_by_name(name) {
            None => Ok(None),
            Some(c) => match c.data_type() {
                DataType::Timestamp(TimeUnit::Microsecond, _) => {
                    Ok(Some(c.as_primitive::<TimestampMicrosecondType>().clone()))
                }
                t => Err(format!("`{name}` is {t}, not Timestamp(µs)")),
            },
        }
    };
    let (start, end) = (times(col::DATETIME)?, times(col::END_DATETIME)?);
    let text = |name: &str| -> Result<Option<StringArray>, String> {
        match batch.column_by_name(name) {
            None => Ok(None),
            Some(c) => c
                .as_string_opt::<i32>()
                .cloned()
                .map(Some)
                .ok_or_else(|| format!("`{name}` is {}, not Utf8", c.data_type())),
        }
    };
    let (ids, uris) = (text(col::ITEM_ID)?, text(col::SOURCE_URI)?);
    for i in 0..batch.num_rows() {
        let uri = get(&uris, i);
        let t0 = start.as_ref().filter(|s| s.is_valid(i)).map(|s| s.value(i));
        let t1 = end.as_ref().filter(|e| e.is_valid(i)).map(|e| e.value(i));
        // A row's source item: only with the URL to link.
        let item = uri.and(get(&ids, i));
        let bbox = bboxes.as_ref().and_then(|b| b[i]);
        extent.add(uri.unwrap_or(""), bbox, t0, t1, item);
    }
    Ok(())
}

/// Row `i` of a text column, when there is one and the row is not null.
fn get(a: &Option<StringArray>, i: usize) -> Option<&str> {
    a.as_ref().filter(|a| a.is_valid(i)).map(|a| a.value(i))
}

/// The rows' bboxes (`None` where null), checked.
fn bboxes(s: &arrow_array::StructArray) -> Result<Vec<Option<[f64; 4]>>, String> {
    let mut cols = Vec::with_capacity(4);
    for name in ["xmin", "ymin", "xmax", "ymax"] {
        let c = s
            .column_by_name(name)
            .ok_or_else(|| format!("`bbox` has no `{name}`"))?;
        if c.data_type() != &DataType::Float64 {
            return Err(format!("`bbox.{name}` is {}, not Float64", c.data_type()));
        }
        cols.push(c.as_primitive::<Float64Type>());
    }
    (0..s.len())
        .map(|i| {
            if s.is_null(i) || cols.iter().any(|c| c.is_null(i)) {
                return Ok(None);
            }
            let b = [
                cols[0].value(i),
                cols[1].value(i),
                cols[2].value(i),
                cols[3].value(i),
            ];
            if b.iter().any(|v| !v.is_finite()) || b[0] > b[2] || b[1] > b[3] {
                return Err(format!(
                    "row {i} has the bbox {b:?}, not xmin<=xmax, ymin<=ymax"
                ));
            }
            Ok(Some(b))
        })
        .collect()
}
