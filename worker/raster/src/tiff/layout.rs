//! Turning an IFD into a validated image description with its block table.

use bytes::Bytes;

use super::ifd::{Format, Ifd};
use super::{ImageInfo, SampleType, TiffError, TiffLimits};

/// Sample layout of a level, including the 1-bit layout of masks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sample(SampleType),
    Bit,
}

/// A decodable raster (main image, overview or mask) with its block table.
#[derive(Debug, Clone)]
pub(crate) struct Level {
    pub(crate) info: ImageInfo,
    pub(crate) kind: Kind,
    pub(crate) subfile: u64,
    pub(crate) offsets: Vec<u64>,
    pub(crate) counts: Vec<u64>,
    pub(crate) jpeg_tables: Option<Bytes>,
    pub(crate) across: u64,
    pub(crate) down: u64,
}

impl Level {
    pub(crate) fn is_mask(&self) -> bool {
        self.subfile & 4 != 0 || self.info.photometric == 4
    }
    pub(crate) fn is_reduced(&self) -> bool {
        self.subfile & 1 != 0
    }
    /// Samples interleaved in one block.
    pub(crate) fn block_samples(&self) -> usize {
        if self.info.planar {
            1
        } else {
            self.info.bands
        }
    }
    pub(crate) fn bytes_per_sample(&self) -> usize {
        match self.kind {
            Kind::Bit => 0,
            Kind::Sample(t) => t.size(),
        }
    }
    /// Rows of block row `by` that hold data (strips at the bottom may be short).
    pub(crate) fn block_rows(&self, by: u64) -> u32 {
        if self.info.tiled {
            self.info.block_height
        } else {
            let top = by * self.info.block_height as u64;
            (self.info.height as u64 - top).min(self.info.block_height as u64) as u32
        }
    }
    /// Decoded byte size of a block with `rows` rows.
    pub(crate) fn block_bytes(&self, rows: u32) -> usize {
        let w = self.info.block_width as usize;
        let row = match self.kind {
            Kind::Bit => (w * self.block_samples()).div_ceil(8),
            Kind::Sample(t) => w * self.block_samples() * t.size(),
        };
        row * rows as usize
    }
}

pub(crate) fn compression_name(c: u16) -> &'static str {
    match c {
        1 => "none",
        2 => "CCITT modified Huffman RLE",
        3 => "CCITT Group 3 fax",
        4 => "CCITT Group 4 fax",
        5 => "LZW",
        6 => "old-style JPEG",
        7 => "JPEG",
        8 | 32946 => "Deflate",
        32773 => "PackBits",
        34676 => "SGILOG",
        34712 => "JPEG 2000",
        34887 => "LERC",
        34925 => "LZMA",
        50000 => "ZSTD",
        50001 => "WebP",
        50002 => "JPEG XL",
        _ => "unknown",
    }
}

fn supported(c: u16) -> bool {
    matches!(c, 1 | 5 | 7 | 8 | 32946 | 32773 | 50000 | 50001)
}

pub(crate) fn build(fmt: &Format, ifd: &Ifd, limits: &TiffLimits) -> Result<Level, TiffError> {
    let width = ifd.int(fmt, 256, None)?;
    let height = ifd.int(fmt, 257, None)?;
    if width == 0 || height == 0 || width > u32::MAX as u64 || height > u32::MAX as u64 {
        return Err(TiffError::malformed(format!(
            "bad image size {width}x{height}"
        )));
    }
    TiffError::limit("image pixels", width * height, limits.max_pixels)?;
    let spp = ifd.int(fmt, 277, Some(1))?;
    if spp == 0 {
        return Err(TiffError::malformed("SamplesPerPixel is 0"));
    }
    TiffError::limit("samples per pixel", spp, limits.max_bands)?;
    let bits = ifd.ints(fmt, 258)?.unwrap_or_else(|| vec![1]);
    let b0 = *bits
        .first()
        .ok_or_else(|| TiffError::malformed("empty BitsPerSample"))?;
    if bits.iter().any(|&b| b != b0) {
        return Err(TiffError::UnsupportedSampleType(format!(
            "mixed BitsPerSample {bits:?}"
        )));
    }
    let formats = ifd.ints(fmt, 339)?.unwrap_or_else(|| vec![1]);
    let f0 = *formats
        .first()
        .ok_or_else(|| TiffError::malformed("empty SampleFormat"))?;
    if formats.iter().any(|&f| f != f0) {
        return Err(TiffError::UnsupportedSampleType(format!(
            "mixed SampleFormat {formats:?}"
        )));
    }
    let compression = ifd.int(fmt, 259, Some(1))? as u16;
    if !supported(compression) {
        return Err(TiffError::UnsupportedCompression {
            code: compression,
            name: compression_name(compression),
        });
    }
    let photometric = ifd.int(fmt, 262, Some(1))? as u16;
    let subfile = ifd.int(fmt, 254, Some(0))?;
    let kind = match (f0, b0) {
        (1, 8) => Kind::Sample(SampleType::U8),
        (1, 16) => Kind::Sample(SampleType::U16),
        (2, 16) => Kind::Sample(SampleType::I16),
        (1, 32) => Kind::Sample(SampleType::U32),
        (3, 32) => Kind::Sample(SampleType::F32),
        (3, 64) => Kind::Sample(SampleType::F64),
        (1, 1) if spp == 1 => Kind::Bit,
        (f, b) => {
            let name = match f {
                1 => "unsigned integer",
                2 => "signed integer",
                3 => "floating point",
                4 => "undefined",
                5 => "complex integer",
                6 => "complex floating point",
                _ => "unknown format",
            };
            return Err(TiffError::UnsupportedSampleType(format!(
                "{b}-bit {name} (SampleFormat {f})"
            )));
        }
    };
    let planar = match ifd.int(fmt, 284, Some(1))? {
        1 => false,
        2 => true,
        p => return Err(TiffError::malformed(format!("PlanarConfiguration {p}"))),
    };
    let planar = planar && spp > 1;
    let predictor = ifd.int(fmt, 317, Some(1))? as u16;
    match (predictor, kind) {
        (1, _) => {}
        (2, Kind::Sample(_)) => {}
        (3, Kind::Sample(SampleType::F32 | SampleType::F64)) => {}
        (p, _) => {
            return Err(TiffError::Unsupported(format!(
                "predictor {p} for {kind:?}"
            )))
        }
    }
    let tiled = ifd.tags.contains_key(&322);
    let (bw, bh, off_tag, cnt_tag) = if tiled {
        (ifd.int(fmt, 322, None)?, ifd.int(fmt, 323, None)?, 324, 325)
    } else {
        let rps = ifd.int(fmt, 278, Some(height))?.clamp(1, height);
        (width, rps, 273, 279)
    };
    if bw == 0 || bh == 0 || bw > u32::MAX as u64 || bh > u32::MAX as u64 {
        return Err(TiffError::malformed(format!("bad block size {bw}x{bh}")));
    }
    TiffError::limit("block pixels", bw * bh, limits.max_pixels)?;
    let across = width.div_ceil(bw);
    let down = height.div_ceil(bh);
    let planes = if planar { spp } else { 1 };
    let nblocks = across
        .checked_mul(down)
        .and_then(|n| n.checked_mul(planes))
        .ok_or_else(|| TiffError::malformed("block count overflows"))?;
    TiffError::limit("block count", nblocks, limits.max_blocks)?;
    let offsets = ifd
        .ints(fmt, off_tag)?
        .ok_or_else(|| TiffError::malformed("missing block offsets"))?;
    let counts = ifd
        .ints(fmt, cnt_tag)?
        .ok_or_else(|| TiffError::malformed("missing block byte counts"))?;
    if (offsets.len() as u64) < nblocks || (counts.len() as u64) < nblocks {
        return Err(TiffError::malformed(format!(
            "{nblocks} blocks but {} offsets and {} byte counts",
            offsets.len(),
            counts.len()
        )));
    }
    let bands = spp as usize;
    let extra = ifd.ints(fmt, 338)?.unwrap_or_default();
    // Like GDAL: associated (1) or unassociated (2) alpha marks an alpha band.
    let alpha_band = extra
        .iter()
        .position(|&e| e == 1 || e == 2)
        .and_then(|i| (bands + i).checked_sub(extra.len()));
    let nodata = ifd.ascii(42113).and_then(|s| parse_nodata(&s));
    let sample_type = match kind {
        Kind::Sample(t) => t,
        Kind::Bit => SampleType::U8,
    };
    let info = ImageInfo {
        width: width as u32,
        height: height as u32,
        bands,
        sample_type,
        planar,
        tiled,
        block_width: bw as u32,
        block_height: bh as u32,
        compression,
        predictor,
        photometric,
        alpha_band,
        nodata,
        ifd_index: ifd.index,
    };
    let level = Level {
        info,
        kind,
        subfile,
        offsets: offsets[..nblocks as usize].to_vec(),
        counts: counts[..nblocks as usize].to_vec(),
        jpeg_tables: ifd.raw(347),
        across,
        down,
    };
    let max_block = level.block_bytes(level.info.block_height) as u64;
    TiffError::limit("decoded block bytes", max_block, limits.max_tile_bytes)?;
    if let Some(&c) = level.counts.iter().max() {
        TiffError::limit("compressed block bytes", c, limits.max_tile_bytes)?;
    }
    Ok(level)
}

/// GDAL writes nodata as text ("0", "-9999", "nan", "inf").
pub(crate) fn parse_nodata(s: &str) -> Option<f64> {
    let t = s.trim();
    match t.to_ascii_lowercase().as_str() {
        "nan" | "-nan" => Some(f64::NAN),
        "inf" | "+inf" | "infinity" => Some(f64::INFINITY),
        "-inf" | "-infinity" => Some(f64::NEG_INFINITY),
        _ => t.parse().ok(),
    }
}
