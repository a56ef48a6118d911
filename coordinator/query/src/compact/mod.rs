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
//!    `SAMPLE_ROWS`; all rows when there are fewer) gives the split keys:
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
//! **Lists.** With `--lists N`, a sample pass and k-means run between passes
//! 1 and 2 (`lists.rs`): each row gets its nearest list in a `list` column
//! in pass 2, the key becomes (list, Hilbert index, chip id), the split
//! sample is the k-means sample with its lists, and pass 3 cuts a row group
//! where the list changes; `centroids.parquet` is written before the
//! manifest, which records it as `ivf`.
//!
//! **Memory bound.** Pass 1: the key sample, at most 2 × `SAMPLE_ROWS` × 32 B
//! = 16 MiB, plus a few row groups of three small columns. Pass 2:
//! `ROUTE_CONCURRENCY` source row groups (8192 rows each in rsembed files)
//! and the spill buffers, at most `SPILL_BUFFER_BYTES` over all buckets (the
//! largest are flushed first) plus one frame being encoded. Pass 3: one output
//! file's rows decoded (about `--target-size`, since embeddings hardly
//! compress; a little more where the sample's split was off), 64 B per row of
//! sort index, `WRITE_BATCH_ROWS` rows being gathered, one row group being
//! encoded and `UPLOAD_CONCURRENCY` 10 MiB upload parts. So about
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
//! is every row for up to `SAMPLE_ROWS` rows), and sums rows and the chip-id
//! digest (count, wrapping sum and xor of the 128-bit ids) of what it hands the
//! writer, checking each file's row count in its footer. The manifest is
//! written only when count and digest equal pass 1's.
//!
//! **Schema versions.** The parts are written in the newest chip schema
//! version among the source's files: a source of version 1 files (14
//! columns) stays version 1, one with any version 2 file (a job resumed by a
//! newer rsembed) becomes version 2, its version 1 rows null in the appended
//! columns, as a reader with `union_by_name` would see them; likewise for
//! version 3 (a job keeps its version, so mixed sources are older outputs). Each part's
//! `rsembed` metadata and the manifest's `schema_version` say which.
//!
//! **Output.** `chips/part-NNNNN.parquet` (the chip schema, as above), the
//! source's `job.json` byte for byte (it records the job that made the rows),
//! its `errors/` files copied (checked against the sha256 its files list
//! records, so the output's error files are valid paths under it), the
//! manifest's lists (format 2, whatever the source's): `files.parquet` =
//! the new parts with sha256, bytes and rows, then the error files;
//! `failures.parquet` = the failed inputs the copied error files hold, then
//! the source's failed tasks and inputs without chips. Then `manifest.json`,
//! last: the source manifest's job id, fingerprint, tasks and counts, a new
//! `finalized_at`, and a `compacted_from` key (source URL and the sha256 of
//! its manifest; readers of [`Manifest`] ignore it).
//!
//! Refused: a source without `manifest.json` (a job not finished), an output
//! equal to the source, and an output already holding a dataset unless
//! `--overwrite` (which deletes its manifest first, then its lists, chips/,
//! errors/ and job.json).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use arrow_schema::SchemaRef;
use futures::{StreamExt, TryStreamExt};
use rsembed_schemas::chip::col;
use rsembed_schemas::chip_file::{chip_file_metadata, chip_writer_properties};
use rsembed_schemas::embedding::EmbeddingType;
use rsembed_schemas::job::{IvfLayout, Manifest, ManifestFile, MANIFEST_FILE};
use rsembed_schemas::manifest::{task_id_of, FailureKind, FileKind, ListedFile};
use rsembed_schemas::meta::FileMeta;
use rsembed_schemas::SOFTWARE_VERSION;
use rsembed_store::{Location, StoreCache};
use sha2::{Digest, Sha256};

use crate::format::footer::FOOTER_BUDGET_GROUPS;
use crate::format::index::Index;
use crate::format::manifest::ManifestBuilder;
use crate::io::put_json;
use crate::Error as QueryError;
use crate::{Error, Result};
use rsembed_schemas::units::human_bytes;

pub use args::CompactArgs;
use keys::{read_keys, split_keys};
use lists::Lists;
use source::{check_paths, check_source, chip_schema_of, copy_rest, duplicate, prepare_output};
use spill::{spill_err, Spill};
use write::{sort_bucket, write_part};

mod args;
mod keys;
mod lists;
mod source;
mod spill;
mod write;

pub(crate) use keys::IdDigest;
pub use keys::{hilbert_key, parse_chip_id, Key};

/// Hilbert curve order per axis: 2^32 cells of 8 mm of longitude at the equator.
pub(crate) const HILBERT_ORDER: u32 = 32;
/// The key of a row without a centre: after every located row.
pub(crate) const NO_CENTRE: u64 = u64::MAX;
/// Keys kept by pass 1's sample; datasets of at most this many rows are split exactly.
pub(crate) const SAMPLE_ROWS: usize = 1 << 18;
/// Pass 2's spill buffers over all buckets, before the largest are flushed.
pub(crate) const SPILL_BUFFER_BYTES: usize = 64 << 20;
/// A bucket's buffer is flushed once it holds this much, whatever the total.
pub(crate) const SPILL_FRAME_BYTES: usize = 16 << 20;
/// Source row groups decoded ahead of the routing in pass 2.
pub(crate) const ROUTE_CONCURRENCY: usize = 2;
/// Rows gathered into one batch for the writer in pass 3 (it fills its
/// 8192-row groups from several): the copy made by the gather stays small.
pub(crate) const WRITE_BATCH_ROWS: usize = 1024;
/// Parts of one output file uploaded at once (10 MiB each).
pub(crate) const UPLOAD_CONCURRENCY: usize = 2;
/// More output files than this means a `--target-size` far too small.
pub(crate) const MAX_FILES: usize = 100_000;

/// The columns of a chip file, in file order; a file of schema version 1
/// has the first 14, one of version 2 the first 19.
const COLUMNS: [&str; 24] = [
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
    col::ITEM_ID,
    col::COLLECTION,
    col::DATETIME,
    col::CLOUD_FRACTION,
    col::END_DATETIME,
    col::CELL,
    col::GRID_CELL,
    col::WINDOW_START,
    col::WINDOW_END,
    col::SCENES,
];

/// What a compaction did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompactSummary {
    /// The compacted dataset's URL.
    pub(crate) output: String,
    /// Rows written (equal to the source manifest's).
    pub(crate) rows: u64,
    /// Files written.
    pub(crate) files: usize,
    /// The source dataset's URL.
    pub(crate) source: String,
    /// Chip files of the source.
    pub(crate) source_files: usize,
    /// Bytes of the source's chip files.
    pub(crate) bytes_in: u64,
    /// Bytes fetched from the source, footers included (each row group once
    /// for the keys, once for the rows).
    pub(crate) bytes_read: u64,
    /// Bytes of the files written.
    pub(crate) bytes_out: u64,
    /// Row groups in the files written.
    pub(crate) row_groups: usize,
    /// Bytes written to the local spill.
    pub(crate) spill_bytes: u64,
    /// Wall time.
    pub(crate) seconds: f64,
    /// `--lists`: the IVF layout written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ivf: Option<IvfLayout>,
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
        if let Some(l) = &self.ivf {
            s += &format!(
                "  lists       {} ({} empty; k-means on {} rows, {} iterations)\n",
                l.lists, l.empty_lists, l.sample, l.iterations
            );
        }
        s += &format!("  time        {:.1} s\n", self.seconds);
        s
    }
}

/// `manifest.json` of a compacted dataset: the [`Manifest`], plus where it came from.
#[derive(Debug, Clone, serde::Serialize)]
struct CompactedManifest<'a> {
    #[serde(flatten)]
    manifest: &'a Manifest,
    /// The chip schema version of the compacted files (the newest of the
    /// source's: its `job.json` records the job, not this).
    schema_version: u32,
    /// How the compacted files store embeddings (`--embedding-type`, else
    /// as the source did); their `rsembed` metadata gives the dequantisation.
    embedding_type: EmbeddingType,
    compacted_from: CompactedFrom,
    /// `--lists`: `centroids.parquet` and how it was made.
    #[serde(skip_serializing_if = "Option::is_none")]
    ivf: Option<IvfLayout>,
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
        spill_dir = ?args.spill_dir, overwrite = args.overwrite, lists = ?args.lists,
        sample = ?args.sample, seed = ?args.seed, "compact"
    );
    check_paths(&src, &out)?;
    let Some((_, manifest_bytes)) = crate::format::manifest::read(&src).await? else {
        return Err(QueryError::Dataset {
            uri: src.url.to_string(),
            problem: format!(
                "has no {MANIFEST_FILE}: compact reads finished jobs only \
                 (run `rsembed finalize` first, or let `rsembed run` finish)"
            ),
        });
    };
    let index = Arc::new(Index::open(&stores, &args.index, FOOTER_BUDGET_GROUPS).await?);
    let manifest = index
        .manifest
        .clone()
        .expect("an index read from a folder with manifest.json has it: this is a bug");
    let (chips, errors): (Vec<ListedFile>, Vec<ListedFile>) =
        crate::format::manifest::files(&index.root, &manifest)
            .try_collect::<Vec<_>>()
            .await?
            .into_iter()
            .partition(|f| f.kind == FileKind::Chips);
    let chips: Vec<ManifestFile> = chips.into_iter().map(|f| f.file).collect();
    let (file_meta, schema_version, source_type) = check_source(&index, &manifest, &chips)?;
    let embedding_type = args.embedding_type.unwrap_or(source_type);
    let file_meta = file_meta.with_embedding_type(embedding_type);
    let schema = chip_schema_of(index.embed_dim, schema_version, embedding_type);
    let progress = Progress::new(!args.json, manifest.rows);

    // Pass 1: keys, count, digest, splits.
    progress.phase("keys");
    let bytes_in: u64 = index.parts.iter().map(|p| p.size).sum();
    let keys = read_keys(&index, &progress).await?;
    if keys.digest.rows != manifest.rows {
        return Err(QueryError::dataset(
            &src.url,
            format!(
                "its chip files hold {} rows, but its manifest says {}: \
                 the dataset changed since it was finalized",
                keys.digest.rows, manifest.rows
            ),
        ));
    }
    if let Some(id) = keys.duplicate {
        return Err(duplicate(&src, id));
    }
    // Converted embeddings change the bytes per row by their element size
    // (and int8's 4-byte scale): files of int8 from f32 hold 4× the rows.
    let stored = |t: EmbeddingType| {
        (index.embed_dim * t.element_bytes()) as u64 + 4 * u64::from(t == EmbeddingType::Int8)
    };
    let bytes_per_row = (bytes_in.div_ceil(manifest.rows.max(1)) + stored(embedding_type))
        .saturating_sub(stored(source_type))
        .max(1);
    let rows_per_file = (args.target_size / bytes_per_row).max(1);
    let files = usize::try_from(manifest.rows.div_ceil(rows_per_file).max(1)).unwrap_or(usize::MAX);
    if files > MAX_FILES {
        return Err(QueryError::flag(
            "--target-size",
            format!(
                "{}: that is {files} files of {rows_per_file} rows \
                 (about {bytes_per_row} bytes each); the most is {MAX_FILES}",
                args.target_size
            ),
        ));
    }
    let (lists, schema, splits) = match args.lists {
        None => (None, schema, split_keys(&keys.sample, files)),
        Some(n) => {
            let seed = args.seed.unwrap_or(crate::ivf::DEFAULT_SEED);
            let (l, sample) = lists::train(&index, n, args.sample, seed, &progress).await?;
            (
                Some(l),
                lists::with_list(&schema),
                split_keys(&sample, files),
            )
        }
    };
    let splits = Arc::new(splits);
    prepare_output(&out, args.overwrite).await?;
    out.probe_local_write("chips/part-00000.parquet")
        .map_err(|e| QueryError::Write {
            path: out.url.to_string(),
            source: Box::new(e),
        })?;
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
        schema_version,
        row_group_rows: args.row_group_rows as usize,
        spill: dir.path().to_path_buf(),
        progress: progress.clone(),
        lists,
    };
    let handle = tokio::runtime::Handle::current();
    let done = tokio::task::spawn_blocking(move || handle.block_on(spill_and_write(job)))
        .await
        .map_err(|source| QueryError::Task {
            what: "compaction thread",
            source,
        })??;
    drop(dir);
    let Rewritten {
        parts,
        digest: written,
        row_groups,
        spill_bytes,
        lists,
    } = done;

    let rows_out: u64 = parts.iter().map(|f| f.rows).sum();
    if rows_out != manifest.rows || written != keys.digest {
        return Err(QueryError::Incomplete {
            path: out.url.to_string(),
            problem: format!(
                "the rows written ({rows_out}, chip ids {written}) are not the rows read \
                 ({}, chip ids {}): no manifest written, the output is incomplete",
                manifest.rows, keys.digest
            ),
        });
    }

    let mut builder = ManifestBuilder::for_job(&out, &manifest.job_id, &manifest.fingerprint)?;
    for p in &parts {
        builder.chips_file(task_id_of(&p.path), p).await?;
    }
    copy_rest(&src, &out, &errors, &mut builder).await?;
    // Failed inputs came with the error files; failed tasks and inputs
    // without chips are the source's, as its list has them.
    let mut kept = crate::format::manifest::failures(&index.root, &manifest);
    while let Some(row) = kept.try_next().await? {
        if row.kind != FailureKind::FailedInput {
            builder.failure_row(row).await?;
        }
    }
    let ivf = match &lists {
        Some(l) => Some(l.write(&out).await?),
        None => None,
    };
    let bytes_out = parts.iter().map(|f| f.bytes).sum();
    let files = parts.len();
    let built = builder.finish_lists(manifest.tasks).await?;
    let new = Manifest {
        // Counted by the source (a format 1 source listed only the first
        // thousand inputs without chips).
        failed_task_count: manifest.failed_task_count,
        inputs_without_chips: manifest.inputs_without_chips,
        ..built.manifest
    };
    let doc = CompactedManifest {
        manifest: &new,
        schema_version,
        embedding_type,
        compacted_from: CompactedFrom {
            url: src.url.to_string(),
            manifest_sha256: hex::encode(Sha256::digest(&manifest_bytes)),
            files: index.parts.len(),
            target_size: args.target_size,
        },
        ivf: ivf.clone(),
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
        ivf,
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
    schema_version: u32,
    row_group_rows: usize,
    spill: PathBuf,
    progress: Progress,
    /// `--lists`: labels each row in pass 2.
    lists: Option<Lists>,
}

/// What passes 2 and 3 did.
struct Rewritten {
    parts: Vec<ManifestFile>,
    digest: IdDigest,
    row_groups: usize,
    spill_bytes: u64,
    lists: Option<Lists>,
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
        schema_version,
        row_group_rows,
        spill,
        progress,
        mut lists,
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
                let part = &index.parts[g.part];
                let columns: Vec<&str> =
                    COLUMNS.into_iter().filter(|c| part.has_column(c)).collect();
                let mut stream = index.stream(g, &columns, None).await?;
                let mut batches = Vec::new();
                while let Some(b) = stream.next().await {
                    batches.push(b.map_err(|source| QueryError::Read {
                        uri: uri.clone(),
                        source,
                    })?);
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
            let b = match &mut lists {
                Some(l) => l.label(b, uri)?,
                None => b,
            };
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
            return Err(QueryError::SpillCorrupt {
                path,
                problem: format!(
                    "read back {} rows of {rows}: is the spill folder's disk full?",
                    sorted.order.len()
                ),
            });
        }
        if let (Some(prev), Some(first)) = (last, sorted.first) {
            assert!(prev < first, "buckets overlap: this is a bug");
        }
        last = sorted.last.or(last);
        digest.merge(&sorted.digest);
        let name = format!("part-{:05}", parts.len());
        let mut meta = file_meta.clone();
        meta.task_id = name.clone();
        meta.schema_version = schema_version;
        meta.software_version = SOFTWARE_VERSION.to_owned();
        let kv = chip_file_metadata(&meta, sorted.extent)?;
        let props = chip_writer_properties(kv, meta.embedding_type())
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
        lists,
    })
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
