//! The IVF layout: spherical k-means over a sample of a dataset's
//! embeddings, each row's nearest list, `centroids.parquet`, and the lists a
//! search probes.
//!
//! Embeddings are unit vectors and search ranks by cosine, so lists are
//! compared by dot product: a row belongs to the centroid of highest dot
//! product (ties to the lower list), and centroids are the normalised means
//! of their rows (spherical k-means). Everything here is deterministic for a
//! seed: the sample is chosen by a hash of the chip id (whatever the file
//! order), k-means++ draws from a seeded generator, sums are taken in one
//! fixed order, and the dot products are `rsembed_query::kernels::dot`'s
//! (same lanes, same reduction), so a row's list is the one a scan would
//! rank first.
//!
//! Compaction's side is in `compact/lists.rs`; search's is `Probe`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int32Type, Int64Type};
use arrow_array::{Array, ArrayRef, FixedSizeListArray, Float32Array, Int32Array, Int64Array};
use arrow_array::{RecordBatch, RecordBatchOptions};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::{FutureExt, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{GetResult, GetResultPayload, ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::{ArrowWriter, ParquetRecordBatchStreamBuilder};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use rsembed_schemas::chip::embedding_type;
use rsembed_schemas::job::{IvfLayout, CENTROIDS_FILE, MANIFEST_FILE};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::query::Error as QueryError;
use rsembed_query::format::index::{guarded, reader_panicked, Index};
use rsembed_query::io::StoreReader;
use rsembed_query::kernels::{dot4, dots, nearest};

pub use rsembed_query::format::LIST;
/// Most lists: a list number takes the top 16 bits of compaction's sort key.
pub const MAX_LISTS: u32 = 1 << 16;
/// k-means++ and Lloyd's seed when `--seed` is not given.
pub const DEFAULT_SEED: u64 = 0;
/// Lloyd iterations at most (fewer once no sample row changes list):
/// FAISS's default is 25; on clustered unit vectors assignments settle well
/// before 20.
pub const KMEANS_ITERATIONS: u32 = 20;
/// Sample rows per list by default: FAISS warns below 39 and stops using
/// more than 256.
pub const SAMPLE_PER_LIST: u64 = 64;
/// The default sample's embeddings take at most this much memory.
pub const SAMPLE_BYTES: u64 = 256 << 20;

/// The default sample size for `lists` lists of `dim` floats over `rows` rows.
pub fn default_sample(rows: u64, lists: u32, dim: usize) -> u64 {
    let cap = (SAMPLE_BYTES / (4 * dim.max(1) as u64)).max(u64::from(lists));
    rows.min(SAMPLE_PER_LIST * u64::from(lists)).min(cap)
}

/// The lists a search probes when `--nprobe` is not given: one in 16,
/// at least 8 (all of them when there are at most 8). Measured on
/// clustered D = 768 unit vectors (docs/benchmarks.md, "IVF"): recall@10
/// ≥ 0.95 from about 3 % of the lists on, so 6 % leaves a margin for data
/// less clustered than that, at 6 % of an exact scan's bytes.
pub fn default_nprobe(lists: usize) -> usize {
    lists.div_ceil(16).max(8).min(lists)
}

/// `--nprobe`: how many lists a search reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NProbe {
    /// Every list: the exact search.
    All,
    /// The P lists whose centroids are nearest the query.
    Lists(usize),
}

/// Parses `--nprobe`: a positive number, or `all`.
pub fn parse_nprobe(s: &str) -> std::result::Result<NProbe, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(NProbe::All);
    }
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(NProbe::Lists(n)),
        _ => Err(format!(
            "{s:?}: want a number of lists (1 or more) or `all`"
        )),
    }
}

/// Unit centroids, row-major, `lists × dim`.
#[derive(Debug, Clone, PartialEq)]
pub struct Centroids {
    /// Dimension.
    pub dim: usize,
    /// The values.
    pub values: Vec<f32>,
}

impl Centroids {
    /// Lists.
    pub fn lists(&self) -> usize {
        self.values.len() / self.dim
    }

    /// `out[i]` = the list of row `i` of `rows` (`out.len()` rows of `dim`),
    /// and its dot product; on several threads when there is enough work.
    pub fn nearest(&self, rows: &[f32], out: &mut [(u32, f32)]) {
        let per = per_thread(out.len(), out.len() * self.values.len());
        if per >= out.len() {
            nearest(&self.values, self.dim, rows, out);
            return;
        }
        std::thread::scope(|s| {
            for (i, chunk) in out.chunks_mut(per).enumerate() {
                let rows = &rows[i * per * self.dim..];
                s.spawn(move || nearest(&self.values, self.dim, rows, chunk));
            }
        });
    }
}

/// Items each thread takes of `items` that cost `work` multiply-adds in
/// all: every item on one thread below 2^22 (a thread costs more than it
/// saves there), else an even split over the cores; in blocks of 4, the unit
/// of [`dot4`], so that a split never changes a result.
fn per_thread(items: usize, work: usize) -> usize {
    let threads = if work < (1 << 22) {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    };
    items.div_ceil(threads).div_ceil(4).max(1) * 4
}

/// SplitMix64: the seeded choices of k-means++ (and the tests' seeded
/// mutations).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Centroids seeded per pass over the sample (see [`kmeans`]).
const SEED_BATCH: usize = 8;

/// What k-means made.
#[derive(Debug, Clone)]
pub struct KMeans {
    /// The centroids.
    pub centroids: Centroids,
    /// Lloyd iterations run.
    pub iterations: u32,
}

/// Spherical k-means of the unit rows `sample` (`m × dim`) into `lists`
/// centroids: k-means++ seeding by `seed` (weights 1 − the best dot product,
/// half the squared distance; from the 8th on, up to 8 drawn per
/// pass, as in k-means‖'s oversampling rounds), then Lloyd iterations until no row changes
/// list or `max_iterations`. A list left empty is given the row farthest
/// from its centroid, so that no centroid is wasted on the sample.
pub fn kmeans(sample: &[f32], dim: usize, lists: usize, seed: u64, max_iterations: u32) -> KMeans {
    let m = sample.len() / dim;
    assert!(
        lists >= 1 && m >= lists,
        "k-means of {m} rows into {lists} lists"
    );
    let row = |i: usize| &sample[i * dim..(i + 1) * dim];
    let mut rng = Rng(seed ^ 0x5EED_1F5E_ED15_EED5);
    let mut values = Vec::with_capacity(lists * dim);
    let first = (rng.next() % m as u64) as usize;
    values.extend_from_slice(row(first));
    let mut best = vec![(0u32, 0f32); m];
    Centroids {
        dim,
        values: values.clone(),
    }
    .nearest(sample, &mut best);
    let mut one = vec![(0u32, 0f32); m];
    // Once l centroids are placed, a pass over the sample seeds up to
    // l / 8 (at most SEED_BATCH) drawn from the same weights, then updates
    // every row's best dot product against all of them at once. A pass
    // against one centroid is bound by reading the sample from memory (196 MB
    // at 64 000 rows of 768): seeding 1 000 lists one a pass took 30 of
    // k-means' 32 s. The first centroids, where two draws from one cluster
    // would cost the most, are still placed one a pass.
    let mut l = 1;
    while l < lists {
        let batch = (l / 8).clamp(1, SEED_BATCH).min(lists - l);
        let weights: Vec<f64> = best
            .iter()
            .map(|b| (1.0 - f64::from(b.1)).max(0.0))
            .collect();
        let total: f64 = weights.iter().sum();
        for _ in 0..batch {
            let pick = if total > 0.0 && total.is_finite() {
                let mut t = rng.unit() * total;
                let mut pick = m - 1;
                for (i, w) in weights.iter().enumerate() {
                    if t < *w {
                        pick = i;
                        break;
                    }
                    t -= w;
                }
                pick
            } else {
                (rng.next() % m as u64) as usize
            };
            values.extend_from_slice(row(pick));
        }
        let c = Centroids {
            dim,
            values: values[l * dim..].to_vec(),
        };
        c.nearest(sample, &mut one);
        for (b, o) in best.iter_mut().zip(&one) {
            if o.1 > b.1 {
                *b = (l as u32 + o.0, o.1);
            }
        }
        l += batch;
    }
    let mut centroids = Centroids { dim, values };
    let mut labels = vec![(u32::MAX, 0f32); m];
    let mut next = vec![(0u32, 0f32); m];
    let mut iterations = 0;
    while iterations < max_iterations {
        centroids.nearest(sample, &mut next);
        iterations += 1;
        if next.iter().map(|n| n.0).eq(labels.iter().map(|l| l.0)) {
            break;
        }
        std::mem::swap(&mut labels, &mut next);
        update(&mut centroids, sample, &labels);
    }
    KMeans {
        centroids,
        iterations,
    }
}

/// Each centroid becomes the normalised mean of its rows; an empty list
/// takes the row farthest from its own centroid (each such row once).
fn update(c: &mut Centroids, sample: &[f32], labels: &[(u32, f32)]) {
    let dim = c.dim;
    let mut sums = vec![0f64; c.values.len()];
    let mut counts = vec![0u64; c.lists()];
    for (r, (l, _)) in sample.chunks_exact(dim).zip(labels) {
        let l = *l as usize;
        counts[l] += 1;
        for (s, x) in sums[l * dim..(l + 1) * dim].iter_mut().zip(r) {
            *s += f64::from(*x);
        }
    }
    let mut far: Vec<usize> = (0..labels.len()).collect();
    far.sort_by(|&a, &b| labels[a].1.total_cmp(&labels[b].1).then(a.cmp(&b)));
    let mut far = far.into_iter();
    for l in 0..counts.len() {
        let s = &mut sums[l * dim..(l + 1) * dim];
        let n = s.iter().map(|x| x * x).sum::<f64>().sqrt();
        if counts[l] == 0 || n == 0.0 || !n.is_finite() {
            if let Some(i) = far.next() {
                let r = &sample[i * dim..(i + 1) * dim];
                c.values[l * dim..(l + 1) * dim].copy_from_slice(r);
            }
            continue;
        }
        for (v, x) in c.values[l * dim..(l + 1) * dim].iter_mut().zip(s.iter()) {
            *v = (x / n) as f32;
        }
    }
}

// ---- centroids.parquet ---------------------------------------------------------

/// The schema of `centroids.parquet` for dimension `dim`.
pub fn centroids_schema(dim: usize) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(LIST, DataType::Int32, false),
        Field::new("centroid", embedding_type(dim), false),
        Field::new("rows", DataType::Int64, false),
    ]))
}

/// `centroids.parquet`'s bytes: one row per list, in list order, with the
/// rows each list got.
pub fn encode_centroids(c: &Centroids, rows: &[u64]) -> Result<Vec<u8>> {
    let schema = centroids_schema(c.dim);
    let lists = Int32Array::from_iter_values(0..c.lists() as i32);
    let values = Float32Array::from(c.values.clone());
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let centroid = FixedSizeListArray::try_new(item, c.dim as i32, Arc::new(values), None)
        .map_err(|e| encode_err(Box::new(e)))?;
    let counts = Int64Array::from_iter_values(rows.iter().map(|&n| n as i64));
    let cols: Vec<ArrayRef> = vec![Arc::new(lists), Arc::new(centroid), Arc::new(counts)];
    let batch = RecordBatch::try_new_with_options(
        schema.clone(),
        cols,
        &RecordBatchOptions::new().with_row_count(Some(c.lists())),
    )
    .map_err(|e| encode_err(Box::new(e)))?;
    let props = WriterProperties::builder()
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_max_row_group_row_count(Some(CENTROID_GROUP_ROWS))
        .build();
    let mut w = ArrowWriter::try_new(Vec::new(), schema, Some(props))
        .map_err(|e| encode_err(Box::new(e)))?;
    w.write(&batch).map_err(|e| encode_err(Box::new(e)))?;
    w.into_inner().map_err(|e| encode_err(Box::new(e)))
}

fn encode_err(source: Box<dyn std::error::Error + Send + Sync>) -> Error {
    QueryError::Write {
        path: CENTROIDS_FILE.to_owned(),
        source,
    }
    .into()
}

/// Centroids a row group of `centroids.parquet` holds: a search that ranks
/// them as they are read holds one group (768 KiB at D = 768), not the file
/// (9.7 MiB at 3,162 lists).
pub const CENTROID_GROUP_ROWS: usize = 256;

/// Files of centroids up to this size are read once, into memory, and
/// decoded from there; larger ones are read twice a piece at a time
/// ([`read_centroids`]). At D = 768 that is up to about 1,300 lists.
const WHOLE_CENTROIDS_BYTES: u64 = 4 << 20;

/// Reads `centroids.parquet` (`path` in `store`, named `uri` in messages)
/// of `lists` centroids of dimension `dim` (read whole when at most `whole`
/// bytes, [`WHOLE_CENTROIDS_BYTES`] but in tests), checking it is the file whose
/// sha256 the manifest recorded, and hands each batch of centroids to `each`
/// as it is read: the first list's number, the values (row-major), each
/// list's rows. Returns the bytes fetched.
///
/// Never more than [`WHOLE_CENTROIDS_BYTES`] of the file and one batch of
/// values are held. A larger file is read twice, both times a piece at a
/// time: whole for its sha256, then its row groups for the centroids.
/// Holding the file and its decoded values was the peak of a single search
/// at 10^7 rows (19 MiB at 3,162 lists, where a group's scan needs 2;
/// docs/benchmarks.md); a small file is read once, as the bytes fetched by
/// a search of a small index are mostly its centroids. A file larger than
/// `lists` centroids can be is refused before it is read.
pub(crate) async fn read_centroids(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    uri: &str,
    sha256: &str,
    (dim, lists, whole): (usize, usize, u64),
    mut each: impl FnMut(u32, &[f32], &[u64]),
) -> Result<u64> {
    let bad = |problem: String| -> Error { QueryError::dataset(uri, problem).into() };
    if lists == 0 || lists > MAX_LISTS as usize {
        return Err(bad(format!(
            "the manifest says {lists} lists: a layout has 1 to {MAX_LISTS}"
        )));
    }
    let got = store.get(path).await?;
    let size = got.meta.size;
    // Values, a page header every 64 KiB of them at most, and the footer's
    // statistics of a group every 256 lists, with room to spare.
    let most = (lists * (dim * 4 + 64) + (1 << 20)) as u64;
    if size > most {
        return Err(bad(format!(
            "{size} bytes: more than {lists} centroids of {dim} floats take ({most} at most)"
        )));
    }
    let same = |hash: Sha256| -> Result<()> {
        let sha = hex::encode(hash.finalize());
        if sha != sha256 {
            return Err(bad(format!(
                "sha256 {sha}, but the manifest says {sha256}: the dataset changed since it was compacted"
            )));
        }
        Ok(())
    };
    let not_parquet = |source| QueryError::NotParquet {
        uri: uri.to_owned(),
        source,
    };
    let mut next = 0i32;
    let mut take = |batch: &RecordBatch| -> Result<()> {
        let first = next;
        let (values, rows) = centroid_batch(batch, dim, &mut next, uri)?;
        if next as usize > lists {
            return Err(bad(format!(
                "more than {lists} centroids, but the manifest says {lists} lists"
            )));
        }
        each(first as u32, values, &rows);
        Ok(())
    };
    let read = if size <= whole {
        let bytes = got.bytes().await?;
        same(Sha256::new_with_prefix(&bytes))?;
        // The sha256 ties the file to the manifest, not to a writer that
        // made it well: parquet-rs panics on some corrupt pages.
        let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<()> {
            let batches = ParquetRecordBatchReaderBuilder::try_new(bytes)
                .map(|b| b.with_batch_size(CENTROID_GROUP_ROWS))
                .and_then(|b| b.build())
                .map_err(not_parquet)?;
            for batch in batches {
                take(&batch.map_err(|source| QueryError::Rows {
                    uri: uri.to_owned(),
                    source,
                })?)?;
            }
            Ok(())
        }));
        decoded.unwrap_or_else(|panic| {
            Err(QueryError::Read {
                uri: uri.to_owned(),
                source: reader_panicked(panic.as_ref()),
            }
            .into())
        })?;
        size
    } else {
        same(sha256_of(got, uri).await?)?;
        let read = Arc::new(AtomicU64::new(size));
        let reader = StoreReader::new(store.clone(), path.clone(), size, read.clone());
        let builder = std::panic::AssertUnwindSafe(ParquetRecordBatchStreamBuilder::new(reader))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(reader_panicked(panic.as_ref())))
            .map_err(not_parquet)?;
        let batches = builder
            .with_batch_size(CENTROID_GROUP_ROWS)
            .build()
            .map_err(not_parquet)?;
        let mut batches = guarded(batches);
        while let Some(batch) = batches.next().await {
            take(&batch.map_err(|source| QueryError::Read {
                uri: uri.to_owned(),
                source,
            })?)?;
        }
        read.load(Ordering::Relaxed)
    };
    if next as usize != lists {
        return Err(bad(format!(
            "{next} centroids, but the manifest says {lists} lists"
        )));
    }
    Ok(read)
}

/// The sha256 of the whole of `got`, read a piece at a time: a local file
/// in 1 MiB reads on the blocking pool (object_store's stream of it is
/// 8 KiB reads, a blocking task each: 1,200 for the centroids of 3,162
/// lists), another store's body as it streams in.
async fn sha256_of(got: GetResult, uri: &str) -> Result<Sha256> {
    let mut hash = Sha256::new();
    match got.payload {
        GetResultPayload::File(mut file, _) => {
            let hashed = tokio::task::spawn_blocking(move || {
                use std::io::Read;
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    match file.read(&mut buf) {
                        Ok(0) => return Ok(hash),
                        Ok(n) => hash.update(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
            })
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|r| r);
            hashed.map_err(|e| QueryError::dataset(uri, format!("reading it: {e}")).into())
        }
        GetResultPayload::Stream(mut pieces) => {
            while let Some(piece) = pieces.try_next().await? {
                hash.update(&piece);
            }
            Ok(hash)
        }
    }
}

/// The values and row counts of one batch of `centroids.parquet`, whose
/// lists must be `next`, `next + 1`, …; `next` moves past them.
fn centroid_batch<'a>(
    batch: &'a RecordBatch,
    dim: usize,
    next: &mut i32,
    uri: &str,
) -> Result<(&'a [f32], Vec<u64>)> {
    let bad = |problem: String| -> Error { QueryError::dataset(uri, problem).into() };
    let ids = batch
        .column_by_name(LIST)
        .and_then(|c| c.as_primitive_opt::<Int32Type>())
        .ok_or_else(|| QueryError::column(uri, LIST, "int32"))?;
    let cents = batch
        .column_by_name("centroid")
        .and_then(|c| c.as_fixed_size_list_opt())
        .filter(|c| c.value_length() as usize == dim && c.null_count() == 0)
        .ok_or_else(|| {
            bad(format!(
                "`centroid` is not a FixedSizeList<Float32, {dim}> without nulls"
            ))
        })?;
    let counts = batch
        .column_by_name("rows")
        .and_then(|c| c.as_primitive_opt::<Int64Type>())
        .filter(|c| c.null_count() == 0)
        .ok_or_else(|| QueryError::column(uri, "rows", "int64 without nulls"))?;
    let v = cents
        .values()
        .as_primitive_opt::<Float32Type>()
        .ok_or_else(|| QueryError::column(uri, "centroid values", "float32"))?;
    for i in 0..ids.len() {
        if ids.is_null(i) || ids.value(i) != *next {
            return Err(bad(format!(
                "its lists are not 0, 1, 2, … in order (row {next})"
            )));
        }
        *next += 1;
    }
    let start = cents.offset() * dim;
    let values = &v.values()[start..start + cents.len() * dim];
    Ok((
        values,
        counts.values().iter().map(|&n| n.max(0) as u64).collect(),
    ))
}

// ---- Search --------------------------------------------------------------------

/// `ivf` of a manifest, the only key a probe needs.
#[derive(serde::Deserialize)]
struct WithIvf {
    #[serde(default)]
    ivf: Option<IvfLayout>,
}

/// An IVF dataset's centroids, opened for a search.
#[derive(Debug)]
pub(crate) struct Probe {
    /// The centroids and each list's rows, when held (a resident search
    /// ranks them for every query); a single pass reads them as it ranks.
    held: Option<(Centroids, Vec<u64>)>,
    /// The index's store.
    store: Arc<dyn ObjectStore>,
    /// `centroids.parquet`: path, URI and the sha256 the manifest records.
    file: (Path, String, String),
    /// Embedding dimension.
    dim: usize,
    /// Lists in the layout.
    lists: usize,
    /// [`WHOLE_CENTROIDS_BYTES`], but in tests.
    whole: u64,
    /// Lists probed.
    pub(crate) nprobe: usize,
    /// Bytes fetched for it (manifest and centroids).
    bytes_read: AtomicU64,
}

/// The lists a batch of queries probes, and which queries probe each.
///
/// Each query is scored against exactly the row groups a search of it alone
/// would read, so its answer does not depend on the rest of its batch.
#[derive(Debug, Clone)]
pub(crate) struct Probed {
    /// By list: the queries (their indices in the batch, ascending) that
    /// probe it.
    by_list: Vec<Arc<[u32]>>,
    /// Every query of the batch, for groups the statistics say nothing of;
    /// shared, not one copy a group.
    all: Arc<[u32]>,
}

impl Probe {
    /// The IVF layout of `index`, when its manifest records one and `nprobe`
    /// asks for fewer than all lists, with its centroids read and `held`
    /// when asked (a resident search). `--nprobe P` on a dataset without
    /// lists is refused (it would silently be an exact scan); `--nprobe
    /// all` is what such a dataset does anyway.
    pub(crate) async fn open(
        index: &Index,
        nprobe: Option<NProbe>,
        hold: bool,
    ) -> Result<Option<Probe>> {
        let layout = match &index.manifest {
            Some(_) => {
                let loc = &index.root;
                let bytes = loc
                    .store
                    .get(&loc.child(MANIFEST_FILE))
                    .await?
                    .bytes()
                    .await?;
                let m: WithIvf =
                    serde_json::from_slice(&bytes).map_err(|source| QueryError::Manifest {
                        uri: format!("{}/{MANIFEST_FILE}", loc.url),
                        source,
                    })?;
                m.ivf.map(|l| (l, bytes.len() as u64))
            }
            None => None,
        };
        let Some((layout, manifest_bytes)) = layout else {
            return match nprobe {
                Some(NProbe::Lists(_)) => Err(QueryError::flag(
                    "--nprobe",
                    format!(
                        "{} has no lists (no `ivf` in its manifest): make an IVF layout with \
                         `rsembed compact --lists N`, or leave --nprobe out for an exact search",
                        index.root.url
                    ),
                )
                .into()),
                _ => Ok(None),
            };
        };
        if nprobe == Some(NProbe::All) {
            return Ok(None);
        }
        let loc = &index.root;
        let uri = format!(
            "{}/{}",
            loc.url.as_str().trim_end_matches('/'),
            layout.centroids.path
        );
        let lists = layout.lists as usize;
        let mut probe = Probe {
            held: None,
            store: loc.store.clone(),
            file: (
                loc.child(&layout.centroids.path),
                uri,
                layout.centroids.sha256,
            ),
            dim: index.embed_dim,
            lists,
            whole: WHOLE_CENTROIDS_BYTES,
            nprobe: match nprobe {
                Some(NProbe::Lists(p)) => p.min(lists),
                _ => default_nprobe(lists),
            },
            bytes_read: AtomicU64::new(manifest_bytes),
        };
        if hold {
            probe.hold().await?;
        }
        Ok(Some(probe))
    }

    /// Reads the centroids into memory, to rank them for query after query.
    async fn hold(&mut self) -> Result<()> {
        let (mut values, mut rows) = (Vec::new(), Vec::new());
        self.read(|_, v, r| {
            values.extend_from_slice(v);
            rows.extend_from_slice(r);
        })
        .await?;
        let dim = self.dim;
        self.held = Some((Centroids { dim, values }, rows));
        Ok(())
    }

    /// Bytes fetched for the probe so far (manifest and centroids).
    pub(crate) fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    async fn read(&self, each: impl FnMut(u32, &[f32], &[u64])) -> Result<()> {
        let (path, uri, sha) = &self.file;
        let dims = (self.dim, self.lists, self.whole);
        let n = read_centroids(&self.store, path, uri, sha, dims, each).await?;
        self.bytes_read.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// The lists each of the unit `queries` probes: its `nprobe` best
    /// non-empty lists by dot product with the centroids (ties to the lower
    /// list), on several threads when there is enough work; centroids not
    /// held are read as they are ranked.
    pub(crate) async fn probe(&self, queries: &[&[f32]]) -> Result<Probed> {
        let dim = self.dim;
        let per = per_thread(queries.len(), queries.len() * self.lists * dim);
        let chunks: Vec<&[&[f32]]> = queries.chunks(per).collect();
        let mut bests: Vec<Best> = chunks
            .iter()
            .map(|c| Best::new(c.len(), self.nprobe))
            .collect();
        match &self.held {
            Some((c, rows)) => offer(&mut bests, &chunks, dim, (0, &c.values, rows)),
            None => {
                self.read(|first, values, rows| {
                    offer(&mut bests, &chunks, dim, (first, values, rows));
                })
                .await?
            }
        }
        let chosen = bests.into_iter().flat_map(Best::finish);
        Ok(Probed::of(chosen, self.lists, queries.len()))
    }
}

/// Offers centroids (first list, values, rows) to each chunk of queries'
/// [`Best`]; one chunk on this thread (a thread started and joined for it
/// was 4 % of a resident query at `--nprobe 1`, `clone3` alone), more on
/// one thread each.
fn offer(bests: &mut [Best], chunks: &[&[&[f32]]], dim: usize, cents: (u32, &[f32], &[u64])) {
    if let [best] = bests {
        best.offer(chunks[0], dim, cents);
        return;
    }
    std::thread::scope(|s| {
        for (best, chunk) in bests.iter_mut().zip(chunks) {
            s.spawn(move || best.offer(chunk, dim, cents));
        }
    });
}

/// Each query's best lists among the centroids offered so far: at most
/// `nprobe` after each offer, in the order "higher dot product, then lower
/// list", a total order, so that the lists chosen do not depend on how the
/// centroids came in.
struct Best {
    nprobe: usize,
    kept: Vec<Vec<(f32, u32)>>,
    scores: Vec<[f32; 4]>,
    one: Vec<f32>,
}

impl Best {
    fn new(queries: usize, nprobe: usize) -> Best {
        Best {
            nprobe,
            kept: vec![Vec::new(); queries],
            scores: Vec::new(),
            one: Vec::new(),
        }
    }

    fn offer(
        &mut self,
        queries: &[&[f32]],
        dim: usize,
        (first, values, rows): (u32, &[f32], &[u64]),
    ) {
        let lists = rows.len().min(values.len() / dim);
        self.scores.resize(lists, [0f32; 4]);
        self.one.resize(lists, 0.0);
        let values = &values[..lists * dim];
        for (ci, chunk) in queries.chunks(4).enumerate() {
            if let [q] = chunk {
                // One query (a resident search's line): a quarter of the
                // work of four lanes of the same query, 13 % of such a
                // query's time before.
                dots(values, dim, q, &mut self.one);
                for (s, &d) in self.scores.iter_mut().zip(&self.one) {
                    s[0] = d;
                }
            } else {
                let q = |k: usize| chunk[k.min(chunk.len() - 1)];
                let four = [q(0), q(1), q(2), q(3)];
                for (s, c) in self.scores.iter_mut().zip(values.chunks_exact(dim)) {
                    *s = dot4(four, c);
                }
            }
            for k in 0..chunk.len() {
                let kept = &mut self.kept[ci * 4 + k];
                kept.extend(
                    (0..lists)
                        .filter(|&l| rows[l] > 0)
                        .map(|l| (self.scores[l][k], first + l as u32)),
                );
                keep_best(kept, self.nprobe);
            }
        }
    }

    /// Each query's lists, ascending.
    fn finish(self) -> impl Iterator<Item = Vec<u32>> {
        self.kept.into_iter().map(|kept| {
            let mut ls: Vec<u32> = kept.into_iter().map(|(_, l)| l).collect();
            ls.sort_unstable();
            ls
        })
    }
}

/// Keeps the `n` best of `kept`: higher score first, then lower list.
fn keep_best(kept: &mut Vec<(f32, u32)>, n: usize) {
    if kept.len() > n {
        kept.select_nth_unstable_by(n, |a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        kept.truncate(n);
    }
}

impl Probed {
    /// The probe of `queries` queries over `lists` lists, from each query's
    /// lists.
    fn of(chosen: impl Iterator<Item = Vec<u32>>, lists: usize, queries: usize) -> Probed {
        let mut by_list = vec![Vec::new(); lists];
        for (qi, ls) in chosen.enumerate() {
            for l in ls {
                by_list[l as usize].push(qi as u32);
            }
        }
        // Lists no query probes share one empty slice: a thousand
        // allocations a resident query otherwise.
        let none: Arc<[u32]> = Arc::from([]);
        Probed {
            by_list: by_list
                .into_iter()
                .map(|qs| {
                    if qs.is_empty() {
                        none.clone()
                    } else {
                        Arc::from(qs)
                    }
                })
                .collect(),
            all: (0..queries as u32).collect(),
        }
    }

    /// The queries that score a row group whose `list` statistics give
    /// `list` (least and greatest): those probing a list in it, ascending;
    /// every query when it has no usable statistics (such a group is read).
    /// Empty: skip the group.
    pub(crate) fn scorers(&self, list: Option<(i32, i32)>) -> Arc<[u32]> {
        let all = || self.all.clone();
        let Some((lo, hi)) = list else {
            return all();
        };
        let n = self.by_list.len() as i64;
        let (lo, hi) = (i64::from(lo), i64::from(hi));
        // Statistics naming no list of the centroids prove nothing: read the group.
        if lo > hi || lo < 0 || hi >= n {
            return all();
        }
        if lo == hi {
            return self.by_list[lo as usize].clone();
        }
        let mut qs: Vec<u32> = (lo..=hi)
            .flat_map(|l| self.by_list[l as usize].iter().copied())
            .collect();
        qs.sort_unstable();
        qs.dedup();
        qs.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsembed_query::kernels::dot;

    fn gen(seed: u64, n: usize, dim: usize, centres: usize, spread: f32) -> Vec<f32> {
        let mut r = Rng(seed);
        let mut gauss = move || {
            let (u1, u2) = (1.0 - r.unit(), r.unit());
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        };
        let cs: Vec<Vec<f32>> = (0..centres)
            .map(|_| unit((0..dim).map(|_| gauss()).collect()))
            .collect();
        let mut out = Vec::new();
        for i in 0..n {
            let c = &cs[i % centres];
            out.extend(unit(c.iter().map(|x| x + spread * gauss()).collect()));
        }
        out
    }

    fn unit(v: Vec<f32>) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / n).collect()
    }

    #[test]
    fn nearest_is_the_argmax_of_dot_bit_for_bit_with_any_block_or_thread_split() {
        for dim in [3, 16, 17, 64, 100] {
            let rows = gen(1, 4099, dim, 7, 0.3);
            let cents = Centroids {
                dim,
                values: gen(2, 37, dim, 37, 0.0),
            };
            let mut out = vec![(0, 0.0); 4099];
            cents.nearest(&rows, &mut out);
            for (i, r) in rows.chunks_exact(dim).enumerate() {
                let d: Vec<f32> = cents.values.chunks_exact(dim).map(|c| dot(r, c)).collect();
                let best = (0..d.len()).fold(0, |b, l| if d[l] > d[b] { l } else { b });
                assert_eq!(out[i], (best as u32, d[best]), "dim {dim} row {i}");
            }
            let mut one = vec![(0, 0.0); 5];
            nearest(&cents.values, dim, &rows[7 * dim..12 * dim], &mut one);
            assert_eq!(&one[..], &out[7..12]);
        }
    }

    #[test]
    fn kmeans_finds_separated_clusters_and_is_deterministic() {
        let dim = 32;
        let rows = gen(3, 2000, dim, 10, 0.05);
        let a = kmeans(&rows, dim, 10, 7, 20);
        let b = kmeans(&rows, dim, 10, 7, 20);
        assert_eq!(a.centroids, b.centroids);
        let mut out = vec![(0, 0.0); 2000];
        a.centroids.nearest(&rows, &mut out);
        // Rows of one generating centre share a list, and the ten lists are distinct.
        for c in 0..10 {
            let l = out[c].0;
            assert!((c..2000).step_by(10).all(|i| out[i].0 == l), "centre {c}");
        }
        let mut lists: Vec<u32> = (0..10).map(|c| out[c].0).collect();
        lists.sort_unstable();
        lists.dedup();
        assert_eq!(lists.len(), 10);
        assert!(a.iterations < 20);
        for c in a.centroids.values.chunks_exact(dim) {
            let n: f32 = c.iter().map(|x| x * x).sum();
            assert!((n - 1.0).abs() < 1e-4);
        }
        assert_ne!(kmeans(&rows, dim, 10, 8, 20).centroids, a.centroids);
    }

    #[test]
    fn kmeans_of_identical_rows_leaves_no_nan() {
        let rows: Vec<f32> = [0.6f32, 0.8].repeat(50);
        let k = kmeans(&rows, 2, 5, 1, 5);
        assert!(k.centroids.values.iter().all(|v| v.is_finite()));
    }

    /// `centroids` written as `centroids.parquet` in `dir`: its store, path
    /// and sha256.
    fn centroids_file(
        dir: &std::path::Path,
        c: &Centroids,
        rows: &[u64],
    ) -> (Arc<dyn ObjectStore>, Path, String) {
        let bytes = encode_centroids(c, rows).unwrap();
        std::fs::write(dir.join(CENTROIDS_FILE), &bytes).unwrap();
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir).unwrap();
        let sha = hex::encode(Sha256::digest(&bytes));
        (Arc::new(store), Path::from(CENTROIDS_FILE), sha)
    }

    fn probe_of(
        file: &(Arc<dyn ObjectStore>, Path, String),
        dim: usize,
        lists: usize,
        nprobe: usize,
        whole: u64,
    ) -> Probe {
        Probe {
            held: None,
            store: file.0.clone(),
            file: (file.1.clone(), "c".into(), file.2.clone()),
            dim,
            lists,
            whole,
            nprobe,
            bytes_read: AtomicU64::new(0),
        }
    }

    #[tokio::test]
    async fn a_batch_probes_each_query_s_best_non_empty_lists_held_or_read_as_ranked() {
        let dim = 24;
        // Two row groups of the file (256 and 44 centroids).
        let lists = 300;
        let cents = Centroids {
            dim,
            values: unit(gen(5, lists, dim, lists, 0.0)),
        };
        let mut rows = vec![10u64; lists];
        for l in (0..lists).step_by(7) {
            rows[l] = 0;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = centroids_file(dir.path(), &cents, &rows);
        let streamed = probe_of(&file, dim, lists, 9, 0);
        let whole = probe_of(&file, dim, lists, 9, u64::MAX);
        let mut held = probe_of(&file, dim, lists, 9, 0);
        held.hold().await.unwrap();
        assert_eq!(held.held, Some((cents.clone(), rows.clone())));
        // Enough queries for the threaded path (work ≥ 2^22), and a ragged last chunk.
        let qs = unit(gen(6, 1_003, dim, 50, 0.3));
        let queries: Vec<&[f32]> = qs.chunks_exact(dim).collect();
        assert!(queries.len() * cents.values.len() >= 1 << 22);
        let mut want = vec![Vec::new(); lists];
        for (qi, q) in queries.iter().enumerate() {
            let d: Vec<f32> = cents.values.chunks_exact(dim).map(|c| dot(c, q)).collect();
            let mut order: Vec<usize> = (0..lists).filter(|&l| rows[l] > 0).collect();
            order.sort_by(|&a, &b| d[b].total_cmp(&d[a]).then(a.cmp(&b)));
            for &l in &order[..9] {
                want[l].push(qi as u32);
            }
        }
        for probe in [&streamed, &whole, &held] {
            for qs in [&queries[..], &queries[..1], &queries[..3]] {
                let probed = probe.probe(qs).await.unwrap();
                let got: Vec<Vec<u32>> = probed.by_list.iter().map(|q| q.to_vec()).collect();
                let want: Vec<Vec<u32>> = want
                    .iter()
                    .map(|w| {
                        w.iter()
                            .copied()
                            .filter(|&q| (q as usize) < qs.len())
                            .collect()
                    })
                    .collect();
                assert_eq!(got, want);
                assert_eq!(probed.all.len(), qs.len());
            }
        }
        // Read as ranked: the file for each probe, streamed twice over.
        let size = std::fs::metadata(dir.path().join(CENTROIDS_FILE))
            .unwrap()
            .len();
        assert!(
            streamed.bytes_read() > 3 * 2 * size - 3 * 1000,
            "{}",
            streamed.bytes_read()
        );
        assert_eq!(whole.bytes_read(), 3 * size);
    }

    #[tokio::test]
    async fn centroids_round_trip_through_parquet_and_a_wrong_file_is_refused() {
        let c = Centroids {
            dim: 3,
            values: vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
        };
        let bytes = encode_centroids(&c, &[5, 0]).unwrap();
        assert_eq!(bytes, encode_centroids(&c, &[5, 0]).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let (store, path, sha) = centroids_file(dir.path(), &c, &[5, 0]);
        // Each case read both ways: streamed twice over, and whole.
        let read = |sha: String, (dim, lists): (usize, usize)| {
            let (store, path) = (store.clone(), path.clone());
            async move {
                let mut got = Vec::new();
                for whole in [0, u64::MAX] {
                    let (mut values, mut rows) = (Vec::new(), Vec::new());
                    let r = read_centroids(
                        &store,
                        &path,
                        "c",
                        &sha,
                        (dim, lists, whole),
                        |first, v, r| {
                            assert_eq!(first as usize, rows.len());
                            values.extend_from_slice(v);
                            rows.extend_from_slice(r);
                        },
                    )
                    .await;
                    got.push(r.map(|_| (values, rows)));
                }
                let whole = got.pop().unwrap();
                match (got.pop().unwrap(), whole) {
                    (Ok(a), Ok(b)) => {
                        assert_eq!(a, b, "streamed or whole");
                        Ok(a)
                    }
                    (Err(a), Err(b)) => {
                        assert_eq!(a.to_string(), b.to_string(), "streamed or whole");
                        Err(a)
                    }
                    (a, b) => panic!("streamed {a:?}, whole {b:?}"),
                }
            }
        };
        let back = read(sha.clone(), (3, 2)).await.unwrap();
        assert_eq!(back, (c.values.clone(), vec![5, 0]));
        let err = |r: Result<(Vec<f32>, Vec<u64>)>| r.unwrap_err().to_string();
        let e = err(read(sha.clone(), (3, 3)).await);
        assert!(e.contains("2 centroids, but the manifest says 3"), "{e}");
        let e = err(read(sha.clone(), (3, 1)).await);
        assert!(e.contains("more than 1 centroids"), "{e}");
        let e = err(read(sha.clone(), (4, 2)).await);
        assert!(e.contains("FixedSizeList<Float32, 4>"), "{e}");
        let e = err(read("0".repeat(64), (3, 2)).await);
        assert!(
            e.contains("the dataset changed since it was compacted"),
            "{e}"
        );
        let e = err(read(sha.clone(), (3, 1 << 20)).await);
        assert!(e.contains("a layout has 1 to 65536"), "{e}");
        // A file larger than its lists' centroids can be is not read.
        let mut big = bytes.clone();
        big.resize((1 << 20) + 4096, 0);
        std::fs::write(dir.path().join(CENTROIDS_FILE), &big).unwrap();
        let e = err(read(sha, (3, 2)).await);
        assert!(e.contains("more than 2 centroids of 3 floats take"), "{e}");
    }

    #[test]
    fn nprobe_parses_numbers_and_all() {
        assert_eq!(parse_nprobe("all"), Ok(NProbe::All));
        assert_eq!(parse_nprobe("12"), Ok(NProbe::Lists(12)));
        assert!(parse_nprobe("0").is_err());
        assert!(parse_nprobe("-1").is_err());
        assert_eq!(default_nprobe(4), 4);
        assert_eq!(default_nprobe(100), 8);
        assert_eq!(default_nprobe(1000), 63);
        assert_eq!(default_sample(1_000_000, 1000, 768), 64_000);
        assert_eq!(default_sample(1000, 1000, 768), 1000);
        assert_eq!(default_sample(10_000_000, 4000, 768), 87_381);
    }
}
