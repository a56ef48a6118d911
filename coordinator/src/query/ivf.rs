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
//! fixed order, and the dot products are `query::scan::dot`'s
//! (same lanes, same reduction), so a row's list is the one a scan would
//! rank first.
//!
//! Compaction's side is in `compact/lists.rs`; search's is `Probe`.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int32Type, Int64Type};
use arrow_array::{Array, ArrayRef, FixedSizeListArray, Float32Array, Int32Array, Int64Array};
use arrow_array::{RecordBatch, RecordBatchOptions};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use rsembed_schemas::chip::embedding_type;
use rsembed_schemas::job::{IvfLayout, CENTROIDS_FILE, MANIFEST_FILE};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::query::index::{reader_panicked, Index};
use crate::query::scan::{dot4, dots};
use crate::query::Error as QueryError;

/// The column of a row's list, appended after the chip columns.
pub const LIST: &str = "list";
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
            nearest_rows(&self.values, self.dim, rows, out);
            return;
        }
        std::thread::scope(|s| {
            for (i, chunk) in out.chunks_mut(per).enumerate() {
                let rows = &rows[i * per * self.dim..];
                s.spawn(move || nearest_rows(&self.values, self.dim, rows, chunk));
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

fn nearest_rows(cents: &[f32], dim: usize, rows: &[f32], out: &mut [(u32, f32)]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA, checked just above.
        unsafe { nearest_avx2(cents, dim, rows, out) };
        return;
    }
    nearest_generic(cents, dim, rows, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn nearest_avx2(cents: &[f32], dim: usize, rows: &[f32], out: &mut [(u32, f32)]) {
    nearest_generic(cents, dim, rows, out);
}

/// Four rows against each centroid at once: each centroid is read from
/// cache once per four rows instead of once per row, which bounds the speed
/// when the centroids outgrow L2 (1000 lists of 768 floats are 3 MB).
#[inline(always)]
fn nearest_generic(cents: &[f32], dim: usize, rows: &[f32], out: &mut [(u32, f32)]) {
    let mut blocks = out.chunks_mut(4);
    let mut r = 0;
    for block in &mut blocks {
        let n = block.len();
        let row = |k: usize| &rows[(r + k.min(n - 1)) * dim..(r + k.min(n - 1) + 1) * dim];
        let (a, b, c, d) = (row(0), row(1), row(2), row(3));
        let mut best = [(0u32, f32::NEG_INFINITY); 4];
        for (l, cent) in cents.chunks_exact(dim).enumerate() {
            let s = dot4([a, b, c, d], cent);
            for k in 0..4 {
                // `>`: ties go to the lower list. NaN never wins, so a row of NaNs gets list 0.
                if s[k] > best[k].1 {
                    best[k] = (l as u32, s[k]);
                }
            }
        }
        block.copy_from_slice(&best[..n]);
        r += n;
    }
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

/// Reads `centroids.parquet` bytes of dimension `dim` with `lists` lists:
/// the centroids and each list's rows.
pub fn decode_centroids(
    bytes: Bytes,
    dim: usize,
    lists: usize,
    uri: &str,
) -> Result<(Centroids, Vec<u64>)> {
    let bad = |problem: String| -> Error { QueryError::dataset(uri, problem).into() };
    // Small batches: a batch of the default 1,024 centroids at D = 768 is
    // 3 MiB of values and 6 MiB of list levels, on top of the file and the
    // decoded table, at the peak of a search that probes a few lists.
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map(|b| b.with_batch_size(64))
        .and_then(|b| b.build())
        .map_err(|source| QueryError::NotParquet {
            uri: uri.to_owned(),
            source,
        })?;
    let mut values = Vec::with_capacity(lists * dim);
    let mut rows = Vec::with_capacity(lists);
    let mut next = 0i32;
    for batch in reader {
        let batch = batch.map_err(|source| QueryError::Rows {
            uri: uri.to_owned(),
            source,
        })?;
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
        rows.extend(counts.values().iter().map(|&n| n.max(0) as u64));
        let v = cents
            .values()
            .as_primitive_opt::<Float32Type>()
            .ok_or_else(|| QueryError::column(uri, "centroid values", "float32"))?;
        let start = cents.offset() * dim;
        values.extend_from_slice(&v.values()[start..start + cents.len() * dim]);
        for i in 0..ids.len() {
            if ids.is_null(i) || ids.value(i) != next {
                return Err(bad(format!(
                    "its lists are not 0, 1, 2, … in order (row {next})"
                )));
            }
            next += 1;
        }
    }
    if next as usize != lists {
        return Err(bad(format!(
            "{next} centroids, but the manifest says {lists} lists"
        )));
    }
    Ok((Centroids { dim, values }, rows))
}

// ---- Search --------------------------------------------------------------------

/// `ivf` of a manifest, the only key a probe needs.
#[derive(serde::Deserialize)]
struct WithIvf {
    #[serde(default)]
    ivf: Option<IvfLayout>,
}

/// An IVF dataset's centroids, opened for a search.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    /// The centroids.
    pub(crate) centroids: Centroids,
    /// Lists probed.
    pub(crate) nprobe: usize,
    /// Rows of each list: empty lists are never probed (they have no row group).
    rows: Vec<u64>,
    /// Bytes fetched for it (manifest and centroids).
    pub(crate) bytes_read: u64,
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
    /// asks for fewer than all lists. `--nprobe P` on a dataset without
    /// lists is refused (it would silently be an exact scan); `--nprobe
    /// all` is what such a dataset does anyway.
    pub(crate) async fn open(index: &Index, nprobe: Option<NProbe>) -> Result<Option<Probe>> {
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
        let bytes = loc
            .store
            .get(&loc.child(&layout.centroids.path))
            .await?
            .bytes()
            .await?;
        let sha = hex::encode(Sha256::digest(&bytes));
        if sha != layout.centroids.sha256 {
            return Err(QueryError::dataset(
                &uri,
                format!(
                    "sha256 {sha}, but the manifest says {}: the dataset changed since it was compacted",
                    layout.centroids.sha256
                ),
            )
            .into());
        }
        let read = manifest_bytes + bytes.len() as u64;
        // The sha256 ties the file to the manifest, not to a writer that
        // made it well: parquet-rs panics on some corrupt pages.
        let (dim, lists) = (index.embed_dim, layout.lists as usize);
        let decoded = std::panic::catch_unwind(|| decode_centroids(bytes, dim, lists, &uri));
        let (centroids, rows) = decoded.unwrap_or_else(|panic| {
            Err(QueryError::Read {
                uri: uri.clone(),
                source: reader_panicked(panic.as_ref()),
            }
            .into())
        })?;
        let lists = centroids.lists();
        let probes = match nprobe {
            Some(NProbe::Lists(p)) => p.min(lists),
            _ => default_nprobe(lists),
        };
        Ok(Some(Probe {
            centroids,
            nprobe: probes,
            rows,
            bytes_read: read,
        }))
    }

    /// The lists each of the unit `queries` probes: its `nprobe` best
    /// non-empty lists by dot product with the centroids (ties to the lower
    /// list), on several threads when there is enough work.
    pub(crate) fn probe(&self, queries: &[&[f32]]) -> Probed {
        let lists = self.centroids.lists();
        let per = per_thread(queries.len(), queries.len() * self.centroids.values.len());
        // One chunk is ranked here: a thread started and joined for it was
        // 4 % of a resident query at `--nprobe 1` (`clone3` alone).
        let chosen: Vec<Vec<u32>> = if per >= queries.len() {
            self.best_lists(queries)
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = queries
                    .chunks(per)
                    .map(|chunk| s.spawn(move || self.best_lists(chunk)))
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().expect("a probe thread panicked"))
                    .collect()
            })
        };
        let mut by_list = vec![Vec::new(); lists];
        for (qi, ls) in chosen.iter().enumerate() {
            for &l in ls {
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
            all: (0..queries.len() as u32).collect(),
        }
    }

    /// [`Probe::probe`]'s choice for each of `queries`, on this thread.
    fn best_lists(&self, queries: &[&[f32]]) -> Vec<Vec<u32>> {
        let dim = self.centroids.dim;
        let lists = self.centroids.lists();
        let mut scores = vec![[0f32; 4]; lists];
        let mut one = vec![0f32; lists];
        let mut out = Vec::with_capacity(queries.len());
        for chunk in queries.chunks(4) {
            if let [q] = chunk {
                // One query (a resident search's line): a quarter of the
                // work of four lanes of the same query, 13 % of such a
                // query's time before.
                dots(&self.centroids.values, dim, q, &mut one);
                for (s, &d) in scores.iter_mut().zip(&one) {
                    s[0] = d;
                }
            } else {
                let q = |k: usize| chunk[k.min(chunk.len() - 1)];
                let four = [q(0), q(1), q(2), q(3)];
                for (s, c) in scores
                    .iter_mut()
                    .zip(self.centroids.values.chunks_exact(dim))
                {
                    *s = dot4(four, c);
                }
            }
            for (k, _) in chunk.iter().enumerate() {
                let better = |a: &u32, b: &u32| {
                    let (a, b) = (*a as usize, *b as usize);
                    scores[b][k].total_cmp(&scores[a][k]).then(a.cmp(&b))
                };
                let mut ls: Vec<u32> = (0..lists as u32)
                    .filter(|&l| self.rows[l as usize] > 0)
                    .collect();
                if self.nprobe < ls.len() {
                    ls.select_nth_unstable_by(self.nprobe, better);
                    ls.truncate(self.nprobe);
                }
                ls.sort_unstable();
                out.push(ls);
            }
        }
        out
    }
}

impl Probed {
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
    use crate::query::scan::dot;

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
            nearest_rows(&cents.values, dim, &rows[7 * dim..12 * dim], &mut one);
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

    #[test]
    fn a_batch_probes_each_query_s_best_non_empty_lists() {
        let dim = 24;
        let lists = 300;
        let cents = Centroids {
            dim,
            values: unit(gen(5, lists, dim, lists, 0.0)),
        };
        let mut rows = vec![10u64; lists];
        for l in (0..lists).step_by(7) {
            rows[l] = 0;
        }
        let probe = Probe {
            centroids: cents.clone(),
            nprobe: 9,
            rows: rows.clone(),
            bytes_read: 0,
        };
        // Enough queries for the threaded path (work ≥ 2^22), and a ragged last chunk.
        let qs = unit(gen(6, 1_003, dim, 50, 0.3));
        let queries: Vec<&[f32]> = qs.chunks_exact(dim).collect();
        assert!(queries.len() * cents.values.len() >= 1 << 22);
        let probed = probe.probe(&queries);
        let mut want = vec![Vec::new(); lists];
        for (qi, q) in queries.iter().enumerate() {
            let d: Vec<f32> = cents.values.chunks_exact(dim).map(|c| dot(c, q)).collect();
            let mut order: Vec<usize> = (0..lists).filter(|&l| rows[l] > 0).collect();
            order.sort_by(|&a, &b| d[b].total_cmp(&d[a]).then(a.cmp(&b)));
            for &l in &order[..9] {
                want[l].push(qi as u32);
            }
        }
        let got: Vec<Vec<u32>> = probed.by_list.iter().map(|q| q.to_vec()).collect();
        assert_eq!(got, want);
        assert_eq!(probed.all.len(), queries.len());
    }

    #[test]
    fn centroids_round_trip_through_parquet() {
        let c = Centroids {
            dim: 3,
            values: vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
        };
        let bytes = encode_centroids(&c, &[5, 0]).unwrap();
        assert_eq!(bytes, encode_centroids(&c, &[5, 0]).unwrap());
        let back = decode_centroids(Bytes::from(bytes.clone()), 3, 2, "c").unwrap();
        assert_eq!(back, (c, vec![5, 0]));
        let err = decode_centroids(Bytes::from(bytes), 3, 3, "c").unwrap_err();
        assert!(err.to_string().contains("2 centroids"), "{err}");
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
