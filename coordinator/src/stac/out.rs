//! A finished job as STAC: `<output>/stac/collection.json`, a STAC 1.1.0
//! Collection with the embeddings extension (proposal), and one Item per chip
//! file under `stac/items/`, each with an `embeddings` asset that points at
//! its `chips/<task>.parquet` by a relative href.
//!
//! The documents are built from the manifest's chip files, each read alone
//! and only in its `bbox`, `datetime`, `end_datetime`, `item_id` and
//! `source_uri` columns, so memory stays that of a few files' small columns
//! whatever the job's size; the collection holds one link per file. Items are written before the
//! collection, so a reader never sees a collection that links an item not yet
//! there, and items of tasks no longer in the manifest go last.
//!
//! Datetimes: an item's range covers its chips' `datetime`..`end_datetime`.
//! Chips without one (schema 1 files, inputs that are not STAC items) give
//! the job's `created_at` instead, and the item says so in
//! `rsembed:datetime_source` = `processing` (docs/decisions.md, "STAC out").

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, TimestampMicrosecondType};
use arrow_array::{Array, ArrayRef, RecordBatch, StructArray};
use arrow_schema::{DataType, TimeUnit};
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, PutPayload};
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use rsembed_schemas::chip::col;
use rsembed_schemas::embedding::EmbeddingType;
use rsembed_schemas::job::{JobSpec, Manifest, ManifestFile, StacSearch};
use rsembed_worker::store::Location;
use serde_json::{json, Map};
use stac::{Asset, Bbox, Collection, Item, ItemAsset, Link};

use crate::error::{Error, Result};
use crate::query::index::StoreReader;

/// The folder of the output that holds the STAC documents.
pub(crate) const STAC_DIR: &str = "stac/";
/// The collection, relative to the output.
pub(crate) const COLLECTION_FILE: &str = "stac/collection.json";
/// The items' folder, relative to the output.
const ITEMS_DIR: &str = "stac/items/";

/// The embeddings extension (proposal) the collection and items implement.
pub(crate) const EMBEDDINGS_EXTENSION: &str =
    "https://stac-extensions.github.io/embeddings/v0.0.1/schema.json";
/// `processing:datetime`: when the embeddings were made (the proposal reuses it).
const PROCESSING_EXTENSION: &str =
    "https://stac-extensions.github.io/processing/v1.2.0/schema.json";
/// `file:size` and `file:checksum` of the embeddings asset, from the manifest.
const FILE_EXTENSION: &str = "https://stac-extensions.github.io/file/v2.1.0/schema.json";

const PARQUET: &str = "application/vnd.apache.parquet";
const GEOJSON: &str = "application/geo+json";
const JSON: &str = "application/json";

/// Rows decoded at once: five small columns (the longest a source URL), so
/// memory stays about a MiB per file whatever row-group size it has.
const BATCH_ROWS: usize = 8192;
/// Chip files read at once: each holds only its batch, so this bounds memory
/// and keeps a remote store's round trips overlapping.
const FILES_AT_ONCE: usize = 8;
/// Source items an item links to (`emb:source-data`), at most: a chip file
/// holds one task's scenes, usually a few; past this the item says
/// `rsembed:more_sources` instead of growing without bound.
pub(crate) const SOURCE_LINKS: usize = 100;

/// What the chips of one file cover: the union of their bboxes, and the range
/// of their acquisition times in microseconds since the epoch, UTC.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ChipSpan {
    /// Rows read.
    pub(crate) rows: u64,
    /// Union of the chips' `bbox`; `None` when no chip has a footprint.
    pub(crate) bbox: Option<[f64; 4]>,
    /// Earliest `datetime`.
    pub(crate) start: Option<i64>,
    /// Latest `end_datetime`, or `datetime` where a chip has no end.
    pub(crate) end: Option<i64>,
    /// Chips whose `datetime` is null.
    pub(crate) without_datetime: u64,
    /// The STAC items the chips came from: `source_uri` (the item's URL) to
    /// `item_id`, the first [`SOURCE_LINKS`] in URL order.
    pub(crate) sources: BTreeMap<String, String>,
    /// Whether there were more than [`SOURCE_LINKS`].
    pub(crate) more_sources: bool,
}

impl ChipSpan {
    fn add_bbox(&mut self, b: [f64; 4]) {
        self.bbox = Some(union(self.bbox, b));
    }

    fn add_source(&mut self, uri: &str, item_id: &str) {
        if self.sources.contains_key(uri) {
            return;
        }
        if self.sources.len() < SOURCE_LINKS {
            self.sources.insert(uri.to_owned(), item_id.to_owned());
        } else if self
            .sources
            .last_key_value()
            .is_some_and(|(k, _)| k.as_str() > uri)
        {
            // Keep the first SOURCE_LINKS in URL order, so the item does not
            // depend on the order of rows.
            self.sources.pop_last();
            self.sources.insert(uri.to_owned(), item_id.to_owned());
            self.more_sources = true;
        } else {
            self.more_sources = true;
        }
    }

    fn add_time(&mut self, start: i64, end: Option<i64>) {
        let end = end.unwrap_or(start).max(start);
        self.start = Some(self.start.map_or(start, |s| s.min(start)));
        self.end = Some(self.end.map_or(end, |e| e.max(end)));
    }

    /// Adds another span (the collection's extent over its items; the
    /// sources stay with the items).
    pub(crate) fn merge(&mut self, o: &ChipSpan) {
        self.rows += o.rows;
        if let Some(b) = o.bbox {
            self.add_bbox(b);
        }
        if let Some(s) = o.start {
            self.add_time(s, o.end);
        }
        self.without_datetime += o.without_datetime;
    }
}

fn union(a: Option<[f64; 4]>, b: [f64; 4]) -> [f64; 4] {
    match a {
        None => b,
        Some(a) => [
            a[0].min(b[0]),
            a[1].min(b[1]),
            a[2].max(b[2]),
            a[3].max(b[3]),
        ],
    }
}

/// What [`write()`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StacWritten {
    /// URL of `collection.json`.
    pub(crate) collection: String,
    /// Items written, one per chip file.
    pub(crate) items: u64,
    /// Items of tasks no longer in the manifest, removed.
    pub(crate) removed: u64,
}

/// Writes `<output>/stac/` for a finished job: an item per chip file of
/// `manifest`, then the collection, then removes items of other tasks.
/// Rerunning it writes the same documents.
pub(crate) async fn write(
    output: &Location,
    spec: &JobSpec,
    manifest: &Manifest,
) -> Result<StacWritten> {
    let ctx = Arc::new(Context::new(spec)?);
    let mut extent = ChipSpan::default();
    let mut ids = Vec::with_capacity(manifest.files.len());
    let mut data_type: Option<(String, String)> = None;
    let mut items = futures::stream::iter(manifest.files.iter().cloned())
        .map(|file| {
            let (output, ctx) = (output.clone(), ctx.clone());
            async move {
                let (span, dtype) = read_span(&output, &file).await?;
                let item = item(&ctx, &file, &span)?;
                put(&output, &format!("{ITEMS_DIR}{}.json", item.id), &item).await?;
                Ok::<_, Error>((item.id, file.path, span, dtype))
            }
        })
        .buffered(FILES_AT_ONCE);
    while let Some((id, path, span, dtype)) = items.try_next().await? {
        if let Some(t) = dtype {
            match &data_type {
                None => data_type = Some((t, path)),
                Some((first, first_path)) if *first != t => {
                    return Err(Error::Output(format!(
                        "{path} holds {t} embeddings and {first_path} {first}: \
                         one collection describes one embedding type"
                    )))
                }
                Some(_) => {}
            }
        }
        extent.merge(&span);
        // The collection covers what its items say, the processing time of
        // those without an acquisition time included.
        let (start, end, _) = times_of(&ctx, &span);
        extent.add_time(start, Some(end));
        ids.push(id);
    }
    drop(items);
    let dtype = data_type.map_or_else(|| "float32".to_owned(), |(t, _)| t);
    let collection = collection(&ctx, &ids, &extent, &dtype)?;
    put(output, COLLECTION_FILE, &collection).await?;
    let keep: HashSet<String> = ids
        .iter()
        .map(|id| format!("{ITEMS_DIR}{id}.json"))
        .chain([COLLECTION_FILE.to_owned()])
        .collect();
    let removed = remove_others(output, &keep).await?;
    Ok(StacWritten {
        collection: format!(
            "{}/{COLLECTION_FILE}",
            output.url.as_str().trim_end_matches('/')
        ),
        items: ids.len() as u64,
        removed,
    })
}

/// What every document of a job shares.
#[derive(Debug)]
pub(crate) struct Context {
    spec: JobSpec,
    /// The collection's id.
    id: String,
    /// `created_at` in microseconds: the processing time.
    created_us: i64,
}

impl Context {
    pub(crate) fn new(spec: &JobSpec) -> Result<Context> {
        let created_us = rfc3339_us(&spec.created_at).ok_or_else(|| {
            Error::Output(format!(
                "job.json: created_at `{}` is not an RFC 3339 time",
                spec.created_at
            ))
        })?;
        Ok(Context {
            spec: spec.clone(),
            id: format!("rsembed-{}", spec.job_id),
            created_us,
        })
    }
}

/// Reads the `bbox`, `datetime`, `end_datetime`, `item_id` and `source_uri`
/// columns of one chip file (schema 1 has none of the STAC ones), and the
/// type of its embeddings.
async fn read_span(output: &Location, file: &ManifestFile) -> Result<(ChipSpan, Option<String>)> {
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
    let mut stream = crate::query::index::guarded(
        builder
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(bad)?,
    );
    let mut span = ChipSpan::default();
    while let Some(batch) = stream.next().await {
        add_batch(&mut span, &batch.map_err(bad)?).map_err(|why| {
            Error::Output(format!(
                "{}: {why}",
                output.uri_of(&output.child(&file.path))
            ))
        })?;
    }
    Ok((span, dtype))
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

/// Adds one batch of the projected columns. A column of another type is an
/// error: a chip file that says something else than the schema is not
/// described by a guess.
pub(crate) fn add_batch(span: &mut ChipSpan, batch: &RecordBatch) -> Result<(), String> {
    span.rows += batch.num_rows() as u64;
    if let Some(c) = batch.column_by_name(col::BBOX) {
        let s = c
            .as_struct_opt()
            .ok_or_else(|| format!("`bbox` is {}, not a struct", c.data_type()))?;
        add_bboxes(span, s)?;
    }
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
    add_sources(span, batch)?;
    match start {
        // Schema 1: no chip has an acquisition time.
        None => span.without_datetime += batch.num_rows() as u64,
        Some(start) => {
            for i in 0..start.len() {
                if start.is_null(i) {
                    span.without_datetime += 1;
                    continue;
                }
                let e = end.as_ref().filter(|e| e.is_valid(i)).map(|e| e.value(i));
                span.add_time(start.value(i), e);
            }
        }
    }
    Ok(())
}

/// The STAC items of the batch's chips: rows with an `item_id`.
fn add_sources(span: &mut ChipSpan, batch: &RecordBatch) -> Result<(), String> {
    let (Some(ids), Some(uris)) = (
        batch.column_by_name(col::ITEM_ID),
        batch.column_by_name(col::SOURCE_URI),
    ) else {
        return Ok(());
    };
    let text = |name: &str, c: &ArrayRef| {
        c.as_string_opt::<i32>()
            .cloned()
            .ok_or_else(|| format!("`{name}` is {}, not Utf8", c.data_type()))
    };
    let (ids, uris) = (text(col::ITEM_ID, ids)?, text(col::SOURCE_URI, uris)?);
    for i in 0..ids.len() {
        if ids.is_valid(i) && uris.is_valid(i) {
            span.add_source(uris.value(i), ids.value(i));
        }
    }
    Ok(())
}

fn add_bboxes(span: &mut ChipSpan, s: &StructArray) -> Result<(), String> {
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
    for i in 0..s.len() {
        if s.is_null(i) || cols.iter().any(|c| c.is_null(i)) {
            continue;
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
        span.add_bbox(b);
    }
    Ok(())
}

/// The item of one chip file.
pub(crate) fn item(ctx: &Context, file: &ManifestFile, span: &ChipSpan) -> Result<Item> {
    let id = file
        .path
        .rsplit('/')
        .next()
        .and_then(|n| n.strip_suffix(".parquet"))
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            Error::Output(format!(
                "manifest: `{}` is not a chips/<task>.parquet path",
                file.path
            ))
        })?;
    let mut item = Item::new(id).collection(&ctx.id);
    item.extensions = vec![
        EMBEDDINGS_EXTENSION.to_owned(),
        PROCESSING_EXTENSION.to_owned(),
        FILE_EXTENSION.to_owned(),
    ];
    if let Some([x0, y0, x1, y1]) = span.bbox {
        let b = Bbox::new(x0, y0, x1, y1);
        item.geometry = Some(b.to_geometry());
        item.bbox = Some(b);
    }
    let p = &mut item.properties;
    let (start, end, source) = times_of(ctx, span);
    if start == end {
        p.datetime = Some(chrono_of(start)?);
    } else {
        p.datetime = None;
        p.start_datetime = Some(chrono_of(start)?);
        p.end_datetime = Some(chrono_of(end)?);
    }
    let f = &mut p.additional_fields;
    f.insert("rsembed:datetime_source".into(), source.into());
    if span.start.is_some() && span.without_datetime > 0 {
        f.insert(
            "rsembed:chips_without_datetime".into(),
            span.without_datetime.into(),
        );
    }
    f.insert("rsembed:chips".into(), span.rows.into());
    if span.more_sources {
        f.insert("rsembed:more_sources".into(), true.into());
    }
    f.insert(
        "processing:datetime".into(),
        serde_json::to_value(chrono_of(ctx.created_us)?)?,
    );
    f.insert(
        "emb:runtime_parameters".into(),
        serde_json::to_value(&ctx.spec.tiling)?,
    );

    let up = "../collection.json";
    for rel in ["root", "parent", "collection"] {
        item.links.push(Link::new(up, rel).r#type(JSON.to_owned()));
    }
    for (uri, id) in &span.sources {
        item.links.push(
            Link::new(uri, "emb:source-data")
                .r#type(GEOJSON.to_owned())
                .title(format!("source item {id}")),
        );
    }
    let mut asset = Asset::new(format!("../../{}", file.path)).role("data");
    asset.r#type = Some(PARQUET.to_owned());
    asset.title = Some(format!("chip embeddings ({} rows)", span.rows));
    asset
        .additional_fields
        .insert("file:size".into(), file.bytes.into());
    // Multihash: 0x12 is SHA2-256, 0x20 its 32-byte length.
    asset.additional_fields.insert(
        "file:checksum".into(),
        format!("1220{}", file.sha256).into(),
    );
    item.assets.insert("embeddings".into(), asset);
    Ok(item)
}

/// An item's (or the collection's) time range, and where it came from.
fn times_of(ctx: &Context, span: &ChipSpan) -> (i64, i64, &'static str) {
    match (span.start, span.end) {
        (Some(s), Some(e)) => (s, e, "acquisition"),
        (Some(s), None) => (s, s, "acquisition"),
        _ => (ctx.created_us, ctx.created_us, "processing"),
    }
}

/// The collection over the items `ids` whose chips `extent` covers.
pub(crate) fn collection(
    ctx: &Context,
    ids: &[String],
    extent: &ChipSpan,
    data_type: &str,
) -> Result<Collection> {
    let spec = &ctx.spec;
    let m = &spec.model;
    let mut c = Collection::new(
        &ctx.id,
        format!(
            "Chip embeddings of {} by the model {} ({} dimensions), one item per chip file; \
             made by {}, job {}.",
            spec.input, m.name, m.embed_dim, spec.software_version, spec.job_id
        ),
    );
    c.title = Some(format!("{} chip embeddings", m.name));
    c.extensions = vec![EMBEDDINGS_EXTENSION.to_owned()];
    c.extent.spatial.bbox = vec![match extent.bbox {
        Some([x0, y0, x1, y1]) => Bbox::new(x0, y0, x1, y1),
        // No chip has a footprint: the whole world is what is known.
        None => Bbox::new(-180.0, -90.0, 180.0, 90.0),
    }];
    let (start, end, _) = times_of(ctx, extent);
    c.extent.temporal.interval = vec![[Some(chrono_of(start)?), Some(chrono_of(end)?)]];

    let f = &mut c.additional_fields;
    f.insert("emb:type".into(), "chip".into());
    f.insert("emb:dimensions".into(), m.embed_dim.into());
    f.insert("data_type".into(), data_type.into());
    // How to get float32 values back from f16 or int8 files: the same
    // record as their `rsembed` metadata's `quantization`.
    if let Some(q) = data_type
        .parse::<EmbeddingType>()
        .ok()
        .and_then(|t| t.quantization())
    {
        f.insert(
            "emb:quantization".into(),
            serde_json::to_value(q).map_err(|e| Error::Output(e.to_string()))?,
        );
    }
    let t = &spec.tiling;
    f.insert(
        "emb:chip_layout".into(),
        json!({
            "layout_type": "regular_grid",
            "chip_size": [t.chip_size, t.chip_size],
            "stride": [t.stride, t.stride],
        }),
    );
    f.insert(
        "rsembed:model".into(),
        json!({
            "name": m.name,
            "sha256": m.sha256,
            "preprocessor_sha256": m.preprocessor_sha256,
            "fp16": m.fp16,
        }),
    );
    f.insert("rsembed:job_id".into(), spec.job_id.clone().into());
    f.insert("rsembed:chips".into(), extent.rows.into());

    c.item_assets.insert(
        "embeddings".into(),
        ItemAsset {
            title: Some("Chip embeddings".into()),
            description: Some(
                "rsembed chip rows (GeoParquet): footprint, source, and the embedding".into(),
            ),
            r#type: Some(PARQUET.into()),
            roles: vec!["data".into()],
            additional_fields: Map::new(),
        },
    );

    c.links
        .push(Link::new("./collection.json", "root").r#type(JSON.to_owned()));
    c.links.push(
        Link::new("../job.json", "emb:model")
            .r#type(JSON.to_owned())
            .title(format!(
                "{} (vision graph sha256 {}); job.json holds every model file's digest",
                m.name, m.sha256
            )),
    );
    c.links
        .push(source_link(&spec.input, spec.search.as_ref())?);
    for id in ids {
        c.links
            .push(Link::new(format!("./items/{id}.json"), "item").r#type(GEOJSON.to_owned()));
    }
    Ok(c)
}

/// `emb:source-data`: for a STAC API the search as a GET `/search` URL with
/// its parameters; else the input's URL (a catalog, an item collection, a
/// folder of images). The search as flags gave it rides along in
/// `rsembed:search`, since `--max-items` has no URL form.
pub(crate) fn source_link(input: &str, search: Option<&StacSearch>) -> Result<Link> {
    let Some(s) = search else {
        return Ok(Link::new(input, "emb:source-data").title("the job's input".to_owned()));
    };
    let mut link = match search_url(input, s) {
        Some(url) => Link::new(url, "emb:source-data")
            .r#type(GEOJSON.to_owned())
            .title("the STAC API search whose items this job embedded".to_owned()),
        None => Link::new(input, "emb:source-data")
            .title("the STAC input whose items this job embedded".to_owned()),
    };
    link.additional_fields
        .insert("rsembed:search".into(), serde_json::to_value(s)?);
    Ok(link)
}

/// The GET `/search` URL of a search of the API rooted at `input`; `None`
/// when `input` names a document (a catalog, collection or item collection)
/// rather than an API root.
pub(crate) fn search_url(input: &str, s: &StacSearch) -> Option<String> {
    let mut url = url::Url::parse(input).ok()?;
    if !matches!(url.scheme(), "http" | "https") {
        return None;
    }
    let last = url.path_segments()?.rev().find(|p| !p.is_empty());
    let document = [".json", ".ndjson", ".parquet", ".geoparquet"];
    if last.is_some_and(|l| document.iter().any(|d| l.to_ascii_lowercase().ends_with(d))) {
        return None;
    }
    let path = format!("{}/search", url.path().trim_end_matches('/'));
    url.set_path(&path);
    let mut filter = s.filter.clone();
    if let Some(pct) = s.cloud_cover_max {
        let cc = format!("\"eo:cloud_cover\" <= {pct}");
        filter = Some(match filter {
            Some(f) => format!("({f}) AND {cc}"),
            None => cc,
        });
    }
    {
        let mut q = url.query_pairs_mut();
        if !s.collections.is_empty() {
            q.append_pair("collections", &s.collections.join(","));
        }
        if let Some(b) = s.bbox {
            q.append_pair("bbox", &format!("{},{},{},{}", b[0], b[1], b[2], b[3]));
        }
        if let Some(d) = &s.datetime {
            q.append_pair("datetime", d);
        }
        if !s.ids.is_empty() {
            q.append_pair("ids", &s.ids.join(","));
        }
        if let Some(f) = &filter {
            q.append_pair("filter", f)
                .append_pair("filter-lang", "cql2-text");
        }
    }
    Some(url.into())
}

/// Microseconds since the epoch of an RFC 3339 time.
fn rfc3339_us(s: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1000).ok()
}

/// A time for the `stac` types, which hold chrono's.
fn chrono_of(us: i64) -> Result<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp_micros(us)
        .ok_or_else(|| Error::Output(format!("a chip's datetime ({us} µs) is out of range")))
}

/// Writes `v` as pretty JSON at `rel` of the output.
async fn put<T: serde::Serialize>(output: &Location, rel: &str, v: &T) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(v)?;
    output
        .store
        .put(&output.child(rel), PutPayload::from(bytes))
        .await?;
    Ok(())
}

/// Deletes what `stac/` holds besides `keep`: items of tasks an earlier run
/// had. Returns how many went.
async fn remove_others(output: &Location, keep: &HashSet<String>) -> Result<u64> {
    let root = output.prefix.as_ref().to_owned();
    let mut stale = Vec::new();
    let mut list = output.store.list(Some(&output.child(STAC_DIR)));
    while let Some(meta) = list.next().await {
        let meta = meta?;
        let full = meta.location.as_ref();
        let rel = full
            .strip_prefix(&root)
            .unwrap_or(full)
            .trim_start_matches('/');
        if !keep.contains(rel) {
            stale.push(meta.location);
        }
    }
    drop(list);
    let n = stale.len() as u64;
    for p in stale {
        tracing::info!(file = %p, "removing a STAC item of no chip file of the job");
        output.store.delete(&p).await?;
    }
    Ok(n)
}

#[cfg(test)]
#[path = "out_tests.rs"]
mod tests;
