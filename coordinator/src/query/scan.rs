//! The query side's scan: row groups read in parallel, dot products over
//! contiguous embedding rows, and a bounded top-K.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use futures::{Stream, StreamExt};
use parquet::arrow::arrow_reader::RowSelection;

use rsembed_schemas::chip::col;

use crate::error::Result;
use crate::query::filter::{Filters, Missing};
use crate::query::index::{embeddings, GroupRef, Index};
use crate::query::pages::{Decode, Stored};
use crate::query::Error as QueryError;

/// Row groups scanned at once when the user does not say: two per core keeps
/// one group's fetch overlapping another's decode and scoring.
pub(crate) fn default_concurrency() -> usize {
    2 * std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// Scans `groups` of `index`, reading `columns`, and those of `optional`
/// that a part has (the columns schema version 2 appended), with `concurrency` row
/// groups in flight, each on its own tokio task (so decoding and scoring use
/// every core). Each group starts from `init()`; `fold` sees each batch with
/// the row offset of its first row in the group and folds it into the
/// group's accumulator. The stream yields the groups' accumulators in the
/// order of `groups`; memory is bounded by `concurrency` groups' batches and
/// accumulators.
pub(crate) fn scan_groups<T, I, F>(
    index: Arc<Index>,
    groups: Vec<GroupRef>,
    columns: Vec<&'static str>,
    optional: Vec<&'static str>,
    concurrency: usize,
    init: I,
    fold: F,
) -> impl Stream<Item = Result<(GroupRef, T)>>
where
    T: Send + 'static,
    I: Fn() -> T + Send + Sync + 'static,
    F: Fn(&mut T, GroupRef, usize, &RecordBatch) -> Result<()> + Send + Sync + 'static,
{
    let fold = Arc::new(fold);
    let init = Arc::new(init);
    per_group(groups, concurrency, move |g| {
        let index = index.clone();
        let part = &index.parts[g.part];
        let columns: Vec<&'static str> = columns
            .iter()
            .chain(optional.iter().filter(|c| part.has_column(c)))
            .copied()
            .collect();
        let (fold, init) = (fold.clone(), init.clone());
        async move {
            let mut acc = init();
            each_batch(&index, g, &columns, |first, batch| {
                fold(&mut acc, g, first, batch)
            })
            .await?;
            Ok((g, acc))
        }
    })
}

/// `task(g)` of each of `groups`, each on its own tokio task (so decoding
/// and scoring use every core), `concurrency` at once; the results in the
/// order of `groups`.
fn per_group<T, Fut>(
    groups: Vec<GroupRef>,
    concurrency: usize,
    task: impl Fn(GroupRef) -> Fut,
) -> impl Stream<Item = Result<T>>
where
    T: Send + 'static,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
{
    futures::stream::iter(groups)
        .map(move |g| {
            let task = tokio::spawn(task(g));
            async move {
                task.await.map_err(|source| QueryError::Task {
                    what: "scan task",
                    source,
                })?
            }
        })
        .buffered(concurrency.max(1))
}

/// Scans the `embedding` column of `groups` for a search, with
/// `concurrency` row groups in flight, each on its own tokio task. A chunk
/// laid out as the chip writer lays it is read in place from its pages
/// ([`crate::query::pages`]); any other (another writer's, or one the page
/// reader finds malformed) with the arrow reader, from the start of the
/// group and with a fresh accumulator, so `fold` must keep every effect in
/// its accumulator. `fold(acc, g, first_row, rows, keep)` sees the group's
/// rows in order, in runs of whole rows, with `filters`' verdict on each
/// row when there are filters (their columns are read first, alone). The
/// stream yields each group's accumulator, in the order of `groups`, with
/// the chips the filters excluded for lacking a property.
pub(crate) fn scan_embeddings<T, I, F>(
    index: Arc<Index>,
    groups: Vec<GroupRef>,
    filters: Filters,
    concurrency: usize,
    init: I,
    fold: F,
) -> impl Stream<Item = Result<(GroupRef, T, Missing)>>
where
    T: Send + 'static,
    I: Fn() -> T + Send + Sync + 'static,
    F: Fn(&mut T, GroupRef, usize, Stored<'_>, Option<&[bool]>) -> Result<()>
        + Send
        + Sync
        + 'static,
{
    let fold = Arc::new(fold);
    let init = Arc::new(init);
    per_group(groups, concurrency, move |g| {
        let (index, fold, init) = (index.clone(), fold.clone(), init.clone());
        async move {
            let mut missing = Missing::default();
            let mask = filter_mask(&index, g, &filters, &mut missing).await?;
            let part = &index.parts[g.part];
            let (ty, dim) = part.embedding_type()?;
            let keep = |first: usize, n: usize| -> Result<Option<&[bool]>> {
                let Some(m) = &mask else { return Ok(None) };
                match m.get(first..first + n) {
                    Some(k) => Ok(Some(k)),
                    None => Err(QueryError::dataset(
                        &part.uri,
                        "its `embedding` column has more rows than its filter columns",
                    )
                    .into()),
                }
            };
            let mut acc = init();
            let why = match index.embedding_chunk(g, ty).await? {
                Ok(chunk) => {
                    let decoded = chunk.decode(ty, dim, |first, rows| {
                        fold(&mut acc, g, first, rows, keep(first, rows.values() / dim)?)
                    });
                    match decoded {
                        Ok(()) => return Ok((g, acc, missing)),
                        Err(Decode::Fold(e)) => return Err(e),
                        Err(Decode::Layout(why)) => why,
                    }
                }
                Err(why) => why,
            };
            tracing::debug!(part = %part.uri, row_group = g.row_group, why, "embedding read with the arrow reader");
            acc = init();
            let read = each_batch(&index, g, &[col::EMBEDDING], |first, batch| {
                let rows = Stored::from(embeddings(batch, dim, &part.uri)?);
                fold(&mut acc, g, first, rows, keep(first, batch.num_rows())?)
            })
            .await?;
            if mask.as_ref().is_some_and(|m| m.len() != read) {
                return Err(QueryError::dataset(
                    &part.uri,
                    "its `embedding` column has fewer rows than its filter columns",
                )
                .into());
            }
            Ok((g, acc, missing))
        }
    })
}

/// `filters`' verdict on each row of group `g` (`None` without filters),
/// counting the chips that lack a filtered property into `missing`.
async fn filter_mask(
    index: &Index,
    g: GroupRef,
    filters: &Filters,
    missing: &mut Missing,
) -> Result<Option<Vec<bool>>> {
    if !filters.any() {
        return Ok(None);
    }
    let part = &index.parts[g.part];
    let (mut columns, optional) = filters.columns();
    columns.extend(optional.into_iter().filter(|c| part.has_column(c)));
    let mut mask = Vec::with_capacity(part.group_rows(g.row_group).min(1 << 20));
    each_batch(index, g, &columns, |_, batch| {
        mask.extend(filters.mask(batch, &part.uri, missing)?);
        Ok(())
    })
    .await?;
    Ok(Some(mask))
}

/// Hands each batch of `columns` of group `g` to `f` with the group row of
/// its first row, in order; the rows read.
async fn each_batch(
    index: &Index,
    g: GroupRef,
    columns: &[&str],
    mut f: impl FnMut(usize, &RecordBatch) -> Result<()>,
) -> Result<usize> {
    let mut stream = index.stream(g, columns, None).await?;
    let mut read = 0usize;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|source| QueryError::Read {
            uri: index.parts[g.part].uri.clone(),
            source,
        })?;
        f(read, &batch)?;
        read += batch.num_rows();
    }
    Ok(read)
}

/// The rows `rows` (sorted, distinct, within the group) as a row selection.
pub(crate) fn selection_of(rows: &[usize], group_rows: usize) -> RowSelection {
    let ranges = rows.iter().map(|&r| r..r + 1);
    RowSelection::from_consecutive_ranges(ranges, group_rows)
}

/// A stored embedding value as the kernels read it: float32 in memory, float32
/// as the little-endian bytes of a Parquet page (any alignment: a page's values
/// start wherever its levels end), or int8. Every kernel is generic over it, so
/// the three share one set of lanes and one reduction order.
pub(crate) trait Lane: Copy {
    /// The value as float32.
    fn f32(self) -> f32;
}

impl Lane for f32 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
}

impl Lane for [u8; 4] {
    #[inline(always)]
    fn f32(self) -> f32 {
        f32::from_le_bytes(self)
    }
}

impl Lane for i8 {
    #[inline(always)]
    fn f32(self) -> f32 {
        f32::from(self)
    }
}

impl Lane for [u8; 2] {
    #[inline(always)]
    fn f32(self) -> f32 {
        f16_bits_to_f32(u16::from_le_bytes(self))
    }
}

impl Lane for half::f16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        f16_bits_to_f32(self.to_bits())
    }
}

/// IEEE binary16 to binary32, exactly, in branch-free integer and float
/// operations the autovectoriser keeps in vector lanes (the `half` crate's
/// conversion is a call per value unless the build targets F16C): the
/// exponent and mantissa shifted into place are the value scaled by 2⁻¹¹²
/// (subnormals included, as binary32 subnormals), so one multiply rescales
/// them; infinities and NaNs get binary32's all-ones exponent.
#[inline(always)]
fn f16_bits_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let v = f32::from_bits(em << 13) * f32::from_bits(0x7780_0000);
    let special = if em >= 0x7c00 {
        0x7f80_0000 | (em << 13)
    } else {
        v.to_bits()
    };
    f32::from_bits(sign | special)
}

/// `out[i] = rows[i] · q` for the `out.len()` rows of `dim` values in `rows`.
pub(crate) fn dots<T: Lane>(rows: &[T], dim: usize, q: &[f32], out: &mut [f32]) {
    assert_eq!(q.len(), dim, "query dimension");
    assert!(rows.len() >= out.len() * dim, "rows hold out.len() rows");
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA, checked just above.
        unsafe { dots_avx2(rows, dim, q, out) };
        return;
    }
    dots_generic(rows, dim, q, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2<T: Lane>(rows: &[T], dim: usize, q: &[f32], out: &mut [f32]) {
    // The same code, compiled with 256-bit lanes: the 16-wide accumulator
    // becomes two ymm registers per row.
    dots_generic(rows, dim, q, out);
}

#[inline(always)]
fn dots_generic<T: Lane>(rows: &[T], dim: usize, q: &[f32], out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(dim)) {
        *o = dot(row, q);
    }
}

/// `out[i][j] = rows[i] · qs[j]`: [`dots`] of four queries at once, each
/// row read once for the four, with `dot`'s results bit for bit.
pub(crate) fn dots4<T: Lane>(rows: &[T], dim: usize, qs: [&[f32]; 4], out: &mut [[f32; 4]]) {
    assert!(qs.iter().all(|q| q.len() == dim), "query dimension");
    assert!(rows.len() >= out.len() * dim, "rows hold out.len() rows");
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA, checked just above.
        unsafe { dots4_avx2(rows, dim, qs, out) };
        return;
    }
    dots4_generic(rows, dim, qs, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots4_avx2<T: Lane>(rows: &[T], dim: usize, qs: [&[f32]; 4], out: &mut [[f32; 4]]) {
    dots4_generic(rows, dim, qs, out);
}

#[inline(always)]
fn dots4_generic<T: Lane>(rows: &[T], dim: usize, qs: [&[f32]; 4], out: &mut [[f32; 4]]) {
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(dim)) {
        *o = dot4(qs, row);
    }
}

/// `out[i] = (rows[i] · q) · inv_norms[i]`: the cosine of a row that is not
/// unit length (int8, whose scale the norm cancels; f16, rounded off unit
/// length) with the unit query. Each value is widened to float32 inside the
/// dot product, so a row is read once, as stored.
pub(crate) fn dots_scaled<T: Lane>(
    rows: &[T],
    dim: usize,
    q: &[f32],
    inv_norms: &[f32],
    out: &mut [f32],
) {
    assert!(inv_norms.len() >= out.len(), "a norm per row");
    dots(rows, dim, q, out);
    for (o, n) in out.iter_mut().zip(inv_norms) {
        *o *= n;
    }
}

/// `out[i][j] = (rows[i] · qs[j]) · inv_norms[i]`: [`dots_scaled`] of four
/// queries at once, each row read and widened once for the four, with
/// `dots_scaled`'s results bit for bit.
pub(crate) fn dots4_scaled<T: Lane>(
    rows: &[T],
    dim: usize,
    qs: [&[f32]; 4],
    inv_norms: &[f32],
    out: &mut [[f32; 4]],
) {
    assert!(inv_norms.len() >= out.len(), "a norm per row");
    dots4(rows, dim, qs, out);
    for (o, n) in out.iter_mut().zip(inv_norms) {
        *o = o.map(|d| d * n);
    }
}

/// `1 / |row|` of each row (0 for a zero row), summed in float32 lanes as
/// [`dot`] sums.
pub(crate) fn inv_norms<T: Lane>(rows: &[T], dim: usize, out: &mut Vec<f32>) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA, checked just above.
        unsafe { inv_norms_avx2(rows, dim, out) };
        return;
    }
    inv_norms_generic(rows, dim, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn inv_norms_avx2<T: Lane>(rows: &[T], dim: usize, out: &mut Vec<f32>) {
    inv_norms_generic(rows, dim, out);
}

#[inline(always)]
fn inv_norms_generic<T: Lane>(rows: &[T], dim: usize, out: &mut Vec<f32>) {
    out.clear();
    // A loop, not `extend(map(..))`: the iterator's fold is a function of its
    // own, compiled without the caller's AVX2.
    for row in rows.chunks_exact(dim) {
        let n = sum_squares(row);
        out.push(if n > 0.0 { 1.0 / n.sqrt() } else { 0.0 });
    }
}

/// `Σ v²` of a row in [`dot`]'s lanes and order: `dot(w, w)` of the row
/// widened, bit for bit.
#[inline(always)]
fn sum_squares<T: Lane>(a: &[T]) -> f32 {
    const W: usize = 16;
    let mut acc = [0f32; W];
    let (ca, ra) = a.as_chunks::<W>();
    for x in ca {
        for i in 0..W {
            let v = x[i].f32();
            acc[i] += v * v;
        }
    }
    let mut tail = 0f32;
    for x in ra {
        let v = x.f32();
        tail += v * v;
    }
    reduce_lanes(&acc, tail)
}

/// `1 / |row|` of each int8 row (0 for a zero row), in exact integer sums.
pub(crate) fn inv_norms_i8(rows: &[i8], dim: usize, out: &mut Vec<f32>) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        unsafe { inv_norms_i8_avx2(rows, dim, out) };
        return;
    }
    inv_norms_i8_generic(rows, dim, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn inv_norms_i8_avx2(rows: &[i8], dim: usize, out: &mut Vec<f32>) {
    inv_norms_i8_generic(rows, dim, out);
}

#[inline(always)]
fn inv_norms_i8_generic(rows: &[i8], dim: usize, out: &mut Vec<f32>) {
    out.clear();
    // A loop, not `extend(map(..))`: the iterator's fold is a function of its
    // own, compiled without this one's AVX2.
    for row in rows.chunks_exact(dim) {
        let n = sum_squares_i8(row);
        out.push(if n > 0 { 1.0 / (n as f32).sqrt() } else { 0.0 });
    }
}

/// `Σ v²` of an int8 row, exactly (at most 128² a value, in 32 bits): a
/// plain sum of widened products, the form LLVM turns into `vpmaddwd`.
#[inline(always)]
fn sum_squares_i8(row: &[i8]) -> i32 {
    let mut n = 0i32;
    for &v in row {
        n += i32::from(i16::from(v) * i16::from(v));
    }
    n
}

/// A dot product written for the autovectoriser: sixteen independent lanes
/// (no loop-carried dependency on one sum), then a fixed-order reduction.
#[inline(always)]
pub(crate) fn dot<T: Lane>(a: &[T], b: &[f32]) -> f32 {
    const W: usize = 16;
    let mut acc = [0f32; W];
    let (ca, ra) = a.as_chunks::<W>();
    let (cb, rb) = b.as_chunks::<W>();
    for (x, y) in ca.iter().zip(cb) {
        for i in 0..W {
            acc[i] += x[i].f32() * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x.f32() * y;
    }
    reduce_lanes(&acc, tail)
}

/// The sum of a kernel's sixteen lanes and its tail, in one fixed order:
/// every kernel here ends with it, which is what makes the four-at-once
/// kernels equal the one-at-a-time ones bit for bit.
#[inline(always)]
fn reduce_lanes(acc: &[f32; 16], tail: f32) -> f32 {
    let mut s = [0f32; 8];
    for i in 0..8 {
        s[i] = acc[i] + acc[i + 8];
    }
    ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])) + tail
}

/// Four [`dot`]s against one vector, each with `dot`'s lanes and
/// reduction order, so the results are `dot`'s bit for bit. Four named
/// accumulators and zipped chunks, not a `[[f32; 16]; 4]` indexed by row:
/// LLVM kept that one in scalar registers and on the stack (2.2 GMAC/s,
/// `perf annotate`: `vmulss`/`vaddss`), and vectorises this one.
#[inline(always)]
pub(crate) fn dot4<T: Lane>(rows: [&[f32]; 4], c: &[T]) -> [f32; 4] {
    const W: usize = 16;
    let (mut a0, mut a1, mut a2, mut a3) = ([0f32; W], [0f32; W], [0f32; W], [0f32; W]);
    let (cc, rc) = c.as_chunks::<W>();
    let [r0, r1, r2, r3] = rows.map(|r| r.as_chunks::<W>());
    for ((((y, x0), x1), x2), x3) in cc.iter().zip(r0.0).zip(r1.0).zip(r2.0).zip(r3.0) {
        for i in 0..W {
            // Widened once for the four (int8), as the one-query kernel does.
            let v = y[i].f32();
            a0[i] += v * x0[i];
            a1[i] += v * x1[i];
            a2[i] += v * x2[i];
            a3[i] += v * x3[i];
        }
    }
    let reduce = |a: &[f32; W], tail: &[f32]| {
        let mut t = 0f32;
        for (y, x) in rc.iter().zip(tail) {
            t += y.f32() * x;
        }
        reduce_lanes(a, t)
    };
    [
        reduce(&a0, r0.1),
        reduce(&a1, r1.1),
        reduce(&a2, r2.1),
        reduce(&a3, r3.1),
    ]
}

/// A scored row: where it is, and its cosine with the query.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Hit {
    /// Its row group.
    pub(crate) group: GroupRef,
    /// Row within the group.
    pub(crate) row: usize,
    /// Cosine with the query (both are unit vectors).
    pub(crate) cosine: f32,
}

impl Hit {
    /// Better first: higher cosine, then earlier in the index, so that equal
    /// scores rank the same way on every run.
    fn rank_cmp(&self, o: &Hit) -> Ordering {
        o.cosine
            .total_cmp(&self.cosine)
            .then_with(|| (self.group, self.row).cmp(&(o.group, o.row)))
    }
}

/// Max-heap order on "worse": the heap's top is the worst hit kept.
#[derive(Debug, Clone, Copy)]
struct Worst(Hit);

impl PartialEq for Worst {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Worst {}
impl PartialOrd for Worst {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Worst {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.rank_cmp(&o.0)
    }
}

/// The best `k` hits seen: O(k) memory, O(log k) per hit that enters.
#[derive(Debug, Clone, Default)]
pub(crate) struct TopK {
    k: usize,
    heap: BinaryHeap<Worst>,
}

impl TopK {
    /// An empty top-`k`.
    pub(crate) fn new(k: usize) -> TopK {
        TopK {
            k,
            heap: BinaryHeap::with_capacity(k.min(1 << 16) + 1),
        }
    }

    /// Offers a hit; cheap when it is worse than everything kept.
    #[inline]
    pub(crate) fn push(&mut self, h: Hit) {
        if self.k == 0 {
            return;
        }
        if self.heap.len() < self.k {
            self.heap.push(Worst(h));
        } else if let Some(top) = self.heap.peek() {
            if h.rank_cmp(&top.0) == Ordering::Less {
                self.heap.pop();
                self.heap.push(Worst(h));
            }
        }
    }

    /// The lowest cosine that still enters, once full: rows below it can be
    /// skipped without building a hit.
    #[inline]
    pub(crate) fn threshold(&self) -> f32 {
        if self.heap.len() < self.k {
            f32::NEG_INFINITY
        } else {
            self.heap.peek().map_or(f32::NEG_INFINITY, |w| w.0.cosine)
        }
    }

    /// Adds every hit of `other`.
    pub(crate) fn merge(&mut self, other: TopK) {
        for w in other.heap {
            self.push(w.0);
        }
    }

    /// The hits, best first.
    pub(crate) fn into_sorted(self) -> Vec<Hit> {
        let mut v: Vec<Hit> = self.heap.into_iter().map(|w| w.0).collect();
        v.sort_by(Hit::rank_cmp);
        v
    }
}

/// `sigmoid(exp(logit_scale) · cos + logit_bias)`: SigLIP's probability that
/// a text matches an image.
pub(crate) fn sigmoid_score(cos: f32, logit_scale: f64, logit_bias: f64) -> f64 {
    let z = logit_scale.exp() * f64::from(cos) + logit_bias;
    1.0 / (1.0 + (-z).exp())
}

/// Scales `v` to unit length; an error for a zero or non-finite vector.
pub(crate) fn normalize(v: &mut [f32]) -> Result<()> {
    let n = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    if !n.is_finite() || n == 0.0 {
        return Err(QueryError::ZeroVector.into());
    }
    for x in v {
        *x = (f64::from(*x) / n) as f32;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_cosines_equal_the_dequantised_rows() {
        let dim = 37;
        let rows: Vec<i8> = (0..3 * dim)
            .map(|i| ((i * 53 % 255) as i32 - 127) as i8)
            .collect();
        let mut q: Vec<f32> = (0..dim).map(|i| (i as f32 * 0.3).cos()).collect();
        normalize(&mut q).unwrap();
        let mut inv = Vec::new();
        inv_norms_i8(&rows, dim, &mut inv);
        let mut out = [0f32; 3];
        dots_scaled(&rows, dim, &q, &inv, &mut out);
        for (r, got) in rows.chunks_exact(dim).zip(out) {
            // The scale cancels: any scale gives the same cosine.
            let mut x: Vec<f32> = r.iter().map(|v| f32::from(*v) * 0.0123).collect();
            normalize(&mut x).unwrap();
            assert!((naive(&x, &q) - f64::from(got)).abs() < 1e-5, "{got}");
        }
        let zero = vec![0i8; dim];
        inv_norms_i8(&zero, dim, &mut inv);
        assert_eq!(inv, [0.0]);
        // Exact sums of squares, extremes included, at every tail length.
        for d in [1, 31, 32, 33, 768, 1000] {
            let row: Vec<i8> = (0..d).map(|i| [-128i8, 127, -1, 0, 5][i % 5]).collect();
            let want: i32 = row.iter().map(|&v| i32::from(v) * i32::from(v)).sum();
            assert_eq!(sum_squares_i8(&row), want, "{d}");
        }
    }

    fn naive(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum()
    }

    #[test]
    fn dots_match_a_naive_sum_for_every_tail_length() {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        for dim in [1, 3, 15, 16, 17, 64, 100, 768, 1024] {
            let rows: Vec<f32> = (0..dim * 5).map(|_| next()).collect();
            let q: Vec<f32> = (0..dim).map(|_| next()).collect();
            let mut out = vec![0f32; 5];
            dots(&rows, dim, &q, &mut out);
            let mut generic = vec![0f32; 5];
            dots_generic(&rows, dim, &q, &mut generic);
            for r in 0..5 {
                let want = naive(&rows[r * dim..(r + 1) * dim], &q);
                assert!((f64::from(out[r]) - want).abs() < 1e-4, "dim {dim} row {r}");
                assert!((f64::from(generic[r]) - want).abs() < 1e-4);
            }
        }
    }

    #[test]
    fn four_queries_at_once_are_dots_bit_for_bit() {
        let mut seed = 11u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        for dim in [1, 15, 16, 17, 100, 768] {
            let rows: Vec<f32> = (0..dim * 9).map(|_| next()).collect();
            let qs: Vec<Vec<f32>> = (0..4).map(|_| (0..dim).map(|_| next()).collect()).collect();
            let mut four = vec![[0f32; 4]; 9];
            dots4(&rows, dim, [&qs[0], &qs[1], &qs[2], &qs[3]], &mut four);
            for (j, q) in qs.iter().enumerate() {
                let mut one = vec![0f32; 9];
                dots(&rows, dim, q, &mut one);
                for r in 0..9 {
                    assert_eq!(
                        four[r][j].to_bits(),
                        one[r].to_bits(),
                        "dim {dim} row {r} q {j}"
                    );
                }
            }
        }
    }

    #[test]
    fn f16_bits_widen_as_the_half_crate_widens_them() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = f16_bits_to_f32(h);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#06x}: {got} != {want}"
            );
            assert_eq!(got.to_bits(), h.to_le_bytes().f32().to_bits());
        }
    }

    #[test]
    fn f16_norms_are_dots_of_rows_with_themselves() {
        let dim = 100;
        let rows: Vec<half::f16> = (0..dim * 3)
            .map(|i| half::f16::from_f32(((i * 37 % 17) as f32 - 8.0) / 9.0))
            .collect();
        let mut inv = Vec::new();
        inv_norms(&rows, dim, &mut inv);
        for (r, n) in rows.chunks_exact(dim).zip(&inv) {
            let w: Vec<f32> = r.iter().map(|x| x.to_f32()).collect();
            assert_eq!(n.to_bits(), (1.0 / dot(&w, &w).sqrt()).to_bits());
        }
    }

    #[test]
    fn four_queries_at_once_are_int8_dots_bit_for_bit() {
        let mut seed = 13u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            seed >> 33
        };
        for dim in [1, 15, 16, 17, 100, 768] {
            let rows: Vec<i8> = (0..dim * 9).map(|_| next() as u8 as i8).collect();
            let qs: Vec<Vec<f32>> = (0..4)
                .map(|_| {
                    (0..dim)
                        .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                        .collect()
                })
                .collect();
            let mut norms = Vec::new();
            inv_norms_i8(&rows, dim, &mut norms);
            let mut four = vec![[0f32; 4]; 9];
            dots4_scaled(
                &rows,
                dim,
                [&qs[0], &qs[1], &qs[2], &qs[3]],
                &norms,
                &mut four,
            );
            for (j, q) in qs.iter().enumerate() {
                let mut one = vec![0f32; 9];
                dots_scaled(&rows, dim, q, &norms, &mut one);
                for r in 0..9 {
                    assert_eq!(
                        four[r][j].to_bits(),
                        one[r].to_bits(),
                        "dim {dim} row {r} q {j}"
                    );
                }
            }
        }
    }

    fn hit(part: usize, row: usize, cosine: f32) -> Hit {
        Hit {
            group: GroupRef { part, row_group: 0 },
            row,
            cosine,
        }
    }

    #[test]
    fn top_k_keeps_the_best_and_breaks_ties_by_position() {
        let mut t = TopK::new(3);
        for (i, c) in [0.1, 0.9, 0.5, 0.9, 0.3, 0.7].iter().enumerate() {
            t.push(hit(0, i, *c));
        }
        let v = t.into_sorted();
        let got: Vec<(usize, f32)> = v.iter().map(|h| (h.row, h.cosine)).collect();
        assert_eq!(got, vec![(1, 0.9), (3, 0.9), (5, 0.7)]);
    }

    #[test]
    fn merged_top_ks_equal_one_over_everything() {
        let cos: Vec<f32> = (0..200).map(|i| ((i * 37) % 101) as f32 / 101.0).collect();
        let mut all = TopK::new(10);
        let (mut a, mut b) = (TopK::new(10), TopK::new(10));
        for (i, c) in cos.iter().enumerate() {
            all.push(hit(0, i, *c));
            if i % 2 == 0 {
                a.push(hit(0, i, *c))
            } else {
                b.push(hit(0, i, *c))
            }
        }
        a.merge(b);
        assert_eq!(a.into_sorted(), all.into_sorted());
    }

    #[test]
    fn scores_are_siglip_sigmoids() {
        let s = sigmoid_score(0.5, 10f64.ln(), -10.0);
        assert!((s - 1.0 / (1.0 + (5.0f64).exp())).abs() < 1e-12);
    }
}
