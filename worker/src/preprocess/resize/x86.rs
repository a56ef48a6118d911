//! AVX2 versions of the two passes, computing the same integers as the scalar
//! ones: i32 sums of `pixel * coefficient` from [`HALF`], then `clip8`.
//!
//! The vector multiplies take 16- or 8-bit factors and Pillow's coefficients
//! have 22 bits, so each coefficient is cut into digits that fit, the
//! products of each digit are summed on their own, and the sums are shifted
//! back together at the end:
//! - `_mm256_madd_epi16` (i16 pairs into i32), in both passes: `k = hi *
//!   2^11 + lo` with `lo` in `[0, 2^11)`. Where the CPU has AVX-VNNI, the
//!   vertical pass does each madd and its add in one `vpdpwssd`.
//! - `vpdpbusd` (AVX-VNNI: four u8 × i8 products into one i32), in the
//!   horizontal pass where the CPU has it: `k = d2 * 2^16 + d1 * 2^8 + d0`
//!   with signed bytes. It takes the pixel bytes as they are, four taps per
//!   i32, so it needs fewer shuffles and multiplies than the madd.
//!
//! With pixels at most 255 no partial product or sum leaves i32. Vector adds
//! wrap, but the scalar sum, computed in i32, is the same integer modulo
//! 2^32, and it fits in i32, so the two agree.
//!
//! A table is `None` where its pass does not apply (a digit out of range,
//! rows narrower than a vector), and the caller falls back to the scalar code.

mod horizontal;
mod vertical;

use std::arch::x86_64::*;

pub(super) use horizontal::{horizontal, HTable};
pub(super) use vertical::{vertical, VTable};

use super::{Coeffs, HALF, PRECISION_BITS};

/// The instruction sets a kernel is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Level {
    Avx2,
    /// AVX2 and AVX-VNNI.
    Vnni,
}

/// The best level this CPU runs; `std` caches the CPUID answers, so this is
/// a few loads and tests.
pub(super) fn level() -> Option<Level> {
    if !is_x86_feature_detected!("avx2") {
        None
    } else if is_x86_feature_detected!("avxvnni") {
        Some(Level::Vnni)
    } else {
        Some(Level::Avx2)
    }
}

/// The tables of both passes of one resize; a pass without one runs scalar.
#[derive(Default)]
pub(super) struct Tables {
    pub(super) horiz: Option<HTable>,
    pub(super) vert: Option<VTable>,
}

impl Tables {
    /// `h`: the horizontal taps, channels and output width, if that pass runs;
    /// `v`: the vertical taps and the row length in bytes it sees, if it runs.
    pub(super) fn new(h: Option<(&Coeffs, usize, usize)>, v: Option<(&Coeffs, usize)>) -> Tables {
        let Some(level) = level() else {
            return Tables::default();
        };
        Tables {
            horiz: h.and_then(|(c, ch, dw)| HTable::new(c, ch, dw, level)),
            vert: v.and_then(|(c, row_len)| VTable::new(c, row_len, level)),
        }
    }
}

/// Bits of `lo` in the madd split.
const SPLIT: u32 = 11;

/// `k` as madd's `(hi, lo)`, or `None` if `hi` does not fit in i16.
fn split_madd(k: i32) -> Option<(i16, i16)> {
    let hi = k >> SPLIT;
    let lo = k - (hi << SPLIT);
    Some((i16::try_from(hi).ok()?, lo as i16))
}

/// `k` as `vpdpbusd`'s signed bytes `[d0, d1, d2]`, or `None` if `d2` does
/// not fit in one.
fn split_dot(k: i32) -> Option<[i8; 3]> {
    let d0 = k as i8;
    let k = (k - d0 as i32) >> 8;
    let d1 = k as i8;
    let d2 = i8::try_from((k - d1 as i32) >> 8).ok()?;
    Some([d0, d1, d2])
}

/// One 32-byte vector operand, aligned for `_mm256_load_si256`.
#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
struct Lanes([u8; 32]);

impl Lanes {
    fn set_i16(&mut self, idx: usize, v: i16) {
        self.0[2 * idx..2 * idx + 2].copy_from_slice(&v.to_le_bytes());
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    fn load(&self) -> __m256i {
        // SAFETY: `Lanes` is 32 bytes and 32-byte aligned.
        unsafe { _mm256_load_si256(self.0.as_ptr().cast()) }
    }
}

/// 16 bytes from `buf` at `off`.
///
/// # Safety
///
/// `off + 16 <= buf.len()`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load16(buf: &[u8], off: usize) -> __m128i {
    debug_assert!(off + 16 <= buf.len());
    // SAFETY: the caller guarantees 16 readable bytes at `off`.
    unsafe { _mm_loadu_si128(buf.as_ptr().add(off).cast()) }
}

/// 32 bytes from `buf` at `off`.
///
/// # Safety
///
/// `off + 32 <= buf.len()`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load32(buf: &[u8], off: usize) -> __m256i {
    debug_assert!(off + 32 <= buf.len());
    // SAFETY: the caller guarantees 32 readable bytes at `off`.
    unsafe { _mm256_loadu_si256(buf.as_ptr().add(off).cast()) }
}

/// `acc + madd(a, b)`, fused where `VNNI`.
#[target_feature(enable = "avx2")]
#[inline]
fn mac<const VNNI: bool>(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    if VNNI {
        // SAFETY: kernels with `VNNI` set are only entered through the
        // `Level::Vnni` entry points, which need AVX-VNNI detected.
        unsafe { mac_vnni(acc, a, b) }
    } else {
        _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
    }
}

#[target_feature(enable = "avx2,avxvnni")]
#[inline]
fn mac_vnni(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpwssd_avx_epi32(acc, a, b)
}

/// The sum from madd's halves.
#[target_feature(enable = "avx2")]
#[inline]
fn join_madd(hi: __m256i, lo: __m256i) -> __m256i {
    _mm256_add_epi32(_mm256_slli_epi32::<{ SPLIT as i32 }>(hi), lo)
}

/// `clip8` before the clamp, which the saturating packs do.
#[target_feature(enable = "avx2")]
#[inline]
fn shift(v: __m256i) -> __m256i {
    _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(v)
}

#[cfg(test)]
mod tests {
    use super::super::tests::Rng;
    use super::super::{horizontal_scalar, precompute_coeffs, vertical_scalar, Filter};
    use super::*;

    #[test]
    fn digit_splits_add_up() {
        for k in [
            0,
            1,
            -1,
            127,
            128,
            -129,
            2047,
            2048,
            -2049,
            HALF,
            1 << 22,
            -(1 << 22),
        ] {
            let (hi, lo) = split_madd(k).unwrap();
            assert_eq!(((hi as i32) << SPLIT) + lo as i32, k);
            assert!((0..1 << SPLIT).contains(&(lo as i32)));
            let [d0, d1, d2] = split_dot(k).unwrap();
            assert_eq!(((d2 as i32) << 16) + ((d1 as i32) << 8) + d0 as i32, k);
        }
        assert!(split_madd(1 << 27).is_none());
        assert!(split_dot(1 << 24).is_none());
    }

    const FILTERS: [Filter; 5] = [
        Filter::Lanczos,
        Filter::Bilinear,
        Filter::Bicubic,
        Filter::Box,
        Filter::Hamming,
    ];

    /// The levels this CPU can run.
    fn levels() -> Vec<Level> {
        match level() {
            None => Vec::new(),
            Some(Level::Avx2) => vec![Level::Avx2],
            Some(Level::Vnni) => vec![Level::Avx2, Level::Vnni],
        }
    }

    fn check_horizontal<const CH: usize>(
        rng: &mut Rng,
        sw: usize,
        dw: usize,
        rows: usize,
        filter: Filter,
    ) {
        let c = precompute_coeffs(sw, dw, filter);
        // Whole buffers, and windows that end at the buffer's last byte.
        let y0 = rng.below(3);
        let src = rng.image((y0 + rows) * sw * CH);
        let mut want = vec![0u8; rows * dw * CH];
        horizontal_scalar::<CH>(&src, sw, y0, &c, dw, &mut want);
        for level in levels() {
            let t = HTable::build(&c, CH, dw, level).expect("table");
            // Stale bytes, as the reused buffer has: every one must be written.
            let mut got = vec![0xa5; t.out_len(rows, dw * CH)];
            horizontal(&src, sw * CH, y0, rows, &t, dw * CH, &mut got);
            assert!(
                got[..want.len()] == want,
                "horizontal {CH}ch {sw}->{dw} x{rows} {filter:?} {level:?}"
            );
        }
    }

    #[test]
    fn horizontal_matches_scalar() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        // Widths around the vector and group sizes, 1-pixel sources and
        // targets, upscales and downscales of up to 40 times.
        let widths = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 257];
        for _ in 0..400 {
            let sw = widths[rng.below(widths.len())] + rng.below(2);
            let dw = if rng.below(4) == 0 {
                widths[rng.below(widths.len())]
            } else {
                1 + rng.below(sw * 3).min(300)
            };
            let filter = FILTERS[rng.below(FILTERS.len())];
            let rows = 1 + rng.below(4);
            match 1 + rng.below(4) {
                1 => check_horizontal::<1>(&mut rng, sw, dw, rows, filter),
                2 => check_horizontal::<2>(&mut rng, sw, dw, rows, filter),
                3 => check_horizontal::<3>(&mut rng, sw, dw, rows, filter),
                _ => check_horizontal::<4>(&mut rng, sw, dw, rows, filter),
            }
        }
        for filter in FILTERS {
            check_horizontal::<3>(&mut rng, 512, 256, 3, filter);
            check_horizontal::<3>(&mut rng, 2000, 37, 2, filter);
            check_horizontal::<1>(&mut rng, 1, 300, 2, filter);
        }
    }

    #[test]
    fn vertical_matches_scalar() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let heights = [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 64, 100, 301];
        for i in 0..300 {
            let sh = heights[rng.below(heights.len())] + rng.below(2);
            let dh = 1 + rng.below(sh * 3).min(200);
            let filter = FILTERS[rng.below(FILTERS.len())];
            let row_len = if i % 2 == 0 {
                32 + rng.below(200)
            } else {
                [32, 33, 63, 64, 65, 96, 768][rng.below(7)]
            };
            let c = precompute_coeffs(sh, dh, filter);
            let src = rng.image(sh * row_len);
            let mut want = vec![0u8; dh * row_len];
            vertical_scalar(&src, row_len, &c, &mut want);
            for level in levels() {
                let t = VTable::new(&c, row_len, level).expect("table");
                let mut got = vec![0xa5; dh * row_len];
                vertical(&src, row_len, &t, &mut got);
                assert!(
                    got == want,
                    "vertical {sh}->{dh} x{row_len} {filter:?} {level:?}"
                );
            }
        }
    }
}
