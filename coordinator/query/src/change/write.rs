//! The changes as one GeoParquet file, written whole or not at all.

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, Float32Builder, Float64Builder, StringBuilder, StructBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::AsyncArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use rsembed_schemas::chip::{bbox_fields, timestamp_type};
use rsembed_schemas::meta::{geo_metadata, GEO_KEY};
use rsembed_store::Location;
use serde_json::json;

use super::{Change, Window};
use crate::format::index::Index;
use crate::io::AtomicUpload;
use crate::{Error, Result};

/// Rows a row group of the output holds.
const GROUP_ROWS: usize = 65_536;

/// The output's columns.
fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("cell", DataType::Utf8, false),
        Field::new("grid_cell", DataType::Utf8, true),
        Field::new("geometry", DataType::Binary, true),
        Field::new("bbox", DataType::Struct(bbox_fields()), true),
        Field::new("window_a", timestamp_type(), false),
        Field::new("window_b", timestamp_type(), false),
        Field::new("distance", DataType::Float32, false),
        Field::new("chip_id_a", DataType::Utf8, false),
        Field::new("chip_id_b", DataType::Utf8, false),
    ]))
}

/// Writes `changes` (ranked) to `out`; the rows written.
pub(super) async fn write(
    out: &Location,
    index: &Index,
    changes: &[Change],
    windows: &[Window],
) -> Result<u64> {
    let extent = changes.iter().filter_map(|c| c.bbox).reduce(|a, b| {
        [
            a[0].min(b[0]),
            a[1].min(b[1]),
            a[2].max(b[2]),
            a[3].max(b[3]),
        ]
    });
    let kv = vec![
        KeyValue::new(GEO_KEY.to_owned(), geo_metadata(extent).to_string()),
        KeyValue::new(
            "rsembed".to_owned(),
            json!({
                "kind": "change",
                "schema_version": 1,
                "index": index.root.url.as_str(),
                "job_id": index.manifest.as_ref().map(|m| m.job_id.clone()),
                "model_sha256": index.model().map(|(_, s)| s.to_owned()),
                "distance": "1 - cosine",
                "software_version": rsembed_schemas::SOFTWARE_VERSION,
            })
            .to_string(),
        ),
    ];
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_key_value_metadata(Some(kv))
        .set_max_row_group_row_count(Some(GROUP_ROWS))
        .build();
    let schema = rsembed_schemas::chip_file::schema_with_file_metadata(&schema(), &props);
    let write_err = |e: parquet::errors::ParquetError| Error::Write {
        path: out.url.to_string(),
        source: Box::new(e),
    };
    let sink = AtomicUpload::new(&out.store, out.prefix.clone(), 4);
    let mut writer =
        AsyncArrowWriter::try_new(sink, schema.clone(), Some(props)).map_err(write_err)?;
    let written: Result<()> = async {
        for chunk in changes.chunks(GROUP_ROWS) {
            let batch = batch(&schema, chunk, windows).map_err(|e| Error::Write {
                path: out.url.to_string(),
                source: Box::new(e),
            })?;
            writer.write(&batch).await.map_err(write_err)?;
        }
        writer.finish().await.map_err(write_err)?;
        Ok(())
    }
    .await;
    if let Err(e) = written {
        writer.into_inner().abort().await;
        return Err(e);
    }
    Ok(changes.len() as u64)
}

fn batch(
    schema: &SchemaRef,
    changes: &[Change],
    windows: &[Window],
) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    let n = changes.len();
    let (mut cell, mut grid) = (StringBuilder::new(), StringBuilder::new());
    let (mut id_a, mut id_b) = (StringBuilder::new(), StringBuilder::new());
    let mut geom = BinaryBuilder::new();
    let mut bbox = StructBuilder::from_fields(bbox_fields(), n);
    let ts = || TimestampMicrosecondBuilder::with_capacity(n).with_timezone("UTC");
    let (mut wa, mut wb) = (ts(), ts());
    let mut distance = Float32Builder::with_capacity(n);
    for c in changes {
        cell.append_value(&c.cell);
        grid.append_option(c.grid_cell.as_deref());
        geom.append_option(c.geometry.as_deref());
        let xyxy = c.bbox.unwrap_or([0.0; 4]);
        for (k, v) in xyxy.iter().enumerate() {
            bbox.field_builder::<Float64Builder>(k)
                .expect("bbox fields are float64")
                .append_value(*v);
        }
        bbox.append(c.bbox.is_some());
        wa.append_value(windows[c.a].0);
        wb.append_value(windows[c.b].0);
        distance.append_value(c.distance);
        id_a.append_value(&c.chip_a);
        id_b.append_value(&c.chip_b);
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(cell.finish()),
        Arc::new(grid.finish()),
        Arc::new(geom.finish()),
        Arc::new(bbox.finish()),
        Arc::new(wa.finish()),
        Arc::new(wb.finish()),
        Arc::new(distance.finish()),
        Arc::new(id_a.finish()),
        Arc::new(id_b.finish()),
    ];
    RecordBatch::try_new(schema.clone(), cols)
}
