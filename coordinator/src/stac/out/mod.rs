//! A finished job as STAC: `<output>/stac/collection.json`, a STAC 1.1.0
//! Collection with the embeddings extension (proposal), over one Item per
//! chip file, each with an `embeddings` asset that points at its
//! `chips/<task>.parquet` by a relative href. Every item is a row of
//! `stac/items.parquet` (stac-geoparquet, an asset of the collection); up to
//! `JSON_ITEMS_MAX` (10 000) chip files each is also a JSON document under
//! `stac/items/`, linked from the collection.
//!
//! - `mod.rs` writes the documents from a stream of chip files: items first
//!   (JSON as they come, the Parquet file completed after the last), then the
//!   collection, then removes what else `stac/` holds, so a reader never sees
//!   a collection that links an item not yet there. It holds about a
//!   thousand items at a time (built on the runtime's threads), a row group
//!   of the Parquet file, and the JSON items' ids (at most
//!   `JSON_ITEMS_MAX`), whatever the number of files;
//! - `item.rs` builds the item of one chip file and the collection;
//! - `geoparquet.rs` writes the items as stac-geoparquet, whose rows
//!   `rows.rs` builds as Arrow columns from the same facts as `item.rs`;
//! - `link.rs` builds the collection's `emb:source-data` link: the search as
//!   it was sent, and what rsembed filtered itself;
//! - `read.rs` reads what a chip file of an older version did not record.
//!
//! Each item is built from its file's [`FileExtent`] (the outline of its
//! chips, their time range and source items), which the worker recorded on
//! the file's manifest entry, so no chip file is opened: the cost is the
//! file list's, whatever the chips. A file without one (written by an older
//! version) is read instead, one at a time and only in its `bbox`,
//! `datetime`, `end_datetime`, `item_id` and `source_uri` columns.
//!
//! Datetimes: an item's range covers its chips' `datetime`..`end_datetime`.
//! Chips without one (schema 1 files, inputs that are not STAC items) give
//! the job's `created_at` instead, and the item says so in
//! `rsembed:datetime_source` = `processing` (docs/decisions.md, "STAC out").

mod geoparquet;
mod item;
mod link;
mod read;
mod rows;

use std::collections::HashSet;
use std::sync::Arc;

use futures::{Stream, StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, PutPayload};
use rsembed_schemas::embedding::EmbeddingType;
use rsembed_schemas::extent::FileExtent;
use rsembed_schemas::job::{JobSpec, ManifestFile};
use rsembed_worker::store::Location;

use crate::error::{Error, Result};

use geoparquet::link_items_parquet;
use geoparquet::ItemsParquet;
pub(crate) use geoparquet::ITEMS_PARQUET;
use item::{collection, item, runtime_params};
use rows::Row;

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

/// Files whose items one spawned task builds, one after another (a task
/// per file spent a fifth of the time switching), and such tasks at once:
/// about a thousand items in flight.
const FILES_PER_TASK: usize = 256;
const TASKS_AT_ONCE: usize = 4;

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

/// Chip files up to which each item is also a JSON document under
/// `stac/items/`, linked from the collection; past it the items are only in
/// `stac/items.parquet` (docs/decisions.md, "STAC out at scale").
pub(crate) const JSON_ITEMS_MAX: u64 = 10_000;

/// Items per row group of `stac/items.parquet`: the writer holds one group
/// being encoded (about 20 MiB at this size), and the footer an entry per
/// group (about 5 KiB).
const ITEMS_PER_GROUP: usize = 32_768;

/// The two sizes [`write()`] works with; tests lower them.
#[derive(Debug, Clone, Copy)]
struct Limits {
    json_items: u64,
    items_per_group: usize,
}

const LIMITS: Limits = Limits {
    json_items: JSON_ITEMS_MAX,
    items_per_group: ITEMS_PER_GROUP,
};

/// What [`write()`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StacWritten {
    /// URL of `collection.json`.
    pub(crate) collection: String,
    /// Items written, one per chip file, all in `stac/items.parquet`.
    pub(crate) items: u64,
    /// Whether each item is also a JSON document under `stac/items/`.
    pub(crate) json_items: bool,
    /// Objects of `stac/` the job no longer has (items of tasks an earlier
    /// run had, or every JSON item once the job is past
    /// [`JSON_ITEMS_MAX`]), removed.
    pub(crate) removed: u64,
}

/// Writes `<output>/stac/` for a finished job from its chip files, given as
/// a stream (`count` of them, when known): every item into
/// `stac/items.parquet`, and up to [`JSON_ITEMS_MAX`] files each item as
/// JSON too; then the collection; then removes what else `stac/` holds.
/// Memory does not grow with the number of files. Rerunning it writes the
/// same documents.
pub(crate) async fn write<S>(
    output: &Location,
    spec: &JobSpec,
    files: S,
    count: Option<u64>,
) -> Result<StacWritten>
where
    S: Stream<Item = Result<ManifestFile>> + Send + Unpin,
{
    write_with(output, spec, files, count, LIMITS).await
}

/// Chip files the feed holds before its sender waits for the writer.
const FEED_QUEUE: usize = 4096;

/// [`write()`] run beside another pass over a job's chip files: each file
/// given to the feed goes to a spawned writer, so building and encoding the
/// items takes another thread while the caller writes the file list.
pub(crate) struct StacFeed {
    tx: tokio::sync::mpsc::Sender<Result<ManifestFile>>,
    writer: Spawned<Result<StacWritten>>,
}

impl StacFeed {
    /// Starts the writer for `count` chip files (when known).
    pub(crate) fn start(output: &Location, spec: &JobSpec, count: Option<u64>) -> StacFeed {
        let (tx, mut rx) = tokio::sync::mpsc::channel(FEED_QUEUE);
        let (output, spec) = (output.clone(), spec.clone());
        let writer = Spawned(tokio::spawn(async move {
            let files = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
            write(&output, &spec, files, count).await
        }));
        StacFeed { tx, writer }
    }

    /// The next chip file. A writer that stopped says why at [`StacFeed::finish`].
    pub(crate) async fn file(&self, file: &ManifestFile) {
        let _ = self.tx.send(Ok(file.clone())).await;
    }

    /// Waits for the writer, once every file is given.
    pub(crate) async fn finish(self) -> Result<StacWritten> {
        drop(self.tx);
        self.writer.await
    }

    /// Stops the writer with `why`: it removes what it started and writes
    /// no collection.
    pub(crate) async fn abort(self, why: &str) {
        let _ = self.tx.send(Err(Error::Output(why.to_owned()))).await;
        drop(self.tx);
        let _ = self.writer.await;
    }
}

async fn write_with<S>(
    output: &Location,
    spec: &JobSpec,
    files: S,
    count: Option<u64>,
    limits: Limits,
) -> Result<StacWritten>
where
    S: Stream<Item = Result<ManifestFile>> + Send + Unpin,
{
    let ctx = Arc::new(Context::new(spec)?);
    let mut parquet = ItemsParquet::create(output, &ctx, limits.items_per_group)?;
    let described = match describe(output, &ctx, files, count, limits, &mut parquet).await {
        Ok(d) => d,
        Err(e) => {
            parquet.abort().await;
            return Err(e);
        }
    };
    let mut collection = match collection(
        &ctx,
        described.ids.as_deref().unwrap_or_default(),
        &described.totals,
        &described.data_type,
    ) {
        Ok(c) => c,
        Err(e) => {
            parquet.abort().await;
            return Err(e);
        }
    };
    // The file's own copy of the collection does not point at the file.
    let written = parquet.finish(&collection, described.totals.bbox).await?;
    link_items_parquet(&mut collection, &written);
    put(output, COLLECTION_FILE, &collection).await?;
    let mut keep: HashSet<String> = [COLLECTION_FILE, ITEMS_PARQUET].map(str::to_owned).into();
    let json_items = described.ids.is_some();
    keep.extend(
        described
            .ids
            .into_iter()
            .flatten()
            .map(|id| format!("{ITEMS_DIR}{id}.json")),
    );
    let removed = remove_others(output, keep).await?;
    Ok(StacWritten {
        collection: format!(
            "{}/{COLLECTION_FILE}",
            output.url.as_str().trim_end_matches('/')
        ),
        items: written.rows,
        json_items,
        removed,
    })
}

/// What the items say about the collection.
struct Described {
    /// The JSON items' ids, in order; `None` past the limit.
    ids: Option<Vec<String>>,
    totals: Totals,
    data_type: String,
}

/// Builds each file's item (8 at once), puts it as JSON while the job is
/// within `limits.json_items`, adds it to `parquet` in stream order, and
/// folds what the collection needs.
async fn describe<S>(
    output: &Location,
    ctx: &Arc<Context>,
    files: S,
    count: Option<u64>,
    limits: Limits,
    parquet: &mut ItemsParquet,
) -> Result<Described>
where
    S: Stream<Item = Result<ManifestFile>> + Send + Unpin,
{
    // A count known to be past the limit writes no JSON item at all; an
    // unknown one writes them until the stream passes the limit, and those
    // written are removed with the other stale items.
    let json_max = match count {
        Some(n) if n > limits.json_items => 0,
        _ => limits.json_items,
    };
    let mut ids = (json_max > 0).then(Vec::new);
    let mut totals = Totals::default();
    let (mut n, mut files_read) = (0u64, 0u64);
    let job_type = data_type_name(ctx.spec.tiling.embedding_type);
    let mut data_type: Option<(String, String)> = None;
    let mut built = files
        .chunks(FILES_PER_TASK)
        .enumerate()
        .map(|(c, chunk)| {
            let (output, ctx) = (output.clone(), ctx.clone());
            let first = (c * FILES_PER_TASK) as u64;
            // On the runtime's threads, a chunk of files to a task: building
            // and flattening items is most of the work per file.
            Spawned(tokio::spawn(async move {
                futures::stream::iter(chunk.into_iter().zip(first..))
                    .map(|(file, i)| build(&output, &ctx, file, i < json_max))
                    .buffered(FILES_AT_ONCE / TASKS_AT_ONCE)
                    .try_collect::<Vec<Built>>()
                    .await
            }))
        })
        .buffered(TASKS_AT_ONCE);
    while let Some(chunk) = built.try_next().await? {
        for b in chunk {
            n += 1;
            files_read += u64::from(b.read);
            // Files whose extent was recorded hold the job's type; only
            // files read say theirs.
            let t = b.data_type.unwrap_or_else(|| job_type.clone());
            match &data_type {
                None => data_type = Some((t, b.path)),
                Some((first, first_path)) if *first != t => {
                    return Err(Error::Output(format!(
                        "{} holds {t} embeddings and {first_path} {first}: \
                         one collection describes one embedding type",
                        b.path
                    )))
                }
                Some(_) => {}
            }
            totals.add(b.rows, b.bbox, b.times);
            if n > json_max {
                ids = None;
            } else if let Some(ids) = ids.as_mut() {
                ids.push(b.row.id().to_owned());
            }
            parquet.add(b.row).await?;
        }
    }
    drop(built);
    if files_read > 0 {
        tracing::info!(
            files_read,
            "chip files of an older rsembed read for their STAC items (their records hold no extent)"
        );
    }
    if let Some(c) = count.filter(|&c| c != n) {
        tracing::warn!(
            expected = c,
            files = n,
            "the job's file list gave another number of chip files than it said"
        );
    }
    Ok(Described {
        ids,
        totals,
        data_type: data_type.map_or(job_type, |(t, _)| t),
    })
}

/// One chip file's item, built, and what the collection takes from it.
struct Built {
    row: Row,
    path: String,
    rows: u64,
    bbox: Option<[f64; 4]>,
    /// The item's time range, the processing time for an item without an
    /// acquisition time: the collection covers what its items say.
    times: (i64, i64),
    /// The embedding type a chip file that had to be read holds.
    data_type: Option<String>,
    read: bool,
}

/// Builds the item of `file` (reading the chip file when its record holds no
/// usable extent), puts it as JSON if `json`, and flattens it into a row.
async fn build(
    output: &Location,
    ctx: &Context,
    file: Result<ManifestFile>,
    json: bool,
) -> Result<Built> {
    let file = file?;
    let recorded = file.extent.clone().filter(|e| match e.check() {
        Ok(()) => true,
        Err(why) => {
            tracing::warn!(path = %file.path, %why, "the recorded extent is not usable: reading the chip file");
            false
        }
    });
    let (extent, data_type, read) = match recorded {
        Some(e) => (e, None, false),
        None => {
            let (e, t) = read::read_extent(output, &file).await?;
            (e, t, true)
        }
    };
    if json {
        let item = item(ctx, &file, &extent)?;
        put(output, &format!("{ITEMS_DIR}{}.json", item.id), &item).await?;
    }
    let (start, end, _) = times_of(ctx, &extent);
    let (path, rows) = (file.path.clone(), file.rows);
    let row = Row::new(ctx, file, extent)?;
    Ok(Built {
        bbox: row.bbox(),
        row,
        path,
        rows,
        times: (start, end),
        data_type,
        read,
    })
}

/// A spawned task, aborted when dropped (a write that fails leaves none
/// running); a panic in it goes on in the caller.
struct Spawned<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Spawned<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> std::future::Future for Spawned<T> {
    type Output = T;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<T> {
        std::pin::Pin::new(&mut self.0)
            .poll(cx)
            .map(|done| match done {
                Ok(v) => v,
                // Only a dropped `Spawned` is aborted, and it is not polled then.
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            })
    }
}

/// What every document of a job shares.
#[derive(Debug)]
pub(crate) struct Context {
    spec: JobSpec,
    /// The collection's id.
    id: String,
    /// `created_at` in microseconds: the processing time.
    created_us: i64,
    /// Every item's `emb:runtime_parameters`.
    runtime_params: serde_json::Value,
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
            runtime_params: runtime_params(spec)?,
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

/// Deletes what `stac/` holds besides `keep` as the listing goes (so an
/// earlier run's items, however many, are never held at once). Returns how
/// many went.
async fn remove_others(output: &Location, keep: HashSet<String>) -> Result<u64> {
    let root = output.prefix.as_ref().to_owned();
    let stale = output
        .store
        .list(Some(&output.child(STAC_DIR)))
        .try_filter(move |meta| {
            let full = meta.location.as_ref();
            let rel = full
                .strip_prefix(&root)
                .unwrap_or(full)
                .trim_start_matches('/');
            futures::future::ready(!keep.contains(rel))
        })
        .map_ok(|meta| {
            tracing::debug!(file = %meta.location, "removing a STAC document of no chip file of the job");
            meta.location
        })
        .boxed();
    let mut deleted = output.store.delete_stream(stale);
    let mut n = 0;
    while deleted.try_next().await?.is_some() {
        n += 1;
    }
    if n > 0 {
        tracing::info!(
            removed = n,
            "removed STAC documents of no chip file of the job"
        );
    }
    Ok(n)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_geoparquet;
