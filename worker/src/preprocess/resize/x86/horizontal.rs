//! The horizontal pass: four output pixels at a time, in two vectors, `a`
//! with pixels 0 and 2 (one per 128-bit lane) and `b` with pixels 1 and 3,
//! the order in which the final packs put them back in sequence.
//!
//! A lane has four i32 slots. With 3 or 4 channels slot `c` sums channel `c`
//! (the fourth idles for RGB); with 1 or 2 channels the slots also take
//! further taps of the same channels, and are added together at the end.
//! Each step shuffles (pshufb) 16 source bytes per lane into the layout the
//! multiply wants and multiplies them by the step's coefficient digits; the
//! tables hold those digits already in lane order, so that the inner loop is
//! loads, shuffles and multiplies only.

use std::arch::x86_64::*;

use super::{join_madd, load16, mac, shift, split_dot, split_madd, Coeffs, Lanes, Level, HALF};

/// Which multiply a table is laid out for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// madd: a step covers two taps per slot (i16s), and steps go in
    /// pairs that share one load.
    Madd,
    /// `vpdpbusd`: a step covers four taps per slot (bytes).
    Dot,
}

impl Kind {
    /// Taps a step covers per slot.
    const fn slot_taps(self) -> usize {
        match self {
            Kind::Madd => 2,
            Kind::Dot => 4,
        }
    }

    /// Coefficient vectors per step.
    const fn vectors(self) -> usize {
        match self {
            Kind::Madd => 4,
            Kind::Dot => 6,
        }
    }
}

/// Channels per lane, see the module comment.
const fn slot_channels(ch: usize) -> usize {
    if ch >= 3 {
        4
    } else {
        ch
    }
}

/// For byte `byte` of a lane in the layout of `kind`: its channel and its tap
/// within the step; madd's lanes hold i16s, whose high bytes are zero (None).
fn lane_byte(kind: Kind, ch: usize, byte: usize) -> Option<(usize, usize)> {
    let (slot, j) = match kind {
        Kind::Madd if byte % 2 == 1 => return None,
        Kind::Madd => (byte / 4, byte / 2 % 2),
        Kind::Dot => (byte / 4, byte % 4),
    };
    let chs = slot_channels(ch);
    let (c, group) = (slot % chs, slot / chs);
    (c < ch).then_some((c, kind.slot_taps() * group + j))
}

/// Taps a step covers per pixel.
const fn step_taps(kind: Kind, ch: usize) -> usize {
    kind.slot_taps() * 4 / slot_channels(ch)
}

/// Four output pixels; see the module comment.
struct Group {
    /// Byte offsets of the first source pixel for a.lo, a.hi, b.lo, b.hi.
    off: [usize; 4],
    /// First step's vectors in [`HTable::k`].
    k0: usize,
    steps: usize,
}

/// The horizontal taps laid out for one of the kernels.
pub(in super::super) struct HTable {
    /// Also says the layout: madd for `Avx2`, `vpdpbusd` for `Vnni`.
    level: Level,
    ch: usize,
    groups: Vec<Group>,
    /// Per group and step, [`Kind::vectors`] operands: a's digits, then b's.
    k: Vec<Lanes>,
    /// How far past a row's first byte the loads reach.
    reach: usize,
}

impl HTable {
    /// The table for the fastest kernel this CPU has that can take `c`.
    pub(in super::super) fn new(c: &Coeffs, ch: usize, dw: usize, level: Level) -> Option<HTable> {
        if level == Level::Vnni {
            if let Some(t) = HTable::build(c, ch, dw, Level::Vnni) {
                return Some(t);
            }
        }
        HTable::build(c, ch, dw, Level::Avx2)
    }

    /// Bytes the pass writes for `rows` rows of `out_stride`: each group
    /// stores 16 bytes, of which `4 * ch` are its pixels; what lies past them
    /// is rewritten by the next group or row, or falls past the last row.
    pub(in super::super) fn out_len(&self, rows: usize, out_stride: usize) -> usize {
        let last_store = self.groups.len().saturating_sub(1) * 4 * self.ch + 16;
        rows * out_stride + last_store.saturating_sub(out_stride)
    }

    /// The table for madd (`Level::Avx2`) or for `vpdpbusd` (`Level::Vnni`).
    pub(super) fn build(c: &Coeffs, ch: usize, dw: usize, level: Level) -> Option<HTable> {
        let kind = match level {
            Level::Avx2 => Kind::Madd,
            Level::Vnni => Kind::Dot,
        };
        let taps = step_taps(kind, ch);
        let n_groups = dw.div_ceil(4);
        let mut groups = Vec::with_capacity(n_groups);
        let mut k = Vec::new();
        let mut reach = 0;
        for g in 0..n_groups {
            // Lane order a.lo, a.hi, b.lo, b.hi. A pixel past `dw` has no
            // taps; its bytes land where the next row's pixels overwrite them.
            let px: [(usize, &[i32]); 4] = [0, 2, 1, 3].map(|i| {
                if 4 * g + i < dw {
                    c.taps(4 * g + i)
                } else {
                    (0, &[][..])
                }
            });
            let n = px.iter().map(|(_, k)| k.len()).max().unwrap_or(0);
            // The last step that loads: madd's steps load in pairs.
            let (steps, last_load) = match kind {
                Kind::Madd => {
                    let steps = n.div_ceil(2 * taps) * 2;
                    (steps, steps.saturating_sub(2))
                }
                Kind::Dot => {
                    let steps = n.div_ceil(taps);
                    (steps, steps.saturating_sub(1))
                }
            };
            let off = px.map(|(xmin, _)| xmin * ch);
            reach = reach.max(off.iter().max().unwrap() + ch * taps * last_load + 16);
            let k0 = k.len();
            for s in 0..steps {
                let mut e = [Lanes::default(); 6];
                for (lane, (_, kp)) in px.iter().enumerate() {
                    // Vector a or b, and the byte where the lane starts.
                    let (v, base) = (lane / 2, 16 * (lane % 2));
                    for byte in (0..16).filter(|b| kind == Kind::Dot || b % 2 == 0) {
                        let kv = match lane_byte(kind, ch, byte) {
                            Some((_, tap)) => kp.get(taps * s + tap).copied().unwrap_or(0),
                            None => 0,
                        };
                        match kind {
                            Kind::Madd => {
                                let (hi, lo) = split_madd(kv)?;
                                e[2 * v].set_i16((base + byte) / 2, hi);
                                e[2 * v + 1].set_i16((base + byte) / 2, lo);
                            }
                            Kind::Dot => {
                                for (d, digit) in split_dot(kv)?.into_iter().enumerate() {
                                    e[3 * v + d].0[base + byte] = digit as u8;
                                }
                            }
                        }
                    }
                }
                k.extend_from_slice(&e[..kind.vectors()]);
            }
            groups.push(Group { off, k0, steps });
        }
        Some(HTable {
            level,
            ch,
            groups,
            k,
            reach,
        })
    }
}

/// pshufb masks that lay out the source bytes of one step for `kind`, and
/// for madd also those of the second step of the same load.
fn spread_masks(kind: Kind, ch: usize) -> [[i8; 16]; 2] {
    let at = |byte, step: usize| {
        lane_byte(kind, ch, byte).map_or(-1, |(c, tap)| {
            (c + ch * (tap + step * step_taps(kind, ch))) as i8
        })
    };
    [
        std::array::from_fn(|byte| at(byte, 0)),
        std::array::from_fn(|byte| at(byte, 1)),
    ]
}

/// The pshufb mask that keeps `ch` of each pixel's four bytes, packed.
fn compact_mask(ch: usize) -> [i8; 16] {
    let mut m = [-1i8; 16];
    for (i, v) in m.iter_mut().enumerate().take(4 * ch) {
        *v = (4 * (i / ch) + i % ch) as i8;
    }
    m
}

/// The accumulators' start: [`HALF`] once per channel of each pixel.
fn half_init(ch: usize) -> [i32; 8] {
    std::array::from_fn(|i| if i % 4 < slot_channels(ch) { HALF } else { 0 })
}

/// The horizontal pass (see `horizontal_scalar`) over `rows` rows of
/// `in_stride` bytes from row `y0`, into rows of `out_stride` bytes at the
/// start of `out`, which has at least [`HTable::out_len`] bytes.
pub(in super::super) fn horizontal(
    src: &[u8],
    in_stride: usize,
    y0: usize,
    rows: usize,
    t: &HTable,
    out_stride: usize,
    out: &mut [u8],
) {
    assert!(
        out.len() >= t.out_len(rows, out_stride) && (y0 + rows) * in_stride <= src.len(),
        "horizontal: buffers do not fit the table: this is a bug"
    );
    let a = (src, in_stride, y0, rows, t, out_stride);
    match t.level {
        // SAFETY: the table's level was detected on this CPU.
        Level::Avx2 => unsafe { horizontal_avx2(a, out) },
        // SAFETY: as above.
        Level::Vnni => unsafe { horizontal_vnni(a, out) },
    }
}

type Args<'a> = (&'a [u8], usize, usize, usize, &'a HTable, usize);

#[target_feature(enable = "avx2")]
fn horizontal_avx2(a: Args, out: &mut [u8]) {
    match a.4.ch {
        1 => madd_kernel::<1>(a, out),
        2 => madd_kernel::<2>(a, out),
        3 => madd_kernel::<3>(a, out),
        _ => madd_kernel::<4>(a, out),
    }
}

#[target_feature(enable = "avx2,avxvnni")]
fn horizontal_vnni(a: Args, out: &mut [u8]) {
    match a.4.ch {
        1 => dot_kernel::<1>(a, out),
        2 => dot_kernel::<2>(a, out),
        3 => dot_kernel::<3>(a, out),
        _ => dot_kernel::<4>(a, out),
    }
}

/// Source row `y`, or where the loads would run past the end of `src`, a
/// copy of it padded with zeros (they meet zero taps only).
fn line<'a>(
    src: &'a [u8],
    y: usize,
    in_stride: usize,
    t: &HTable,
    padded: &'a mut Vec<u8>,
) -> &'a [u8] {
    let line = &src[y * in_stride..];
    if line.len() >= t.reach {
        return line;
    }
    padded.clear();
    padded.extend_from_slice(&line[..in_stride]);
    padded.resize(t.reach, 0);
    padded
}

/// Loads 16 bytes at `off[0] + d` and `off[1] + d` into the two lanes.
///
/// # Safety
///
/// Both loads lie inside `line`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load_lanes(line: &[u8], off: [usize; 2], d: usize) -> __m256i {
    // SAFETY: guaranteed by the caller.
    unsafe {
        _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(load16(line, off[0] + d)),
            load16(line, off[1] + d),
        )
    }
}

/// Folds the extra slots of 1- and 2-channel lanes into the first ones,
/// shifts, and stores group `gi`'s four pixels into `out_row`.
#[target_feature(enable = "avx2")]
#[inline]
fn store<const CH: usize>(out_row: &mut [u8], gi: usize, a: __m256i, b: __m256i, compact: __m128i) {
    let fold = |v: __m256i| {
        let mut v = v;
        if slot_channels(CH) <= 2 {
            v = _mm256_add_epi32(v, _mm256_shuffle_epi32::<0b01_00_11_10>(v));
        }
        if slot_channels(CH) == 1 {
            v = _mm256_add_epi32(v, _mm256_shuffle_epi32::<0b10_11_00_01>(v));
        }
        shift(v)
    };
    let (a, b) = (fold(a), fold(b));
    // Lane 0: pixels 0, 1; lane 1: pixels 2, 3 (as i16, then bytes).
    let p = _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_setzero_si256());
    let p = _mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b1000>(p));
    let p = if CH == 4 {
        p
    } else {
        _mm_shuffle_epi8(p, compact)
    };
    let dst = &mut out_row[gi * 4 * CH..gi * 4 * CH + 16];
    // SAFETY: `dst` is 16 bytes.
    unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), p) };
}

/// The constant vectors: spread masks, compaction mask, accumulator start.
#[target_feature(enable = "avx2")]
#[inline]
fn constants(kind: Kind, ch: usize) -> ([__m256i; 2], __m128i, __m256i) {
    let [m0, m1] = spread_masks(kind, ch);
    let (compact, init) = (compact_mask(ch), half_init(ch));
    // SAFETY: the arrays are 16, 16, 16 and 32 bytes.
    unsafe {
        (
            [
                _mm256_broadcastsi128_si256(_mm_loadu_si128(m0.as_ptr().cast())),
                _mm256_broadcastsi128_si256(_mm_loadu_si128(m1.as_ptr().cast())),
            ],
            _mm_loadu_si128(compact.as_ptr().cast()),
            _mm256_loadu_si256(init.as_ptr().cast()),
        )
    }
}

#[target_feature(enable = "avx2")]
#[inline]
fn madd_kernel<const CH: usize>((src, in_stride, y0, rows, t, out_stride): Args, out: &mut [u8]) {
    let pair_bytes = 2 * CH * step_taps(Kind::Madd, CH);
    let (m, compact, init) = constants(Kind::Madd, CH);
    let zero = _mm256_setzero_si256();
    let mut padded = Vec::new();
    for y in 0..rows {
        let line = line(src, y0 + y, in_stride, t, &mut padded);
        let out_row = &mut out[y * out_stride..];
        for (gi, g) in t.groups.iter().enumerate() {
            let (mut ah, mut al, mut bh, mut bl) = (zero, init, zero, init);
            let ks = &t.k[g.k0..g.k0 + 4 * g.steps];
            for (s, k) in ks.chunks_exact(8).enumerate() {
                let d = s * pair_bytes;
                // SAFETY: `t.reach` bounds `off + d + 16` for every load of
                // every group, and `line` is at least that long.
                let (va, vb) = unsafe {
                    (
                        load_lanes(line, [g.off[0], g.off[1]], d),
                        load_lanes(line, [g.off[2], g.off[3]], d),
                    )
                };
                for (k, m) in k.chunks_exact(4).zip(m) {
                    let (pa, pb) = (_mm256_shuffle_epi8(va, m), _mm256_shuffle_epi8(vb, m));
                    ah = mac::<false>(ah, pa, k[0].load());
                    al = mac::<false>(al, pa, k[1].load());
                    bh = mac::<false>(bh, pb, k[2].load());
                    bl = mac::<false>(bl, pb, k[3].load());
                }
            }
            store::<CH>(out_row, gi, join_madd(ah, al), join_madd(bh, bl), compact);
        }
    }
}

#[target_feature(enable = "avx2,avxvnni")]
#[inline]
fn dot_kernel<const CH: usize>((src, in_stride, y0, rows, t, out_stride): Args, out: &mut [u8]) {
    let ([m, _], compact, init) = constants(Kind::Dot, CH);
    let mut padded = Vec::new();
    for y in 0..rows {
        let line = line(src, y0 + y, in_stride, t, &mut padded);
        let out_row = &mut out[y * out_stride..];
        for (gi, g) in t.groups.iter().enumerate() {
            let ks = &t.k[g.k0..g.k0 + 6 * g.steps];
            // SAFETY: `t.reach` bounds `off + d + 16` for every load of every
            // group, and `line` is at least that long.
            let (a, b) = unsafe {
                match g.steps {
                    1 => dot_horner::<CH, 1>(line, g, ks, m, init),
                    2 => dot_horner::<CH, 2>(line, g, ks, m, init),
                    3 => dot_horner::<CH, 3>(line, g, ks, m, init),
                    _ => dot_loop::<CH>(line, g, ks, m, init),
                }
            };
            store::<CH>(out_row, gi, a, b, compact);
        }
    }
}

/// A group's pixel vectors for step `s`, laid out for `vpdpbusd`.
///
/// # Safety
///
/// The loads lie inside `line`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot_pixels<const CH: usize>(
    line: &[u8],
    g: &Group,
    s: usize,
    m: __m256i,
) -> [__m256i; 2] {
    let d = s * CH * step_taps(Kind::Dot, CH);
    // SAFETY: guaranteed by the caller.
    let (va, vb) = unsafe {
        (
            load_lanes(line, [g.off[0], g.off[1]], d),
            load_lanes(line, [g.off[2], g.off[3]], d),
        )
    };
    [_mm256_shuffle_epi8(va, m), _mm256_shuffle_epi8(vb, m)]
}

/// A group of `S` steps, digit by digit from the highest (Horner's rule), so
/// that one accumulator per vector takes all three and no adds join them.
///
/// # Safety
///
/// As [`dot_pixels`], for each step.
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
unsafe fn dot_horner<const CH: usize, const S: usize>(
    line: &[u8],
    g: &Group,
    ks: &[Lanes],
    m: __m256i,
    init: __m256i,
) -> (__m256i, __m256i) {
    const { assert!(HALF % (1 << 16) == 0) };
    let ks = &ks[..6 * S];
    let mut p = [[_mm256_setzero_si256(); 2]; S];
    for (s, p) in p.iter_mut().enumerate() {
        // SAFETY: guaranteed by the caller.
        *p = unsafe { dot_pixels::<CH>(line, g, s, m) };
    }
    // `HALF` goes in above the two shifts.
    let mut acc = [_mm256_srli_epi32::<16>(init); 2];
    for d in (0..3).rev() {
        if d < 2 {
            acc = [
                _mm256_slli_epi32::<8>(acc[0]),
                _mm256_slli_epi32::<8>(acc[1]),
            ];
        }
        // Indexed by the constant `S`, so that the loop unrolls.
        for (s, p) in p.iter().enumerate() {
            acc[0] = _mm256_dpbusd_avx_epi32(acc[0], p[0], ks[6 * s + d].load());
            acc[1] = _mm256_dpbusd_avx_epi32(acc[1], p[1], ks[6 * s + 3 + d].load());
        }
    }
    (acc[0], acc[1])
}

/// A group of any number of steps: three accumulators per vector, joined
/// at the end.
///
/// # Safety
///
/// As [`dot_pixels`], for each step.
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
unsafe fn dot_loop<const CH: usize>(
    line: &[u8],
    g: &Group,
    ks: &[Lanes],
    m: __m256i,
    init: __m256i,
) -> (__m256i, __m256i) {
    let zero = _mm256_setzero_si256();
    let mut acc = [[init, zero, zero], [init, zero, zero]];
    for (s, k) in ks.chunks_exact(6).enumerate() {
        // SAFETY: guaranteed by the caller.
        let p = unsafe { dot_pixels::<CH>(line, g, s, m) };
        for v in 0..2 {
            for d in 0..3 {
                acc[v][d] = _mm256_dpbusd_avx_epi32(acc[v][d], p[v], k[3 * v + d].load());
            }
        }
    }
    let join = |[d0, d1, d2]: [__m256i; 3]| {
        let d21 = _mm256_add_epi32(_mm256_slli_epi32::<8>(d2), d1);
        _mm256_add_epi32(_mm256_slli_epi32::<8>(d21), d0)
    };
    (join(acc[0]), join(acc[1]))
}
