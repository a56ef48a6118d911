//! Port of libjpeg-turbo `jidctint.c jpeg_idct_islow` (the default
//! `JDCT_ISLOW` method) including its post-IDCT range-limit table.
//!
//! Intermediate values use i64 because the C code computes in `JLONG`
//! (64-bit `long` on LP64 targets) and truncates pass-1 results to `int`;
//! replicating those widths keeps results identical even for absurd
//! coefficients and rules out overflow panics.

const CONST_BITS: u32 = 13;
const PASS1_BITS: u32 = 2;

const FIX_0_298631336: i64 = 2446;
const FIX_0_390180644: i64 = 3196;
const FIX_0_541196100: i64 = 4433;
const FIX_0_765366865: i64 = 6270;
const FIX_0_899976223: i64 = 7373;
const FIX_1_175875602: i64 = 9633;
const FIX_1_501321110: i64 = 12299;
const FIX_1_847759065: i64 = 15137;
const FIX_1_961570560: i64 = 16069;
const FIX_2_053119869: i64 = 16819;
const FIX_2_562915447: i64 = 20995;
const FIX_3_072711026: i64 = 25172;

const RANGE_MASK: i64 = 1023;

/// `jdmaster.c prepare_range_limit_table`, seen from `IDCT_range_limit`:
/// indexed by `x & RANGE_MASK` it gives `x + 128` for x in -128..=127,
/// saturates just outside that, and deliberately wraps for values beyond
/// ±512, which only corrupt or extreme data produces.
const RANGE_LIMIT: [u8; 1024] = build_range_limit();

const fn build_range_limit() -> [u8; 1024] {
    let mut t = [0u8; 1024];
    let mut i = 0;
    while i < 1024 {
        t[i] = if i < 128 {
            (i + 128) as u8
        } else if i < 512 {
            255
        } else if i < 896 {
            0
        } else {
            (i - 896) as u8
        };
        i += 1;
    }
    t
}

#[inline(always)]
fn descale(x: i64, n: u32) -> i64 {
    (x + (1 << (n - 1))) >> n
}

#[inline(always)]
fn limit(x: i64) -> u8 {
    RANGE_LIMIT[(x & RANGE_MASK) as usize]
}

/// `jddctmgr.c` stores ISLOW multipliers as `short`.
pub(crate) fn quant_for_idct(q: [u16; 64]) -> [i32; 64] {
    q.map(|v| i32::from(v as i16))
}

/// Output value of a block whose AC coefficients are all zero: both passes
/// take their zero-AC shortcuts, so every sample is the same.
#[inline(always)]
pub(crate) fn dc_only_value(dc: i16, q0: i32) -> u8 {
    let dcval = ((i64::from(i32::from(dc) * q0)) << PASS1_BITS) as i32;
    limit(descale(i64::from(dcval), PASS1_BITS + 3))
}

/// Inputs below this magnitude keep every intermediate of a pass within
/// i32 (the largest is about 178219 times the input), so the fast path
/// computes exactly what the C code computes in 64 bits.
const NARROW_LIMIT: u32 = 8192;

/// `coef` in natural order; `quant` is the table as libjpeg stores it for
/// ISLOW (`ISLOW_MULT_TYPE` is `short`, so 16-bit entries > 32767 wrap).
/// Writes 8 rows of 8 samples at `out[r * stride ..]`.
///
/// The zero-AC shortcuts of jidctint.c are omitted here: they produce the
/// same values as the full computation, and branch-free lanes vectorise.
pub(crate) fn idct_islow(coef: &[i16; 64], quant: &[i32; 64], out: &mut [u8], stride: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 support was verified at run time just above.
        return unsafe { idct_islow_avx2(coef, quant, out, stride) };
    }
    idct_islow_narrow(coef, quant, out, stride)
}

/// The same code compiled for AVX2, where the lane loops become 8-wide
/// 32-bit vector operations (baseline x86-64 lacks a 32-bit vector multiply).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn idct_islow_avx2(coef: &[i16; 64], quant: &[i32; 64], out: &mut [u8], stride: usize) {
    idct_islow_narrow(coef, quant, out, stride)
}

#[inline(always)]
fn idct_islow_narrow(coef: &[i16; 64], quant: &[i32; 64], out: &mut [u8], stride: usize) {
    let mut dq = [[0i32; 8]; 8];
    let mut bits = 0u32;
    for (i, (&c, &q)) in coef.iter().zip(quant).enumerate() {
        let v = i32::from(c) * q;
        dq[i / 8][i % 8] = v;
        bits |= v.unsigned_abs();
    }
    // OR of magnitudes is below a power of two iff every magnitude is.
    if bits >= NARROW_LIMIT {
        return idct_islow_wide(coef, quant, out, stride);
    }
    // Pass 1 with columns as lanes: ws[r][c].
    let ws = idct_1d(&dq, CONST_BITS - PASS1_BITS);
    let mut bits = 0u32;
    let mut t = [[0i32; 8]; 8];
    for (r, row) in ws.iter().enumerate() {
        for (c, &v) in row.iter().enumerate() {
            t[c][r] = v;
            bits |= v.unsigned_abs();
        }
    }
    if bits >= NARROW_LIMIT {
        return idct_islow_wide(coef, quant, out, stride);
    }
    // Pass 2 with rows as lanes: px[c][r].
    let px = idct_1d(&t, CONST_BITS + PASS1_BITS + 3);
    for r in 0..8 {
        let o = &mut out[r * stride..r * stride + 8];
        for c in 0..8 {
            o[c] = RANGE_LIMIT[(px[c][r] & RANGE_MASK as i32) as usize];
        }
    }
}

/// One 1-D IDCT on eight lanes at once: `x[k][lane]` is input k, the result
/// `[k][lane]` output k, descaled by `n` bits (jidctint.c's DESCALE).
#[inline(always)]
fn idct_1d(x: &[[i32; 8]; 8], n: u32) -> [[i32; 8]; 8] {
    const F0298: i32 = FIX_0_298631336 as i32;
    const F0390: i32 = FIX_0_390180644 as i32;
    const F0541: i32 = FIX_0_541196100 as i32;
    const F0765: i32 = FIX_0_765366865 as i32;
    const F0899: i32 = FIX_0_899976223 as i32;
    const F1175: i32 = FIX_1_175875602 as i32;
    const F1501: i32 = FIX_1_501321110 as i32;
    const F1847: i32 = FIX_1_847759065 as i32;
    const F1961: i32 = FIX_1_961570560 as i32;
    const F2053: i32 = FIX_2_053119869 as i32;
    const F2562: i32 = FIX_2_562915447 as i32;
    const F3072: i32 = FIX_3_072711026 as i32;
    let round = 1i32 << (n - 1);
    let mut o = [[0i32; 8]; 8];
    for l in 0..8 {
        let z2 = x[2][l];
        let z3 = x[6][l];
        let z1 = (z2 + z3) * F0541;
        let tmp2 = z1 - z3 * F1847;
        let tmp3 = z1 + z2 * F0765;
        let tmp0 = (x[0][l] + x[4][l]) << CONST_BITS;
        let tmp1 = (x[0][l] - x[4][l]) << CONST_BITS;
        let tmp10 = tmp0 + tmp3;
        let tmp13 = tmp0 - tmp3;
        let tmp11 = tmp1 + tmp2;
        let tmp12 = tmp1 - tmp2;

        let (t0, t1, t2, t3) = (x[7][l], x[5][l], x[3][l], x[1][l]);
        let z1 = t0 + t3;
        let z2 = t1 + t2;
        let z3 = t0 + t2;
        let z4 = t1 + t3;
        let z5 = (z3 + z4) * F1175;
        let z1 = z1 * -F0899;
        let z2 = z2 * -F2562;
        let z3 = z3 * -F1961 + z5;
        let z4 = z4 * -F0390 + z5;
        let o0 = t0 * F0298 + z1 + z3;
        let o1 = t1 * F2053 + z2 + z4;
        let o2 = t2 * F3072 + z2 + z3;
        let o3 = t3 * F1501 + z1 + z4;

        o[0][l] = (tmp10 + o3 + round) >> n;
        o[7][l] = (tmp10 - o3 + round) >> n;
        o[1][l] = (tmp11 + o2 + round) >> n;
        o[6][l] = (tmp11 - o2 + round) >> n;
        o[2][l] = (tmp12 + o1 + round) >> n;
        o[5][l] = (tmp12 - o1 + round) >> n;
        o[3][l] = (tmp13 + o0 + round) >> n;
        o[4][l] = (tmp13 - o0 + round) >> n;
    }
    o
}

/// Literal port with 64-bit intermediates, for inputs outside the narrow
/// path's range (only extreme or corrupt data gets here).
#[cold]
fn idct_islow_wide(coef: &[i16; 64], quant: &[i32; 64], out: &mut [u8], stride: usize) {
    let mut ws = [0i32; 64];

    for c in 0..8 {
        let col = |r: usize| coef[r * 8 + c];
        let dq = |r: usize| i64::from(i32::from(coef[r * 8 + c]) * quant[r * 8 + c]);
        if col(1) == 0
            && col(2) == 0
            && col(3) == 0
            && col(4) == 0
            && col(5) == 0
            && col(6) == 0
            && col(7) == 0
        {
            let dcval = (dq(0) << PASS1_BITS) as i32;
            for r in 0..8 {
                ws[r * 8 + c] = dcval;
            }
            continue;
        }

        let z2 = dq(2);
        let z3 = dq(6);
        let z1 = (z2 + z3) * FIX_0_541196100;
        let tmp2 = z1 + z3 * -FIX_1_847759065;
        let tmp3 = z1 + z2 * FIX_0_765366865;

        let z2 = dq(0);
        let z3 = dq(4);
        let tmp0 = (z2 + z3) << CONST_BITS;
        let tmp1 = (z2 - z3) << CONST_BITS;

        let tmp10 = tmp0 + tmp3;
        let tmp13 = tmp0 - tmp3;
        let tmp11 = tmp1 + tmp2;
        let tmp12 = tmp1 - tmp2;

        let (tmp0, tmp1, tmp2, tmp3) = odd_part(dq(7), dq(5), dq(3), dq(1));

        let n = CONST_BITS - PASS1_BITS;
        ws[c] = descale(tmp10 + tmp3, n) as i32;
        ws[7 * 8 + c] = descale(tmp10 - tmp3, n) as i32;
        ws[8 + c] = descale(tmp11 + tmp2, n) as i32;
        ws[6 * 8 + c] = descale(tmp11 - tmp2, n) as i32;
        ws[2 * 8 + c] = descale(tmp12 + tmp1, n) as i32;
        ws[5 * 8 + c] = descale(tmp12 - tmp1, n) as i32;
        ws[3 * 8 + c] = descale(tmp13 + tmp0, n) as i32;
        ws[4 * 8 + c] = descale(tmp13 - tmp0, n) as i32;
    }

    for (r, w) in ws.chunks_exact(8).enumerate() {
        let o = &mut out[r * stride..r * stride + 8];
        if w[1..].iter().all(|&v| v == 0) {
            o.fill(limit(descale(i64::from(w[0]), PASS1_BITS + 3)));
            continue;
        }
        let wv = |i: usize| i64::from(w[i]);

        let z2 = wv(2);
        let z3 = wv(6);
        let z1 = (z2 + z3) * FIX_0_541196100;
        let tmp2 = z1 + z3 * -FIX_1_847759065;
        let tmp3 = z1 + z2 * FIX_0_765366865;

        let tmp0 = (wv(0) + wv(4)) << CONST_BITS;
        let tmp1 = (wv(0) - wv(4)) << CONST_BITS;

        let tmp10 = tmp0 + tmp3;
        let tmp13 = tmp0 - tmp3;
        let tmp11 = tmp1 + tmp2;
        let tmp12 = tmp1 - tmp2;

        let (tmp0, tmp1, tmp2, tmp3) = odd_part(wv(7), wv(5), wv(3), wv(1));

        let n = CONST_BITS + PASS1_BITS + 3;
        o[0] = limit(descale(tmp10 + tmp3, n));
        o[7] = limit(descale(tmp10 - tmp3, n));
        o[1] = limit(descale(tmp11 + tmp2, n));
        o[6] = limit(descale(tmp11 - tmp2, n));
        o[2] = limit(descale(tmp12 + tmp1, n));
        o[5] = limit(descale(tmp12 - tmp1, n));
        o[3] = limit(descale(tmp13 + tmp0, n));
        o[4] = limit(descale(tmp13 - tmp0, n));
    }
}

/// Odd part of the 1-D IDCT ("figure 8" in jidctint.c); inputs are the
/// y7, y5, y3, y1 terms.
#[inline(always)]
fn odd_part(t0: i64, t1: i64, t2: i64, t3: i64) -> (i64, i64, i64, i64) {
    let z1 = t0 + t3;
    let z2 = t1 + t2;
    let z3 = t0 + t2;
    let z4 = t1 + t3;
    let z5 = (z3 + z4) * FIX_1_175875602;

    let t0 = t0 * FIX_0_298631336;
    let t1 = t1 * FIX_2_053119869;
    let t2 = t2 * FIX_3_072711026;
    let t3 = t3 * FIX_1_501321110;
    let z1 = z1 * -FIX_0_899976223;
    let z2 = z2 * -FIX_2_562915447;
    let z3 = z3 * -FIX_1_961570560 + z5;
    let z4 = z4 * -FIX_0_390180644 + z5;

    (t0 + z1 + z3, t1 + z2 + z4, t2 + z2 + z3, t3 + z1 + z4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_limit_wraps_like_libjpeg() {
        assert_eq!(limit(-128), 0);
        assert_eq!(limit(0), 128);
        assert_eq!(limit(127), 255);
        assert_eq!(limit(300), 255);
        assert_eq!(limit(600), 0);
        assert_eq!(limit(-300), 0);
        assert_eq!(limit(-600), 255);
    }

    #[test]
    fn narrow_path_matches_wide_path() {
        let mut seed = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..20_000 {
            let mut coef = [0i16; 64];
            let mut q = [0i32; 64];
            let scale = [16u64, 256, 2048, 8192][round % 4];
            for i in 0..64 {
                if next() % 3 == 0 {
                    coef[i] = ((next() % (2 * scale)) as i64 - scale as i64) as i16;
                }
                q[i] = 1 + (next() % [2u64, 16, 255, 4][round % 4]) as i32;
            }
            let mut a = [0u8; 64];
            let mut b = [0u8; 64];
            idct_islow(&coef, &q, &mut a, 8);
            idct_islow_wide(&coef, &q, &mut b, 8);
            assert_eq!(a, b, "round {round}");
        }
    }

    #[test]
    fn dc_only_matches_full_idct() {
        let q = [3i32; 64];
        for dc in [-2000i16, -100, -1, 0, 1, 37, 500, 2047] {
            let mut coef = [0i16; 64];
            coef[0] = dc;
            let mut out = [0u8; 64];
            idct_islow(&coef, &q, &mut out, 8);
            assert!(out.iter().all(|&v| v == dc_only_value(dc, 3)));
        }
    }
}
