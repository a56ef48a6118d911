//! `stac/items.parquet`: the job's items as one stac-geoparquet file
//! (<https://github.com/radiantearth/stac-geoparquet-spec>), written as the
//! items stream by, a row group at a time, through an upload that appears
//! whole on completion.
//!
//! The rows are the items [`item()`](super::item::item) builds, flattened as
//! the spec and rustac have it: `type`, `stac_version`, `stac_extensions`,
//! `id`, `geometry` (WKB, with GeoParquet 1.1 `geo` metadata), `bbox` (a
//! struct, the `geo` covering), `links`, `assets`, `collection`, then every
//! property as a top-level column, times as timestamps (µs, UTC). The schema
//! is fixed here, before the first row, so a property `item()` starts to
//! write without a column here is an error, not a silently missing field.
//! The footer holds `geo` (with the items' bbox) and `stac-geoparquet`
//! (version and the collection), both known only at the end; no
//! `ARROW:schema` is written, so Arrow C++ (PyArrow, GeoPandas) reads them
//! from the Parquet key-value list.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_json::reader::{infer_json_schema_from_iterator, ReaderBuilder};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use parquet::arrow::arrow_writer::ArrowWriterOptions;
use parquet::arrow::AsyncArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use rsembed_schemas::chip::{bbox_fields, timestamp_type};
use rsembed_schemas::meta::{geo_metadata, GEO_KEY};
use rsembed_worker::store::Location;
use serde_json::{json, Map, Value};
use stac::{Asset, Collection};

use super::item::{FILE_EXTENSION, ITEMS_PARQUET_ASSET};
use super::rows::{Columns, JobColumns, Row};
use super::{Context, PARQUET};
use crate::error::{Error, Result};
use rsembed_query::io::AtomicUpload;

/// The file, relative to the output.
pub(crate) const ITEMS_PARQUET: &str = "stac/items.parquet";

/// The stac-geoparquet metadata key and the spec version written (the one
/// its JSON schema accepts, and rustac writes).
const METADATA_KEY: &str = "stac-geoparquet";
const VERSION: &str = "1.0.0";

/// Rows handed to the writer at once.
const BATCH_ITEMS: usize = 1024;

/// Upload parts (10 MiB each) in flight.
const UPLOAD_CONCURRENCY: usize = 2;

/// The Arrow schema of the rows, in the order the spec lists the fields;
/// `params` is the type of `emb:runtime_parameters`, which depends on the job.
/// Times are without a zone here: arrow-json parses zone names only with
/// chrono-tz, so they are labelled UTC after decoding.
fn decode_schema(params: DataType) -> Schema {
    let utf8 = |name: &str, null: bool| Field::new(name, DataType::Utf8, null);
    let list = |t: DataType| DataType::List(Arc::new(Field::new("item", t, true)));
    let time = |name: &str, null: bool| {
        Field::new(name, DataType::Timestamp(TimeUnit::Microsecond, None), null)
    };
    let link = Fields::from(vec![
        utf8("href", false),
        utf8("rel", false),
        utf8("type", true),
        utf8("title", true),
    ]);
    let embeddings = Fields::from(vec![
        utf8("href", false),
        utf8("title", true),
        utf8("type", true),
        Field::new("roles", list(DataType::Utf8), true),
        Field::new("file:size", DataType::Int64, true),
        utf8("file:checksum", true),
    ]);
    Schema::new(vec![
        utf8("type", false),
        utf8("stac_version", false),
        Field::new("stac_extensions", list(DataType::Utf8), false),
        utf8("id", false),
        Field::new("bbox", DataType::Struct(bbox_fields()), true),
        Field::new("links", list(DataType::Struct(link)), false),
        Field::new(
            "assets",
            DataType::Struct(Fields::from(vec![Field::new(
                "embeddings",
                DataType::Struct(embeddings),
                false,
            )])),
            false,
        ),
        utf8("collection", true),
        time("datetime", true),
        time("start_datetime", true),
        time("end_datetime", true),
        utf8("rsembed:datetime_source", false),
        Field::new("rsembed:chips_without_datetime", DataType::Int64, true),
        Field::new("rsembed:chips", DataType::Int64, false),
        Field::new("rsembed:more_sources", DataType::Boolean, true),
        Field::new("rsembed:wide_footprint", DataType::Boolean, true),
        time("processing:datetime", false),
        Field::new("emb:runtime_parameters", params, false),
    ])
}

/// Where the geometry column goes: after `id`, as in the spec's table.
const GEOMETRY_AT: usize = 4;

/// `v` without nulls, empty lists and empty objects, at any depth: a Parquet
/// column of nulls has no type readers agree on, and an absent property
/// reads back the same as a null one.
fn strip_empty(v: &mut Value) {
    match v {
        Value::Object(o) => {
            o.values_mut().for_each(strip_empty);
            o.retain(|_, v| !is_empty(v));
        }
        Value::Array(a) => a.iter_mut().for_each(strip_empty),
        _ => {}
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// The type of the job's `emb:runtime_parameters`, the same on every item.
fn params_type(ctx: &Context) -> Result<DataType> {
    let mut v = ctx.runtime_params.clone();
    strip_empty(&mut v);
    let schema =
        infer_json_schema_from_iterator(std::iter::once(Ok::<_, arrow_schema::ArrowError>(v)))
            .map_err(|e| {
                Error::Output(format!("emb:runtime_parameters as a Parquet column: {e}"))
            })?;
    Ok(DataType::Struct(schema.fields().clone()))
}

/// The job's `emb:runtime_parameters` as one row of `params` (the type
/// [`params_type`] gave it), decoded from its JSON once: every row repeats it.
fn params_row(
    ctx: &Context,
    params: DataType,
) -> std::result::Result<ArrayRef, arrow_schema::ArrowError> {
    let mut v = ctx.runtime_params.clone();
    strip_empty(&mut v);
    let schema = Arc::new(Schema::new(vec![Field::new("p", params, false)]));
    let mut decoder = ReaderBuilder::new(schema)
        .with_strict_mode(true)
        .build_decoder()?;
    decoder.serialize(&[json!({ "p": v })])?;
    let batch = decoder
        .flush()?
        .ok_or_else(|| arrow_schema::ArrowError::JsonError("no parameters decoded".into()))?;
    Ok(batch.column(0).clone())
}

/// The items of a job as they go into `stac/items.parquet`.
pub(super) struct ItemsParquet {
    writer: AsyncArrowWriter<AtomicUpload>,
    /// The written schema: times in UTC, the geometry column in.
    schema: SchemaRef,
    job: JobColumns,
    /// Rows not yet handed to the writer.
    columns: Columns,
    geometry_types: BTreeSet<&'static str>,
    written: u64,
    path: String,
}

/// What [`ItemsParquet::finish`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ParquetWritten {
    pub(super) rows: u64,
    pub(super) bytes: u64,
    pub(super) sha256: String,
}

impl ItemsParquet {
    /// Starts the upload of `stac/items.parquet`; row groups of
    /// `items_per_group` items.
    pub(super) fn create(
        output: &Location,
        ctx: &Context,
        items_per_group: usize,
    ) -> Result<ItemsParquet> {
        let path = output.uri_of(&output.child(ITEMS_PARQUET));
        let wrap = |e: arrow_schema::ArrowError| Error::Output(format!("{path}: {e}"));
        let params = params_type(ctx)?;
        let decode = Arc::new(decode_schema(params.clone()));
        let job = JobColumns {
            collection: ctx.id.clone(),
            created_us: ctx.created_us,
            params: params_row(ctx, params).map_err(wrap)?,
        };
        let mut fields: Vec<Field> = decode
            .fields()
            .iter()
            .map(|f| match f.data_type() {
                DataType::Timestamp(..) => f.as_ref().clone().with_data_type(timestamp_type()),
                _ => f.as_ref().clone(),
            })
            .collect();
        fields.insert(GEOMETRY_AT, Field::new("geometry", DataType::Binary, false));
        let schema = Arc::new(Schema::new(fields));
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(
                ZstdLevel::try_new(3).expect("a valid level"),
            ))
            .set_max_row_group_row_count(Some(items_per_group))
            // One value per item: a dictionary only costs memory until it
            // gives up, and min/max of WKB say nothing.
            .set_column_dictionary_enabled(ColumnPath::from("id"), false)
            .set_column_dictionary_enabled(ColumnPath::from("geometry"), false)
            .set_column_statistics_enabled(ColumnPath::from("geometry"), EnabledStatistics::None)
            .set_column_dictionary_enabled(
                ColumnPath::from(vec!["assets".into(), "embeddings".into(), "href".into()]),
                false,
            )
            .build();
        let options = ArrowWriterOptions::new()
            .with_properties(props)
            .with_skip_arrow_metadata(true);
        let upload = AtomicUpload::new(
            &output.store,
            output.child(ITEMS_PARQUET),
            UPLOAD_CONCURRENCY,
        );
        let writer = AsyncArrowWriter::try_new_with_options(upload, schema.clone(), options)
            .map_err(|e| write_error(&path, e))?;
        Ok(ItemsParquet {
            writer,
            schema,
            job,
            columns: Columns::default(),
            geometry_types: BTreeSet::new(),
            written: 0,
            path,
        })
    }

    /// Adds `row` as the next row.
    pub(super) async fn add(&mut self, row: Row) -> Result<()> {
        self.geometry_types.insert(self.columns.push(row));
        if self.columns.len() == BATCH_ITEMS {
            self.write_rows().await?;
        }
        Ok(())
    }

    /// Hands the pending rows to the writer, which flushes a row group to
    /// the upload whenever one fills.
    async fn write_rows(&mut self) -> Result<()> {
        if self.columns.len() == 0 {
            return Ok(());
        }
        let n = self.columns.len();
        let batch = self.columns.take(&self.job, &self.schema)?;
        self.writer
            .write(&batch)
            .await
            .map_err(|e| write_error(&self.path, e))?;
        self.written += n as u64;
        Ok(())
    }

    /// Writes the last rows and the footer, with `collection` and the items'
    /// `bbox` in it, and completes the upload.
    pub(super) async fn finish(
        mut self,
        collection: &Collection,
        bbox: Option<[f64; 4]>,
    ) -> Result<ParquetWritten> {
        let done = async {
            self.write_rows().await?;
            let mut geo = geo_metadata(bbox);
            // An empty list (no row) says the types are not known.
            geo["columns"]["geometry"]["geometry_types"] = json!(self.geometry_types);
            self.writer
                .append_key_value_metadata(KeyValue::new(GEO_KEY.to_owned(), geo.to_string()));
            // The collection without its item links: the rows are the items,
            // and a footer is read whole.
            let mut c = serde_json::to_value(collection)?;
            if let Some(Value::Array(links)) = c.get_mut("links") {
                links.retain(|l| l["rel"] != "item");
            }
            let mut collections = Map::new();
            collections.insert(collection.id.clone(), c);
            let meta = json!({"version": VERSION, "collections": collections});
            self.writer.append_key_value_metadata(KeyValue::new(
                METADATA_KEY.to_owned(),
                meta.to_string(),
            ));
            self.writer
                .finish()
                .await
                .map_err(|e| write_error(&self.path, e))
        }
        .await;
        let md = match done {
            Ok(md) => md,
            Err(e) => {
                self.abort().await;
                return Err(e);
            }
        };
        let rows = u64::try_from(md.file_metadata().num_rows()).unwrap_or(0);
        if rows != self.written {
            return Err(Error::Output(format!(
                "{}: its footer says {rows} rows, {} were written",
                self.path, self.written
            )));
        }
        let upload = self.writer.into_inner();
        Ok(ParquetWritten {
            rows,
            bytes: upload.bytes(),
            sha256: upload.sha256(),
        })
    }

    /// Gives the upload up: no object is left.
    pub(super) async fn abort(self) {
        let mut upload = self.writer.into_inner();
        upload.abort().await;
    }

    /// Bytes the writer holds: encoded rows of the row group being filled.
    #[cfg(test)]
    pub(super) fn buffered(&self) -> usize {
        self.writer.memory_size()
    }
}

fn write_error(path: &str, e: parquet::errors::ParquetError) -> Error {
    Error::WriteOutput {
        path: path.to_owned(),
        source: std::io::Error::other(e),
    }
}

/// Points the collection at `stac/items.parquet`, as the stac-geoparquet
/// spec says a collection refers to its mirror: an asset of type
/// `application/vnd.apache.parquet` and role `collection-mirror`. The key
/// and the `stac-items` role are the Planetary Computer's, which clients of
/// its collections look for.
pub(crate) fn link_items_parquet(c: &mut Collection, written: &ParquetWritten) {
    let mut a = Asset::new("./items.parquet")
        .role("collection-mirror")
        .role("stac-items");
    a.r#type = Some(PARQUET.to_owned());
    a.title = Some("The items as stac-geoparquet".into());
    a.description = Some(format!(
        "Every item of this collection ({} items), one row each in the order of the \
         job's chip files; not spatially partitioned: the bbox columns (the GeoParquet \
         covering) select.",
        written.rows
    ));
    a.additional_fields
        .insert("file:size".into(), written.bytes.into());
    a.additional_fields.insert(
        "file:checksum".into(),
        format!("1220{}", written.sha256).into(),
    );
    c.assets.insert(ITEMS_PARQUET_ASSET.into(), a);
    if !c.extensions.iter().any(|e| e == FILE_EXTENSION) {
        c.extensions.push(FILE_EXTENSION.to_owned());
    }
}
