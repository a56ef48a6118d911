//! Item collections: a `.json` FeatureCollection (read whole, with a cap),
//! `.ndjson` (streamed line by line) and stac-geoparquet (streamed batch by
//! batch with our parquet 60 reader, rows turned back into item JSON).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use arrow_array::{Array, BinaryArray, LargeBinaryArray, RecordBatch};
use arrow_schema::{DataType, Schema};
use futures::StreamExt;
use object_store::ObjectStoreExt;
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use rsembed_worker::store::StoreCache;
use serde::Deserialize;
use serde_json::{Map, Value};
use url::Url;

use super::emit::{href_of, parse, Emit, Flow, ItemsFormat};
use super::fetch::{Fetcher, Lines, MAX_ITEM_COLLECTION, MAX_LINE};
use crate::error::{Error, Result};
use rsembed_query::io::StoreReader;

/// Rows per stac-geoparquet batch: a few MiB of item JSON at ~10 KiB an item.
const PARQUET_BATCH: usize = 256;

/// Streams the items of the collection at `url`.
pub(crate) async fn stream(
    f: &Fetcher,
    stores: &StoreCache,
    url: &str,
    format: ItemsFormat,
    emit: &mut Emit<'_>,
) -> Result<()> {
    let doc = Url::parse(url).map_err(|e| Error::Stac {
        url: url.into(),
        reason: format!("not a URL: {e}"),
    })?;
    emit.stats.documents.fetch_add(1, Ordering::Relaxed);
    match format {
        ItemsFormat::Json => json(f, &doc, emit).await,
        ItemsFormat::Ndjson => ndjson(f, &doc, emit).await,
        ItemsFormat::Parquet => geoparquet(stores, &doc, emit).await,
    }
}

/// Sends one item of the collection read from `doc`; `n` numbers items
/// without an id.
async fn one(emit: &mut Emit<'_>, doc: &Url, json: Value, n: u64) -> Flow {
    let fallback = match json.get("id").and_then(Value::as_str) {
        Some(id) if !id.is_empty() => format!("{doc}#{id}"),
        _ => format!("{doc}#{n}"),
    };
    if !json.is_object() {
        return emit
            .bad(fallback, None, format!("is not a JSON object (item {n})"))
            .await;
    }
    // Assets resolve against the collection file unless the item says where
    // it lives.
    let (href, base) = href_of(&json, doc, &fallback);
    let base = if href == fallback { doc.clone() } else { base };
    emit.item(json, href, base).await
}

async fn json(f: &Fetcher, doc: &Url, emit: &mut Emit<'_>) -> Result<()> {
    #[derive(Deserialize)]
    struct Collection {
        #[serde(rename = "type")]
        kind: Option<String>,
        #[serde(default)]
        features: Vec<Value>,
    }
    let bytes = f.read(doc.as_str(), MAX_ITEM_COLLECTION).await?;
    let whole: Value = parse(doc.as_str(), &bytes)?;
    drop(bytes);
    let features = match whole.get("type").and_then(Value::as_str) {
        // One item on its own is a collection of one.
        Some("Feature") => vec![whole],
        _ => {
            let c: Collection = serde_json::from_value(whole).map_err(|e| Error::Stac {
                url: doc.to_string(),
                reason: format!("not a FeatureCollection: {e}"),
            })?;
            if c.kind.as_deref() != Some("FeatureCollection") {
                return Err(Error::Stac {
                    url: doc.to_string(),
                    reason: "not a FeatureCollection".into(),
                });
            }
            c.features
        }
    };
    emit.stats.pages.fetch_add(1, Ordering::Relaxed);
    for (i, feature) in features.into_iter().enumerate() {
        if one(emit, doc, feature, i as u64 + 1).await == Flow::Stop {
            break;
        }
    }
    Ok(())
}

async fn ndjson(f: &Fetcher, doc: &Url, emit: &mut Emit<'_>) -> Result<()> {
    let mut lines = Lines::new(f.open(doc.as_str()).await?, doc.as_str(), MAX_LINE);
    while let Some(line) = lines.next_line().await? {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        emit.stats.pages.fetch_add(1, Ordering::Relaxed);
        let n = lines.number;
        let flow = match serde_json::from_slice::<Value>(&line) {
            Ok(v) => one(emit, doc, v, n).await,
            Err(e) => {
                emit.bad(
                    format!("{doc}#line-{n}"),
                    None,
                    format!("(line {n}) is not JSON: {e}"),
                )
                .await
            }
        };
        if flow == Flow::Stop {
            break;
        }
    }
    Ok(())
}

async fn geoparquet(stores: &StoreCache, doc: &Url, emit: &mut Emit<'_>) -> Result<()> {
    let loc = stores.location(doc.as_str())?;
    let parquet_error = |e: parquet::errors::ParquetError| Error::StacFetch {
        url: doc.to_string(),
        source: Box::new(e),
    };
    let meta = loc
        .store
        .head(&loc.prefix)
        .await
        .map_err(|e| Error::StacFetch {
            url: doc.to_string(),
            source: Box::new(e),
        })?;
    // The query side's ranged reader; what it counts is not needed here.
    let reader = StoreReader::new(
        loc.store.clone(),
        loc.prefix.clone(),
        meta.size,
        Arc::default(),
    );
    // A hostile document must not reach parquet-rs's panics.
    let mut batches = rsembed_query::format::index::guarded(
        ParquetRecordBatchStreamBuilder::new(reader)
            .await
            .map_err(parquet_error)?
            .with_batch_size(PARQUET_BATCH)
            .build()
            .map_err(parquet_error)?,
    );
    let mut n = 0u64;
    while let Some(batch) = batches.next().await {
        let batch = batch.map_err(parquet_error)?;
        emit.stats.pages.fetch_add(1, Ordering::Relaxed);
        for row in rows_of(&batch).map_err(|reason| Error::Stac {
            url: doc.to_string(),
            reason,
        })? {
            n += 1;
            let flow = match row {
                Ok(item) => one(emit, doc, item, n).await,
                Err(reason) => emit.bad(format!("{doc}#{n}"), None, reason).await,
            };
            if flow == Flow::Stop {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// The fields of a stac-geoparquet row that stay at the top of an item;
/// every other column is a property.
const TOP_LEVEL: [&str; 9] = [
    "type",
    "stac_version",
    "stac_extensions",
    "id",
    "geometry",
    "bbox",
    "links",
    "assets",
    "collection",
];

/// The items of one stac-geoparquet batch, or why each row is not one.
pub(crate) fn rows_of(batch: &RecordBatch) -> Result<Vec<Result<Value, String>>, String> {
    let schema = batch.schema();
    let geometry_col = schema.index_of("geometry").ok();
    // WKB is decoded here; arrow-json would write the bytes as a string.
    let keep: Vec<usize> = (0..batch.num_columns())
        .filter(|&i| Some(i) != geometry_col)
        .collect();
    let rest = utc_as_offset(&batch.project(&keep).map_err(|e| e.to_string())?)?;
    let mut out = Vec::new();
    let mut w = arrow_json::LineDelimitedWriter::new(&mut out);
    w.write(&rest)
        .map_err(|e| format!("stac-geoparquet rows do not convert to JSON: {e}"))?;
    w.finish().map_err(|e| e.to_string())?;
    drop(w);
    let geometry = geometry_col.map(|i| batch.column(i).clone());
    let mut rows = Vec::with_capacity(batch.num_rows());
    for (i, line) in out
        .split(|&b| b == b'\n')
        .take(batch.num_rows())
        .enumerate()
    {
        let flat: Map<String, Value> = match serde_json::from_slice(line) {
            Ok(m) => m,
            Err(e) => {
                rows.push(Err(format!("row does not convert to JSON: {e}")));
                continue;
            }
        };
        let geom = match &geometry {
            None => Ok(Value::Null),
            Some(col) => geometry_at(col.as_ref(), i),
        };
        rows.push(geom.map(|g| unflatten(flat, g)));
    }
    Ok(rows)
}

/// The batch with its timestamps in zone `UTC` re-labelled `+00:00`, the
/// same instants: arrow-json formats zone names only with chrono-tz, and
/// stac-geoparquet writes every time in `UTC`.
fn utc_as_offset(batch: &RecordBatch) -> Result<RecordBatch, String> {
    fn fix(t: &DataType) -> Option<DataType> {
        match t {
            DataType::Timestamp(u, Some(tz))
                if matches!(tz.as_ref(), "UTC" | "utc" | "Etc/UTC" | "Z") =>
            {
                Some(DataType::Timestamp(*u, Some("+00:00".into())))
            }
            DataType::Struct(fields) => {
                let new: Vec<Option<DataType>> =
                    fields.iter().map(|f| fix(f.data_type())).collect();
                new.iter().any(Option::is_some).then(|| {
                    DataType::Struct(
                        fields
                            .iter()
                            .zip(new)
                            .map(|(f, n)| match n {
                                Some(n) => Arc::new(f.as_ref().clone().with_data_type(n)),
                                None => f.clone(),
                            })
                            .collect(),
                    )
                })
            }
            DataType::List(f) => fix(f.data_type())
                .map(|n| DataType::List(Arc::new(f.as_ref().clone().with_data_type(n)))),
            DataType::LargeList(f) => fix(f.data_type())
                .map(|n| DataType::LargeList(Arc::new(f.as_ref().clone().with_data_type(n)))),
            _ => None,
        }
    }
    let schema = batch.schema();
    if schema.fields().iter().all(|f| fix(f.data_type()).is_none()) {
        return Ok(batch.clone());
    }
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (f, c) in schema.fields().iter().zip(batch.columns()) {
        match fix(f.data_type()) {
            Some(t) => {
                columns.push(
                    arrow_cast::cast(c, &t).map_err(|e| format!("column {}: {e}", f.name()))?,
                );
                fields.push(Arc::new(f.as_ref().clone().with_data_type(t)));
            }
            None => {
                columns.push(c.clone());
                fields.push(f.clone());
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| e.to_string())
}

/// A row (flat, as stac-geoparquet stores it) as an item.
fn unflatten(flat: Map<String, Value>, geometry: Value) -> Value {
    let mut item = Map::new();
    let mut props = Map::new();
    for (k, v) in flat {
        if k == "bbox" {
            item.insert(k, bbox_array(v));
        } else if TOP_LEVEL.contains(&k.as_str()) {
            item.insert(k, v);
        } else {
            props.insert(k, v);
        }
    }
    // A null datetime is meaningful (a range item); arrow-json leaves nulls out.
    props.entry("datetime").or_insert(Value::Null);
    item.insert("geometry".into(), geometry);
    item.insert("properties".into(), Value::Object(props));
    item.entry("type").or_insert("Feature".into());
    Value::Object(item)
}

/// stac-geoparquet's bbox struct (`xmin`, `ymin`, [`zmin`], `xmax`, ...) as
/// a GeoJSON bbox array; an array stays as it is.
fn bbox_array(v: Value) -> Value {
    let Value::Object(m) = v else { return v };
    let keys: &[&str] = if m.contains_key("zmin") {
        &["xmin", "ymin", "zmin", "xmax", "ymax", "zmax"]
    } else {
        &["xmin", "ymin", "xmax", "ymax"]
    };
    keys.iter()
        .map(|k| m.get(*k).cloned().unwrap_or(Value::Null))
        .collect()
}

/// Row `i`'s geometry as GeoJSON (null for a null cell).
fn geometry_at(col: &dyn Array, i: usize) -> Result<Value, String> {
    if col.is_null(i) {
        return Ok(Value::Null);
    }
    let bytes = if let Some(a) = col.as_any().downcast_ref::<BinaryArray>() {
        a.value(i)
    } else if let Some(a) = col.as_any().downcast_ref::<LargeBinaryArray>() {
        a.value(i)
    } else {
        return Err(format!(
            "geometry column is {}, not WKB binary",
            col.data_type()
        ));
    };
    rsembed_query::format::wkb::to_geojson(bytes)
        .map_err(|e| format!("geometry is not valid WKB: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flat_rows_become_items() {
        let flat = json!({"id": "a", "collection": "c", "bbox": {"xmin": 0.0, "ymin": 1.0, "xmax": 2.0, "ymax": 3.0},
            "datetime": "2024-06-01T00:00:00Z", "eo:cloud_cover": 3, "assets": {"red": {"href": "r.tif"}}});
        let Value::Object(flat) = flat else {
            unreachable!()
        };
        let item = unflatten(flat, json!({"type": "Point", "coordinates": [1.0, 2.0]}));
        assert_eq!(item["bbox"], json!([0.0, 1.0, 2.0, 3.0]));
        assert_eq!(item["properties"]["eo:cloud_cover"], json!(3));
        assert_eq!(item["type"], json!("Feature"));
        assert_eq!(item["assets"]["red"]["href"], json!("r.tif"));
        let parsed: stac::Item = serde_json::from_value(item).unwrap();
        assert_eq!(parsed.id, "a");
        assert!(parsed.properties.datetime.is_some());
    }
}
