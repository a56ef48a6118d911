//! Reading a dataset as an index: its chip files, their footers, row-group
//! pruning by the `bbox` statistics, and streams of selected columns.
//!
//! An index is a job's output or a compacted dataset (a folder with `chips/`
//! and, once finished, `manifest.json`), or a single Parquet file. The
//! manifest, when there is one, names the files: a reader then sees exactly
//! the finished dataset, never a half-written compaction or a stray file.

use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;

use arrow_array::{Array, RecordBatch};
use arrow_schema::SchemaRef;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions, RowSelection};
use parquet::arrow::async_reader::ParquetRecordBatchStream;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use rsembed_schemas::chip::{col, embedding_type_from};
use rsembed_schemas::embedding::{EmbeddingType, SCALE_COLUMN};
use rsembed_schemas::job::Manifest;
use rsembed_schemas::meta::{FileMeta, RSEMBED_KEY};
use rsembed_store::{Location, StoreCache};

use super::footer::{Footers, GroupStats, StatsColumns};
use super::pages::{self, Chunk};
use crate::io::{Reads, StoreReader, CACHE_BYTES};
use crate::{Error, Result};

/// Footers read at once when an index opens.
const FOOTER_CONCURRENCY: usize = 16;

/// Rows decoded per batch: bounds the memory of one row group's stream
/// whatever row-group size a foreign writer chose. Small enough (2 MiB of
/// embeddings at D = 1024) that glibc serves the decode buffers from its
/// heap: at 4096 rows each 16 MiB buffer was a fresh mmap, and page faults
/// took 40 % of a search (docs/benchmarks.md).
pub const SCAN_BATCH_ROWS: usize = 512;

/// One chip file of an index.
#[derive(Debug, Clone)]
pub struct Part {
    /// Object path in the index's store.
    pub path: Path,
    /// Its URI, for messages.
    pub uri: String,
    /// Size in bytes.
    pub size: u64,
    /// Its Arrow schema.
    pub schema: SchemaRef,
    /// Rows in the file.
    rows: u64,
    /// What its footer says of each row group; the footer itself is in
    /// [`Index`]'s [`Footers`] while it is read.
    pub groups: Box<[GroupStats]>,
    /// Its `rsembed` metadata, when it has one.
    pub file_meta: Option<FileMeta>,
}

pub use super::GroupRef;

/// What pruning kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Pruning {
    /// Row groups in the index.
    pub groups_total: usize,
    /// Row groups that may hold matching rows (read).
    pub groups_kept: usize,
    /// Rows in the index.
    pub rows_total: u64,
    /// Rows in the kept row groups.
    pub rows_kept: u64,
}

/// An opened index.
#[derive(Debug, Clone)]
pub struct Index {
    /// Where it is; part paths are in this location's store.
    pub root: Location,
    /// Its chip files, in a stable order (the manifest's, else by path).
    pub parts: Vec<Part>,
    /// `manifest.json`, when the index has one.
    pub manifest: Option<Manifest>,
    /// Embedding dimension, equal in every part.
    pub embed_dim: usize,
    /// How its parts' bytes are read, and how many were.
    reads: Reads,
    /// The parsed footers held.
    footers: Arc<Footers>,
}

impl Index {
    /// Opens the index at `url` and reads every part's footer, holding up
    /// to `footer_budget` row groups' footers beyond those being read
    /// ([`super::footer::FOOTER_BUDGET_GROUPS`] unless a caller has
    /// reason to hold more).
    pub async fn open(stores: &StoreCache, url: &str, footer_budget: usize) -> Result<Index> {
        let loc = stores.location(url)?;
        let (root, listed, manifest) = if url.trim_end_matches('/').ends_with(".parquet") {
            let head = loc.store.head(&loc.prefix).await?;
            (loc.clone(), vec![(head.location, head.size)], None)
        } else {
            list_parts(stores, &loc).await?
        };
        if listed.is_empty() {
            return Err(Error::dataset(
                &loc.url,
                "no chip files (expected chips/*.parquet under it, or a .parquet file)",
            ));
        }
        let store = root.store.clone();
        let reads = Reads::new(&root);
        let footers = Arc::new(Footers::new(footer_budget));
        let parts: Vec<Part> = futures::stream::iter(listed.into_iter().enumerate())
            .map(|(i, (path, size))| {
                let store = store.clone();
                let uri = root.uri_of(&path);
                let (reads, footers) = (reads.clone(), footers.clone());
                async move {
                    let (part, footer) = open_part(store, path, uri, size, &reads).await?;
                    footers.offer(i, &footer);
                    Ok::<_, Error>(part)
                }
            })
            .buffered(FOOTER_CONCURRENCY)
            .try_collect()
            .await?;
        let embed_dim = parts[0].embed_dim()?;
        for p in &parts[1..] {
            let d = p.embed_dim()?;
            if d != embed_dim {
                return Err(Error::dataset(
                    &p.uri,
                    format!(
                        "embedding dimension {d}, but {} has {embed_dim}: an index holds one model's embeddings",
                        parts[0].uri
                    ),
                ));
            }
        }
        let models: std::collections::BTreeSet<&str> = parts
            .iter()
            .filter_map(|p| p.file_meta.as_ref())
            .map(|m| m.model_sha256.as_str())
            .collect();
        if models.len() > 1 {
            return Err(Error::dataset(
                &root.url,
                format!(
                    "its files were embedded by {} different models (vision graph sha256 {}); \
                     their embeddings are not comparable",
                    models.len(),
                    models.into_iter().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        Ok(Index {
            root,
            parts,
            manifest,
            embed_dim,
            reads,
            footers,
        })
    }

    /// Keeps up to [`CACHE_BYTES`] of the column chunks it reads from now
    /// on: for a resident search, which reads the same lists again and again.
    pub fn keep_chunks(&mut self) {
        self.reads.keep_chunks(CACHE_BYTES);
    }

    /// An error naming a file that was cut short since the last call while
    /// chunks kept of it were read: what a search made of them is not to be
    /// trusted.
    pub fn check_files(&self) -> Result<()> {
        if let Some(p) = self.reads.shrunk() {
            return Err(Error::dataset(
                &self.parts[p].uri,
                "the file shrank while it was being searched: it was rewritten or \
                 truncated under the search; search it again once it is whole",
            ));
        }
        Ok(())
    }

    /// The model name and sha256 recorded in the files, when they say.
    pub fn model(&self) -> Option<(&str, &str)> {
        self.parts
            .iter()
            .find_map(|p| p.file_meta.as_ref())
            .map(|m| (m.model_name.as_str(), m.model_sha256.as_str()))
    }

    /// Bytes fetched from the store so far, footers included.
    pub fn bytes_read(&self) -> u64 {
        self.reads.bytes_read()
    }

    /// Total rows.
    pub fn rows(&self) -> u64 {
        self.parts.iter().map(|p| p.rows()).sum()
    }

    /// The row groups that may hold a chip whose bbox intersects `bbox`
    /// (all of them without one), judged from the `bbox` column statistics
    /// only: nothing but the footers is read.
    pub fn row_groups(&self, bbox: Option<[f64; 4]>) -> (Vec<GroupRef>, Pruning) {
        let mut kept = Vec::new();
        let mut p = Pruning::default();
        for (pi, part) in self.parts.iter().enumerate() {
            for (gi, g) in part.groups.iter().enumerate() {
                let rows = g.rows;
                p.groups_total += 1;
                p.rows_total += rows;
                let keep = match (bbox, &g.bbox) {
                    (Some(b), Some(s)) => s.may_intersect(b),
                    _ => true,
                };
                if keep {
                    p.groups_kept += 1;
                    p.rows_kept += rows;
                    kept.push(GroupRef {
                        part: pi,
                        row_group: gi,
                    });
                }
            }
        }
        (kept, p)
    }

    /// The parsed footer of part `pi`: held, or read again. A footer that
    /// no longer matches the row groups the index opened with is an error:
    /// the file was rewritten under the search.
    async fn footer(&self, pi: usize) -> Result<ArrowReaderMetadata> {
        let part = &self.parts[pi];
        let load = async {
            tracing::debug!(target: crate::LOG, part = %part.uri, groups = part.groups.len(), "footer read again: not held");
            let meta = load_footer(&mut self.reader(part), &part.uri).await?;
            let groups = meta.metadata().row_groups();
            let same = groups.len() == part.groups.len()
                && groups
                    .iter()
                    .zip(part.groups.iter())
                    .all(|(rg, s)| rg.num_rows().max(0) as u64 == s.rows);
            if !same {
                return Err(Error::dataset(
                    &part.uri,
                    "its row groups changed since the index was opened: the file was rewritten",
                ));
            }
            Ok(meta)
        };
        self.footers.get(pi, part.groups.len(), load).await
    }

    /// The `embedding` column chunk of row group `g`, fetched, for reading
    /// its pages in place ([`super::pages`]); or why it cannot be
    /// (judged from the footer, before anything is fetched).
    pub async fn embedding_chunk(
        &self,
        g: GroupRef,
        ty: EmbeddingType,
    ) -> Result<std::result::Result<Chunk, String>> {
        let part = &self.parts[g.part];
        let meta = self.footer(g.part).await?;
        let md = meta.metadata();
        let mut leaves = md
            .file_metadata()
            .schema_descr()
            .columns()
            .iter()
            .enumerate()
            .filter(|(_, c)| c.path().parts().first().map(String::as_str) == Some(col::EMBEDDING));
        let (Some((leaf, _)), None) = (leaves.next(), leaves.next()) else {
            return Ok(Err("not one leaf column".into()));
        };
        let Some(rg) = md.row_groups().get(g.row_group) else {
            return Ok(Err("no such row group".into()));
        };
        let chunk = rg.column(leaf);
        if let Err(why) = pages::check(chunk, ty) {
            return Ok(Err(why));
        }
        let (start, len) = chunk.byte_range();
        if start.checked_add(len).is_none_or(|end| end > part.size) {
            return Ok(Err("a column chunk past the end of the file".into()));
        }
        let data = self.fetch(g.part, start, start + len).await?;
        Ok(Ok(Chunk {
            data,
            meta: chunk.clone(),
            rows: part.group_rows(g.row_group),
        }))
    }

    /// The chunks of the flat top-level columns `names` of row group `g`,
    /// fetched in as few reads as their places allow (neighbours less than
    /// 64 KiB apart are read as one); or why they cannot be read so.
    pub async fn flat_chunks(
        &self,
        g: GroupRef,
        names: &[&str],
    ) -> Result<std::result::Result<Vec<Chunk>, String>> {
        const GAP: u64 = 64 << 10;
        let part = &self.parts[g.part];
        let meta = self.footer(g.part).await?;
        let md = meta.metadata();
        let Some(rg) = md.row_groups().get(g.row_group) else {
            return Ok(Err("no such row group".into()));
        };
        let columns = md.file_metadata().schema_descr().columns();
        let mut want = Vec::with_capacity(names.len());
        for name in names {
            let Some(leaf) = columns.iter().position(|c| c.path().parts() == [*name]) else {
                return Ok(Err(format!("no flat column {name}")));
            };
            let chunk = rg.column(leaf);
            let (start, len) = chunk.byte_range();
            if start.checked_add(len).is_none_or(|end| end > part.size) {
                return Ok(Err("a column chunk past the end of the file".into()));
            }
            want.push((start, len, chunk));
        }
        let mut order: Vec<usize> = (0..want.len()).collect();
        order.sort_by_key(|&i| want[i].0);
        // Spans of neighbouring chunks: (start, end, members).
        let mut spans: Vec<(u64, u64, Vec<usize>)> = Vec::new();
        for i in order {
            let (start, len, _) = want[i];
            match spans.last_mut() {
                Some((_, end, members)) if start <= end.saturating_add(GAP) => {
                    *end = (*end).max(start + len);
                    members.push(i);
                }
                _ => spans.push((start, start + len, vec![i])),
            }
        }
        let mut out: Vec<Option<Chunk>> = (0..want.len()).map(|_| None).collect();
        for (start, end, members) in spans {
            let data = self.fetch(g.part, start, end).await?;
            for i in members {
                let (from, n, chunk) = want[i];
                let from = (from - start) as usize;
                out[i] = Some(Chunk {
                    data: data.slice(from..from + n as usize),
                    meta: chunk.clone(),
                    rows: part.group_rows(g.row_group),
                });
            }
        }
        Ok(Ok(out.into_iter().flatten().collect()))
    }

    /// Bytes `start..end` of `part`, counted in [`Index::bytes_read`].
    async fn fetch(&self, pi: usize, start: u64, end: u64) -> Result<Bytes> {
        let part = &self.parts[pi];
        Ok(self
            .reads
            .range(pi, (&part.path, &part.uri, part.size), start, end)
            .await?)
    }

    fn reader(&self, part: &Part) -> StoreReader {
        self.reads.reader(&part.path, part.size)
    }

    /// A stream of the columns `columns` (top-level names) of one row group,
    /// in batches of at most [`SCAN_BATCH_ROWS`] rows, optionally only the
    /// rows `selection` picks.
    ///
    /// A panic inside parquet-rs ends the stream with an error: it has
    /// panics that corrupt pages reach (`peek_next_page` unwraps header
    /// fields a corrupt page header may lack, found by a mutation run of
    /// `search`), and a corrupt file must be an error, never a crash.
    pub async fn stream(
        &self,
        g: GroupRef,
        columns: &[&str],
        selection: Option<RowSelection>,
    ) -> Result<BoxStream<'static, parquet::errors::Result<RecordBatch>>> {
        Ok(guarded(self.arrow_stream(g, columns, selection).await?))
    }

    async fn arrow_stream(
        &self,
        g: GroupRef,
        columns: &[&str],
        selection: Option<RowSelection>,
    ) -> Result<ParquetRecordBatchStream<StoreReader>> {
        let part = &self.parts[g.part];
        let meta = self.footer(g.part).await?;
        let reader = self.reader(part);
        let schema = &part.schema;
        // An int8 embedding is read with its scale, wherever it is read.
        let scale = (columns.contains(&col::EMBEDDING) && part.has_column(SCALE_COLUMN))
            .then_some(SCALE_COLUMN);
        let roots: Vec<usize> = columns
            .iter()
            .copied()
            .chain(scale)
            .map(|c| {
                schema.index_of(c).map_err(|_| Error::MissingColumn {
                    uri: part.uri.clone(),
                    column: c.to_owned(),
                })
            })
            .collect::<Result<_, Error>>()?;
        let mask = ProjectionMask::roots(meta.parquet_schema(), roots);
        let mut b = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, meta)
            .with_projection(mask)
            .with_row_groups(vec![g.row_group])
            .with_batch_size(SCAN_BATCH_ROWS);
        if let Some(s) = selection {
            b = b.with_row_selection(s);
        }
        b.build().map_err(|source| Error::Read {
            uri: part.uri.clone(),
            source,
        })
    }
}

impl Part {
    /// Rows in the file.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Whether the file has top-level column `name` (files of schema
    /// version 1 lack the columns version 2 appended).
    pub fn has_column(&self, name: &str) -> bool {
        self.schema.index_of(name).is_ok()
    }

    /// Rows of row group `g`.
    pub fn group_rows(&self, g: usize) -> usize {
        self.groups[g].rows as usize
    }

    /// D of the `embedding` column.
    pub fn embed_dim(&self) -> Result<usize> {
        Ok(self.embedding_type()?.1)
    }

    /// The stored type of the `embedding` column and D: FixedSizeList of
    /// Float32, Float16 or Int8 (with a Float32 `embedding_scale`).
    pub fn embedding_type(&self) -> Result<(EmbeddingType, usize)> {
        let f = self.schema.field_with_name(col::EMBEDDING).map_err(|_| {
            Error::dataset(&self.uri, "no `embedding` column: not an rsembed chip file")
        })?;
        let Some((ty, d)) = embedding_type_from(f.data_type()) else {
            return Err(Error::dataset(
                &self.uri,
                format!(
                    "`embedding` is {}, not a FixedSizeList of Float32, Float16 or Int8",
                    f.data_type()
                ),
            ));
        };
        if ty == EmbeddingType::Int8 && !self.has_column(SCALE_COLUMN) {
            return Err(Error::dataset(
                &self.uri,
                format!("int8 `embedding` without its `{SCALE_COLUMN}` column"),
            ));
        }
        Ok((ty, d))
    }
}

/// Chip files of a dataset: the manifest's when it has one (with the
/// manifest), else what `chips/` lists now, sorted by path. The `chips/`
/// folder itself is accepted too, as GeoPandas and PyArrow read it: its
/// dataset's manifest where there is one, else the Parquet files in it.
async fn list_parts(
    stores: &StoreCache,
    loc: &Location,
) -> Result<(Location, Vec<(Path, u64)>, Option<Manifest>)> {
    if let Some((files, m)) = read_manifest(loc).await? {
        return Ok((loc.clone(), files, Some(m)));
    }
    let mut files = parquet_files(loc, &loc.child("chips"), true).await?;
    if !files.is_empty() {
        warn_unfinished(loc, files.len());
        return Ok((loc.clone(), files, None));
    }
    let url = loc.url.as_str().trim_end_matches('/');
    if let Some((parent, "chips")) = url.rsplit_once('/') {
        let root = stores.location(parent)?;
        if let Some((files, m)) = read_manifest(&root).await? {
            return Ok((root, files, Some(m)));
        }
        files = parquet_files(loc, &loc.prefix, false).await?;
        warn_unfinished(&root, files.len());
    }
    Ok((loc.clone(), files, None))
}

/// The chip files the manifest of a dataset root lists (its Parquet list,
/// or the JSON one of a format 1 manifest), and the manifest; `None` when
/// there is none.
async fn read_manifest(loc: &Location) -> Result<Option<(Vec<(Path, u64)>, Manifest)>> {
    let Some((m, _)) = super::manifest::read(loc).await? else {
        return Ok(None);
    };
    let files = super::manifest::chip_files(loc, &m).await?;
    Ok(Some((files, m)))
}

/// The `.parquet` files under `prefix`, sorted by path: all of them with
/// `nested`, else only those directly in it.
async fn parquet_files(loc: &Location, prefix: &Path, nested: bool) -> Result<Vec<(Path, u64)>> {
    let listed: Vec<object_store::ObjectMeta> = if nested {
        loc.store.list(Some(prefix)).try_collect().await?
    } else {
        match loc.store.list_with_delimiter(Some(prefix)).await {
            Ok(l) => l.objects,
            Err(object_store::Error::NotFound { .. }) => Vec::new(),
            Err(e) => return Err(e.into()),
        }
    };
    let mut files: Vec<(Path, u64)> = listed
        .into_iter()
        .filter(|m| m.location.as_ref().ends_with(".parquet"))
        .map(|m| (m.location, m.size))
        .collect();
    files.sort();
    Ok(files)
}

fn warn_unfinished(root: &Location, files: usize) {
    if files > 0 {
        tracing::warn!(target: crate::LOG,
            index = %root.url,
            files,
            "no manifest.json (a job still running, or not finalized): reading the chip files listed now"
        );
    }
}

/// `batches` ended by an error where parquet-rs panics inside it: every
/// arrow-reader stream over a file we did not write goes through this.
pub fn guarded<S>(batches: S) -> BoxStream<'static, parquet::errors::Result<RecordBatch>>
where
    S: futures::Stream<Item = parquet::errors::Result<RecordBatch>> + Send + 'static,
{
    std::panic::AssertUnwindSafe(batches)
        .catch_unwind()
        .map(|r| r.unwrap_or_else(|panic| Err(reader_panicked(panic.as_ref()))))
        .boxed()
}

/// The error for a panic of parquet-rs while reading pages, with its message.
pub fn reader_panicked(panic: &(dyn std::any::Any + Send)) -> parquet::errors::ParquetError {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    parquet::errors::ParquetError::General(format!(
        "corrupt pages: the Parquet reader failed on them ({message})"
    ))
}

/// The parsed footer of the file `reader` reads, `uri` naming it in the error.
async fn load_footer(reader: &mut StoreReader, uri: &str) -> Result<ArrowReaderMetadata> {
    ArrowReaderMetadata::load_async(reader, ArrowReaderOptions::default())
        .await
        .map_err(|source| Error::NotParquet {
            uri: uri.to_owned(),
            source,
        })
}

async fn open_part(
    store: Arc<dyn ObjectStore>,
    path: Path,
    uri: String,
    mut size: u64,
    reads: &Reads,
) -> Result<(Part, ArrowReaderMetadata)> {
    let mut reader = reads.reader(&path, size);
    let meta = match ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::default())
        .await
    {
        Ok(meta) => meta,
        Err(e) => {
            // The size came from the manifest, and the file was rewritten
            // since (by PyArrow, say): its footer is at its real end.
            let real = store.head(&path).await.map(|m| m.size).ok();
            match real.filter(|r| *r != size) {
                Some(real) => {
                    tracing::warn!(target: crate::LOG,
                        part = %uri, bytes = real, manifest_bytes = size,
                        "the file's size is not the manifest's: it changed since the job finished"
                    );
                    size = real;
                    reader = reads.reader(&path, real);
                    load_footer(&mut reader, &uri).await?
                }
                None => return Err(Error::NotParquet { uri, source: e }),
            }
        }
    };
    let file_meta = meta
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|k| k.key == RSEMBED_KEY))
        .and_then(|k| k.value.as_deref())
        .and_then(|v| serde_json::from_str::<FileMeta>(v).ok());
    let md = meta.metadata();
    let cols = StatsColumns::find(meta.schema(), md.file_metadata().schema_descr());
    let part = Part {
        path,
        uri,
        size,
        schema: meta.schema().clone(),
        rows: md.file_metadata().num_rows().max(0) as u64,
        groups: md.row_groups().iter().map(|rg| cols.of(rg)).collect(),
        file_meta,
    };
    Ok((part, meta))
}

/// The `bbox` column of a batch: a struct of four float64.
pub struct Bboxes<'a> {
    rows: &'a arrow_array::StructArray,
    xyxy: [&'a arrow_array::Float64Array; 4],
}

impl<'a> Bboxes<'a> {
    /// The `bbox` column of `batch`; `None` where the batch has none, an
    /// error naming the file where it is not a struct of four float64.
    pub fn of(batch: &'a RecordBatch, uri: &str) -> Result<Option<Bboxes<'a>>> {
        use arrow_array::{Float64Array, StructArray};
        let Some(c) = batch.column_by_name(col::BBOX) else {
            return Ok(None);
        };
        let rows = c
            .as_any()
            .downcast_ref::<StructArray>()
            .ok_or_else(|| Error::column(uri, col::BBOX, "a struct"))?;
        let f = |name: &str| -> Result<&Float64Array> {
            rows.column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<Float64Array>())
                .ok_or_else(|| Error::column(uri, &format!("bbox.{name}"), "float64"))
        };
        Ok(Some(Bboxes {
            rows,
            xyxy: [f("xmin")?, f("ymin")?, f("xmax")?, f("ymax")?],
        }))
    }

    /// Row `i`'s xmin, ymin, xmax, ymax; `None` for a null bbox.
    pub fn get(&self, i: usize) -> Option<[f64; 4]> {
        (self.rows.is_valid(i) && self.xyxy[0].is_valid(i)).then(|| self.xyxy.map(|c| c.value(i)))
    }
}

/// Per row of `batch`: whether its bbox intersects `b` (false for a null bbox).
pub fn bbox_mask(batch: &RecordBatch, b: [f64; 4], uri: &str) -> Result<Vec<bool>> {
    let boxes = Bboxes::of(batch, uri)?.ok_or_else(|| Error::column(uri, col::BBOX, "a struct"))?;
    let [w, so, e, n] = b;
    Ok((0..batch.num_rows())
        .map(|i| {
            boxes
                .get(i)
                .is_some_and(|[x0, y0, x1, y1]| x1 >= w && x0 <= e && y1 >= so && y0 <= n)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{RecordBatch, StringArray};
    use futures::StreamExt;
    use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
    use parquet::arrow::{ArrowWriter, ParquetRecordBatchStreamBuilder};
    use parquet::file::reader::{FileReader, SerializedFileReader};

    use super::guarded;

    /// A page header that says DATA_PAGE but carries a dictionary page's
    /// header: parquet-rs 60 unwraps the missing data page header when it
    /// skips rows (`peek_next_page`), the panic a mutation run of `search`
    /// found in its answer's arrow fallback.
    #[tokio::test]
    async fn a_panic_of_the_parquet_reader_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dict.parquet");
        let names: StringArray = (0..1000).map(|i| Some(format!("chip-{}", i % 7))).collect();
        let batch = RecordBatch::try_from_iter([("s", Arc::new(names) as _)]).unwrap();
        let mut w =
            ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), None)
                .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        let at = reader
            .metadata()
            .row_group(0)
            .column(0)
            .dictionary_page_offset();
        let at = at.expect("a dictionary page") as usize;
        // Thrift compact: field 1 (i32) = zigzag(2), DICTIONARY_PAGE; 0 is DATA_PAGE.
        assert_eq!(&bytes[at..at + 2], &[0x15, 0x04]);
        bytes[at + 1] = 0x00;
        std::fs::write(&path, &bytes).unwrap();

        let file = tokio::fs::File::open(&path).await.unwrap();
        let skip_some = RowSelection::from(vec![RowSelector::skip(10), RowSelector::select(10)]);
        let stream = ParquetRecordBatchStreamBuilder::new(file)
            .await
            .unwrap()
            .with_row_selection(skip_some)
            .build()
            .unwrap();
        let results: Vec<_> = guarded(stream).collect().await;
        let err = results
            .iter()
            .find_map(|r| r.as_ref().err())
            .expect("the corrupt page is an error");
        assert!(
            err.to_string().contains("corrupt pages"),
            "{err}: should say the pages are corrupt"
        );
        assert!(results.last().unwrap().is_err(), "nothing after the error");
    }
}
