//! A scene's place on the CRS lattice (`--align crs`).
//!
//! The lattice of a CRS and pixel size `res` has its pixel (i, j) at
//! x ∈ [i·res, (i+1)·res), y ∈ (−(j+1)·res, −j·res]: it passes through the
//! CRS origin, i counts east and j south (see [`rsembed_schemas::align`]).
//! A north-up scene whose corner lies on it (within
//! [`PHASE_TOLERANCE`] of a pixel) has its pixel (0, 0) at lattice pixel
//! (`col0`, `row0`) = (round(x0 / res), round(−y0 / res)), and its chips are
//! the lattice's chips that overlap it: chip (col, row) at lattice pixels
//! (col·S, row·S), scene pixels (col·S − col0, row·S − row0). Two scenes on
//! one lattice therefore cut the same chip for the same cell, from the same
//! ground.
//!
//! The phase rule: the lattice is the one through the CRS origin, so every
//! scene of a CRS and resolution must have a corner at a whole number of
//! pixels from it. Sentinel-2 and HLS tiles do; Landsat Collection 2 scenes
//! are half a pixel off (their corners are at 15 m past a multiple of 30 m)
//! and are refused with the phase named. Fixing the lattice by the CRS origin
//! (rather than by a job's first scene) needs no shared state between
//! workers, and a scene is placed the same way in every job and every run.

use rsembed_schemas::align::{Cell, PHASE_TOLERANCE};
use rsembed_schemas::ids::Window;

use crate::geo::{Crs, GeoTransform};
use crate::grid::ChipGrid;

/// Why a scene cannot be cut on the CRS lattice; each is the scene's error
/// record.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LatticeError {
    /// No geotransform.
    #[error("the scene is not georeferenced (no geotransform)")]
    NotGeoreferenced,
    /// A geotransform without a CRS rsembed understands.
    #[error("the scene's CRS is unknown")]
    NoCrs,
    /// A CRS without an EPSG code: a cell names its CRS by code.
    #[error("the scene's CRS has no EPSG code ({0}); a cell names its CRS by EPSG code")]
    NoEpsg(String),
    /// Rotation or shear terms.
    #[error("the scene is a rotated raster (geotransform {0:?}); the lattice is north-up")]
    Rotated([f64; 6]),
    /// Columns running west or rows running north.
    #[error("the scene is not north-up (pixel size {x} by {y}); the lattice runs east and south")]
    Flipped {
        /// Pixel width in CRS units (positive east).
        x: f64,
        /// Pixel height in CRS units (negative south).
        y: f64,
    },
    /// Pixels that are not square: a cell has one pixel size.
    #[error("the scene's pixels are not square ({x} by {y}); a cell has one pixel size")]
    NotSquare {
        /// Pixel width.
        x: f64,
        /// Pixel height.
        y: f64,
    },
    /// A corner off the lattice.
    #[error(
        "the scene's sub-pixel phase ({px:.6}, {py:.6}) is not the CRS lattice's (0, 0): its \
         corner ({x0}, {y0}) is not a whole number of its {res}-unit pixels from the CRS origin \
         (tolerance {tol} pixel); scenes on another phase cannot share cells with it"
    )]
    Phase {
        /// Corner x in CRS units.
        x0: f64,
        /// Corner y in CRS units.
        y0: f64,
        /// Pixel size.
        res: f64,
        /// Phase along x, in pixels (−0.5..0.5).
        px: f64,
        /// Phase along y, in pixels.
        py: f64,
        /// [`PHASE_TOLERANCE`].
        tol: f64,
    },
    /// A corner so far from the origin, in pixels, that its index is not exact.
    #[error("the scene's corner ({x0}, {y0}) is too far from the CRS origin in {res}-unit pixels")]
    TooFar {
        /// Corner x.
        x0: f64,
        /// Corner y.
        y0: f64,
        /// Pixel size.
        res: f64,
    },
}

/// Lattice indexes beyond this are not exact in `f64` arithmetic and not
/// anything a real scene has (2⁴⁰ pixels of a millimetre is a million km).
const MAX_INDEX: f64 = (1u64 << 40) as f64;

/// A scene placed on its CRS lattice.
#[derive(Debug, Clone, PartialEq)]
pub struct Lattice {
    /// The CRS's EPSG code.
    pub epsg: u32,
    /// Pixel size in CRS units.
    pub res: f64,
    /// Chip size in pixels.
    pub chip: u32,
    /// Stride in pixels.
    pub stride: u32,
    /// Lattice column of the scene's pixel column 0.
    pub col0: i64,
    /// Lattice row of the scene's pixel row 0 (south is positive).
    pub row0: i64,
}

impl Lattice {
    /// Places a scene of geotransform `gt` and CRS `crs` on its lattice for
    /// chips of `chip` pixels every `stride`.
    pub fn of_scene(
        gt: Option<&GeoTransform>,
        crs: Option<&Crs>,
        chip: u32,
        stride: u32,
    ) -> Result<Lattice, LatticeError> {
        let gt = gt.ok_or(LatticeError::NotGeoreferenced)?.0;
        let epsg = match crs {
            None => return Err(LatticeError::NoCrs),
            Some(Crs::UserDefined { proj4 }) => return Err(LatticeError::NoEpsg(proj4.clone())),
            Some(Crs::Epsg(code)) => *code,
        };
        if gt[2] != 0.0 || gt[4] != 0.0 {
            return Err(LatticeError::Rotated(gt));
        }
        let (rx, ry) = (gt[1], gt[5]);
        if !(rx > 0.0 && ry < 0.0) {
            return Err(LatticeError::Flipped { x: rx, y: ry });
        }
        if ((rx + ry).abs() / rx) > 1e-9 {
            return Err(LatticeError::NotSquare { x: rx, y: ry });
        }
        let (fx, fy) = (gt[0] / rx, gt[3] / ry);
        if !(fx.abs() < MAX_INDEX && fy.abs() < MAX_INDEX) {
            return Err(LatticeError::TooFar {
                x0: gt[0],
                y0: gt[3],
                res: rx,
            });
        }
        let (cx, cy) = (fx.round(), fy.round());
        let (px, py) = (fx - cx, fy - cy);
        if px.abs() > PHASE_TOLERANCE || py.abs() > PHASE_TOLERANCE {
            return Err(LatticeError::Phase {
                x0: gt[0],
                y0: gt[3],
                res: rx,
                px,
                py,
                tol: PHASE_TOLERANCE,
            });
        }
        Ok(Lattice {
            epsg,
            res: rx,
            chip,
            stride: stride.max(1),
            col0: cx as i64,
            row0: cy as i64,
        })
    }

    /// The first lattice chip index overlapping a scene that starts at
    /// lattice pixel `p0`: the smallest k with k·S + C > p0.
    fn first(&self, p0: i64) -> i64 {
        let (c, s) = (i64::from(self.chip), i64::from(self.stride));
        (p0 - c).div_euclid(s) + 1
    }

    /// The scene's chip grid: every lattice chip that overlaps its
    /// `width` × `height` pixels.
    pub fn grid(&self, width: u32, height: u32) -> ChipGrid {
        let s = i64::from(self.stride);
        let origin = |p0: i64| -> i32 {
            let o = self.first(p0) * s - p0;
            i32::try_from(o).expect("a lattice origin is within a chip of the corner")
        };
        ChipGrid {
            width,
            height,
            chip: self.chip,
            stride: self.stride,
            origin: [origin(self.col0), origin(self.row0)],
        }
    }

    /// The cells of the chips that overlap a scene of `width` × `height`
    /// pixels: the first and last column, and the first and last row (the
    /// chips of [`Lattice::grid`], without cutting them).
    pub fn cell_span(&self, width: u32, height: u32) -> [[i64; 2]; 2] {
        let s = i64::from(self.stride);
        let last = |p0: i64, n: u32| (p0 + i64::from(n.max(1)) - 1).div_euclid(s);
        [
            [self.first(self.col0), last(self.col0, width)],
            [self.first(self.row0), last(self.row0, height)],
        ]
    }

    /// The cell of the chip whose window starts at scene pixel (`w.x`, `w.y`)
    /// (a window of [`Lattice::grid`]).
    pub fn cell(&self, w: Window) -> Cell {
        let s = i64::from(self.stride);
        let (lx, ly) = self.lattice_pixel(w);
        debug_assert!(lx % s == 0 && ly % s == 0, "a window of the lattice grid");
        Cell {
            epsg: self.epsg,
            res: self.res,
            stride: self.stride,
            col: lx.div_euclid(s),
            row: ly.div_euclid(s),
        }
    }

    /// The lattice pixel of a window's top-left corner.
    pub fn lattice_pixel(&self, w: Window) -> (i64, i64) {
        (self.col0 + i64::from(w.x), self.row0 + i64::from(w.y))
    }

    /// The lattice's own affine: lattice pixel (i, j) to CRS coordinates.
    /// Footprints computed through it are the same for a cell whichever
    /// scene it was cut from, to the last bit.
    pub fn transform(&self) -> GeoTransform {
        GeoTransform([0.0, self.res, 0.0, 0.0, 0.0, -self.res])
    }
}

#[cfg(test)]
#[path = "lattice_tests.rs"]
mod tests;
