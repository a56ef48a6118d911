//! A finished job as STAC: `<output>/stac/collection.json`, a STAC 1.1.0
//! Collection with the embeddings extension (proposal), and one Item per chip
//! file under `stac/items/`, each with an `embeddings` asset that points at
//! its `chips/<task>.parquet` by a relative href.
//!
//! - `mod.rs` writes the documents: items first, then the collection, then
//!   removes items of tasks no longer in the manifest, so a reader never sees
//!   a collection that links an item not yet there;
//! - `item.rs` builds the item of one chip file and the collection;
//! - `link.rs` builds the collection's `emb:source-data` link: the search as
//!   it was sent, and what rsembed filtered itself;
//! - `read.rs` reads what a chip file of an older version did not record.
//!
//! Each item is built from its file's [`FileExtent`] (the outline of its
//! chips, their time range and source items), which the worker recorded on
//! the file's manifest entry, so no chip file is opened: the cost is the
//! manifest's, whatever the chips. A file without one (written by an older
//! version) is read instead, one at a time and only in its `bbox`,
//! `datetime`, `end_datetime`, `item_id` and `source_uri` columns.
//!
//! Datetimes: an item's range covers its chips' `datetime`..`end_datetime`.
//! Chips without one (schema 1 files, inputs that are not STAC items) give
//! the job's `created_at` instead, and the item says so in
//! `rsembed:datetime_source` = `processing` (docs/decisions.md, "STAC out").

mod item;
mod link;
mod read;

use std::collections::HashSet;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, PutPayload};
use rsembed_schemas::embedding::EmbeddingType;
use rsembed_schemas::extent::FileExtent;
use rsembed_schemas::job::{JobSpec, Manifest};
use rsembed_worker::store::Location;

use crate::error::{Error, Result};

use item::{collection, item};

/// The folder of the output that holds the STAC documents.
pub(crate) const STAC_DIR: &str = "stac/";
/// The collection, relative to the output.
pub(crate) const COLLECTION_FILE: &str = "stac/collection.json";
/// The items' folder, relative to the output.
const ITEMS_DIR: &str = "stac/items/";

/// The embeddings extension (proposal) the collection and items implement.
pub(crate) const EMBEDDINGS_EXTENSION: &str =
    "https://stac-extensions.github.io/embeddings/v0.0.1/schema.json";

const PARQUET: &str = "application/vnd.apache.parquet";
const GEOJSON: &str = "application/geo+json";
const JSON: &str = "application/json";

/// Items built at once: each is a small document, and a file without a
/// recorded extent holds only its read batch, so this bounds memory and
/// keeps a remote store's round trips overlapping.
const FILES_AT_ONCE: usize = 8;

/// What the collection covers: the union of its items'.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Totals {
    /// Chip rows.
    pub(crate) rows: u64,
    /// Union of the items' bboxes; `None` when no chip has a footprint.
    pub(crate) bbox: Option<[f64; 4]>,
    /// Earliest time, µs since the epoch, UTC.
    pub(crate) start: Option<i64>,
    /// Latest time.
    pub(crate) end: Option<i64>,
}

impl Totals {
    fn add(&mut self, rows: u64, bbox: Option<[f64; 4]>, (start, end): (i64, i64)) {
        self.rows += rows;
        if let Some(b) = bbox {
            self.bbox = Some(match self.bbox {
                None => b,
                Some(a) => [
                    a[0].min(b[0]),
                    a[1].min(b[1]),
                    a[2].max(b[2]),
                    a[3].max(b[3]),
                ],
            });
        }
        self.start = Some(self.start.map_or(start, |s| s.min(start)));
        self.end = Some(self.end.map_or(end, |e| e.max(end)));
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
    let mut totals = Totals::default();
    let files = crate::job::manifest::chip_files(output, manifest).await?;
    let mut ids = Vec::with_capacity(files.len());
    let mut files_read = 0;
    let job_type = data_type_name(spec.tiling.embedding_type);
    let mut data_type: Option<(String, String)> = None;
    let mut items = futures::stream::iter(files)
        .map(|file| {
            let (output, ctx) = (output.clone(), ctx.clone());
            async move {
                let recorded = file.extent.clone().filter(|e| match e.check() {
                    Ok(()) => true,
                    Err(why) => {
                        tracing::warn!(path = %file.path, %why, "the recorded extent is not usable: reading the chip file");
                        false
                    }
                });
                let (extent, dtype, read) = match recorded {
                    Some(e) => (e, None, false),
                    None => {
                        let (e, t) = read::read_extent(&output, &file).await?;
                        (e, t, true)
                    }
                };
                let item = item(&ctx, &file, &extent)?;
                put(&output, &format!("{ITEMS_DIR}{}.json", item.id), &item).await?;
                Ok::<_, Error>((item.id, file.path, file.rows, extent, dtype, read))
            }
        })
        .buffered(FILES_AT_ONCE);
    while let Some((id, path, rows, extent, dtype, read)) = items.try_next().await? {
        files_read += u64::from(read);
        // Files whose extent was recorded hold the job's type; only files
        // read say theirs.
        let t = dtype.unwrap_or_else(|| job_type.clone());
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
        // The collection covers what its items say, the processing time of
        // those without an acquisition time included.
        let (start, end, _) = times_of(&ctx, &extent);
        totals.add(rows, extent.bbox(), (start, end));
        ids.push(id);
    }
    drop(items);
    if files_read > 0 {
        tracing::info!(
            files_read,
            "chip files of an older rsembed read for their STAC items (their records hold no extent)"
        );
    }
    let dtype = data_type.map_or(job_type, |(t, _)| t);
    let collection = collection(&ctx, &ids, &totals, &dtype)?;
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

/// The STAC common-metadata `data_type` of an embedding type.
fn data_type_name(t: EmbeddingType) -> String {
    match t {
        EmbeddingType::F32 => "float32",
        EmbeddingType::F16 => "float16",
        EmbeddingType::Int8 => "int8",
    }
    .to_owned()
}

/// An item's time range, and where it came from.
fn times_of(ctx: &Context, e: &FileExtent) -> (i64, i64, &'static str) {
    match (e.start, e.end) {
        (Some(s), Some(e)) => (s, e, "acquisition"),
        (Some(s), None) => (s, s, "acquisition"),
        _ => (ctx.created_us, ctx.created_us, "processing"),
    }
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
mod tests;
