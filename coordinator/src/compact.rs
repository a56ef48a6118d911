//! `rsembed compact`: a finished job's per-task files merged into large,
//! Hilbert-sorted files, every row exactly once, with a new manifest.
//!
//! A job writes one chip file per task, in task order; a spatial filter then
//! reads the footers and often the row groups of all of them. Compaction
//! rewrites the rows into `chips/part-00000.parquet`, `part-00001`, ... of
//! about `--target-size` bytes each, ordered along a Hilbert curve over the
//! chip centres, so that each row group (8192 rows) covers a small region and
//! its `bbox` statistics let readers skip it.
//!
//! The sort is external, in three passes, so memory does not grow with the
//! dataset:
//!
//! 1. **Keys.** `chip_id`, `centre_lon` and `centre_lat` of every row are read.
//!    Each row's sort key is (Hilbert index, chip id): the index is order 32
//!    per axis over lon [-180, 180] × lat [-90, 90], a `u64`; rows without a
//!    centre get `u64::MAX` and sort last, by chip id. The rows are counted
//!    against the manifest, an order-independent digest of the chip ids is
//!    kept, and a bottom-k sample of the keys (by a hash of the chip id, at most
//!    [`SAMPLE_ROWS`]; all rows when there are fewer) gives the split keys:
//!    output file *i* holds the keys between split *i−1* and split *i*, about
//!    `--target-size` divided by the source's bytes per row rows each.
//! 2. **Route.** Every row group of the source is read once, whole; each row
//!    goes to its file's bucket, buffered in memory and appended to a local
//!    spill file per bucket (`--spill-dir`, else the temp dir) as
//!    self-contained, uncompressed Parquet frames. Spill files are opened for
//!    each append only, so the number of buckets is not bounded by file
//!    descriptors.
//! 3. **Sort and write.** Bucket by bucket: its spill is read back (about one
//!    output file of rows), sorted by key, and written as a chip file with the
//!    job's writer settings ([`chip_writer_properties`]; row groups of
//!    `--row-group-rows`, 8192 like job files) and `geo` + `rsembed`
//!    metadata (the source's [`FileMeta`], with `task_id` = the part's name),
//!    streamed to the store through an atomic upload (one put, or a multipart
//!    upload that appears whole), hashed on the way. The spill is then deleted.
//!
//! **Memory bound.** Pass 1: the key sample, at most 2 × [`SAMPLE_ROWS`] × 32 B
//! = 16 MiB, plus a few row groups of three small columns. Pass 2:
//! [`ROUTE_CONCURRENCY`] source row groups (8192 rows each in rsembed files)
//! and the spill buffers, at most [`SPILL_BUFFER_BYTES`] over all buckets (the
//! largest are flushed first) plus one frame being encoded. Pass 3: one output
//! file's rows decoded (about `--target-size`, since embeddings hardly
//! compress; a little more where the sample's split was off), 64 B per row of
//! sort index, [`WRITE_BATCH_ROWS`] rows being gathered, one row group being
//! encoded and [`UPLOAD_CONCURRENCY`] 10 MiB upload parts. So about
//! `--target-size` + 150 MiB, whatever the number of rows; lower
//! `--target-size` to need less. Passes 2 and 3 run on one thread so that
//! malloc reuses one arena's memory (see `spill_and_write`). Measured on a
//! synthetic 731 MiB job (200 000 rows, D = 1024, 100 files): peak resident
//! 337 MB at `--target-size 16MB` (48 files), 460 MB at 64 MB, 707 MB at the
//! default 256 MB. Local disk: the spill holds the whole dataset, uncompressed,
//! during pass 2 (about the source's size, as embeddings are most of it).
//!
//! **Every row exactly once.** Pass 1 checks the rows read against the
//! manifest's `rows` (and each file's footer against its manifest entry). Pass 3
//! checks each bucket for a repeated chip id (copies of one chip share its
//! centre, so its key, so its bucket; pass 1 already checks the sample, which
//! is every row for up to [`SAMPLE_ROWS`] rows), and sums rows and the chip-id
//! digest (count, wrapping sum and xor of the 128-bit ids) of what it hands the
//! writer, checking each file's row count in its footer. The manifest is
//! written only when count and digest equal pass 1's.
//!
//! **Output.** `chips/part-NNNNN.parquet` (the chip schema, unchanged), the
//! source's `job.json` byte for byte (it records the job that made the rows),
//! its `errors/` files copied (checked against their manifest sha256, so the
//! output's `error_files` are valid paths under it), and `manifest.json`, last:
//! the source manifest's job id, fingerprint, tasks, rows, failures and failed
//! tasks, `files` = the new parts with sha256, bytes and rows, a new
//! `finalized_at`, and a `compacted_from` key (source URL and the sha256 of its
//! manifest; readers of [`Manifest`] ignore it).
//!
//! Refused: a source without `manifest.json` (a job not finished), an output
//! equal to the source, and an output already holding a dataset unless
//! `--overwrite` (which deletes its manifest first, then its chips/, errors/
//! and job.json).

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::cast::AsArray;
use arrow_array::types::Float64Type;
use arrow_array::{make_array, Array, ArrayRef, RecordBatch, UInt32Array};
use arrow_schema::{ArrowError, DataType, Fields, SchemaRef};
use arrow_select::interleave::interleave_record_batch;
use arrow_select::take::take_record_batch;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use object_store::buffered::BufWriter;
use object_store::{ObjectStoreExt, PutPayload};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::async_writer::{AsyncArrowWriter, AsyncFileWriter};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::errors::ParquetError;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use rsembed_schemas::chip::{chip_schema, col};
use rsembed_schemas::job::{Manifest, ManifestFile, JOB_FILE, MANIFEST_FILE};
use rsembed_schemas::meta::FileMeta;
use rsembed_schemas::SOFTWARE_VERSION;
use rsembed_worker::sink::parquet::{
    chip_file_metadata, chip_writer_properties, schema_with_file_metadata, CHIP_ROW_GROUP_ROWS,
};
use rsembed_worker::store::{Location, StoreCache};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::cli::CompactArgs;
use crate::error::{Error, Result};
use crate::index::{GroupRef, Index};
use crate::run::put_json;
use crate::scan::{default_concurrency, scan_groups};
use crate::summary::human_bytes;

/// Hilbert curve order per axis: 2^32 cells of 8 mm of longitude at the equator.
pub const HILBERT_ORDER: u32 = 32;
/// The key of a row without a centre: after every located row.
pub const NO_CENTRE: u64 = u64::MAX;
/// Keys kept by pass 1's sample; datasets of at most this many rows are split exactly.
pub const SAMPLE_ROWS: usize = 1 << 18;
/// Pass 2's spill buffers over all buckets, before the largest are flushed.
pub const SPILL_BUFFER_BYTES: usize = 64 << 20;
/// A bucket's buffer is flushed once it holds this much, whatever the total.
pub const SPILL_FRAME_BYTES: usize = 16 << 20;
/// Source row groups decoded ahead of the routing in pass 2.
pub const ROUTE_CONCURRENCY: usize = 2;
/// Rows gathered into one batch for the writer in pass 3 (it fills its
/// 8192-row groups from several): the copy made by the gather stays small.
pub const WRITE_BATCH_ROWS: usize = 1024;
/// Parts of one output file uploaded at once (10 MiB each).
pub const UPLOAD_CONCURRENCY: usize = 2;
/// More output files than this means a `--target-size` far too small.
pub const MAX_FILES: usize = 100_000;

/// The columns of a chip file, in file order.
const COLUMNS: [&str; 14] = [
    col::CHIP_ID,
    col::SOURCE_URI,
    col::SOURCE_VERSION,
    col::X,
    col::Y,
    col::WIDTH,
    col::HEIGHT,
    col::VALID_FRACTION,
    col::CRS,
    col::GEOMETRY,
    col::BBOX,
    col::CENTRE_LON,
    col::CENTRE_LAT,
    col::EMBEDDING,
];

/// A row's sort key: Hilbert index of its centre, then its chip id.
pub type Key = (u64, u128);

/// What a compaction did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompactSummary {
    /// The compacted dataset's URL.
    pub output: String,
    /// Rows written (equal to the source manifest's).
    pub rows: u64,
    /// Files written.
    pub files: usize,
    /// The source dataset's URL.
    pub source: String,
    /// Chip files of the source.
    pub source_files: usize,
    /// Bytes of the source's chip files.
    pub bytes_in: u64,
    /// Bytes fetched from the source, footers included (each row group once
    /// for the keys, once for the rows).
    pub bytes_read: u64,
    /// Bytes of the files written.
    pub bytes_out: u64,
    /// Row groups in the files written.
    pub row_groups: usize,
    /// Bytes written to the local spill.
    pub spill_bytes: u64,
    /// Wall time.
    pub seconds: f64,
}

impl CompactSummary {
    /// The summary for a terminal.
    pub fn render(&self) -> String {
        let mut s = format!(
            "rsembed compact: {} rows in {} files at {}\n",
            self.rows, self.files, self.output
        );
        s += &format!(
            "  source      {} ({} files, {})\n",
            self.source,
            self.source_files,
            human_bytes(self.bytes_in)
        );
        s += &format!("  written     {}\n", human_bytes(self.bytes_out));
        s += &format!("  row groups  {}\n", self.row_groups);
        s += &format!("  read        {}\n", human_bytes(self.bytes_read));
        s += &format!("  spilled     {}\n", human_bytes(self.spill_bytes));
        s += &format!("  time        {:.1} s\n", self.seconds);
        s
    }
}

/// `manifest.json` of a compacted dataset: the [`Manifest`], plus where it came from.
#[derive(Debug, Clone, serde::Serialize)]
struct CompactedManifest<'a> {
    #[serde(flatten)]
    manifest: &'a Manifest,
    compacted_from: CompactedFrom,
}

/// The source of a compaction, as recorded in its manifest.
#[derive(Debug, Clone, serde::Serialize)]
struct CompactedFrom {
    /// Its URL.
    url: String,
    /// SHA-256 of its `manifest.json`.
    manifest_sha256: String,
    /// Its chip files.
    files: usize,
    /// `--target-size` in bytes.
    target_size: u64,
}

/// Compacts `args.index` into `args.output`.
pub async fn compact(args: CompactArgs) -> Result<CompactSummary> {
    let started = Instant::now();
    let stores = StoreCache::default();
    let src = stores.location(&args.index)?;
    let out = stores.location(&args.output)?;
    tracing::info!(
        index = %src.url, output = %out.url, target_size = args.target_size,
        spill_dir = ?args.spill_dir, overwrite = args.overwrite, "compact"
    );
    check_paths(&src, &out)?;
    let manifest_bytes = match src.store.get(&src.child(MANIFEST_FILE)).await {
        Ok(g) => g.bytes().await?,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(Error::Input(format!(
                "{} has no {MANIFEST_FILE}: compact reads finished jobs only \
                 (run `rsembed finalize` first, or let `rsembed run` finish)",
                src.url
            )))
        }
        Err(e) => return Err(e.into()),
    };
    let index = Arc::new(Index::open(&stores, &args.index).await?);
    let manifest = index
        .manifest
        .clone()
        .expect("an index read from a folder with manifest.json has it: this is a bug");
    let file_meta = check_source(&index, &manifest)?;
    let schema = chip_schema(index.embed_dim);
    let progress = Progress::new(!args.json, manifest.rows);

    // Pass 1: keys, count, digest, splits.
    progress.phase("keys");
    let bytes_in: u64 = index.parts.iter().map(|p| p.size).sum();
    let keys = read_keys(&index, &progress).await?;
    if keys.digest.rows != manifest.rows {
        return Err(Error::Input(format!(
            "{}: its chip files hold {} rows, but its manifest says {}: \
             the dataset changed since it was finalized",
            src.url, keys.digest.rows, manifest.rows
        )));
    }
    if let Some(id) = keys.duplicate {
        return Err(duplicate(&src, id));
    }
    let bytes_per_row = bytes_in.div_ceil(manifest.rows.max(1)).max(1);
    let rows_per_file = (args.target_size / bytes_per_row).max(1);
    let files = usize::try_from(manifest.rows.div_ceil(rows_per_file).max(1)).unwrap_or(usize::MAX);
    if files > MAX_FILES {
        return Err(Error::Usage(format!(
            "--target-size {}: that is {files} files of {rows_per_file} rows \
             (about {bytes_per_row} bytes each); the most is {MAX_FILES}",
            args.target_size
        )));
    }
    let splits = Arc::new(split_keys(&keys.sample, files));
    prepare_output(&out, args.overwrite).await?;
    out.probe_local_write("chips/part-00000.parquet")
        .map_err(|e| Error::Output(format!("cannot write to {}: {e}", out.url)))?;
    tracing::info!(
        rows = manifest.rows,
        bytes_per_row,
        rows_per_file,
        buckets = splits.len() + 1,
        exact = keys.sample_is_complete,
        "pass 1 done"
    );

    // Passes 2 and 3, on one thread (see `spill_and_write`).
    let base = args.spill_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base).map_err(|e| spill_err(&base, e))?;
    let dir = tempfile::Builder::new()
        .prefix("rsembed-compact-")
        .tempdir_in(&base)
        .map_err(|e| spill_err(&base, e))?;
    let job = Rewrite {
        index: index.clone(),
        out: out.clone(),
        source: src.url.to_string(),
        splits,
        schema,
        file_meta,
        row_group_rows: args.row_group_rows as usize,
        spill: dir.path().to_path_buf(),
        progress: progress.clone(),
    };
    let handle = tokio::runtime::Handle::current();
    let done = tokio::task::spawn_blocking(move || handle.block_on(spill_and_write(job)))
        .await
        .map_err(|e| Error::Output(format!("compaction thread failed: {e}")))??;
    drop(dir);
    let Rewritten {
        parts,
        digest: written,
        row_groups,
        spill_bytes,
    } = done;

    let rows_out: u64 = parts.iter().map(|f| f.rows).sum();
    if rows_out != manifest.rows || written != keys.digest {
        return Err(Error::Output(format!(
            "the rows written ({rows_out}, chip ids {written}) are not the rows read \
             ({}, chip ids {}): no manifest written, the output is incomplete",
            manifest.rows, keys.digest
        )));
    }

    copy_rest(&src, &out, &manifest).await?;
    let bytes_out = parts.iter().map(|f| f.bytes).sum();
    let files = parts.len();
    let new = Manifest {
        files: parts,
        finalized_at: rsembed_worker::now_rfc3339(),
        software_version: SOFTWARE_VERSION.to_owned(),
        ..manifest
    };
    let doc = CompactedManifest {
        manifest: &new,
        compacted_from: CompactedFrom {
            url: src.url.to_string(),
            manifest_sha256: hex::encode(Sha256::digest(&manifest_bytes)),
            files: index.parts.len(),
            target_size: args.target_size,
        },
    };
    put_json(&out, MANIFEST_FILE, &doc).await?;
    progress.finish();
    Ok(CompactSummary {
        output: out.url.to_string(),
        rows: rows_out,
        files,
        source: src.url.to_string(),
        source_files: index.parts.len(),
        bytes_in,
        bytes_read: index.bytes_read(),
        bytes_out,
        row_groups,
        spill_bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// What passes 2 and 3 need.
struct Rewrite {
    index: Arc<Index>,
    out: Location,
    source: String,
    splits: Arc<Vec<Key>>,
    schema: SchemaRef,
    file_meta: FileMeta,
    row_group_rows: usize,
    spill: PathBuf,
    progress: Progress,
}

/// What passes 2 and 3 did.
struct Rewritten {
    parts: Vec<ManifestFile>,
    digest: IdDigest,
    row_groups: usize,
    spill_bytes: u64,
}

/// Passes 2 and 3: route every row into its bucket's spill, then sort and
/// write each bucket.
///
/// Runs on one thread (a blocking-pool thread driving the futures itself),
/// so that every large buffer (decoded row groups, spill frames, a decoded
/// bucket, encoded row groups) comes from one malloc arena and is reused
/// there: spread over the runtime's threads, glibc kept a bucket's worth of
/// freed memory in each thread's arena, and the resident size grew with the
/// number of buckets. Fetches still overlap the work (local reads run on
/// other blocking threads, uploads on the runtime).
async fn spill_and_write(job: Rewrite) -> Result<Rewritten> {
    let Rewrite {
        index,
        out,
        source,
        splits,
        schema,
        file_meta,
        row_group_rows,
        spill,
        progress,
    } = job;

    // Pass 2: route every row to its bucket's spill.
    progress.phase("spill");
    let mut spill = Spill::new(&spill, schema.clone(), splits.len() + 1);
    let (groups, _) = index.row_groups(None);
    let fetched = futures::stream::iter(groups)
        .map(|g| {
            let index = index.clone();
            async move {
                let uri = &index.parts[g.part].uri;
                let mut stream = index.stream(g, &COLUMNS, None)?;
                let mut batches = Vec::new();
                while let Some(b) = stream.next().await {
                    batches.push(b.map_err(|e| Error::Input(format!("{uri}: {e}")))?);
                }
                Ok::<_, Error>((g, batches))
            }
        })
        .buffered(ROUTE_CONCURRENCY);
    futures::pin_mut!(fetched);
    while let Some(r) = fetched.next().await {
        let (g, batches) = r?;
        let uri = &index.parts[g.part].uri;
        for b in batches {
            progress.inc(b.num_rows() as u64);
            spill.route(b, &splits, uri)?;
        }
    }
    spill.flush_all()?;

    // Pass 3: sort each bucket and write it.
    progress.phase("write");
    let mut digest = IdDigest::default();
    let mut parts: Vec<ManifestFile> = Vec::new();
    let mut row_groups = 0;
    let mut last: Option<Key> = None;
    for b in 0..spill.rows.len() {
        let rows = spill.rows[b];
        // Empty buckets are skipped, but an empty dataset gets one (empty) file.
        if rows == 0 && !(b + 1 == spill.rows.len() && parts.is_empty()) {
            continue;
        }
        let path = spill.path(b);
        let sorted = sort_bucket(Spill::read(&path)?, &source)?;
        let _ = std::fs::remove_file(&path);
        if sorted.order.len() as u64 != rows {
            return Err(Error::Output(format!(
                "spill of bucket {b}: read back {} rows of {rows}: is the spill folder's disk full?",
                sorted.order.len()
            )));
        }
        if let (Some(prev), Some(first)) = (last, sorted.first) {
            assert!(prev < first, "buckets overlap: this is a bug");
        }
        last = sorted.last.or(last);
        digest.merge(&sorted.digest);
        let name = format!("part-{:05}", parts.len());
        let mut meta = file_meta.clone();
        meta.task_id = name.clone();
        meta.software_version = SOFTWARE_VERSION.to_owned();
        let kv = chip_file_metadata(&meta, sorted.extent)?;
        let props = chip_writer_properties(kv)?
            .into_builder()
            .set_max_row_group_row_count(Some(row_group_rows))
            .build();
        let rel = format!("chips/{name}.parquet");
        let (file, groups) = write_part(&out, &rel, schema.clone(), sorted, props).await?;
        progress.inc(file.rows);
        row_groups += groups;
        parts.push(file);
    }
    Ok(Rewritten {
        parts,
        digest,
        row_groups,
        spill_bytes: spill.bytes,
    })
}

fn check_paths(src: &Location, out: &Location) -> Result<()> {
    let s = src.url.as_str().trim_end_matches('/');
    let o = out.url.as_str().trim_end_matches('/');
    if s == o {
        return Err(Error::Usage(format!(
            "--output {o} is the dataset being compacted: write the compaction elsewhere"
        )));
    }
    for dir in ["chips", "errors"] {
        if o.starts_with(&format!("{s}/{dir}/")) || o == format!("{s}/{dir}") {
            return Err(Error::Usage(format!(
                "--output {o} is inside the source's {dir}/, where readers of the source would find it"
            )));
        }
    }
    Ok(())
}

/// Refuses an output that holds a dataset, or (with `overwrite`) deletes it:
/// the manifest first, so no reader ever sees its old file list with new files.
async fn prepare_output(out: &Location, overwrite: bool) -> Result<()> {
    let mut found = Vec::new();
    for f in [MANIFEST_FILE, JOB_FILE] {
        match out.store.head(&out.child(f)).await {
            Ok(_) => found.push(f.to_owned()),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut listed = Vec::new();
    for dir in ["chips", "errors"] {
        let l: Vec<_> = out.store.list(Some(&out.child(dir))).try_collect().await?;
        if !l.is_empty() {
            found.push(format!("{dir}/"));
        }
        listed.extend(l.into_iter().map(|m| m.location));
    }
    if found.is_empty() {
        return Ok(());
    }
    if !overwrite {
        return Err(Error::Output(format!(
            "{} already holds a dataset ({}): pass --overwrite to replace it, or pick another --output",
            out.url,
            found.join(", ")
        )));
    }
    tracing::warn!(output = %out.url, "--overwrite: deleting the dataset there");
    for p in [out.child(MANIFEST_FILE), out.child(JOB_FILE)]
        .into_iter()
        .chain(listed)
    {
        match out.store.delete(&p).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The source's files agree with its manifest and each other; returns their metadata.
fn check_source(index: &Index, manifest: &Manifest) -> Result<FileMeta> {
    let want = chip_schema(index.embed_dim);
    let mut meta: Option<&FileMeta> = None;
    for (part, entry) in index.parts.iter().zip(&manifest.files) {
        if part.rows() != entry.rows {
            return Err(Error::Input(format!(
                "{}: {} rows, but the manifest says {}: the dataset changed since it was finalized",
                part.uri,
                part.rows(),
                entry.rows
            )));
        }
        if !same_fields(part.meta.schema().fields(), want.fields()) {
            return Err(Error::Input(format!(
                "{}: its columns are not the chip schema version {}: {:?}",
                part.uri,
                rsembed_schemas::SCHEMA_VERSION,
                part.meta.schema().fields()
            )));
        }
        let m = part.file_meta.as_ref().ok_or_else(|| {
            Error::Input(format!(
                "{}: no `rsembed` metadata: not a chip file of a job",
                part.uri
            ))
        })?;
        if m.job_id != manifest.job_id {
            return Err(Error::Input(format!(
                "{}: written by job {}, but the manifest is job {}'s",
                part.uri, m.job_id, manifest.job_id
            )));
        }
        meta.get_or_insert(m);
    }
    Ok(meta
        .expect("an opened index has a part: this is a bug")
        .clone())
}

/// Whether two lists of fields are the same logical columns: names, types and
/// order, aside from the names of list items and from metadata. A file that
/// PyArrow rewrote names its list items `element` where arrow-rs writes
/// `item`, and holds the same data.
pub fn same_fields(a: &Fields, b: &Fields) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b.iter())
            .all(|(x, y)| x.name() == y.name() && same_type(x.data_type(), y.data_type()))
}

fn same_type(a: &DataType, b: &DataType) -> bool {
    match (a, b) {
        (DataType::List(x), DataType::List(y))
        | (DataType::LargeList(x), DataType::LargeList(y)) => {
            same_type(x.data_type(), y.data_type())
        }
        (DataType::FixedSizeList(x, n), DataType::FixedSizeList(y, m)) => {
            n == m && same_type(x.data_type(), y.data_type())
        }
        (DataType::Struct(x), DataType::Struct(y)) => same_fields(x, y),
        _ => a == b,
    }
}

/// `batch` with the columns typed exactly as `schema` says, for columns of
/// the same logical type ([`same_fields`]): only the list item names change.
fn conform(
    batch: &RecordBatch,
    schema: &SchemaRef,
) -> std::result::Result<RecordBatch, ArrowError> {
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                return Ok(c.clone());
            }
            let data = c
                .to_data()
                .into_builder()
                .data_type(f.data_type().clone())
                .build()?;
            Ok(make_array(data))
        })
        .collect::<std::result::Result<Vec<ArrayRef>, ArrowError>>()?;
    RecordBatch::try_new(schema.clone(), columns)
}

fn duplicate(src: &Location, id: u128) -> Error {
    Error::Input(format!(
        "{}: chip_id {id:032x} is in it more than once (find its copies with \
         `SELECT filename, * FROM read_parquet('{}/chips/*.parquet', filename=true) \
         WHERE chip_id = '{id:032x}'`): a dataset must hold each chip once",
        src.url,
        src.url.as_str().trim_end_matches('/')
    ))
}

fn spill_err(p: &FsPath, e: std::io::Error) -> Error {
    Error::Output(format!("spill folder {}: {e}", p.display()))
}

// ---- Hilbert keys ------------------------------------------------------------

/// The index of cell (`x`, `y`) along the Hilbert curve of `order` (1..=32)
/// over a 2^order × 2^order grid; the curve starts at (0, 0) and ends at
/// (2^order − 1, 0), and consecutive indexes are adjacent cells.
pub fn hilbert_index(order: u32, x: u32, y: u32) -> u64 {
    assert!((1..=32).contains(&order), "Hilbert order {order}");
    let max = u32::MAX >> (32 - order);
    let (mut x, mut y) = (x & max, y & max);
    let mut d = 0u64;
    let mut s = 1u32 << (order - 1);
    while s > 0 {
        let rx = u32::from(x & s != 0);
        let ry = u32::from(y & s != 0);
        d += u64::from(s) * u64::from(s) * u64::from((3 * rx) ^ ry);
        if ry == 0 {
            if rx == 1 {
                x = max - x;
                y = max - y;
            }
            std::mem::swap(&mut x, &mut y);
        }
        s >>= 1;
    }
    d
}

/// The Hilbert key of a chip centre: order 32 over the whole globe, lon
/// [-180, 180] × lat [-90, 90] (values outside are clamped); [`NO_CENTRE`]
/// for a missing or non-finite centre.
pub fn hilbert_key(lon: Option<f64>, lat: Option<f64>) -> u64 {
    match (lon, lat) {
        (Some(lon), Some(lat)) if lon.is_finite() && lat.is_finite() => {
            let cell = |v: f64, min: f64, span: f64| {
                let t = ((v - min) / span).clamp(0.0, 1.0);
                (t * 4_294_967_296.0).min(4_294_967_295.0) as u32
            };
            hilbert_index(
                HILBERT_ORDER,
                cell(lon, -180.0, 360.0),
                cell(lat, -90.0, 180.0),
            )
            .min(NO_CENTRE - 1)
        }
        _ => NO_CENTRE,
    }
}

/// `chip_id` as its 128 bits; `None` unless it is 32 hex digits.
pub fn parse_chip_id(s: &str) -> Option<u128> {
    (s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u128::from_str_radix(s, 16).ok())
        .flatten()
}

/// The sort keys of a batch's rows (it needs `chip_id` and the centres).
fn batch_keys(batch: &RecordBatch, uri: &str) -> Result<Vec<Key>> {
    let bad = |what: &str| Error::Input(format!("{uri}: {what}"));
    let ids = batch
        .column_by_name(col::CHIP_ID)
        .and_then(|c| c.as_string_opt::<i32>())
        .ok_or_else(|| bad("no Utf8 `chip_id` column"))?;
    let f64s = |name: &str| {
        batch
            .column_by_name(name)
            .and_then(|c| c.as_primitive_opt::<Float64Type>())
            .ok_or_else(|| bad(&format!("no Float64 `{name}` column")))
    };
    let (lon, lat) = (f64s(col::CENTRE_LON)?, f64s(col::CENTRE_LAT)?);
    (0..batch.num_rows())
        .map(|i| {
            let id = ids
                .is_valid(i)
                .then(|| parse_chip_id(ids.value(i)))
                .flatten()
                .ok_or_else(|| {
                    bad(&format!(
                        "chip_id {:?} is not 32 hex digits",
                        ids.is_valid(i).then(|| ids.value(i))
                    ))
                })?;
            let key = hilbert_key(
                lon.is_valid(i).then(|| lon.value(i)),
                lat.is_valid(i).then(|| lat.value(i)),
            );
            Ok((key, id))
        })
        .collect()
}

// ---- Pass 1: keys ------------------------------------------------------------

/// An order-independent digest of a set of chip ids.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdDigest {
    /// How many.
    pub rows: u64,
    /// Their wrapping sum.
    pub sum: u128,
    /// Their xor.
    pub xor: u128,
}

impl IdDigest {
    /// Adds one id.
    pub fn add(&mut self, id: u128) {
        self.rows += 1;
        self.sum = self.sum.wrapping_add(id);
        self.xor ^= id;
    }

    /// Adds another digest's ids.
    pub fn merge(&mut self, o: &IdDigest) {
        self.rows += o.rows;
        self.sum = self.sum.wrapping_add(o.sum);
        self.xor ^= o.xor;
    }
}

impl std::fmt::Display for IdDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sum {:032x} xor {:032x}", self.sum, self.xor)
    }
}

/// A bottom-k sample of keys by a hash of the chip id: uniform, the same on
/// every run, and every key while there are at most `cap`.
#[derive(Debug)]
struct Sample {
    cap: usize,
    threshold: Option<u64>,
    items: Vec<(u64, Key)>,
}

impl Sample {
    fn new(cap: usize) -> Sample {
        Sample {
            cap: cap.max(1),
            threshold: None,
            items: Vec::new(),
        }
    }

    fn push(&mut self, key: Key) {
        let p = mix(key.1);
        if self.threshold.is_some_and(|t| p >= t) {
            return;
        }
        self.items.push((p, key));
        if self.items.len() >= 2 * self.cap {
            self.items.select_nth_unstable_by_key(self.cap, |e| e.0);
            self.threshold = Some(self.items[self.cap].0);
            self.items.truncate(self.cap);
        }
    }

    /// The sampled keys, sorted, and whether they are all the keys pushed.
    fn finish(self) -> (Vec<Key>, bool) {
        let mut v: Vec<Key> = self.items.into_iter().map(|e| e.1).collect();
        v.sort_unstable();
        (v, self.threshold.is_none())
    }
}

/// SplitMix64's finalizer over the id's halves.
fn mix(id: u128) -> u64 {
    let mut z = (id as u64) ^ ((id >> 64) as u64);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A chip id twice in sorted keys (adjacent, or anywhere by id).
fn find_duplicate(sorted: &[Key]) -> Option<u128> {
    if let Some(w) = sorted.windows(2).find(|w| w[0].1 == w[1].1) {
        return Some(w[0].1);
    }
    let mut ids: Vec<u128> = sorted.iter().map(|k| k.1).collect();
    ids.sort_unstable();
    ids.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// `files − 1` split keys from a sorted sample (fewer when the sample has
/// fewer distinct keys): file `i` gets the keys in `[split[i−1], split[i])`.
fn split_keys(sample: &[Key], files: usize) -> Vec<Key> {
    let m = sample.len();
    let mut v: Vec<Key> = (1..files.max(1))
        .map(|i| i * m / files)
        .filter(|&j| j > 0 && j < m)
        .map(|j| sample[j])
        .collect();
    v.dedup();
    v
}

/// The bucket of a key.
fn bucket_of(splits: &[Key], k: Key) -> usize {
    splits.partition_point(|s| *s <= k)
}

struct Keys {
    digest: IdDigest,
    sample: Vec<Key>,
    sample_is_complete: bool,
    duplicate: Option<u128>,
}

async fn read_keys(index: &Arc<Index>, progress: &Progress) -> Result<Keys> {
    let (groups, _) = index.row_groups(None);
    let uris: Arc<Vec<String>> = Arc::new(index.parts.iter().map(|p| p.uri.clone()).collect());
    let stream = scan_groups(
        index.clone(),
        groups,
        vec![col::CHIP_ID, col::CENTRE_LON, col::CENTRE_LAT],
        default_concurrency(),
        Vec::new,
        move |acc: &mut Vec<Key>, g: GroupRef, _: usize, batch: &RecordBatch| {
            acc.extend(batch_keys(batch, &uris[g.part])?);
            Ok(())
        },
    );
    futures::pin_mut!(stream);
    let mut digest = IdDigest::default();
    let mut sample = Sample::new(SAMPLE_ROWS);
    while let Some(r) = stream.next().await {
        let (_, keys) = r?;
        progress.inc(keys.len() as u64);
        for k in keys {
            digest.add(k.1);
            sample.push(k);
        }
    }
    let (sample, sample_is_complete) = sample.finish();
    let duplicate = find_duplicate(&sample);
    Ok(Keys {
        digest,
        sample,
        sample_is_complete,
        duplicate,
    })
}

// ---- Pass 2: route into spill buckets ----------------------------------------

/// The buckets' spill files and their in-memory buffers.
struct Spill {
    dir: PathBuf,
    schema: SchemaRef,
    buffers: Vec<Vec<RecordBatch>>,
    buffered: Vec<usize>,
    total: usize,
    /// Rows routed to each bucket.
    rows: Vec<u64>,
    /// Bytes written to spill files.
    bytes: u64,
}

impl Spill {
    fn new(dir: &FsPath, schema: SchemaRef, buckets: usize) -> Spill {
        Spill {
            dir: dir.to_path_buf(),
            schema,
            buffers: vec![Vec::new(); buckets],
            buffered: vec![0; buckets],
            total: 0,
            rows: vec![0; buckets],
            bytes: 0,
        }
    }

    fn path(&self, b: usize) -> PathBuf {
        self.dir.join(format!("bucket-{b:05}.spill"))
    }

    /// Sends each row of `batch` to its bucket.
    fn route(&mut self, batch: RecordBatch, splits: &[Key], uri: &str) -> Result<()> {
        let batch =
            conform(&batch, &self.schema).map_err(|e| Error::Input(format!("{uri}: {e}")))?;
        let buckets: Vec<u32> = batch_keys(&batch, uri)?
            .into_iter()
            .map(|k| bucket_of(splits, k) as u32)
            .collect();
        let Some(&first) = buckets.first() else {
            return Ok(());
        };
        if buckets.iter().all(|&b| b == first) {
            return self.push(first as usize, batch);
        }
        let mut order: Vec<u32> = (0..buckets.len() as u32).collect();
        order.sort_by_key(|&i| buckets[i as usize]);
        for run in order.chunk_by(|a, b| buckets[*a as usize] == buckets[*b as usize]) {
            let rows = take_record_batch(&batch, &UInt32Array::from(run.to_vec()))
                .map_err(rsembed_worker::Error::from)?;
            self.push(buckets[run[0] as usize] as usize, rows)?;
        }
        Ok(())
    }

    fn push(&mut self, b: usize, batch: RecordBatch) -> Result<()> {
        let size = batch.get_array_memory_size();
        self.rows[b] += batch.num_rows() as u64;
        self.buffers[b].push(batch);
        self.buffered[b] += size;
        self.total += size;
        if self.buffered[b] >= SPILL_FRAME_BYTES {
            self.flush(b)?;
        }
        if self.total > SPILL_BUFFER_BYTES {
            let mut by_size: Vec<usize> = (0..self.buffers.len()).collect();
            by_size.sort_unstable_by_key(|&i| std::cmp::Reverse(self.buffered[i]));
            for i in by_size {
                if self.total <= SPILL_BUFFER_BYTES / 2 {
                    break;
                }
                self.flush(i)?;
            }
        }
        Ok(())
    }

    /// Appends bucket `b`'s buffer to its spill file as one frame: its length
    /// (u64, little-endian), then a Parquet file of its rows.
    fn flush(&mut self, b: usize) -> Result<()> {
        let batches = std::mem::take(&mut self.buffers[b]);
        self.total -= std::mem::take(&mut self.buffered[b]);
        if batches.is_empty() {
            return Ok(());
        }
        let props = WriterProperties::builder()
            .set_compression(Compression::UNCOMPRESSED)
            .set_dictionary_enabled(false)
            .set_statistics_enabled(EnabledStatistics::None)
            .set_max_row_group_row_count(None)
            .build();
        let mut w = ArrowWriter::try_new(Vec::new(), self.schema.clone(), Some(props))
            .map_err(rsembed_worker::Error::from)?;
        for batch in &batches {
            w.write(batch).map_err(rsembed_worker::Error::from)?;
        }
        drop(batches);
        let frame = w.into_inner().map_err(rsembed_worker::Error::from)?;
        let path = self.path(b);
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| spill_err(&path, e))?;
        f.write_all(&(frame.len() as u64).to_le_bytes())
            .and_then(|()| f.write_all(&frame))
            .map_err(|e| spill_err(&path, e))?;
        self.bytes += 8 + frame.len() as u64;
        Ok(())
    }

    fn flush_all(&mut self) -> Result<()> {
        (0..self.buffers.len()).try_for_each(|b| self.flush(b))
    }

    /// The rows of a spill file, frame by frame; none when it does not exist.
    fn read(path: &FsPath) -> Result<Vec<RecordBatch>> {
        let f = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(spill_err(path, e)),
        };
        let mut r = BufReader::new(f);
        let mut out = Vec::new();
        loop {
            let mut len = [0u8; 8];
            match r.read_exact(&mut len) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(spill_err(path, e)),
            }
            let n = usize::try_from(u64::from_le_bytes(len))
                .map_err(|_| Error::Output(format!("spill {}: corrupt frame", path.display())))?;
            let mut frame = vec![0u8; n];
            r.read_exact(&mut frame).map_err(|e| spill_err(path, e))?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(Bytes::from(frame))
                .and_then(|b| b.with_batch_size(CHIP_ROW_GROUP_ROWS).build())
                .map_err(rsembed_worker::Error::from)?;
            for batch in reader {
                out.push(batch.map_err(rsembed_worker::Error::from)?);
            }
        }
        Ok(out)
    }
}

// ---- Pass 3: sort a bucket and write it --------------------------------------

/// A bucket's rows and the order to write them in.
struct Sorted {
    batches: Vec<RecordBatch>,
    /// (batch, row) in key order.
    order: Vec<(usize, usize)>,
    digest: IdDigest,
    extent: Option<[f64; 4]>,
    first: Option<Key>,
    last: Option<Key>,
}

fn sort_bucket(batches: Vec<RecordBatch>, uri: &str) -> Result<Sorted> {
    let mut rows: Vec<(Key, u32, u32)> = Vec::new();
    for (bi, b) in batches.iter().enumerate() {
        for (ri, k) in batch_keys(b, uri)?.into_iter().enumerate() {
            rows.push((k, bi as u32, ri as u32));
        }
    }
    rows.sort_unstable_by_key(|r| r.0);
    let keys: Vec<Key> = rows.iter().map(|r| r.0).collect();
    if let Some(id) = find_duplicate(&keys) {
        return Err(Error::Input(format!(
            "{uri}: chip_id {id:032x} is in it more than once: a dataset must hold each chip once \
             (no manifest written, the output is incomplete)"
        )));
    }
    let mut digest = IdDigest::default();
    keys.iter().for_each(|k| digest.add(k.1));
    let mut extent: Option<[f64; 4]> = None;
    for b in &batches {
        let Some(bbox) = b.column_by_name(col::BBOX).and_then(|c| c.as_struct_opt()) else {
            continue;
        };
        let f = |i: usize| bbox.column(i).as_primitive_opt::<Float64Type>();
        let (Some(x0), Some(y0), Some(x1), Some(y1)) = (f(0), f(1), f(2), f(3)) else {
            continue;
        };
        for i in (0..bbox.len()).filter(|&i| bbox.is_valid(i)) {
            let r = [x0.value(i), y0.value(i), x1.value(i), y1.value(i)];
            extent = Some(match extent {
                None => r,
                Some(e) => [
                    e[0].min(r[0]),
                    e[1].min(r[1]),
                    e[2].max(r[2]),
                    e[3].max(r[3]),
                ],
            });
        }
    }
    Ok(Sorted {
        order: rows.iter().map(|r| (r.1 as usize, r.2 as usize)).collect(),
        batches,
        digest,
        extent,
        first: keys.first().copied(),
        last: keys.last().copied(),
    })
}

/// An upload of one object for a Parquet writer: one put, or a multipart
/// upload that appears whole on completion; hashes what it writes, and can
/// be aborted whatever state it failed in.
pub(crate) struct AtomicUpload {
    inner: BufWriter,
    sha: Sha256,
    bytes: u64,
    /// Set once completion starts: object_store's `BufWriter` panics
    /// ("Already shut down") when a failed shutdown is then aborted.
    closing: bool,
}

impl AtomicUpload {
    /// An upload of `path`, `concurrency` parts of 10 MiB at once.
    pub(crate) fn new(
        store: &Arc<dyn object_store::ObjectStore>,
        path: object_store::path::Path,
        concurrency: usize,
    ) -> AtomicUpload {
        AtomicUpload {
            inner: BufWriter::new(store.clone(), path).with_max_concurrency(concurrency),
            sha: Sha256::new(),
            bytes: 0,
            closing: false,
        }
    }

    /// Gives up the upload, leaving no object; errors are of no use then.
    pub(crate) async fn abort(&mut self) {
        if !self.closing {
            if let Err(e) = self.inner.abort().await {
                tracing::warn!(error = %e, "aborting an upload failed");
            }
        }
    }
}

impl AsyncFileWriter for AtomicUpload {
    fn write(&mut self, bs: Bytes) -> BoxFuture<'_, parquet::errors::Result<()>> {
        self.sha.update(&bs);
        self.bytes += bs.len() as u64;
        async move {
            self.inner
                .put(bs)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        }
        .boxed()
    }

    fn complete(&mut self) -> BoxFuture<'_, parquet::errors::Result<()>> {
        self.closing = true;
        async move { Ok(self.inner.shutdown().await?) }.boxed()
    }
}

/// Writes a sorted bucket as the chip file `rel`; its manifest entry and row groups.
async fn write_part(
    out: &Location,
    rel: &str,
    schema: SchemaRef,
    sorted: Sorted,
    props: WriterProperties,
) -> Result<(ManifestFile, usize)> {
    // `geo` and `rsembed` in the Arrow schema too, as in job files (Arrow C++ reads only those).
    let schema = schema_with_file_metadata(&schema, &props);
    let upload = AtomicUpload::new(&out.store, out.child(rel), UPLOAD_CONCURRENCY);
    let mut w = AsyncArrowWriter::try_new(upload, schema.clone(), Some(props))
        .map_err(rsembed_worker::Error::from)?;
    let refs: Vec<&RecordBatch> = sorted.batches.iter().collect();
    let written: std::result::Result<_, ParquetError> = async {
        for chunk in sorted.order.chunks(WRITE_BATCH_ROWS) {
            let rows = interleave_record_batch(&refs, chunk)?;
            let rows = RecordBatch::try_new(schema.clone(), rows.columns().to_vec())?;
            w.write(&rows).await?;
        }
        w.finish().await
    }
    .await;
    let mut upload = w.into_inner();
    let md = match written {
        Ok(md) => md,
        Err(e) => {
            upload.abort().await;
            return Err(Error::Output(format!(
                "cannot write {}: {e}",
                out.uri_of(&out.child(rel))
            )));
        }
    };
    let rows = md.file_metadata().num_rows().max(0) as u64;
    if rows != sorted.order.len() as u64 {
        return Err(Error::Output(format!(
            "{}: its footer says {rows} rows, {} were written",
            out.uri_of(&out.child(rel)),
            sorted.order.len()
        )));
    }
    let file = ManifestFile {
        path: rel.to_owned(),
        rows,
        sha256: hex::encode(upload.sha.finalize_reset()),
        bytes: upload.bytes,
    };
    Ok((file, md.num_row_groups()))
}

/// Copies `job.json` and the error files of the source, checking the latter
/// against the manifest.
async fn copy_rest(src: &Location, out: &Location, manifest: &Manifest) -> Result<()> {
    match src.store.get(&src.child(JOB_FILE)).await {
        Ok(g) => {
            let bytes = g.bytes().await?;
            out.store
                .put(&out.child(JOB_FILE), PutPayload::from(bytes))
                .await?;
        }
        Err(object_store::Error::NotFound { .. }) => {
            tracing::warn!(source = %src.url, "the source has no {JOB_FILE}; the output has none either");
        }
        Err(e) => return Err(e.into()),
    }
    for f in &manifest.error_files {
        let bytes = src.store.get(&src.child(&f.path)).await?.bytes().await?;
        let sha = hex::encode(Sha256::digest(&bytes));
        if sha != f.sha256 {
            return Err(Error::Input(format!(
                "{}/{}: sha256 {sha}, but the manifest says {}: the dataset changed since it was finalized",
                src.url.as_str().trim_end_matches('/'),
                f.path,
                f.sha256
            )));
        }
        out.store
            .put(&out.child(&f.path), PutPayload::from(bytes))
            .await?;
    }
    Ok(())
}

/// A progress bar over the rows of each pass, on a terminal only.
#[derive(Clone)]
struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    fn new(show: bool, rows: u64) -> Progress {
        use std::io::IsTerminal;
        if !show || !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let bar = indicatif::ProgressBar::new(rows);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {msg:6} {bar:40} {pos}/{len} rows",
            )
            .expect("progress template is valid"),
        );
        Progress(Some(bar))
    }

    fn phase(&self, name: &'static str) {
        if let Some(b) = &self.0 {
            b.set_position(0);
            b.set_message(name);
        }
    }

    fn inc(&self, n: u64) {
        if let Some(b) = &self.0 {
            b.inc(n);
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hilbert_order_1_visits_the_four_cells_in_a_u() {
        assert_eq!(hilbert_index(1, 0, 0), 0);
        assert_eq!(hilbert_index(1, 0, 1), 1);
        assert_eq!(hilbert_index(1, 1, 1), 2);
        assert_eq!(hilbert_index(1, 1, 0), 3);
    }

    #[test]
    fn hilbert_order_2_matches_the_textbook_table() {
        // want[y][x]: the 4×4 curve of the textbook figure, (0,0) (1,0) (1,1)
        // (0,1) (0,2) (0,3) (1,3) (1,2) (2,2) ... (2,0) (3,0).
        let want = [[0, 1, 14, 15], [3, 2, 13, 12], [4, 7, 8, 11], [5, 6, 9, 10]];
        for (y, row) in want.iter().enumerate() {
            for (x, d) in row.iter().enumerate() {
                assert_eq!(hilbert_index(2, x as u32, y as u32), *d, "({x}, {y})");
            }
        }
    }

    #[test]
    fn hilbert_curves_are_bijections_of_adjacent_steps() {
        for order in 1..=6u32 {
            let n = 1u32 << order;
            let mut cell = vec![None; (n * n) as usize];
            for x in 0..n {
                for y in 0..n {
                    let d = hilbert_index(order, x, y) as usize;
                    assert!(cell[d].is_none(), "order {order}: {d} twice");
                    cell[d] = Some((x as i64, y as i64));
                }
            }
            let cells: Vec<(i64, i64)> = cell.into_iter().map(Option::unwrap).collect();
            for w in cells.windows(2) {
                let step = (w[0].0 - w[1].0).abs() + (w[0].1 - w[1].1).abs();
                assert_eq!(step, 1, "order {order}: {:?} -> {:?}", w[0], w[1]);
            }
            assert_eq!(cells[0], (0, 0));
            assert_eq!(cells[cells.len() - 1], (i64::from(n) - 1, 0));
        }
    }

    #[test]
    fn a_coarser_curve_is_a_prefix_of_the_order_32_key() {
        let mut seed = 11u64;
        for _ in 0..1000 {
            seed = mix(u128::from(seed));
            let (x, y) = (seed as u32, (seed >> 32) as u32);
            let d = hilbert_index(32, x, y);
            for k in [1u32, 5, 16, 31] {
                let coarse = hilbert_index(k, x >> (32 - k), y >> (32 - k));
                assert_eq!(d >> (2 * (32 - k)), coarse, "order {k} of ({x}, {y})");
            }
        }
    }

    #[test]
    fn keys_cover_the_globe_and_put_missing_centres_last() {
        assert_eq!(hilbert_key(None, Some(1.0)), NO_CENTRE);
        assert_eq!(hilbert_key(Some(f64::NAN), Some(1.0)), NO_CENTRE);
        assert_eq!(hilbert_key(Some(-180.0), Some(-90.0)), 0);
        assert_eq!(hilbert_key(Some(180.0), Some(-90.0)), NO_CENTRE - 1);
        assert_eq!(hilbert_key(Some(500.0), Some(-100.0)), NO_CENTRE - 1);
        // Nearby points share a long prefix; far ones do not.
        let a = hilbert_key(Some(2.35), Some(48.85));
        let b = hilbert_key(Some(2.3501), Some(48.8501));
        let c = hilbert_key(Some(-74.0), Some(40.7));
        assert!((a ^ b).leading_zeros() > 20);
        assert!((a ^ c).leading_zeros() < 4);
    }

    #[test]
    fn chip_ids_parse_only_as_32_hex_digits() {
        assert_eq!(parse_chip_id(&"0".repeat(31)), None);
        assert_eq!(parse_chip_id("000000000000000000000000000000ff"), Some(255));
        assert_eq!(parse_chip_id("+00000000000000000000000000000ff"), None);
        assert_eq!(parse_chip_id("g00000000000000000000000000000ff"), None);
    }

    #[test]
    fn digests_do_not_depend_on_order_but_on_every_id() {
        let (mut a, mut b, mut c) = (
            IdDigest::default(),
            IdDigest::default(),
            IdDigest::default(),
        );
        for i in 0..100u128 {
            a.add(i * 7919);
            b.add((99 - i) * 7919);
            c.add(if i == 50 { 1 } else { i * 7919 });
        }
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut m = IdDigest::default();
        let (mut h1, mut h2) = (IdDigest::default(), IdDigest::default());
        (0..50u128).for_each(|i| h1.add(i * 7919));
        (50..100u128).for_each(|i| h2.add(i * 7919));
        m.merge(&h1);
        m.merge(&h2);
        assert_eq!(m, a);
    }

    fn keys(n: u64) -> Vec<Key> {
        (0..n)
            .map(|i| {
                (
                    mix(u128::from(i)) >> 8,
                    u128::from(mix(u128::from(i) + 1_000_000)),
                )
            })
            .collect()
    }

    #[test]
    fn a_small_dataset_is_split_exactly() {
        let mut s = Sample::new(1000);
        let all = keys(999);
        all.iter().for_each(|k| s.push(*k));
        let (sample, complete) = s.finish();
        assert!(complete);
        assert_eq!(sample.len(), 999);
        let splits = split_keys(&sample, 7);
        assert_eq!(splits.len(), 6);
        let mut sizes = [0usize; 7];
        all.iter().for_each(|k| sizes[bucket_of(&splits, *k)] += 1);
        assert!(sizes.iter().all(|&n| n == 142 || n == 143), "{sizes:?}");
    }

    #[test]
    fn a_large_dataset_is_split_about_evenly_from_its_sample() {
        let mut s = Sample::new(2000);
        let all = keys(100_000);
        all.iter().for_each(|k| s.push(*k));
        let (sample, complete) = s.finish();
        assert!(!complete);
        assert!((2000..4000).contains(&sample.len()), "{}", sample.len());
        let splits = split_keys(&sample, 10);
        let mut sizes = [0usize; 10];
        all.iter().for_each(|k| sizes[bucket_of(&splits, *k)] += 1);
        assert!(
            sizes.iter().all(|&n| (7_000..13_000).contains(&n)),
            "{sizes:?}"
        );
    }

    #[test]
    fn splits_of_few_keys_leave_no_empty_range() {
        assert!(split_keys(&[], 5).is_empty());
        let one = [(1, 1)];
        assert!(split_keys(&one, 5).is_empty());
        let k = [(1, 1), (1, 2), (5, 0)];
        assert_eq!(split_keys(&k, 10), vec![(1, 2), (5, 0)]);
        assert_eq!(bucket_of(&[(1, 2), (5, 0)], (1, 1)), 0);
        assert_eq!(bucket_of(&[(1, 2), (5, 0)], (1, 2)), 1);
        assert_eq!(bucket_of(&[(1, 2), (5, 0)], (NO_CENTRE, 0)), 2);
    }

    #[test]
    fn duplicates_are_found_adjacent_or_apart() {
        assert_eq!(find_duplicate(&[(1, 5), (2, 6), (3, 7)]), None);
        assert_eq!(find_duplicate(&[(1, 5), (1, 5), (3, 7)]), Some(5));
        assert_eq!(find_duplicate(&[(1, 5), (2, 6), (3, 5)]), Some(5));
    }

    fn chip_rows(ids: &[u128], dim: usize) -> RecordBatch {
        use rsembed_raster::geo::Footprint;
        use rsembed_schemas::ids::Window;
        use rsembed_worker::sink::rows::{chip_batch, ChipRow};
        let rows: Vec<ChipRow> = ids
            .iter()
            .map(|&id| {
                let lon = (id % 360) as f64 - 180.0;
                ChipRow {
                    chip_id: format!("{id:032x}"),
                    source_uri: "file:///x.tif".into(),
                    source_version: None,
                    window: Window {
                        x: 0,
                        y: 0,
                        width: 8,
                        height: 8,
                    },
                    valid_fraction: 1.0,
                    crs: (id % 3 != 0).then(|| "EPSG:4326".into()),
                    footprint: (id % 3 != 0).then(|| Footprint {
                        wkb: vec![1, 3, 0, 0, 0],
                        bbox: [lon, 0.0, lon + 1.0, 1.0],
                        centre: [lon + 0.5, 0.5],
                    }),
                    embedding: vec![id as f32; dim],
                }
            })
            .collect();
        chip_batch(&rows, dim).unwrap()
    }

    #[test]
    fn spilled_rows_come_back_sorted_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let schema = chip_schema(4);
        let ids: Vec<u128> = (1..=500u128).map(|i| i * 7).collect();
        let all = chip_rows(&ids, 4);
        let all_keys = batch_keys(&all, "test").unwrap();
        let mut sorted_keys = all_keys.clone();
        sorted_keys.sort_unstable();
        let splits = split_keys(&sorted_keys, 3);
        let mut spill = Spill::new(dir.path(), schema, splits.len() + 1);
        for start in (0..500).step_by(64) {
            let len = 64.min(500 - start);
            spill.route(all.slice(start, len), &splits, "test").unwrap();
            // Force many small frames.
            spill.flush_all().unwrap();
        }
        assert_eq!(spill.rows.iter().sum::<u64>(), 500);
        let mut digest = IdDigest::default();
        let mut seen: Vec<Key> = Vec::new();
        for b in 0..spill.rows.len() {
            let sorted = sort_bucket(Spill::read(&spill.path(b)).unwrap(), "test").unwrap();
            assert_eq!(sorted.order.len() as u64, spill.rows[b]);
            digest.merge(&sorted.digest);
            for &(bi, ri) in &sorted.order {
                let k = batch_keys(&sorted.batches[bi].slice(ri, 1), "test").unwrap()[0];
                seen.push(k);
            }
            let e = sorted.extent.unwrap();
            assert!(e[0] >= -180.0 && e[2] <= 181.0 && e[1] == 0.0 && e[3] == 1.0);
        }
        assert_eq!(
            seen, sorted_keys,
            "every row once, in key order across buckets"
        );
        let mut want = IdDigest::default();
        ids.iter().for_each(|id| want.add(*id));
        assert_eq!(digest, want);
    }

    #[test]
    fn a_bucket_with_a_chip_twice_is_refused() {
        let b = chip_rows(&[3, 4, 3], 2);
        let err = sort_bucket(vec![b], "file:///d").err().unwrap().to_string();
        assert!(err.contains(&format!("{:032x}", 3u128)), "{err}");
    }
}
