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
use crate::raster::scale::{percentile_stretch, ScaleSpec, Stretch};
use crate::raster::tiff::{RangeRead, SampleType, TiffError, TiffFile, TiffLimits, WindowData};
use crate::sink::rows::Footprint;

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

/// Why a scene could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SceneError {
    /// The TIFF reader refused it.
    #[error(transparent)]
    Tiff(#[from] TiffError),
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

/// An opened scene: header, bands, stretch and georeferencing, read once per task.
pub struct Scene {
    tiff: TiffFile,
    bands: Vec<usize>,
    stretch: Stretch,
    geo: Option<(GeoTransform, Crs, Projector)>,
    /// The chip grid; `None` for a whole-image chip (plain TIFFs and rasters no larger than a chip).
    pub grid: Option<ChipGrid>,
    /// Source CRS label (`EPSG:32618`), when known.
    pub crs_label: Option<String>,
}

/// Samples taken per band for `--scale auto` when the scene has no overview.
const STRETCH_WINDOWS: u32 = 4;

impl Scene {
    /// Reads the header, decides bands, georeferencing, grid and stretch.
    pub async fn open(
        reader: Arc<dyn RangeRead>,
        tiling: &TilingSpec,
        scale: ScaleSpec,
        limits: TiffLimits,
        uri: &str,
    ) -> Result<Scene, SceneError> {
        let tiff = TiffFile::open(reader, limits).await?;
        let info = tiff.image().clone();
        let bands = select_bands(&tiling.bands, info.bands)?;

        let tags = tiff.geo_tags().clone();
        let keys = geo::parse_geokeys(&tags).unwrap_or_else(|e| {
            tracing::warn!(uri, cause = %e, "bad GeoKey directory; no footprints for this scene");
            None
        });
        let gt = geo::geotransform(&tags, keys.as_ref()).unwrap_or_else(|e| {
            tracing::warn!(uri, cause = %e, "bad georeferencing tags; no footprints for this scene");
            None
        });
        let crs = keys
            .as_ref()
            .and_then(|k| geo::crs_from_geokeys(k).ok().flatten());
        let crs_label = crs.as_ref().map(Crs::label);
        let georeferenced = gt.is_some();
        let geo = match (gt, crs) {
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
        // Only rasters without a geotransform, or no larger than a chip, are whole-image chips.
        let whole =
            !georeferenced || (info.width <= tiling.chip_size && info.height <= tiling.chip_size);
        let grid = (!whole).then_some(ChipGrid {
            width: info.width,
            height: info.height,
            chip: tiling.chip_size,
            stride: tiling.stride,
        });
        let mut scene = Scene {
            tiff,
            bands,
            stretch: Stretch::identity(3),
            geo,
            grid,
            crs_label,
        };
        scene.stretch = match scale {
            ScaleSpec::None => Stretch::identity(3),
            ScaleSpec::Range(lo, hi) => Stretch::uniform(3, lo, hi),
            ScaleSpec::Auto if info.sample_type == SampleType::U8 => Stretch::identity(3),
            ScaleSpec::Auto => scene.scene_stretch().await?,
        };
        Ok(scene)
    }

    /// Scene-level percentiles from the smallest overview, or from a few
    /// windows spread over the image when there is none.
    async fn scene_stretch(&self) -> Result<Stretch, SceneError> {
        let mut samples = vec![Vec::new(); self.bands.len()];
        let ovs = self.tiff.overviews();
        // The smallest overview that still has enough pixels for stable
        // percentiles; COGs end their pyramids at a few dozen pixels.
        let pick = ovs
            .iter()
            .enumerate()
            .rev()
            .find(|(_, o)| u64::from(o.width) * u64::from(o.height) >= 256 * 256);
        if let Some((i, ov)) = pick {
            let w = self
                .tiff
                .read_window(i + 1, 0, 0, ov.width, ov.height, &self.bands)
                .await?;
            take_valid(&mut samples, &w);
        } else {
            let info = self.tiff.image();
            let side = 256u32.min(info.width).min(info.height).max(1);
            for j in 0..STRETCH_WINDOWS {
                for i in 0..STRETCH_WINDOWS {
                    let x =
                        (info.width - side) as u64 * u64::from(i) / u64::from(STRETCH_WINDOWS - 1);
                    let y =
                        (info.height - side) as u64 * u64::from(j) / u64::from(STRETCH_WINDOWS - 1);
                    let w = self
                        .tiff
                        .read_window(0, x as i64, y as i64, side, side, &self.bands)
                        .await?;
                    take_valid(&mut samples, &w);
                }
            }
        }
        Ok(percentile_stretch(samples))
    }

    /// The windows of the scene, or of one block of its grid.
    pub fn windows(&self, block: Option<ChipBlock>) -> Vec<Window> {
        match (&self.grid, block) {
            (Some(g), Some(b)) => g.block_windows(b),
            (Some(g), None) => g.windows(0..g.rows()).collect(),
            (None, _) => {
                let info = self.tiff.image();
                vec![Window {
                    x: 0,
                    y: 0,
                    width: info.width as i32,
                    height: info.height as i32,
                }]
            }
        }
    }

    /// Reads one chip; `None` when its valid fraction is below `min_valid`
    /// (or it has no valid pixel when `min_valid` is `None`).
    pub async fn chip(
        &self,
        window: Window,
        min_valid: Option<f32>,
    ) -> Result<Option<SceneChip>, SceneError> {
        {
            let w = self
                .tiff
                .read_window(
                    0,
                    window.x.into(),
                    window.y.into(),
                    window.width as u32,
                    window.height as u32,
                    &self.bands,
                )
                .await?;
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
    }

    fn to_rgb8(&self, w: &WindowData) -> Rgb8 {
        let n = (w.width * w.height) as usize;
        let mut data = vec![0u8; n * 3];
        for (i, px) in data.chunks_exact_mut(3).enumerate() {
            if !w.valid[i] {
                continue;
            }
            for (c, out) in px.iter_mut().enumerate() {
                *out = self.stretch.apply(c, w.values[c * n + i]);
            }
        }
        Rgb8 {
            width: w.width,
            height: w.height,
            data,
        }
    }
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

/// Appends the valid, non-NaN samples of each band of `w`.
fn take_valid(samples: &mut [Vec<f64>], w: &WindowData) {
    let n = (w.width * w.height) as usize;
    for (b, s) in samples.iter_mut().enumerate() {
        let vals = &w.values[b * n..(b + 1) * n];
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
