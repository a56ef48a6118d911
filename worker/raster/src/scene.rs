//! TIFF and GeoTIFF inputs: chips of a raster with their footprints.
//!
//! A TIFF without georeferencing, or one no larger than a chip, is one chip
//! (x = y = 0, its own size), as DESIGN.md's chip grid says; any other GeoTIFF
//! is cut on the grid. Reads go through object_store range requests for the
//! tiles a chip needs, and every byte fetched is counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use rsembed_schemas::ids::Window;
use rsembed_schemas::job::TilingSpec;
use rsembed_schemas::task::ChipBlock;

use crate::raster::geo::{self, Crs, GeoTransform, Projector};
use crate::raster::grid::ChipGrid;
use crate::raster::image::Rgb8;
use crate::raster::scale::{percentile_stretch, ScaleSpec, Stretch, StretchCache};
use crate::raster::tiff::{
    RangeRead, SampleType, Samples, TiffError, TiffFile, TiffLimits, WindowData,
};
use crate::sink::rows::Footprint;

/// Whether an input is read as a (Geo)TIFF scene rather than a whole image.
pub fn is_tiff(uri: &str) -> bool {
    // Band-file scenes are named `<prefix>{B4,B3,B2}<rest>`, so the same test holds.
    let lower = uri.to_ascii_lowercase();
    lower.ends_with(".tif") || lower.ends_with(".tiff")
}

/// Range reads of one object, counted.
pub struct StoreRange {
    store: Arc<dyn ObjectStore>,
    path: Path,
    size: u64,
    bytes_read: Arc<AtomicU64>,
}

impl StoreRange {
    /// A reader of `path`, whose size the listing or a HEAD gave.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        path: Path,
        size: u64,
        bytes_read: Arc<AtomicU64>,
    ) -> Self {
        StoreRange {
            store,
            path,
            size,
            bytes_read,
        }
    }
}

impl RangeRead for StoreRange {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_range(&self, start: u64, end: u64) -> BoxFuture<'_, std::io::Result<Bytes>> {
        async move {
            let end = end.min(self.size);
            if start >= end {
                return Ok(Bytes::new());
            }
            let b = self
                .store
                .get_range(&self.path, start..end)
                .await
                .map_err(std::io::Error::other)?;
            self.bytes_read.fetch_add(b.len() as u64, Ordering::Relaxed);
            Ok(b)
        }
        .boxed()
    }
}

/// An object already in memory (a tar member), read through the same
/// interface as storage, so it gives exactly what the stored file gives.
/// Reads are not counted: the bytes were counted when they were fetched.
pub struct MemRange(Bytes);

impl MemRange {
    /// A reader of `bytes`.
    pub fn new(bytes: Bytes) -> Self {
        MemRange(bytes)
    }
}

impl RangeRead for MemRange {
    fn size(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_range(&self, start: u64, end: u64) -> BoxFuture<'_, std::io::Result<Bytes>> {
        let len = self.0.len();
        let end = usize::try_from(end).unwrap_or(len).min(len);
        let start = usize::try_from(start).unwrap_or(len).min(end);
        let b = self.0.slice(start..end);
        async move { Ok(b) }.boxed()
    }
}

/// Where a scene's `--scale auto` stretch is remembered, and under which key.
pub struct StretchMemo<'a> {
    /// The process's cache.
    pub cache: &'a StretchCache,
    /// What identifies the scene's content and bands: URIs, versions, sizes, `--bands`.
    pub key: String,
}

/// Why a scene could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SceneError {
    /// The TIFF reader refused it.
    #[error(transparent)]
    Tiff(#[from] TiffError),
    /// The GeoKey directory is malformed.
    #[error("bad GeoKey directory: {0}")]
    GeoKeys(#[source] geo::GeoError),
    /// Band files whose grids do not line up.
    #[error("band file {uri}: {reason}")]
    Misaligned {
        /// The file at fault.
        uri: String,
        /// How it differs.
        reason: String,
    },
    /// `--bands` names a band the raster lacks.
    #[error("--bands {asked:?} but the raster has {bands} band(s)")]
    NoSuchBand {
        /// 1-based bands asked for.
        asked: Vec<u32>,
        /// Bands present.
        bands: usize,
    },
}

/// One chip cut from a scene.
#[derive(Debug, Clone)]
pub struct SceneChip {
    /// Window fed to the model, padding included.
    pub window: Window,
    /// Share of real, non-nodata pixels.
    pub valid_fraction: f32,
    /// Source CRS label, when the scene's CRS is known.
    pub crs: Option<String>,
    /// Lon/lat footprint, when the scene is georeferenced and the chip is in the projection's domain.
    pub footprint: Option<Footprint>,
    /// The chip in 8 bits; invalid pixels are 0.
    pub rgb: Rgb8,
}

/// One file of a scene and the channels it provides.
struct Source {
    tiff: TiffFile,
    /// 0-based bands of this file, in channel order.
    bands: Vec<usize>,
    /// How many pixels of the scene grid one pixel of this file covers per axis
    /// (1 for the finest file; band files on a coarser grid are upsampled).
    factor: u32,
}

/// An opened scene: headers, bands, stretch and georeferencing, read once per task.
pub struct Scene {
    sources: Vec<Source>,
    width: u32,
    height: u32,
    stretch: Stretch,
    geo: Option<(GeoTransform, Crs, Projector)>,
    /// The chip grid; `None` for a whole-image chip (plain TIFFs and rasters no larger than a chip).
    pub grid: Option<ChipGrid>,
    /// Source CRS label (`EPSG:32618`), when known.
    pub crs_label: Option<String>,
    /// `stretch` as 16-bit lookup tables (192 KiB), for 16-bit sources.
    u16_luts: std::sync::OnceLock<[Box<[u8; 65536]>; 3]>,
}

/// Pixels per band the `--scale auto` sample aims at when the scene has no
/// overview: enough for stable 2nd/98th percentiles (a 512² square).
const STRETCH_SAMPLE_PIXELS: u64 = 1 << 19;
/// Fewest blocks sampled, so that a scene of large tiles is still sampled in
/// several places.
const STRETCH_MIN_BLOCKS: u64 = 8;

/// Georeferencing of one file, with warnings for what cannot be used.
struct FileGeo {
    gt: Option<GeoTransform>,
    crs: Option<Crs>,
}

/// A structurally broken GeoKey directory fails the scene: its georeferencing
/// cannot be trusted, and footprints from it would be worse than none. Keys that
/// are valid but name a CRS we cannot rebuild only null `crs` and `geometry`.
fn file_geo(tiff: &TiffFile, uri: &str) -> Result<FileGeo, SceneError> {
    let tags = tiff.geo_tags();
    let keys = geo::parse_geokeys(tags).map_err(SceneError::GeoKeys)?;
    let gt = geo::geotransform(tags, keys.as_ref()).unwrap_or_else(|e| {
        tracing::warn!(uri, cause = %e, "bad georeferencing tags; no footprints for this scene");
        None
    });
    let crs = keys
        .as_ref()
        .and_then(|k| geo::crs_from_geokeys(k).ok().flatten());
    Ok(FileGeo { gt, crs })
}

impl Scene {
    /// Reads the header, decides bands, georeferencing, grid and stretch.
    ///
    /// With `memo`, a `--scale auto` stretch another task of this process
    /// already computed for the scene is reused instead of read again.
    pub async fn open(
        reader: Arc<dyn RangeRead>,
        tiling: &TilingSpec,
        scale: ScaleSpec,
        limits: TiffLimits,
        uri: &str,
        memo: Option<StretchMemo<'_>>,
    ) -> Result<Scene, SceneError> {
        let tiff = TiffFile::open(reader, limits).await?;
        let bands = select_bands(&tiling.bands, tiff.image().bands)?;
        let g = file_geo(&tiff, uri)?;
        let sources = vec![Source {
            tiff,
            bands,
            factor: 1,
        }];
        Scene::assemble(sources, g, tiling, scale, uri, memo).await
    }

    /// A scene stored one file per band (`--band-files`), files in channel order.
    ///
    /// The finest grid is the scene's; a file on a coarser grid must line up with
    /// it (same CRS, same origin, an integer multiple of its pixel size) and is
    /// upsampled by nearest neighbour. Anything else is an error for the scene.
    pub async fn open_band_files(
        readers: Vec<(String, Arc<dyn RangeRead>)>,
        tiling: &TilingSpec,
        scale: ScaleSpec,
        limits: TiffLimits,
        uri: &str,
        memo: Option<StretchMemo<'_>>,
    ) -> Result<Scene, SceneError> {
        let mut files = Vec::new();
        for (file_uri, r) in readers {
            let tiff = TiffFile::open(r, limits.clone()).await?;
            let g = file_geo(&tiff, &file_uri)?;
            files.push((file_uri, tiff, g));
        }
        let finest = files
            .iter()
            .enumerate()
            .filter_map(|(i, (_, _, g))| g.gt.as_ref().map(|gt| (i, gt.0[1].abs())))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i)
            .unwrap_or(0);
        let base_gt = files[finest].2.gt.as_ref().map(|g| g.0);
        let base_crs = files[finest].2.crs.as_ref().map(Crs::label);
        let mut factors = Vec::with_capacity(files.len());
        for (file_uri, _, g) in &files {
            let factor = match (base_gt, g.gt.as_ref().map(|g| g.0)) {
                (None, None) => 1,
                (Some(b), Some(f)) => {
                    if g.crs.as_ref().map(Crs::label) != base_crs {
                        return Err(SceneError::Misaligned {
                            uri: file_uri.clone(),
                            reason: "its CRS differs from the finest band's".into(),
                        });
                    }
                    grid_factor(&b, &f).ok_or_else(|| SceneError::Misaligned {
                        uri: file_uri.clone(),
                        reason: format!(
                            "its grid (geotransform {f:?}) does not line up with the finest band's ({b:?})"
                        ),
                    })?
                }
                _ => {
                    return Err(SceneError::Misaligned {
                        uri: file_uri.clone(),
                        reason: "only some band files are georeferenced".into(),
                    })
                }
            };
            factors.push(factor);
        }
        let mut g = None;
        let mut srcs = Vec::new();
        for (i, ((_, tiff, fg), factor)) in files.into_iter().zip(factors).enumerate() {
            if i == finest {
                g = Some(fg);
            }
            // A band file contributes its first band (or band 1 replicated).
            srcs.push(Source {
                tiff,
                bands: vec![0],
                factor,
            });
        }
        let g = g.expect("the finest file is one of the files");
        Scene::assemble(srcs, g, tiling, scale, uri, memo).await
    }

    async fn assemble(
        sources: Vec<Source>,
        g: FileGeo,
        tiling: &TilingSpec,
        scale: ScaleSpec,
        uri: &str,
        memo: Option<StretchMemo<'_>>,
    ) -> Result<Scene, SceneError> {
        let info = sources
            .iter()
            .find(|s| s.factor == 1)
            .unwrap_or(&sources[0])
            .tiff
            .image()
            .clone();
        let crs_label = g.crs.as_ref().map(Crs::label);
        let georeferenced = g.gt.is_some();
        let geo = match (g.gt, g.crs) {
            (Some(gt), Some(crs)) => match Projector::new(&crs) {
                Ok(p) => Some((gt, crs, p)),
                Err(e) => {
                    tracing::warn!(uri, cause = %e, "CRS not reprojectable; geometry is null");
                    None
                }
            },
            (Some(_), None) => {
                tracing::warn!(
                    uri,
                    "georeferenced but the CRS is unknown; crs and geometry are null"
                );
                None
            }
            _ => None,
        };
        let all_u8 = sources
            .iter()
            .all(|s| s.tiff.image().sample_type == SampleType::U8);
        let mut scene = Scene {
            sources,
            width: info.width,
            height: info.height,
            stretch: Stretch::identity(3),
            geo,
            grid: layout(info.width, info.height, georeferenced, tiling),
            crs_label,
            u16_luts: std::sync::OnceLock::new(),
        };
        scene.stretch = match scale {
            ScaleSpec::None => Stretch::identity(3),
            ScaleSpec::Range(lo, hi) => Stretch::uniform(3, lo, hi),
            ScaleSpec::Auto if all_u8 => Stretch::identity(3),
            ScaleSpec::Auto => match memo {
                Some(m) => {
                    m.cache
                        .get_or_compute(&m.key, scene.scene_stretch())
                        .await?
                }
                None => scene.scene_stretch().await?,
            },
        };
        Ok(scene)
    }

    /// Scene-level percentiles, per source from its smallest overview with
    /// enough pixels, or else from whole blocks (tiles or strips) spread over
    /// it: a bounded read, a fraction of the file, the same for every task.
    async fn scene_stretch(&self) -> Result<Stretch, SceneError> {
        if self.sources.len() > 1 {
            // Band files may sit on different grids: sample on the scene's own,
            // at the finest file's blocks, so a scene stretches the same
            // whichever way its bands are stored.
            let finest = self
                .sources
                .iter()
                .find(|s| s.factor == 1)
                .unwrap_or(&self.sources[0])
                .tiff
                .image();
            let mut samples = vec![Vec::new(); 3];
            let blocks = stretch_blocks(
                self.width,
                self.height,
                finest.block_width,
                finest.block_height,
            );
            for (x, y, w, h) in blocks {
                let w = self
                    .read(Window {
                        x: x as i32,
                        y: y as i32,
                        width: w as i32,
                        height: h as i32,
                    })
                    .await?;
                take_valid(&mut samples, &w);
            }
            return Ok(percentile_stretch(samples));
        }
        let src = &self.sources[0];
        // A one-band raster is read as bands [0, 0, 0]: sample and sort it once.
        let mut distinct = src.bands.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let mut samples = vec![Vec::new(); distinct.len()];
        let ovs = src.tiff.overviews();
        // COG pyramids end at a few dozen pixels: too few for stable percentiles.
        let pick = ovs
            .iter()
            .enumerate()
            .rev()
            .find(|(_, o)| u64::from(o.width) * u64::from(o.height) >= 256 * 256);
        if let Some((i, ov)) = pick {
            let w = src
                .tiff
                .read_window(i + 1, 0, 0, ov.width, ov.height, &distinct)
                .await?;
            take_valid(&mut samples, &w);
        } else {
            let info = src.tiff.image();
            let blocks =
                stretch_blocks(info.width, info.height, info.block_width, info.block_height);
            for (x, y, w, h) in blocks {
                let w = src
                    .tiff
                    .read_window(0, x.into(), y.into(), w, h, &distinct)
                    .await?;
                take_valid(&mut samples, &w);
            }
        }
        let per_band = percentile_stretch(samples);
        let bands = src
            .bands
            .iter()
            .map(|b| {
                let i = distinct
                    .binary_search(b)
                    .expect("every band is in the distinct list");
                per_band.bands[i]
            })
            .collect();
        Ok(Stretch { bands })
    }

    /// The windows of the scene, or of one block of its grid.
    pub fn windows(&self, block: Option<ChipBlock>) -> Vec<Window> {
        match (&self.grid, block) {
            (Some(g), Some(b)) => g.block_windows(b),
            (Some(g), None) => g.windows(0..g.rows()).collect(),
            (None, _) => vec![Window {
                x: 0,
                y: 0,
                width: self.width as i32,
                height: self.height as i32,
            }],
        }
    }

    /// Reads a window of every source onto the scene grid: 3 channels, valid
    /// where any source has a real pixel (a pixel is nodata only when every band is).
    async fn read(&self, win: Window) -> Result<WindowData, SceneError> {
        let (w, h) = (win.width as u32, win.height as u32);
        if let [only] = self.sources.as_slice() {
            return Ok(only
                .tiff
                .read_window(0, win.x.into(), win.y.into(), w, h, &only.bands)
                .await?);
        }
        let n = (w * h) as usize;
        let mut values = Vec::with_capacity(3 * n);
        let mut valid = vec![false; n];
        for src in &self.sources {
            let f = i64::from(src.factor);
            let (x0, y0) = (
                i64::from(win.x).div_euclid(f),
                i64::from(win.y).div_euclid(f),
            );
            let x1 = (i64::from(win.x) + i64::from(w) + f - 1).div_euclid(f);
            let y1 = (i64::from(win.y) + i64::from(h) + f - 1).div_euclid(f);
            let (cw, ch) = ((x1 - x0) as u32, (y1 - y0) as u32);
            let c = src.tiff.read_window(0, x0, y0, cw, ch, &src.bands).await?;
            let cn = (cw * ch) as usize;
            for b in 0..src.bands.len() {
                for j in 0..h as i64 {
                    let cy = (i64::from(win.y) + j).div_euclid(f) - y0;
                    for i in 0..w as i64 {
                        let cx = (i64::from(win.x) + i).div_euclid(f) - x0;
                        let k = (cy * i64::from(cw) + cx) as usize;
                        values.push(c.values.get(b * cn + k));
                        if c.valid[k] {
                            valid[(j * i64::from(w) + i) as usize] = true;
                        }
                    }
                }
            }
        }
        Ok(WindowData {
            width: w,
            height: h,
            bands: 3,
            values: Samples::F64(values),
            valid,
        })
    }

    /// Reads one chip; `None` when its valid fraction is below `min_valid`
    /// (or it has no valid pixel when `min_valid` is `None`).
    pub async fn chip(
        &self,
        window: Window,
        min_valid: Option<f32>,
    ) -> Result<Option<SceneChip>, SceneError> {
        let w = self.read(window).await?;
        let valid = w.valid.iter().filter(|v| **v).count();
        let valid_fraction = valid as f32 / w.valid.len().max(1) as f32;
        let keep = match min_valid {
            Some(m) => valid > 0 && valid_fraction >= m,
            None => valid > 0,
        };
        if !keep {
            return Ok(None);
        }
        let footprint = self.geo.as_ref().and_then(|(gt, _, p)| {
            p.footprint(
                gt,
                window.x.into(),
                window.y.into(),
                window.width.into(),
                window.height.into(),
            )
            .map(|f| Footprint {
                wkb: f.wkb,
                bbox: f.bbox,
                centre: f.centre,
            })
        });
        Ok(Some(SceneChip {
            window,
            valid_fraction,
            crs: self.crs_label.clone(),
            footprint,
            rgb: self.to_rgb8(&w),
        }))
    }

    fn to_rgb8(&self, w: &WindowData) -> Rgb8 {
        let n = (w.width * w.height) as usize;
        let mut data = vec![0u8; n * 3];
        match &w.values {
            // Integer sources map through one table per band, built from
            // `Stretch::apply` itself so both paths give the same bytes.
            Samples::U8(v) => {
                let luts: [[u8; 256]; 3] = std::array::from_fn(|c| {
                    std::array::from_fn(|x| self.stretch.apply(c, x as f64))
                });
                fill_rgb(&mut data, &w.valid, planes(v, n), |c, x| {
                    luts[c][usize::from(x)]
                });
            }
            Samples::U16(v) => {
                let luts = self.u16_luts();
                fill_rgb(&mut data, &w.valid, planes(v, n), |c, x| {
                    luts[c][usize::from(x)]
                });
            }
            Samples::F64(v) => {
                fill_rgb(&mut data, &w.valid, planes(v, n), |c, x| {
                    self.stretch.apply(c, x)
                });
            }
        }
        Rgb8 {
            width: w.width,
            height: w.height,
            data,
        }
    }

    /// 16-bit lookup tables, built on first use and kept for the scene.
    fn u16_luts(&self) -> &[Box<[u8; 65536]>; 3] {
        self.u16_luts.get_or_init(|| {
            std::array::from_fn(|c| {
                let mut t = Box::new([0u8; 65536]);
                for (x, o) in t.iter_mut().enumerate() {
                    *o = self.stretch.apply(c, x as f64);
                }
                t
            })
        })
    }
}

/// The three band planes of a band-sequential window of `n` pixels.
fn planes<T>(v: &[T], n: usize) -> [&[T]; 3] {
    [&v[..n], &v[n..2 * n], &v[2 * n..3 * n]]
}

/// Interleaves three band planes into RGB through `map(channel, sample)`,
/// leaving invalid pixels 0.
fn fill_rgb<T: Copy>(
    data: &mut [u8],
    valid: &[bool],
    [r, g, b]: [&[T]; 3],
    map: impl Fn(usize, T) -> u8,
) {
    let src = r.iter().zip(g).zip(b);
    for ((px, ok), ((r, g), b)) in data.chunks_exact_mut(3).zip(valid).zip(src) {
        if *ok {
            px[0] = map(0, *r);
            px[1] = map(1, *g);
            px[2] = map(2, *b);
        }
    }
}

/// The integer factor by which grid `f` is coarser than grid `b`, when `f`
/// lines up with `b`: no rotation, the same origin, pixel sizes k times `b`'s.
fn grid_factor(b: &[f64; 6], f: &[f64; 6]) -> Option<u32> {
    let tol = b[1].abs() * 1e-6;
    if b[2] != 0.0 || b[4] != 0.0 || f[2] != 0.0 || f[4] != 0.0 {
        return None;
    }
    if (b[0] - f[0]).abs() > tol || (b[3] - f[3]).abs() > tol {
        return None;
    }
    let kx = f[1] / b[1];
    let ky = f[5] / b[5];
    let k = kx.round();
    if k < 1.0 || (kx - k).abs() > 1e-6 || (ky - k).abs() > 1e-6 {
        return None;
    }
    Some(k as u32)
}

/// The chip grid of a raster, or `None` when it is one whole-image chip: a
/// raster without a geotransform, or one no larger than a chip.
fn layout(width: u32, height: u32, georeferenced: bool, tiling: &TilingSpec) -> Option<ChipGrid> {
    let whole = !georeferenced || (width <= tiling.chip_size && height <= tiling.chip_size);
    (!whole).then_some(ChipGrid {
        width,
        height,
        chip: tiling.chip_size,
        stride: tiling.stride,
    })
}

/// The chip grid of a TIFF for planning, from its header alone: `None` when
/// the raster is one whole-image chip. The planner and the worker both derive
/// the grid this way, so the blocks a task names are the blocks it reads.
pub async fn plan_grid(
    reader: Arc<dyn RangeRead>,
    tiling: &TilingSpec,
    limits: TiffLimits,
) -> Result<Option<ChipGrid>, SceneError> {
    let tiff = TiffFile::open(reader, limits).await?;
    let info = tiff.image();
    let tags = tiff.geo_tags();
    let keys = geo::parse_geokeys(tags).ok().flatten();
    let georeferenced = matches!(geo::geotransform(tags, keys.as_ref()), Ok(Some(_)));
    Ok(layout(info.width, info.height, georeferenced, tiling))
}

/// The chip grid of a band-file scene, as [`Scene::open_band_files`] lays it:
/// on the finest band's grid. Reads only the headers.
pub async fn plan_band_grid(
    readers: Vec<Arc<dyn RangeRead>>,
    tiling: &TilingSpec,
    limits: TiffLimits,
) -> Result<Option<ChipGrid>, SceneError> {
    // (pixel size, width, height, georeferenced) of the finest file so far;
    // the first of equals wins, as in `open_band_files`.
    let mut best: Option<(f64, u32, u32, bool)> = None;
    for r in readers {
        let tiff = TiffFile::open(r, limits.clone()).await?;
        let info = tiff.image();
        let tags = tiff.geo_tags();
        let keys = geo::parse_geokeys(tags).ok().flatten();
        let gt = geo::geotransform(tags, keys.as_ref()).ok().flatten();
        let px = gt.as_ref().map_or(f64::INFINITY, |g| g.0[1].abs());
        if best.is_none_or(|b| px < b.0) {
            best = Some((px, info.width, info.height, gt.is_some()));
        }
    }
    Ok(best.and_then(|(_, w, h, georeferenced)| layout(w, h, georeferenced, tiling)))
}

/// The blocks (x, y, width, height) a raster without a usable overview is
/// sampled at for `--scale auto`: whole tiles or strips, so each costs one
/// block read and no neighbour, on an even grid of strata over the raster.
///
/// About [`STRETCH_SAMPLE_PIXELS`] pixels in at least [`STRETCH_MIN_BLOCKS`]
/// blocks, but never more than a quarter of the blocks (one block at least):
/// every task of a sharded scene computes the stretch, so what it costs is
/// paid once per task, and must stay well below what the task reads anyway.
fn stretch_blocks(width: u32, height: u32, bw: u32, bh: u32) -> Vec<(u32, u32, u32, u32)> {
    let (bw, bh) = (bw.clamp(1, width.max(1)), bh.clamp(1, height.max(1)));
    let (nx, ny) = (
        u64::from(width.max(1).div_ceil(bw)),
        u64::from(height.max(1).div_ceil(bh)),
    );
    let per_block = u64::from(bw) * u64::from(bh);
    let want = STRETCH_SAMPLE_PIXELS
        .div_ceil(per_block)
        .max(STRETCH_MIN_BLOCKS);
    let cap = (nx * ny / 4).max(1);
    let k = want.min(cap);
    // A kx × ky grid of strata shaped like the block grid, one block at the
    // centre of each.
    let kx = ((k as f64 * nx as f64 / ny as f64).sqrt().round() as u64).clamp(1, nx.min(k));
    let ky = k.div_ceil(kx).min(cap / kx).clamp(1, ny);
    let mut out = Vec::with_capacity((kx * ky) as usize);
    for j in 0..ky {
        let by = ((2 * j + 1) * ny / (2 * ky)) as u32;
        for i in 0..kx {
            let bx = ((2 * i + 1) * nx / (2 * kx)) as u32;
            let (x, y) = (bx * bw, by * bh);
            out.push((x, y, bw.min(width - x), bh.min(height - y)));
        }
    }
    out
}

/// Appends the valid, non-NaN samples of each band of `w`.
fn take_valid(samples: &mut [Vec<f64>], w: &WindowData) {
    let n = (w.width * w.height) as usize;
    for (b, s) in samples.iter_mut().enumerate() {
        let vals = w.values.to_f64(b * n..(b + 1) * n);
        s.extend(
            vals.iter()
                .zip(&w.valid)
                .filter(|(v, ok)| **ok && !v.is_nan())
                .map(|(v, _)| *v),
        );
    }
}

/// 0-based band indexes for `--bands`; a one-band raster replicates band 1
/// when the default 1,2,3 was not changed.
fn select_bands(asked: &[u32], bands: usize) -> Result<Vec<usize>, SceneError> {
    if bands == 1 && asked == [1, 2, 3] {
        return Ok(vec![0, 0, 0]);
    }
    if asked.iter().any(|b| *b == 0 || *b as usize > bands) {
        return Err(SceneError::NoSuchBand {
            asked: asked.to_vec(),
            bands,
        });
    }
    Ok(asked.iter().map(|b| *b as usize - 1).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretch_sample_is_whole_blocks_and_a_bounded_share() {
        // (width, height, block width, block height)
        let cases = [
            (1550, 1578, 256, 256), // the Landsat band that read its file 16 times
            (1024, 1024, 256, 256),
            (438, 500, 32, 32),
            (10980, 10980, 512, 512),
            (7000, 5000, 7000, 1), // one-row strips
            (300, 200, 300, 200),  // one block
            (600, 600, 512, 512),
            (1, 1, 256, 256),
        ];
        for (w, h, bw, bh) in cases {
            let blocks = stretch_blocks(w, h, bw, bh);
            let n = u64::from(w.div_ceil(bw)) * u64::from(h.div_ceil(bh.min(h)));
            assert!(!blocks.is_empty());
            assert!(
                blocks.len() as u64 <= (n / 4).max(1),
                "{w}x{h}/{bw}x{bh}: {} of {n} blocks",
                blocks.len()
            );
            let mut seen = std::collections::HashSet::new();
            for &(x, y, bw2, bh2) in &blocks {
                assert_eq!((x % bw, y % bh), (0, 0), "block-aligned");
                assert!(x + bw2 <= w && y + bh2 <= h, "inside the raster");
                assert_eq!(bw2, bw.min(w - x));
                assert_eq!(bh2, bh.min(h - y));
                assert!(seen.insert((x, y)), "each block once");
            }
        }
        // Spread over the raster, not bunched in a row or a column.
        let b = stretch_blocks(1550, 1578, 256, 256);
        let xs: std::collections::HashSet<_> = b.iter().map(|b| b.0).collect();
        let ys: std::collections::HashSet<_> = b.iter().map(|b| b.1).collect();
        assert!(xs.len() >= 2 && ys.len() >= 2, "{b:?}");
        // Enough pixels where the raster has them.
        let px: u64 = stretch_blocks(7000, 5000, 7000, 1)
            .iter()
            .map(|b| u64::from(b.2) * u64::from(b.3))
            .sum();
        assert!(px >= STRETCH_SAMPLE_PIXELS, "{px}");
    }

    #[test]
    fn mem_range_clamps_to_the_object() {
        let r = MemRange::new(Bytes::from_static(b"0123456789"));
        let read = |a, b| futures::executor::block_on(r.read_range(a, b)).unwrap();
        assert_eq!(r.size(), 10);
        assert_eq!(&read(2, 5)[..], b"234");
        assert_eq!(&read(8, 100)[..], b"89");
        assert!(read(50, 60).is_empty());
        assert!(read(6, 3).is_empty());
    }
}
