//! Window reads: block selection, coalesced fetching, decoding and assembly.

use super::cache::Block;
use super::codec::{self, BlockCtx};
use super::fetch::{fetch, Want};
use super::layout::{Kind, Level};
use super::{predictor, ImageInfo, SampleType, Samples, TiffError, TiffFile, WindowData};

/// Window clipped to the raster, in level pixel coordinates (exclusive ends).
#[derive(Clone, Copy)]
struct Clip {
    x0: u64,
    y0: u64,
    x1: u64,
    y1: u64,
}

pub(crate) async fn read(
    f: &TiffFile,
    level: usize,
    x: i64,
    y: i64,
    w: u32,
    h: u32,
    bands: &[usize],
) -> Result<WindowData, TiffError> {
    let lv = f
        .levels
        .get(level)
        .ok_or_else(|| TiffError::InvalidRequest(format!("level {level} of {}", f.levels.len())))?;
    let info = &lv.info;
    if bands.is_empty() {
        return Err(TiffError::InvalidRequest("no bands selected".into()));
    }
    if let Some(&b) = bands.iter().find(|&&b| b >= info.bands) {
        return Err(TiffError::InvalidRequest(format!(
            "band {b} of {}",
            info.bands
        )));
    }
    // The alpha band is read even when not selected: it decides validity.
    let mut reads = bands.to_vec();
    if let Some(a) = info.alpha_band {
        reads.push(a);
    }
    let npix = w as u64 * h as u64;
    TiffError::limit(
        "window samples",
        npix * reads.len() as u64,
        f.limits.max_window_samples,
    )?;
    let npix = npix as usize;
    let out_type = match lv.kind {
        Kind::Sample(t) => t,
        // 1-bit blocks are unpacked only as masks; as pixels they would be
        // indexed as bytes, past the block's end.
        Kind::Bit => {
            return Err(TiffError::UnsupportedSampleType(
                "1-bit image (bilevel images are read only as masks)".into(),
            ))
        }
    };
    let mut values = Samples::zeroed(out_type, npix * reads.len());
    let mut valid = vec![false; npix];

    let cx0 = x.clamp(0, info.width as i64) as u64;
    let cy0 = y.clamp(0, info.height as i64) as u64;
    let cx1 = x.saturating_add(w as i64).clamp(0, info.width as i64) as u64;
    let cy1 = y.saturating_add(h as i64).clamp(0, info.height as i64) as u64;
    if cx0 >= cx1 || cy0 >= cy1 {
        values.truncate(bands.len() * npix);
        return Ok(WindowData {
            width: w,
            height: h,
            bands: bands.len(),
            values,
            valid,
        });
    }
    let clip = Clip {
        x0: cx0,
        y0: cy0,
        x1: cx1,
        y1: cy1,
    };
    for row in cy0..cy1 {
        let r = (row as i64 - y) as usize * w as usize;
        for col in cx0..cx1 {
            valid[r + (col as i64 - x) as usize] = true;
        }
    }

    let mut planes: Vec<usize> = if info.planar { reads.clone() } else { vec![0] };
    planes.sort_unstable();
    planes.dedup();
    let mut wants = Vec::new();
    blocks(lv, clip, &planes, false, &mut wants);
    let mask = f.masks[level].as_ref();
    if let Some(m) = mask {
        blocks(m, clip, &[0], true, &mut wants);
    }
    // Blocks other windows of this file already decoded are not fetched again.
    // Taken out of the cache now, so the blocks this read adds cannot evict
    // ones it is about to use.
    let key = |w: &Want| (level, w.mask, w.index);
    let mut decoded: std::collections::HashMap<(usize, bool, usize), Block> =
        std::collections::HashMap::with_capacity(wants.len());
    let mut missing: Vec<Want> = Vec::new();
    for w in &wants {
        match f.cache.get(&key(w)) {
            Some(b) => {
                decoded.insert(key(w), b);
            }
            None => missing.push(w.clone()),
        }
    }
    let fetched = fetch(f, &mut missing).await?;
    for (want, data) in missing.iter().zip(&fetched) {
        let l = if want.mask { mask.unwrap_or(lv) } else { lv };
        let (_, by, _) = position(l, want.index);
        let rows = l.block_rows(by);
        let buf = match data {
            Some(d) => Some(std::sync::Arc::new(decode_block(
                f, l, want.index, rows, d,
            )?)),
            None => None,
        };
        f.cache.put(key(want), buf.clone());
        decoded.insert(key(want), buf);
    }

    let origin = (x, y, w as usize);
    for want in wants.iter() {
        let l = if want.mask { mask.unwrap_or(lv) } else { lv };
        let (bx, by, plane) = position(l, want.index);
        let rows = l.block_rows(by);
        let buf = decoded
            .get(&key(want))
            .expect("every wanted block was cached or fetched: this is a bug")
            .as_ref()
            .map(|v| v.as_slice());
        let bw = l.info.block_width as u64;
        let bh = l.info.block_height as u64;
        let r0 = (by * bh).max(clip.y0);
        let r1 = (by * bh + rows as u64).min(clip.y1);
        let c0 = (bx * bw).max(clip.x0);
        let c1 = ((bx + 1) * bw).min(clip.x1);
        if want.mask {
            mask_into(
                l,
                buf,
                (bx * bw, by * bh),
                (r0, r1, c0, c1),
                origin,
                &mut valid,
            );
            continue;
        }
        for (ri, &band) in reads.iter().enumerate() {
            if info.planar && band != plane {
                continue;
            }
            let sample = if info.planar { 0 } else { band };
            let span = (r0, r1, c0, c1);
            let place = (bx * bw, by * bh);
            let part = ri * npix..(ri + 1) * npix;
            match &mut values {
                Samples::U8(v) => copy_u8(l, buf, place, sample, span, origin, &mut v[part]),
                Samples::U16(v) => copy_u16(f, l, buf, place, sample, span, origin, &mut v[part]),
                Samples::F64(v) => copy_band(f, l, buf, place, sample, span, origin, &mut v[part]),
            }
        }
    }

    let nb = bands.len();
    match &values {
        Samples::U8(v) => invalidate(v, info, nb, npix, &mut valid),
        Samples::U16(v) => invalidate(v, info, nb, npix, &mut valid),
        Samples::F64(v) => invalidate(v, info, nb, npix, &mut valid),
    }
    values.truncate(nb * npix);
    Ok(WindowData {
        width: w,
        height: h,
        bands: nb,
        values,
        valid,
    })
}

/// A window sample type: compared with nodata and alpha in its own type.
trait Sample: Copy + PartialEq {
    fn is_zero(self) -> bool;
    /// `nd` in this type, or `None` when no sample can equal it (NaN or a
    /// fraction or out-of-range value for an integer type).
    fn nodata(nd: f64) -> Option<Self>;
    fn is_nan(self) -> bool;
}

macro_rules! integer_sample {
    ($t:ty) => {
        impl Sample for $t {
            fn is_zero(self) -> bool {
                self == 0
            }
            fn nodata(nd: f64) -> Option<$t> {
                let range = f64::from(<$t>::MIN)..=f64::from(<$t>::MAX);
                (nd.fract() == 0.0 && range.contains(&nd)).then_some(nd as $t)
            }
            fn is_nan(self) -> bool {
                false
            }
        }
    };
}

integer_sample!(u8);
integer_sample!(u16);

impl Sample for f64 {
    fn is_zero(self) -> bool {
        self == 0.0
    }
    fn nodata(nd: f64) -> Option<f64> {
        Some(nd)
    }
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
}

/// Clears `valid` where the alpha band (stored after the `nb` selected bands)
/// is 0 or every selected band equals nodata (NaN nodata matches NaN).
fn invalidate<T: Sample>(v: &[T], info: &ImageInfo, nb: usize, npix: usize, valid: &mut [bool]) {
    if info.alpha_band.is_some() {
        for (ok, a) in valid.iter_mut().zip(&v[nb * npix..(nb + 1) * npix]) {
            if a.is_zero() {
                *ok = false;
            }
        }
    }
    let Some(nd) = info.nodata else { return };
    let nan = nd.is_nan();
    let Some(ndv) = T::nodata(nd) else { return };
    let same = |x: T| x == ndv || (nan && x.is_nan());
    if nb == 3 {
        // The common case, as one pass of zipped slices the compiler can vectorise.
        let (r, g, b) = (&v[..npix], &v[npix..2 * npix], &v[2 * npix..3 * npix]);
        for (ok, ((r, g), b)) in valid.iter_mut().zip(r.iter().zip(g).zip(b)) {
            *ok &= !(same(*r) && same(*g) && same(*b));
        }
        return;
    }
    for (p, ok) in valid.iter_mut().enumerate() {
        if *ok && (0..nb).all(|b| same(v[b * npix + p])) {
            *ok = false;
        }
    }
}

/// (block column, block row, plane) of a block index.
fn position(l: &Level, index: usize) -> (u64, u64, usize) {
    let i = index as u64;
    let per_plane = l.across * l.down;
    let plane = i / per_plane;
    let rem = i % per_plane;
    (rem % l.across, rem / l.across, plane as usize)
}

fn blocks(l: &Level, c: Clip, planes: &[usize], mask: bool, out: &mut Vec<Want>) {
    let bw = l.info.block_width as u64;
    let bh = l.info.block_height as u64;
    for &p in planes {
        for by in c.y0 / bh..=(c.y1 - 1) / bh {
            for bx in c.x0 / bw..=(c.x1 - 1) / bw {
                let index = ((p as u64 * l.down + by) * l.across + bx) as usize;
                out.push(Want {
                    mask,
                    index,
                    offset: l.offsets[index],
                    count: l.counts[index],
                });
            }
        }
    }
}

fn decode_block(
    f: &TiffFile,
    l: &Level,
    index: usize,
    rows: u32,
    data: &[u8],
) -> Result<Vec<u8>, TiffError> {
    let info = &l.info;
    let spp = l.block_samples();
    let ctx = BlockCtx {
        compression: info.compression,
        block: index,
        width: info.block_width,
        rows,
        samples: spp,
        photometric: info.photometric,
        jpeg_tables: l.jpeg_tables.as_deref(),
        expected: l.block_bytes(rows),
    };
    let mut buf = codec::decode(&ctx, data)?;
    let size = l.bytes_per_sample();
    let row_samples = info.block_width as usize * spp;
    match info.predictor {
        2 => predictor::horizontal(&mut buf, row_samples, spp, size, f.fmt.big_endian),
        3 => predictor::floating(&mut buf, row_samples, spp, size, f.fmt.big_endian)?,
        _ => {}
    }
    Ok(buf)
}

fn sample(buf: &[u8], i: usize, t: SampleType, be: bool) -> f64 {
    let n = t.size();
    let b = &buf[i * n..i * n + n];
    let mut a = [0u8; 8];
    a[..n].copy_from_slice(b);
    if be {
        a[..n].reverse();
    }
    let v = u64::from_le_bytes(a);
    match t {
        SampleType::U8 | SampleType::U16 | SampleType::U32 => v as f64,
        SampleType::I16 => v as u16 as i16 as f64,
        SampleType::F32 => f32::from_bits(v as u32) as f64,
        SampleType::F64 => f64::from_bits(v),
    }
}

type Span = (u64, u64, u64, u64);

/// Copies sample `s` of a u8 block into a u8 window.
fn copy_u8(
    l: &Level,
    buf: Option<&[u8]>,
    (ox, oy): (u64, u64),
    s: usize,
    span: Span,
    (x, y, w): (i64, i64, usize),
    out: &mut [u8],
) {
    let place = (ox, oy, x, y, w);
    let Some(b) = buf else {
        // GDAL fills sparse blocks with nodata (0 without one).
        let fill = l.info.nodata.and_then(u8::nodata).unwrap_or(0);
        return copy_rows(l, b"", s, span, place, out, |_, _| fill);
    };
    let spp = l.block_samples();
    if spp == 1 {
        // One sample per pixel: each row of the span is one slice copy.
        let (r0, r1, c0, c1) = span;
        let bw = l.info.block_width as usize;
        let n = (c1 - c0) as usize;
        for row in r0..r1 {
            let o = (row as i64 - y) as usize * w + (c0 as i64 - x) as usize;
            let bi = (row - oy) as usize * bw + (c0 - ox) as usize;
            out[o..o + n].copy_from_slice(&b[bi..bi + n]);
        }
        return;
    }
    copy_rows(l, b, s, span, place, out, |b, i| b[i]);
}

/// Copies sample `s` of a u16 block into a u16 window.
#[allow(clippy::too_many_arguments)]
fn copy_u16(
    f: &TiffFile,
    l: &Level,
    buf: Option<&[u8]>,
    (ox, oy): (u64, u64),
    s: usize,
    span: Span,
    (x, y, w): (i64, i64, usize),
    out: &mut [u16],
) {
    let place = (ox, oy, x, y, w);
    let Some(b) = buf else {
        let fill = l.info.nodata.and_then(u16::nodata).unwrap_or(0);
        return copy_rows(l, b"", s, span, place, out, |_, _| fill);
    };
    if f.fmt.big_endian {
        copy_rows(l, b, s, span, place, out, |b, i| {
            u16::from_be_bytes([b[2 * i], b[2 * i + 1]])
        })
    } else {
        copy_rows(l, b, s, span, place, out, |b, i| {
            u16::from_le_bytes([b[2 * i], b[2 * i + 1]])
        })
    }
}

/// Copies sample `s` of a block of any other type into an f64 window.
#[allow(clippy::too_many_arguments)]
fn copy_band(
    f: &TiffFile,
    l: &Level,
    buf: Option<&[u8]>,
    (ox, oy): (u64, u64),
    s: usize,
    span: Span,
    (x, y, w): (i64, i64, usize),
    out: &mut [f64],
) {
    let Kind::Sample(t) = l.kind else { return };
    let place = (ox, oy, x, y, w);
    let Some(b) = buf else {
        let fill = l.info.nodata.unwrap_or(0.0);
        return copy_rows(l, b"", s, span, place, out, |_, _| fill);
    };
    let be = f.fmt.big_endian;
    copy_rows(l, b, s, span, place, out, |b, i| sample(b, i, t, be))
}

/// Copies sample `s` of every pixel of a block's span into the window, reading
/// each with `get(block, sample_index)`.
fn copy_rows<T>(
    l: &Level,
    b: &[u8],
    s: usize,
    (r0, r1, c0, c1): Span,
    (ox, oy, x, y, w): (u64, u64, i64, i64, usize),
    out: &mut [T],
    get: impl Fn(&[u8], usize) -> T,
) {
    let spp = l.block_samples();
    let bw = l.info.block_width as usize;
    for row in r0..r1 {
        let o = (row as i64 - y) as usize * w;
        let br = (row - oy) as usize;
        let dst = &mut out[o + (c0 as i64 - x) as usize..o + (c1 as i64 - x) as usize];
        let base = (br * bw + (c0 - ox) as usize) * spp + s;
        for (k, d) in dst.iter_mut().enumerate() {
            *d = get(b, base + k * spp);
        }
    }
}

fn mask_into(
    l: &Level,
    buf: Option<&[u8]>,
    (ox, oy): (u64, u64),
    (r0, r1, c0, c1): Span,
    (x, y, w): (i64, i64, usize),
    valid: &mut [bool],
) {
    let bw = l.info.block_width as usize;
    let row_bytes = bw.div_ceil(8);
    for row in r0..r1 {
        let o = (row as i64 - y) as usize * w;
        let br = (row - oy) as usize;
        for col in c0..c1 {
            let bc = (col - ox) as usize;
            let ok = match (buf, l.kind) {
                (None, _) => false,
                (Some(b), Kind::Bit) => (b[br * row_bytes + bc / 8] >> (7 - bc % 8)) & 1 == 1,
                (Some(b), Kind::Sample(_)) => b[br * bw + bc] != 0,
            };
            if !ok {
                valid[o + (col as i64 - x) as usize] = false;
            }
        }
    }
}
