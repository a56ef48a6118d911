//! The vertical pass: 32 output bytes at a time, each i32 lane summing one
//! column over pairs of source rows, with madd (`vpdpwssd` with AVX-VNNI).

use std::arch::x86_64::*;

use super::{join_madd, load32, mac, shift, split_madd, Coeffs, Level, HALF};

/// Two source rows (byte offsets) and their taps' hi and lo halves, each
/// pair packed as madd reads it from an i32.
#[derive(Clone, Copy)]
struct VPair {
    r0: usize,
    r1: usize,
    hi: i32,
    lo: i32,
}

/// The vertical taps laid out for the kernel.
pub(in super::super) struct VTable {
    level: Level,
    row_len: usize,
    /// Per output row: its range in `pairs`.
    rows: Vec<(usize, usize)>,
    pairs: Vec<VPair>,
    /// One past the last source byte read.
    end: usize,
}

impl VTable {
    pub(in super::super) fn new(c: &Coeffs, row_len: usize, level: Level) -> Option<VTable> {
        if row_len < 32 {
            return None;
        }
        let mut rows = Vec::with_capacity(c.bounds.len());
        let mut pairs = Vec::new();
        let mut end = 0;
        for yy in 0..c.bounds.len() {
            let (ymin, k) = c.taps(yy);
            let first = pairs.len();
            for (i, kp) in k.chunks(2).enumerate() {
                let r0 = ymin + 2 * i;
                // An odd last tap pairs with its own row and a zero.
                let (k1, r1) = if kp.len() == 2 {
                    (kp[1], r0 + 1)
                } else {
                    (0, r0)
                };
                let (h0, l0) = split_madd(kp[0])?;
                let (h1, l1) = split_madd(k1)?;
                let pack = |a: i16, b: i16| (((b as u16 as u32) << 16) | a as u16 as u32) as i32;
                pairs.push(VPair {
                    r0: r0 * row_len,
                    r1: r1 * row_len,
                    hi: pack(h0, h1),
                    lo: pack(l0, l1),
                });
                end = end.max((r1 + 1) * row_len);
            }
            rows.push((first, pairs.len() - first));
        }
        Some(VTable {
            level,
            row_len,
            rows,
            pairs,
            end,
        })
    }
}

/// The vertical pass (see `vertical_scalar`), filling `out`.
pub(in super::super) fn vertical(src: &[u8], row_len: usize, t: &VTable, out: &mut [u8]) {
    assert!(
        t.row_len == row_len && t.rows.len() * row_len == out.len() && t.end <= src.len(),
        "vertical: buffers do not fit the table: this is a bug"
    );
    match t.level {
        // SAFETY: the table's level was detected on this CPU.
        Level::Avx2 => unsafe { vertical_avx2(src, t, out) },
        // SAFETY: as above.
        Level::Vnni => unsafe { vertical_vnni(src, t, out) },
    }
}

#[target_feature(enable = "avx2")]
fn vertical_avx2(src: &[u8], t: &VTable, out: &mut [u8]) {
    kernel::<false>(src, t, out)
}

#[target_feature(enable = "avx2,avxvnni")]
fn vertical_vnni(src: &[u8], t: &VTable, out: &mut [u8]) {
    kernel::<true>(src, t, out)
}

#[target_feature(enable = "avx2")]
#[inline]
fn kernel<const VNNI: bool>(src: &[u8], t: &VTable, out: &mut [u8]) {
    let row_len = t.row_len;
    let mut ks = Vec::new();
    for (line_out, &(first, n)) in out.chunks_exact_mut(row_len).zip(&t.rows) {
        ks.clear();
        ks.extend(
            t.pairs[first..first + n]
                .iter()
                .map(|p| (p.r0, p.r1, _mm256_set1_epi32(p.hi), _mm256_set1_epi32(p.lo))),
        );
        let mut x = 0;
        loop {
            // The last chunk overlaps the one before rather than running
            // past the row; it recomputes those bytes to the same values.
            let x0 = x.min(row_len - 32);
            // SAFETY: every `r0`, `r1` is a row start with the row inside
            // `src` (`t.end <= src.len()`), and `x0 + 32 <= row_len`.
            let v = unsafe { chunk::<VNNI>(src, x0, &ks) };
            let dst = &mut line_out[x0..x0 + 32];
            // SAFETY: `dst` is 32 bytes.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) };
            x += 32;
            if x >= row_len {
                break;
            }
        }
    }
}

/// 32 output bytes at column `x0`.
///
/// # Safety
///
/// `src` holds 32 bytes at `r + x0` for every row offset `r` in `ks`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn chunk<const VNNI: bool>(
    src: &[u8],
    x0: usize,
    ks: &[(usize, usize, __m256i, __m256i)],
) -> __m256i {
    let zero = _mm256_setzero_si256();
    let half = _mm256_set1_epi32(HALF);
    // Per quarter: the hi and the lo sums.
    let mut acc = [zero, half, zero, half, zero, half, zero, half];
    for &(r0, r1, kh, kl) in ks {
        // SAFETY: guaranteed by the caller.
        let (a, b) = unsafe { (load32(src, r0 + x0), load32(src, r1 + x0)) };
        let (ab0, ab1) = (_mm256_unpacklo_epi8(a, b), _mm256_unpackhi_epi8(a, b));
        // Column pairs (row 0, row 1) as i16: columns 0-3 and 16-19, then
        // 4-7 and 20-23, 8-11 and 24-27, 12-15 and 28-31.
        let w = [
            _mm256_unpacklo_epi8(ab0, zero),
            _mm256_unpackhi_epi8(ab0, zero),
            _mm256_unpacklo_epi8(ab1, zero),
            _mm256_unpackhi_epi8(ab1, zero),
        ];
        for (i, w) in w.into_iter().enumerate() {
            acc[2 * i] = mac::<VNNI>(acc[2 * i], w, kh);
            acc[2 * i + 1] = mac::<VNNI>(acc[2 * i + 1], w, kl);
        }
    }
    let r = [
        shift(join_madd(acc[0], acc[1])),
        shift(join_madd(acc[2], acc[3])),
        shift(join_madd(acc[4], acc[5])),
        shift(join_madd(acc[6], acc[7])),
    ];
    // The packs put the columns back in order.
    _mm256_packus_epi16(
        _mm256_packs_epi32(r[0], r[1]),
        _mm256_packs_epi32(r[2], r[3]),
    )
}
