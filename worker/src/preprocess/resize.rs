//! Pillow's `Image.resize`, reproduced byte for byte on 8-bit images.
//!
//! Hugging Face's `SiglipImageProcessor` resizes with Pillow before it rescales
//! and normalizes, so the 8-bit values Pillow rounds to (including those of its
//! intermediate image between the two separable passes) are part of what the
//! embeddings depend on. A "close enough" resampler would change embeddings.
//!
//! This mirrors, for a full-image box and `reducing_gap=None`:
//! - `Image.resize` in `PIL/Image.py`: same size returns a copy; `LA`/`RGBA`
//!   images are premultiplied (`La`/`RGBa`) around every filter but nearest;
//! - `_resize` in `_imaging.c`: nearest goes through the affine transform's
//!   scaling path (`ImagingScaleAffine` in `Geometry.c`), not the resampler;
//! - `ImagingResample` in `libImaging/Resample.c` for the other filters:
//!   `precompute_coeffs`, `normalize_coeffs_8bpc` and the 8bpc passes;
//! - `rgbA2rgba`/`rgba2rgbA` and `lA2la`/`la2lA` in `libImaging/Convert.c`.
//!
//! Checked against the Pillow 13.0.0 sources and wheels (x86_64, glibc).
//! Pillow 13 picks the pass order per image (vertical first when the height
//! shrinks by more than twice what the width does); the Resample.c of earlier
//! releases always ran the horizontal pass first, so their output differs for
//! such sizes. The `MKS2013`/`MKS2021` filters (codes 6 and 7, new in 13.0) are
//! not implemented.
//!
//! Float expressions keep Pillow's operation order and `f32` box coordinates
//! on purpose: coefficients are rounded to fixed point, and one ulp can move a
//! coefficient, and so a pixel, by one. Hamming and Lanczos call `sin`/`cos`;
//! Rust's `f64::sin`/`cos` go to the platform libm, the same one Pillow's
//! wheels use on Linux.
//!
//! Past the coefficients everything is integer arithmetic with exact sums, so
//! it can be vectorised without changing a byte: on x86_64 CPUs with AVX2 the
//! passes run in the `x86` module (picked at run time), elsewhere in the
//! scalar loops here, and tests hold the two to the same output. The
//! coefficient tables depend only on the sizes, so the last ones are kept per
//! thread.

mod plan;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::cell::RefCell;

use plan::{Plan, PlanKey};

/// Pillow resampling filters, numbered as PIL's codes (the `resample` field of preprocessor_config.json).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// `Image.NEAREST` (0).
    Nearest,
    /// `Image.LANCZOS` (1), three lobes.
    Lanczos,
    /// `Image.BILINEAR` (2).
    Bilinear,
    /// `Image.BICUBIC` (3), Keys cubic with a = -0.5.
    Bicubic,
    /// `Image.BOX` (4).
    Box,
    /// `Image.HAMMING` (5).
    Hamming,
}

impl Filter {
    /// PIL code: 0 nearest, 1 lanczos, 2 bilinear, 3 bicubic, 4 box, 5 hamming. None for anything else.
    pub(crate) fn from_pil_code(code: u32) -> Option<Filter> {
        Some(match code {
            0 => Filter::Nearest,
            1 => Filter::Lanczos,
            2 => Filter::Bilinear,
            3 => Filter::Bicubic,
            4 => Filter::Box,
            5 => Filter::Hamming,
            _ => return None,
        })
    }

    /// Half-width of the kernel at scale 1 (`struct filter.support`).
    fn support(self) -> f64 {
        match self {
            Filter::Box => 0.5,
            Filter::Bilinear | Filter::Hamming => 1.0,
            Filter::Bicubic => 2.0,
            Filter::Lanczos => 3.0,
            Filter::Nearest => 0.0,
        }
    }

    /// The kernel, written with the same operations in the same order as
    /// Resample.c so that the f64 results agree to the last bit.
    fn kernel(self, x: f64) -> f64 {
        match self {
            Filter::Box => {
                if x > -0.5 && x <= 0.5 {
                    1.0
                } else {
                    0.0
                }
            }
            Filter::Bilinear => {
                let x = x.abs();
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Filter::Hamming => {
                let x = x.abs();
                if x == 0.0 {
                    1.0
                } else if x >= 1.0 {
                    0.0
                } else {
                    let x = x * std::f64::consts::PI;
                    // Pillow writes `0.54f + 0.46f * cos(x)`: the constants are
                    // single precision, widened to double.
                    x.sin() / x * (0.54f32 as f64 + 0.46f32 as f64 * x.cos())
                }
            }
            Filter::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            Filter::Lanczos => {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
            Filter::Nearest => unreachable!("nearest does not use the resampler"),
        }
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let x = x * std::f64::consts::PI;
        x.sin() / x
    }
}

/// `32 - 8 - 2`: 8 bits of result, 2 bits of headroom for kernels whose
/// partial sums leave [0, 1], and the sign bit.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// The rounding offset every accumulator starts from.
const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// Pillow's `clip8` indexes a table covering -640..=639 after the shift; that
/// range is never left for 8-bit input, so a clamp is the same function.
#[inline(always)]
fn clip8(v: i32) -> u8 {
    (v >> PRECISION_BITS).clamp(0, 255) as u8
}

/// One axis's fixed-point filter taps, as `precompute_coeffs` followed by
/// `normalize_coeffs_8bpc` leave them.
struct Coeffs {
    /// Per output index: first input index and number of taps.
    bounds: Vec<(usize, usize)>,
    /// Taps of output index `i` start at `i * ksize`.
    k: Vec<i32>,
    ksize: usize,
}

impl Coeffs {
    #[inline(always)]
    fn taps(&self, i: usize) -> (usize, &[i32]) {
        let (min, n) = self.bounds[i];
        let start = i * self.ksize;
        (min, &self.k[start..start + n])
    }
}

fn precompute_coeffs(in_size: usize, out_size: usize, filter: Filter) -> Coeffs {
    // The box is `float box[4]` = (0, 0, w, h) in Pillow; the subtraction and
    // the division happen after widening to double.
    let in0 = 0.0f32;
    let in1 = in_size as f32;
    let scale = (in1 - in0) as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let inv_filterscale = 1.0 / filterscale;

    let mut bounds = Vec::with_capacity(out_size);
    let mut k = vec![0i32; out_size * ksize];
    let mut w = vec![0f64; ksize];
    for xx in 0..out_size {
        let center = in0 as f64 + (xx as f64 + 0.5) * scale;
        // `(int)` truncates toward zero, which `as` also does (and saturates
        // where C would be undefined).
        let xmin = ((center - support + 0.5) as i64).max(0);
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64);
        let n = (xmax - xmin).max(0) as usize;
        let xmin = xmin as usize;
        let mut ww = 0.0f64;
        for (x, wx) in w[..n].iter_mut().enumerate() {
            let v = filter.kernel(((x + xmin) as f64 - center + 0.5) * inv_filterscale);
            *wx = v;
            ww += v;
        }
        let row = &mut k[xx * ksize..xx * ksize + n];
        for (kx, &wx) in row.iter_mut().zip(&w[..n]) {
            let v = if ww != 0.0 { wx / ww } else { wx };
            let scaled = v * (1i32 << PRECISION_BITS) as f64;
            *kx = if v < 0.0 {
                (-0.5 + scaled) as i32
            } else {
                (0.5 + scaled) as i32
            };
        }
        bounds.push((xmin, n));
    }
    Coeffs { bounds, k, ksize }
}

/// Horizontal pass over source rows `y0..y0 + rows`, into a `dw`-wide image
/// at the start of `out`, which has at least [`Plan::horizontal_len`] bytes.
fn horizontal<const CH: usize>(
    src: &[u8],
    sw: usize,
    y0: usize,
    rows: usize,
    plan: &Plan,
    dw: usize,
    out: &mut [u8],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = &plan.fast.horiz {
        return x86::horizontal(src, sw * CH, y0, rows, t, dw * CH, out);
    }
    horizontal_scalar::<CH>(src, sw, y0, &plan.horiz, dw, &mut out[..rows * dw * CH]);
}

/// [`horizontal`] into a new buffer.
fn horizontal_vec<const CH: usize>(
    src: &[u8],
    sw: usize,
    y0: usize,
    rows: usize,
    plan: &Plan,
    dw: usize,
) -> Vec<u8> {
    let mut out = vec![0u8; plan.horizontal_len(rows, dw * CH)];
    horizontal::<CH>(src, sw, y0, rows, plan, dw, &mut out);
    out.truncate(rows * dw * CH);
    out
}

/// Fills `out`, `out.len() / (dw * CH)` rows, from source rows `y0..`.
fn horizontal_scalar<const CH: usize>(
    src: &[u8],
    sw: usize,
    y0: usize,
    c: &Coeffs,
    dw: usize,
    out: &mut [u8],
) {
    let in_stride = sw * CH;
    let out_stride = dw * CH;
    if out_stride == 0 {
        return;
    }
    for (y, line_out) in out.chunks_exact_mut(out_stride).enumerate() {
        let line = &src[(y0 + y) * in_stride..(y0 + y + 1) * in_stride];
        for (xx, px_out) in line_out.chunks_exact_mut(CH).enumerate() {
            let (xmin, k) = c.taps(xx);
            let px_in = &line[xmin * CH..(xmin + k.len()) * CH];
            let mut acc = [HALF; CH];
            for (p, &kv) in px_in.chunks_exact(CH).zip(k) {
                for ch in 0..CH {
                    acc[ch] += p[ch] as i32 * kv;
                }
            }
            for ch in 0..CH {
                px_out[ch] = clip8(acc[ch]);
            }
        }
    }
}

/// Vertical pass over a `row_len`-byte-wide image, filling `out` (`dh` rows).
fn vertical(src: &[u8], row_len: usize, plan: &Plan, out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = &plan.fast.vert {
        return x86::vertical(src, row_len, t, out);
    }
    vertical_scalar(src, row_len, &plan.vert, out);
}

/// [`vertical`] into a new buffer.
fn vertical_vec(src: &[u8], row_len: usize, plan: &Plan, dh: usize) -> Vec<u8> {
    let mut out = vec![0u8; row_len * dh];
    vertical(src, row_len, plan, &mut out);
    out
}

/// Pillow sums per pixel; here whole rows are accumulated at a time, which
/// gives the same integers because the sums are exact i32 arithmetic that
/// cannot overflow.
fn vertical_scalar(src: &[u8], row_len: usize, c: &Coeffs, out: &mut [u8]) {
    if row_len == 0 {
        return;
    }
    let mut acc = vec![0i32; row_len];
    for (yy, line_out) in out.chunks_exact_mut(row_len).enumerate() {
        let (ymin, k) = c.taps(yy);
        acc.fill(HALF);
        for (y, &kv) in k.iter().enumerate() {
            let line = &src[(ymin + y) * row_len..(ymin + y + 1) * row_len];
            for (a, &p) in acc.iter_mut().zip(line) {
                *a += p as i32 * kv;
            }
        }
        for (o, &a) in line_out.iter_mut().zip(&acc) {
            *o = clip8(a);
        }
    }
}

/// Runs `f` on `len` bytes that this thread reuses from call to call, so that
/// the image between the two passes is neither allocated nor zeroed each
/// time. They hold what the last call left; the passes write every byte.
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    /// Larger images get a buffer of their own, rather than one that stays
    /// allocated for the life of the thread.
    const KEEP: usize = 16 << 20;
    thread_local! {
        static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    if len > KEEP {
        return f(&mut vec![0u8; len]);
    }
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < len {
            s.resize(len, 0);
        }
        f(&mut s[..len])
    })
}

/// `ImagingResampleInner` with a full-image box.
fn resample<const CH: usize>(src: &[u8], plan: &Plan) -> Vec<u8> {
    let PlanKey { sw, sh, dw, dh, .. } = plan.key;
    let need_horizontal = dw != sw;
    let need_vertical = dh != sh;
    if !need_horizontal && !need_vertical {
        return src.to_vec();
    }
    if plan.horizontal_first {
        if !need_horizontal {
            return vertical_vec(src, sw * CH, plan, dh);
        }
        let (first, last) = plan.rows;
        let rows = last - first;
        if !need_vertical {
            return horizontal_vec::<CH>(src, sw, first, rows, plan, dw);
        }
        with_scratch(plan.horizontal_len(rows, dw * CH), |tmp| {
            horizontal::<CH>(src, sw, first, rows, plan, dw, tmp);
            vertical_vec(&tmp[..rows * dw * CH], dw * CH, plan, dh)
        })
    } else {
        // Reached only when the height shrinks, so the vertical pass runs.
        if !need_horizontal {
            return vertical_vec(src, sw * CH, plan, dh);
        }
        with_scratch(sw * CH * dh, |tmp| {
            vertical(src, sw * CH, plan, tmp);
            horizontal_vec::<CH>(tmp, sw, 0, dh, plan, dw)
        })
    }
}

/// `ImagingScaleAffine` as `_resize` calls it for nearest: source positions
/// are accumulated by repeated addition in f64, as Pillow does, rather than
/// computed by multiplication, which could round to a different pixel.
fn nearest(src: &[u8], sw: usize, sh: usize, ch: usize, dw: usize, dh: usize) -> Vec<u8> {
    let a0 = (sw as f32 - 0.0f32) as f64 / dw as f64;
    let a4 = (sh as f32 - 0.0f32) as f64 / dh as f64;
    let coord = |v: f64| if v < 0.0 { -1 } else { v as i64 };

    let mut xintab = vec![0usize; dw];
    let (mut xmin, mut xmax) = (dw, 0);
    let mut xo = 0.0 + a0 * 0.5;
    for (x, t) in xintab.iter_mut().enumerate() {
        let xin = coord(xo);
        if xin >= 0 && (xin as usize) < sw {
            xmax = x + 1;
            xmin = xmin.min(x);
            *t = xin as usize;
        }
        xo += a0;
    }

    // Pillow asks for a zero fill, so pixels that map outside stay 0.
    let mut out = vec![0u8; dw * dh * ch];
    let mut yo = 0.0 + a4 * 0.5;
    for line_out in out.chunks_exact_mut(dw * ch) {
        let yi = coord(yo);
        if yi >= 0 && (yi as usize) < sh {
            let line = &src[yi as usize * sw * ch..(yi as usize + 1) * sw * ch];
            for x in xmin..xmax {
                let s = xintab[x] * ch;
                line_out[x * ch..(x + 1) * ch].copy_from_slice(&line[s..s + ch]);
            }
        }
        yo += a4;
    }
    out
}

/// Divides by 255 the way Pillow's `MULDIV255` does.
#[inline(always)]
fn muldiv255(a: u32, b: u32) -> u8 {
    let t = a * b + 128;
    (((t >> 8) + t) >> 8) as u8
}

/// `RGBA -> RGBa` / `LA -> La`: colour channels times alpha (the last channel).
fn premultiply(img: &mut [u8], ch: usize) {
    for px in img.chunks_exact_mut(ch) {
        let (color, alpha) = px.split_at_mut(ch - 1);
        let a = alpha[0] as u32;
        for c in color {
            *c = muldiv255(*c as u32, a);
        }
    }
}

/// `RGBa -> RGBA` / `La -> LA`.
fn unpremultiply(img: &mut [u8], ch: usize) {
    for px in img.chunks_exact_mut(ch) {
        let (color, alpha) = px.split_at_mut(ch - 1);
        let a = alpha[0] as u32;
        if a != 0 && a != 255 {
            for c in color {
                *c = ((255 * *c as u32) / a).min(255) as u8;
            }
        }
    }
}

/// Resize an interleaved 8-bit image with `channels` channels (1..=4), exactly as Pillow does.
///
/// Channels are taken as Pillow's `L` (1), `LA` (2), `RGB` (3) and `RGBA` (4)
/// modes; with 2 or 4 channels the last is alpha, and Pillow premultiplies by
/// it around every filter except nearest, so this does too.
///
/// `src.len()` must be `sw * sh * channels`; returns `dw * dh * channels`
/// bytes, or an empty `Vec` when `dw` or `dh` is 0.
///
/// # Panics
///
/// If `channels` is not in 1..=4 or `src.len()` does not match.
pub fn resize_u8(
    src: &[u8],
    sw: usize,
    sh: usize,
    channels: usize,
    dw: usize,
    dh: usize,
    filter: Filter,
) -> Vec<u8> {
    resize_with(src, sw, sh, channels, dw, dh, filter, true)
}

/// [`resize_u8`], with the vectorised passes allowed (where the CPU has them)
/// or not, so that tests can hold the two against each other.
#[allow(clippy::too_many_arguments)]
fn resize_with(
    src: &[u8],
    sw: usize,
    sh: usize,
    channels: usize,
    dw: usize,
    dh: usize,
    filter: Filter,
    simd: bool,
) -> Vec<u8> {
    assert!(
        (1..=4).contains(&channels),
        "resize_u8: {channels} channels, want 1..=4"
    );
    assert_eq!(
        src.len(),
        sw * sh * channels,
        "resize_u8: buffer is not {sw}x{sh}x{channels}"
    );
    if dw == 0 || dh == 0 {
        return Vec::new();
    }
    if sw == dw && sh == dh {
        return src.to_vec();
    }
    if filter == Filter::Nearest {
        return nearest(src, sw, sh, channels, dw, dh);
    }
    let has_alpha = channels == 2 || channels == 4;
    let premultiplied;
    let input = if has_alpha {
        let mut p = src.to_vec();
        premultiply(&mut p, channels);
        premultiplied = p;
        &premultiplied[..]
    } else {
        src
    };
    let plan = Plan::get(PlanKey {
        sw,
        sh,
        dw,
        dh,
        channels,
        filter,
        simd,
    });
    let mut out = match channels {
        1 => resample::<1>(input, &plan),
        2 => resample::<2>(input, &plan),
        3 => resample::<3>(input, &plan),
        _ => resample::<4>(input, &plan),
    };
    if has_alpha {
        unpremultiply(&mut out, channels);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/resize");

    fn read(name: &str) -> Vec<u8> {
        let path = format!("{FIXTURES}/{name}");
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn matches_pillow_fixtures() {
        let index = String::from_utf8(read("index.txt")).unwrap();
        let mut cases = 0;
        let mut failures = Vec::new();
        for line in index.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(f.len(), 9, "bad index line: {line}");
            let num = |i: usize| -> usize { f[i].parse().unwrap() };
            let (sw, sh, ch, dw, dh) = (num(1), num(2), num(3), num(4), num(5));
            let filter = Filter::from_pil_code(num(6) as u32).unwrap();
            let src = read(f[7]);
            let want = read(f[8]);
            assert_eq!(want.len(), dw * dh * ch, "{}: fixture size", f[0]);
            // Both the scalar and (where the CPU has them) the vector passes.
            for simd in [false, true] {
                let got = resize_with(&src, sw, sh, ch, dw, dh, filter, simd);
                if got != want {
                    let diffs = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                    failures.push(format!("{} simd={simd} ({diffs} bytes differ)", f[0]));
                }
            }
            cases += 1;
        }
        assert!(cases >= 100, "only {cases} cases in the index");
        assert!(failures.is_empty(), "differs from Pillow: {failures:?}");
    }

    /// Deterministic bytes (xorshift), so that a failure reproduces.
    pub(super) struct Rng(pub(super) u64);

    impl Rng {
        pub(super) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        pub(super) fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        /// Random bytes, or in a third of the images only 0 and 255, which
        /// make the negative lobes overshoot and the sums clip.
        pub(super) fn image(&mut self, len: usize) -> Vec<u8> {
            let extremes = self.below(3) == 0;
            (0..len)
                .map(|_| match self.next() as u8 {
                    v if !extremes => v,
                    v if v & 1 == 0 => 0,
                    _ => 255,
                })
                .collect()
        }
    }

    #[test]
    fn vector_paths_match_scalar() {
        let mut rng = Rng(0x853c_49e6_748f_ea9b);
        let sizes = [1, 2, 3, 5, 8, 11, 16, 17, 33, 64, 97];
        let mut cases: Vec<(usize, usize, usize, usize, usize, Filter)> = Vec::new();
        for i in 0..400 {
            let mut pick = || sizes[rng.below(sizes.len())] + rng.below(3);
            let (sw, sh) = (pick(), pick());
            // Same size on one axis, downscales (vertical first where the
            // height shrinks the most) and upscales.
            let mut target = |s: usize| match rng.below(4) {
                0 => s,
                1 => 1 + rng.below(s),
                _ => sizes[rng.below(sizes.len())] + rng.below(3),
            };
            let (dw, dh) = (target(sw), target(sh));
            let filter = Filter::from_pil_code(rng.below(6) as u32).unwrap();
            cases.push((1 + i % 4, sw, sh, dw, dh, filter));
        }
        for ch in 1..=4 {
            cases.push((ch, 512, 384, 256, 256, Filter::Bicubic));
            cases.push((ch, 300, 900, 224, 224, Filter::Lanczos));
            cases.push((ch, 77, 53, 640, 480, Filter::Hamming));
        }
        for (ch, sw, sh, dw, dh, filter) in cases {
            let src = rng.image(sw * sh * ch);
            let want = resize_with(&src, sw, sh, ch, dw, dh, filter, false);
            let got = resize_with(&src, sw, sh, ch, dw, dh, filter, true);
            assert!(got == want, "{ch}ch {sw}x{sh} -> {dw}x{dh} {filter:?}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_tables_cover_the_benchmark_case() {
        if x86::level().is_none() {
            eprintln!("no AVX2 here: only the scalar passes run");
            return;
        }
        let plan = Plan::new(PlanKey {
            sw: 512,
            sh: 384,
            dw: 256,
            dh: 256,
            channels: 3,
            filter: Filter::Bicubic,
            simd: true,
        });
        assert!(plan.fast.horiz.is_some() && plan.fast.vert.is_some());
    }

    #[test]
    fn plan_cache_follows_the_sizes() {
        // One plan is kept: a repeat finds it, another size replaces it.
        let mut rng = Rng(7);
        let (a, b) = (rng.image(40 * 30 * 3), rng.image(64 * 64 * 3));
        let resize_a = || resize_u8(&a, 40, 30, 3, 17, 23, Filter::Bicubic);
        let fresh = resize_a();
        assert_eq!(resize_a(), fresh);
        let scalar_b = resize_with(&b, 64, 64, 3, 17, 23, Filter::Bicubic, false);
        assert_eq!(resize_u8(&b, 64, 64, 3, 17, 23, Filter::Bicubic), scalar_b);
        assert_eq!(resize_a(), fresh);
        let other_channels = resize_u8(&a, 40, 30 * 3, 1, 17, 23, Filter::Bicubic);
        assert_eq!(
            other_channels,
            resize_with(&a, 40, 30 * 3, 1, 17, 23, Filter::Bicubic, false)
        );
    }

    #[test]
    fn same_size_is_identity() {
        let src: Vec<u8> = (0..256 * 256 * 3).map(|i| (i * 7 + i / 13) as u8).collect();
        for code in 0..=5 {
            let filter = Filter::from_pil_code(code).unwrap();
            assert_eq!(
                resize_u8(&src, 256, 256, 3, 256, 256, filter),
                src,
                "{filter:?}"
            );
        }
    }

    #[test]
    fn zero_target_is_empty() {
        let src = vec![7u8; 4 * 3 * 3];
        assert!(resize_u8(&src, 4, 3, 3, 0, 5, Filter::Bicubic).is_empty());
        assert!(resize_u8(&src, 4, 3, 3, 5, 0, Filter::Nearest).is_empty());
    }

    #[test]
    fn filter_codes() {
        assert_eq!(Filter::from_pil_code(3), Some(Filter::Bicubic));
        assert_eq!(Filter::from_pil_code(0), Some(Filter::Nearest));
        assert_eq!(Filter::from_pil_code(6), None);
    }
}
