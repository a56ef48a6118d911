//! Pure-Rust, hostile-input-safe GeoTIFF / COG window reader.
//!
//! [`TiffFile::open`] reads the header and IFD chain once through a
//! [`RangeRead`] (usually object storage), classifies IFDs into the main
//! image, its overviews and internal masks, and keeps only the block tables.
//! [`TiffFile::read_window`] then fetches just the tiles/strips a window
//! touches, in a few coalesced range requests, decodes them into buffers of
//! exactly the expected size and returns `f64` samples plus a validity mask
//! with rasterio's dataset-mask semantics.
//!
//! Every size taken from the file is checked against [`TiffLimits`] before
//! anything is allocated, so damaged or malicious files fail with a
//! [`TiffError`] instead of panicking or exhausting memory.

mod cache;
mod codec;
mod error;
mod fetch;
mod ifd;
mod layout;
mod limits;
mod predictor;
mod window;

#[cfg(test)]
mod test_util;
#[cfg(test)]
mod tests_fixtures;
#[cfg(test)]
mod tests_hostile;
#[cfg(test)]
mod tests_real;

use std::sync::Arc;

pub use crate::geo::GeoTiffTags;
pub use error::TiffError;
pub use limits::TiffLimits;

use fetch::Source;
use ifd::Format;
use layout::Level;

/// Random-access byte source, e.g. an object-store object.
pub trait RangeRead: Send + Sync {
    /// Total object size in bytes.
    fn size(&self) -> u64;
    /// Bytes [start, end). May return fewer bytes only at end of object.
    fn read_range(
        &self,
        start: u64,
        end: u64,
    ) -> futures::future::BoxFuture<'_, std::io::Result<bytes::Bytes>>;
}

/// Sample data type of an image (BitsPerSample + SampleFormat).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleType {
    /// 8-bit unsigned integer.
    U8,
    /// 16-bit unsigned integer.
    U16,
    /// 16-bit signed integer.
    I16,
    /// 32-bit unsigned integer.
    U32,
    /// 32-bit IEEE float.
    F32,
    /// 64-bit IEEE float.
    F64,
}

impl SampleType {
    /// Bytes per sample.
    pub fn size(self) -> usize {
        match self {
            SampleType::U8 => 1,
            SampleType::U16 | SampleType::I16 => 2,
            SampleType::U32 | SampleType::F32 => 4,
            SampleType::F64 => 8,
        }
    }
}

/// Description of one image (main image or overview).
#[derive(Debug, Clone, PartialEq)]
pub struct ImageInfo {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Samples per pixel (alpha included).
    pub bands: usize,
    /// Sample type of every band.
    pub sample_type: SampleType,
    /// PlanarConfiguration = 2 (one plane per band).
    pub planar: bool,
    /// Tiled (true) or striped (false).
    pub tiled: bool,
    /// Tile width, or the image width for strips.
    pub block_width: u32,
    /// Tile height, or rows per strip.
    pub block_height: u32,
    /// TIFF Compression tag value.
    pub compression: u16,
    /// TIFF Predictor tag value (1 = none).
    pub predictor: u16,
    /// TIFF PhotometricInterpretation tag value.
    pub photometric: u16,
    /// Band marked as alpha by ExtraSamples (associated or unassociated).
    pub alpha_band: Option<usize>,
    /// GDAL_NODATA (tag 42113); may be NaN.
    pub nodata: Option<f64>,
    /// Position of this image's IFD in the file's IFD chain.
    pub ifd_index: usize,
}

/// Window samples, in the source's own type where that is 8 or 16 bits
/// unsigned (most imagery), else widened to f64.
///
/// Keeping u8/u16 lets a chip be scaled through a lookup table and moves an
/// eighth (a quarter) of the memory an f64 window would.
#[derive(Debug, Clone, PartialEq)]
pub enum Samples {
    /// 8-bit unsigned samples.
    U8(Vec<u8>),
    /// 16-bit unsigned samples.
    U16(Vec<u16>),
    /// Every other sample type, widened.
    F64(Vec<f64>),
}

impl Samples {
    /// Zeroed samples of the kind a `t` source reads into.
    pub(crate) fn zeroed(t: SampleType, n: usize) -> Samples {
        match t {
            SampleType::U8 => Samples::U8(vec![0; n]),
            SampleType::U16 => Samples::U16(vec![0; n]),
            _ => Samples::F64(vec![0.0; n]),
        }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        match self {
            Samples::U8(v) => v.len(),
            Samples::U16(v) => v.len(),
            Samples::F64(v) => v.len(),
        }
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `i` as f64.
    pub fn get(&self, i: usize) -> f64 {
        match self {
            Samples::U8(v) => f64::from(v[i]),
            Samples::U16(v) => f64::from(v[i]),
            Samples::F64(v) => v[i],
        }
    }

    /// Samples `range` as f64, for the paths that mix sources or sort.
    pub fn to_f64(&self, range: std::ops::Range<usize>) -> Vec<f64> {
        match self {
            Samples::U8(v) => v[range].iter().map(|&x| f64::from(x)).collect(),
            Samples::U16(v) => v[range].iter().map(|&x| f64::from(x)).collect(),
            Samples::F64(v) => v[range].to_vec(),
        }
    }

    pub(crate) fn truncate(&mut self, n: usize) {
        match self {
            Samples::U8(v) => v.truncate(n),
            Samples::U16(v) => v.truncate(n),
            Samples::F64(v) => v.truncate(n),
        }
    }
}

/// Decoded samples of a window.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowData {
    /// Window width.
    pub width: u32,
    /// Window height.
    pub height: u32,
    /// Number of bands returned.
    pub bands: usize,
    /// band-sequential: values[b*w*h + row*w + col]
    pub values: Samples,
    /// Per pixel (row-major, w*h): false for padding, masked, alpha == 0 or all-nodata pixels.
    pub valid: Vec<bool>,
}

/// An opened TIFF: parsed metadata, ready for window reads.
pub struct TiffFile {
    src: Source,
    fmt: Format,
    limits: TiffLimits,
    /// levels[0] is the main image, then overviews largest first.
    levels: Vec<Level>,
    /// Internal mask of each level, if any.
    masks: Vec<Option<Level>>,
    overview_infos: Vec<ImageInfo>,
    geo: GeoTiffTags,
    /// Decoded blocks shared by the window reads of one task.
    cache: cache::BlockCache,
}

/// Decoded bytes a file keeps between window reads: four 512² RGB tiles of
/// f64-free 8-bit data take 3 MiB; this holds a row of 16-bit tiles across a
/// Sentinel-2 scene.
const BLOCK_CACHE_BYTES: usize = 64 << 20;

impl std::fmt::Debug for TiffFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TiffFile")
            .field("size", &self.src.size)
            .field("image", &self.levels[0].info)
            .field("overviews", &self.overview_infos.len())
            .field("has_mask", &self.has_mask())
            .finish()
    }
}

impl TiffFile {
    /// Reads the header and every IFD once (classic and BigTIFF, little and big endian), bounded by limits; detects IFD offset loops; classifies IFDs: the main image (first full-resolution IFD without NewSubfileType reduced/mask bits), overviews (NewSubfileType bit 0, no mask bit), internal masks (bit 2 / PhotometricInterpretation=4, for the main image and overviews). Overviews and masks are never mistaken for the image or for bands.
    pub async fn open(
        reader: Arc<dyn RangeRead>,
        limits: TiffLimits,
    ) -> Result<TiffFile, TiffError> {
        let src = Source::new(reader, limits.prefetch_bytes).await?;
        let (fmt, ifds) = ifd::read_ifds(&src, &limits).await?;
        let mut main = None;
        let mut overviews = Vec::new();
        let mut masks = Vec::new();
        // Block tables of all IFDs together share one budget, so many IFDs
        // cannot multiply the bookkeeping kept for the file's lifetime.
        let mut blocks = 0u64;
        for ifd in &ifds {
            let level = layout::build(&fmt, ifd, &limits)?;
            blocks += level.offsets.len() as u64;
            TiffError::limit("blocks in all IFDs", blocks, limits.max_blocks)?;
            if level.is_mask() {
                masks.push(level);
            } else if level.is_reduced() {
                overviews.push(level);
            } else if main.is_none() {
                main = Some((level, ifd));
            }
            // Further full-resolution pages are other images, not bands: ignored.
        }
        let (main, main_ifd) =
            main.ok_or_else(|| TiffError::malformed("no full-resolution image IFD"))?;
        overviews.sort_by_key(|l| std::cmp::Reverse(l.info.width));
        let geo = GeoTiffTags {
            model_pixel_scale: main_ifd.floats(&fmt, 33550)?,
            model_tiepoint: main_ifd.floats(&fmt, 33922)?,
            model_transformation: main_ifd.floats(&fmt, 34264)?,
            geo_key_directory: main_ifd
                .ints(&fmt, 34735)?
                .map(|v| v.into_iter().map(|x| x as u16).collect()),
            geo_double_params: main_ifd.floats(&fmt, 34736)?,
            geo_ascii_params: main_ifd.ascii(34737),
        };
        let mut levels = vec![main];
        levels.extend(overviews);
        // Overviews inherit the main image's nodata (GDAL writes it on every IFD, others may not).
        let nodata = levels[0].info.nodata;
        for l in levels.iter_mut().skip(1) {
            if l.info.nodata.is_none() {
                l.info.nodata = nodata;
            }
        }
        let level_masks = levels
            .iter()
            .map(|l| {
                masks
                    .iter()
                    .find(|m| {
                        m.info.width == l.info.width
                            && m.info.height == l.info.height
                            && m.info.bands == 1
                            && matches!(
                                m.kind,
                                layout::Kind::Bit | layout::Kind::Sample(SampleType::U8)
                            )
                    })
                    .cloned()
            })
            .collect();
        let overview_infos = levels[1..].iter().map(|l| l.info.clone()).collect();
        Ok(TiffFile {
            src,
            fmt,
            limits,
            levels,
            masks: level_masks,
            overview_infos,
            geo,
            cache: cache::BlockCache::new(BLOCK_CACHE_BYTES),
        })
    }

    /// The main (full-resolution) image.
    pub fn image(&self) -> &ImageInfo {
        &self.levels[0].info
    }

    /// Overviews, largest first; `overviews()[i]` is level `i + 1`.
    pub fn overviews(&self) -> &[ImageInfo] {
        &self.overview_infos
    }

    /// GeoTIFF tags of the main image.
    pub fn geo_tags(&self) -> &GeoTiffTags {
        &self.geo
    }

    /// Whether the main image has an internal mask IFD.
    pub fn has_mask(&self) -> bool {
        self.masks[0].is_some()
    }

    /// Forgets the decoded blocks of the main image (and its mask) that lie
    /// wholly above row `y`: a reader that walks the image north to south
    /// (a window's cells, `rsembed_worker`'s composites) never reads them
    /// again, and they need not hold the cache's memory until it is full.
    pub fn forget_rows_above(&self, y: i64) {
        let Ok(y) = u64::try_from(y) else {
            return;
        };
        self.cache.forget(|&(level, mask, index)| {
            let l = match (level, mask) {
                (0, false) => &self.levels[0],
                (0, true) => match &self.masks[0] {
                    Some(m) => m,
                    None => return false,
                },
                _ => return false,
            };
            let by = (index as u64 % (l.across * l.down).max(1)) / l.across.max(1);
            (by + 1) * u64::from(l.info.block_height) <= y
        });
    }

    /// Reads the window [x, x+w) × [y, y+h) of `level` (0 = full resolution, i = overviews()[i-1]) for the 0-based `bands`.
    ///
    /// Pixels outside the raster are padding: value 0.0 and valid = false. Only
    /// the tiles/strips that intersect the window are fetched, adjacent byte
    /// ranges coalesced into few requests; each block is decompressed into a
    /// buffer of exactly its expected size, and predictors 2 and 3 are undone.
    /// `valid[i]` is false for padding, for pixels the internal mask marks
    /// invalid, for alpha == 0, and for pixels where every selected band equals
    /// nodata (NaN-aware), i.e. rasterio's dataset-mask semantics.
    pub async fn read_window(
        &self,
        level: usize,
        x: i64,
        y: i64,
        w: u32,
        h: u32,
        bands: &[usize],
    ) -> Result<WindowData, TiffError> {
        window::read(self, level, x, y, w, h, bands).await
    }
}
