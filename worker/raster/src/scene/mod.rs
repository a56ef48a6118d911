//! TIFF and GeoTIFF inputs: chips of a raster with their footprints.
//!
//! A TIFF without georeferencing, or one no larger than a chip, is one chip
//! (x = y = 0, its own size), as DESIGN.md's chip grid says; any other GeoTIFF
//! is cut on the grid. Reads go through a [`RangeRead`] (object storage, in the
//! worker) for the tiles a chip needs.
//!
//! `plan.rs` opens a scene and decides its bands, georeferencing, grid and
//! stretch (and gives the planner the same grid); `read.rs` reads a chip's
//! window of every band file and scales it to 8 bits, and of the cloud mask,
//! when the scene has one.

mod plan;
mod read;
mod samples;

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use rsembed_schemas::ids::Window;
use rsembed_schemas::task::{ChipBlock, MaskKind, Units};

use crate::geo::{self, Crs, Footprint, GeoTransform, Projector};
use crate::grid::ChipGrid;
use crate::lattice::{Lattice, LatticeError};
use crate::pixels::Rgb8;
use crate::scale::{Stretch, StretchCache};

#[cfg(test)]
mod test_tiff;
#[cfg(test)]
mod tests_parts;
use crate::tiff::{RangeRead, TiffError, TiffFile};

pub use plan::{plan_band_grid, plan_grid, planned_layout};
pub use samples::SampleChip;

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
    /// A scene's parts name another number of channels than the model's three.
    #[error(
        "the scene's files give {got} channel(s) ({detail}); a scene needs exactly 3 (R, G, B)"
    )]
    Channels {
        /// Channels over all parts.
        got: usize,
        /// Per file: its bands.
        detail: String,
    },
    /// The scene is not on the grid its task was planned on.
    #[error(
        "the scene's grid is {found:?} pixels (width, height) but its item says {planned:?} \
         (proj:shape); its chip blocks were planned on that"
    )]
    GridMismatch {
        /// (width, height) the planner split the scene by.
        planned: [u32; 2],
        /// (width, height) of the opened scene.
        found: [u32; 2],
    },
    /// `--align crs`, and the scene cannot be cut on its CRS lattice.
    #[error("--align crs: {0}")]
    Lattice(#[from] LatticeError),
    /// Physical units (`raster:scale`, `raster:offset`) that map no range of
    /// stored numbers onto `--scale MIN:MAX`.
    #[error("physical units of channel {channel}: {reason}")]
    Units {
        /// 0-based channel.
        channel: usize,
        /// What is wrong with them.
        reason: String,
    },
}

/// One file of a scene and the bands it gives, in channel order.
pub struct ScenePart {
    /// The file's URI, for messages.
    pub uri: String,
    /// Its bytes.
    pub reader: Arc<dyn RangeRead>,
    /// 1-based bands it gives, in channel order; empty: band 1 (a one-band file).
    pub bands: Vec<u32>,
}

/// A scene's cloud mask: a file beside its bands, read per chip for
/// `cloud_fraction`, never as a channel.
pub struct SceneMask {
    /// How its values mark clouds.
    pub kind: MaskKind,
    /// The file's URI, for messages.
    pub uri: String,
    /// Its bytes (band 1 is read).
    pub reader: Arc<dyn RangeRead>,
}

/// A scene stored as several files (band files, or a STAC item's assets) and
/// what its item says about it.
pub struct SceneParts {
    /// The files, in channel order; their bands must add up to 3 channels.
    pub files: Vec<ScenePart>,
    /// The cloud mask, if any.
    pub mask: Option<SceneMask>,
    /// Per channel, the physical units of its samples; empty when none are
    /// known. With them, `--scale MIN:MAX` is in physical units.
    pub units: Vec<Option<Units>>,
    /// The (width, height) the scene was planned on; another grid is an error.
    pub grid: Option<[u32; 2]>,
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
    /// Lon/lat of the window's centre, when the scene is georeferenced and
    /// the centre is in the projection's domain (with or without a footprint).
    pub centre: Option<[f64; 2]>,
    /// The chip in 8 bits; invalid pixels are 0.
    pub rgb: Rgb8,
    /// Share of the valid pixels the scene's cloud mask marks as cloud;
    /// `None` without a mask.
    pub cloud_fraction: Option<f32>,
    /// The chip's cell of the CRS lattice (`--align crs`).
    pub cell: Option<String>,
}

/// Where a chip lies: what [`Scene::place`] gives.
struct Place {
    footprint: Option<Footprint>,
    centre: Option<[f64; 2]>,
    cell: Option<String>,
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

/// The opened cloud mask of a scene.
struct MaskSource {
    tiff: TiffFile,
    kind: MaskKind,
    /// As [`Source::factor`].
    factor: u32,
}

/// An opened scene: headers, bands, stretch and georeferencing, read once per task.
pub struct Scene {
    sources: Vec<Source>,
    width: u32,
    height: u32,
    stretch: Stretch,
    geo: Option<(GeoTransform, Crs, Projector)>,
    mask: Option<MaskSource>,
    /// The chip grid; `None` for a whole-image chip (plain TIFFs and rasters no larger than a chip).
    pub grid: Option<ChipGrid>,
    /// The scene's place on its CRS lattice (`--align crs`): the grid is the
    /// lattice's, and footprints are drawn through the lattice's affine.
    pub lattice: Option<Lattice>,
    /// Source CRS label (`EPSG:32618`), when known.
    pub crs_label: Option<String>,
    /// Per channel, the physical units of its stored numbers (empty: none).
    units: Vec<Option<Units>>,
    /// `stretch` as 16-bit lookup tables (192 KiB), for 16-bit sources.
    u16_luts: std::sync::OnceLock<[Box<[u8; 65536]>; 3]>,
}

impl Scene {
    /// (width, height) of the scene's grid: its finest file's.
    pub fn size(&self) -> (u32, u32) {
        (self.width, self.height)
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

    /// Lets every file of the scene forget the blocks wholly above scene
    /// row `y` ([`TiffFile::forget_rows_above`]): a walk north to south
    /// that has passed them.
    pub fn forget_rows_above(&self, y: i64) {
        for s in &self.sources {
            s.tiff
                .forget_rows_above(y.div_euclid(i64::from(s.factor.max(1))));
        }
        if let Some(m) = &self.mask {
            m.tiff
                .forget_rows_above(y.div_euclid(i64::from(m.factor.max(1))));
        }
    }

    /// Reads one chip; `None` when its valid fraction is below `min_valid`
    /// (or it has no valid pixel when `min_valid` is `None`).
    pub async fn chip(
        &self,
        window: Window,
        min_valid: Option<f32>,
    ) -> Result<Option<SceneChip>, SceneError> {
        let w = self.read(window).await?;
        let Some(valid_fraction) = kept(&w.valid, min_valid) else {
            return Ok(None);
        };
        let cloud_fraction = match &self.mask {
            Some(m) => self.cloud_count(m, window, &w.valid).await?.fraction(),
            None => None,
        };
        let place = self.place(window);
        Ok(Some(SceneChip {
            window,
            valid_fraction,
            crs: self.crs_label.clone(),
            footprint: place.footprint,
            centre: place.centre,
            rgb: self.to_rgb8(&w),
            cloud_fraction,
            cell: place.cell,
        }))
    }

    /// Where a chip of `window` lies: its footprint, centre and cell.
    fn place(&self, window: Window) -> Place {
        let (cw, ch) = (f64::from(window.width), f64::from(window.height));
        // On a lattice, through the lattice's affine from the chip's lattice
        // pixel: a cell's footprint is the same from every scene.
        let (lattice_gt, x, y) = match &self.lattice {
            Some(l) => {
                let (lx, ly) = l.lattice_pixel(window);
                (Some(l.transform()), lx as f64, ly as f64)
            }
            None => (None, f64::from(window.x), f64::from(window.y)),
        };
        let footprint = self
            .geo
            .as_ref()
            .and_then(|(gt, _, p)| p.footprint(lattice_gt.as_ref().unwrap_or(gt), x, y, cw, ch));
        let centre = self
            .geo
            .as_ref()
            .and_then(|(gt, _, p)| p.centre(lattice_gt.as_ref().unwrap_or(gt), x, y, cw, ch));
        Place {
            footprint,
            centre,
            cell: self.lattice.as_ref().map(|l| l.cell(window).to_string()),
        }
    }
}

/// The share of valid pixels of a chip whose validity is `valid`, when the
/// chip is kept: it has a valid pixel, and at least `min_valid` of them.
pub(crate) fn kept(valid: &[bool], min_valid: Option<f32>) -> Option<f32> {
    let n = valid.iter().filter(|v| **v).count();
    let fraction = n as f32 / valid.len().max(1) as f32;
    let keep = n > 0 && min_valid.is_none_or(|m| fraction >= m);
    keep.then_some(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

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
