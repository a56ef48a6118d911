//! Dot products over stored embedding rows, one query or four at a time,
//! the inverse norms of rows that are not unit length, and the nearest
//! centroid of each row.

use super::{dispatch, Lane};

/// `out[i] = rows[i] · q` for the `out.len()` rows of `dim` values in `rows`.
pub fn dots<T: Lane>(rows: &[T], dim: usize, q: &[f32], out: &mut [f32]) {
    assert_eq!(q.len(), dim, "query dimension");
    assert!(rows.len() >= out.len() * dim, "rows hold out.len() rows");
    dispatch(
        #[inline(always)]
        || dots_generic(rows, dim, q, out),
    );
}

#[inline(always)]
fn dots_generic<T: Lane>(rows: &[T], dim: usize, q: &[f32], out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(dim)) {
        *o = dot(row, q);
    }
}

/// `out[i][j] = rows[i] · qs[j]`: [`dots`] of four queries at once, each
/// row read once for the four, with `dot`'s results bit for bit.
pub fn dots4<T: Lane>(rows: &[T], dim: usize, qs: [&[f32]; 4], out: &mut [[f32; 4]]) {
    assert!(qs.iter().all(|q| q.len() == dim), "query dimension");
    assert!(rows.len() >= out.len() * dim, "rows hold out.len() rows");
    dispatch(
        #[inline(always)]
        || dots4_generic(rows, dim, qs, out),
    );
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
pub fn dots_scaled<T: Lane>(rows: &[T], dim: usize, q: &[f32], inv_norms: &[f32], out: &mut [f32]) {
    assert!(inv_norms.len() >= out.len(), "a norm per row");
    dots(rows, dim, q, out);
    for (o, n) in out.iter_mut().zip(inv_norms) {
        *o *= n;
    }
}

/// `out[i][j] = (rows[i] · qs[j]) · inv_norms[i]`: [`dots_scaled`] of four
/// queries at once, each row read and widened once for the four, with
/// `dots_scaled`'s results bit for bit.
pub fn dots4_scaled<T: Lane>(
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
pub fn inv_norms<T: Lane>(rows: &[T], dim: usize, out: &mut Vec<f32>) {
    dispatch(
        #[inline(always)]
        || inv_norms_generic(rows, dim, out),
    );
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
pub fn inv_norms_i8(rows: &[i8], dim: usize, out: &mut Vec<f32>) {
    dispatch(
        #[inline(always)]
        || inv_norms_i8_generic(rows, dim, out),
    );
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
pub fn dot<T: Lane>(a: &[T], b: &[f32]) -> f32 {
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
pub fn dot4<T: Lane>(rows: [&[f32]; 4], c: &[T]) -> [f32; 4] {
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

/// Each row's nearest centroid (highest dot product; ties to the lower
/// list) and its dot product: `out[i]` for the `out.len()` rows of `dim`
/// values in `rows`, against the centroids of `dim` values in `cents`.
pub fn nearest(cents: &[f32], dim: usize, rows: &[f32], out: &mut [(u32, f32)]) {
    dispatch(
        #[inline(always)]
        || nearest_generic(cents, dim, rows, out),
    );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::normalize;

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
}
