//! The chip grid of a scene (DESIGN.md, "Contract: chip grid").
//!
//! Chips start at x ∈ {0, S, 2S, …} with x < W, and y likewise. A chip that runs
//! past the right or bottom edge keeps its full size C: the part outside the
//! raster is padding, counted as invalid.
//!
//! Under `--align crs` the grid's first chip starts where the CRS lattice puts
//! it ([`crate::lattice`]): at an `origin` left of and above the scene's
//! corner (never by a whole chip), so chips run past every edge and are
//! padded there; chips start at `origin + (i·S, j·S)` with x < W and y < H.

use rsembed_schemas::ids::Window;
use rsembed_schemas::task::ChipBlock;

/// Chip size and stride over a raster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChipGrid {
    /// Raster width in pixels.
    pub width: u32,
    /// Raster height in pixels.
    pub height: u32,
    /// Chip size C in source pixels.
    pub chip: u32,
    /// Stride S in source pixels.
    pub stride: u32,
    /// The scene pixel (x, y) where chip (0, 0) starts: (0, 0) on the scene's
    /// own grid, at most (0, 0) and more than (−C, −C) on the CRS lattice
    /// (above it when the stride leaves gaps between chips).
    pub origin: [i32; 2],
}

/// Chips from `origin` at stride `s` that start before `len`.
fn count(len: u32, origin: i32, s: u32) -> u32 {
    let span = i64::from(len) - i64::from(origin);
    if len == 0 || span <= 0 {
        return 0;
    }
    let s = i64::from(s.max(1));
    u32::try_from((span + s - 1) / s).unwrap_or(u32::MAX)
}

impl ChipGrid {
    /// The grid of a raster cut from its own corner.
    pub fn from_corner(width: u32, height: u32, chip: u32, stride: u32) -> ChipGrid {
        ChipGrid {
            width,
            height,
            chip,
            stride,
            origin: [0, 0],
        }
    }

    /// A grid with as many columns and rows as any placement of a
    /// `width` × `height` raster on a CRS lattice gives (the first chip
    /// starting one pixel in from its far side): the planner splits a scene
    /// into blocks of this grid without knowing where the scene lies, and
    /// the worker's grid, never larger, is then split exactly (a block past
    /// its last column or row holds no chip). Only its counts and blocks mean
    /// anything; its windows are not the scene's.
    pub fn lattice_bound(width: u32, height: u32, chip: u32, stride: u32) -> ChipGrid {
        let o = 1 - i32::try_from(chip).unwrap_or(i32::MAX);
        ChipGrid {
            width,
            height,
            chip,
            stride,
            origin: [o, o],
        }
    }

    /// Chips per row: ⌈(W − origin x) / S⌉ (⌈W / S⌉ from the corner).
    pub fn columns(&self) -> u32 {
        count(self.width, self.origin[0], self.stride)
    }

    /// Chip rows: ⌈(H − origin y) / S⌉.
    pub fn rows(&self) -> u32 {
        count(self.height, self.origin[1], self.stride)
    }

    /// Chips in the grid.
    pub fn len(&self) -> u64 {
        u64::from(self.columns()) * u64::from(self.rows())
    }

    /// Whether the grid has no chip (an empty raster).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The window of chip (column `i`, row `j`).
    pub fn window(&self, i: u32, j: u32) -> Window {
        let c = self.chip as i32;
        Window {
            x: self.origin[0] + (i * self.stride) as i32,
            y: self.origin[1] + (j * self.stride) as i32,
            width: c,
            height: c,
        }
    }

    /// The windows of a block of the grid, row-major, clipped to the grid.
    pub(crate) fn block_windows(&self, b: ChipBlock) -> Vec<Window> {
        let (cols, rows) = (self.columns(), self.rows());
        let mut out = Vec::new();
        for j in b.row..b.row.saturating_add(b.rows).min(rows) {
            for i in b.col..b.col.saturating_add(b.cols).min(cols) {
                out.push(self.window(i, j));
            }
        }
        out
    }

    /// Blocks of about `target` chips (square, `k × k` with `k = ⌊√target⌋`)
    /// covering the grid, row-major; tasks of a scene split this way each read
    /// one compact region of the raster.
    pub fn blocks(&self, target: usize) -> Vec<ChipBlock> {
        let k = ((target.max(1) as f64).sqrt().floor() as u32).max(1);
        let mut out = Vec::new();
        let mut row = 0;
        while row < self.rows() {
            let mut col = 0;
            while col < self.columns() {
                out.push(ChipBlock {
                    col,
                    row,
                    cols: k.min(self.columns() - col),
                    rows: k.min(self.rows() - row),
                });
                col += k;
            }
            row += k;
        }
        out
    }

    /// The windows of chip rows `rows`, row-major.
    pub fn windows(&self, rows: std::ops::Range<u32>) -> impl Iterator<Item = Window> + '_ {
        let cols = self.columns();
        rows.flat_map(move |j| (0..cols).map(move |i| self.window(i, j)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_covers_edges_with_padding() {
        // RGB.byte.tif is 791 × 718; 256-pixel chips without overlap.
        let g = ChipGrid::from_corner(791, 718, 256, 256);
        assert_eq!((g.columns(), g.rows()), (4, 3));
        let w: Vec<_> = g.windows(0..g.rows()).collect();
        assert_eq!(w.len(), 12);
        assert_eq!((w[3].x, w[3].y, w[3].width), (768, 0, 256));
        assert_eq!((w[11].x, w[11].y), (768, 512));
        assert!(w.iter().all(|w| w.width == 256 && w.height == 256));
    }

    #[test]
    fn overlapping_stride_starts_below_width() {
        let g = ChipGrid::from_corner(300, 100, 128, 64);
        let xs: Vec<_> = g.windows(0..1).map(|w| w.x).collect();
        assert_eq!(xs, [0, 64, 128, 192, 256]);
        assert_eq!(g.rows(), 2);
    }

    #[test]
    fn blocks_partition_the_grid() {
        let g = ChipGrid::from_corner(8192, 5000, 256, 256);
        let blocks = g.blocks(16);
        let mut all: Vec<_> = blocks.iter().flat_map(|b| g.block_windows(*b)).collect();
        assert_eq!(all.len() as u64, g.len());
        all.sort_by_key(|w| (w.y, w.x));
        all.dedup();
        assert_eq!(all.len() as u64, g.len(), "no chip in two blocks");
        assert_eq!((blocks[0].cols, blocks[0].rows), (4, 4));
        let first = g.block_windows(blocks[0]);
        assert_eq!(first.last().unwrap().x, 768, "a 1024 x 1024 pixel window");
    }

    #[test]
    fn empty_raster_has_no_chips() {
        let g = ChipGrid::from_corner(0, 10, 8, 8);
        assert!(g.is_empty());
        assert!(ChipGrid::lattice_bound(0, 10, 8, 8).is_empty());
    }

    #[test]
    fn a_lattice_grid_starts_left_of_the_corner_and_pads_every_edge() {
        let g = ChipGrid {
            origin: [-100, -3],
            ..ChipGrid::from_corner(600, 520, 256, 256)
        };
        assert_eq!((g.columns(), g.rows()), (3, 3));
        let w: Vec<_> = g.windows(0..g.rows()).collect();
        assert_eq!((w[0].x, w[0].y), (-100, -3));
        assert_eq!((w[2].x, w[8].y), (412, 509));
        // An overlapping stride: chips start until x < W.
        let g = ChipGrid {
            origin: [-200, 0],
            ..ChipGrid::from_corner(300, 100, 256, 128)
        };
        let xs: Vec<_> = g.windows(0..1).map(|w| w.x).collect();
        assert_eq!(xs, [-200, -72, 56, 184]);
        // A stride with gaps may start inside the raster, or past it.
        let g = ChipGrid {
            origin: [40, 0],
            ..ChipGrid::from_corner(30, 10, 8, 64)
        };
        assert_eq!(g.columns(), 0);
    }

    #[test]
    fn blocks_of_the_bound_partition_every_lattice_grid() {
        // Whatever the scene's place on the lattice, blocks planned on the
        // bound hold each of its chips exactly once.
        for (w, h, c, s) in [
            (600, 520, 256, 256),
            (1000, 37, 64, 48),
            (513, 700, 128, 200),
        ] {
            let bound = ChipGrid::lattice_bound(w, h, c, s);
            let blocks = bound.blocks(4);
            for ox in [
                0,
                -1,
                1 - c as i32,
                -(s as i32) / 2,
                (s as i32 - c as i32).min(0),
            ] {
                let g = ChipGrid {
                    origin: [ox, ox / 2],
                    ..ChipGrid::from_corner(w, h, c, s)
                };
                assert!(g.columns() <= bound.columns() && g.rows() <= bound.rows());
                let mut all: Vec<_> = blocks.iter().flat_map(|b| g.block_windows(*b)).collect();
                assert_eq!(all.len() as u64, g.len(), "{w}x{h} c{c} s{s} at {ox}");
                all.sort_by_key(|w| (w.y, w.x));
                all.dedup();
                assert_eq!(all.len() as u64, g.len(), "no chip in two blocks");
            }
        }
    }
}
