//! The chip grid of a scene (DESIGN.md, "Contract: chip grid").
//!
//! Chips start at x ∈ {0, S, 2S, …} with x < W, and y likewise. A chip that runs
//! past the right or bottom edge keeps its full size C: the part outside the
//! raster is padding, counted as invalid.

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
}

impl ChipGrid {
    /// Chips per row: ⌈W / S⌉.
    pub fn columns(&self) -> u32 {
        self.width.div_ceil(self.stride.max(1))
    }

    /// Chip rows: ⌈H / S⌉.
    pub fn rows(&self) -> u32 {
        self.height.div_ceil(self.stride.max(1))
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
            x: (i * self.stride) as i32,
            y: (j * self.stride) as i32,
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
        let g = ChipGrid {
            width: 791,
            height: 718,
            chip: 256,
            stride: 256,
        };
        assert_eq!((g.columns(), g.rows()), (4, 3));
        let w: Vec<_> = g.windows(0..g.rows()).collect();
        assert_eq!(w.len(), 12);
        assert_eq!((w[3].x, w[3].y, w[3].width), (768, 0, 256));
        assert_eq!((w[11].x, w[11].y), (768, 512));
        assert!(w.iter().all(|w| w.width == 256 && w.height == 256));
    }

    #[test]
    fn overlapping_stride_starts_below_width() {
        let g = ChipGrid {
            width: 300,
            height: 100,
            chip: 128,
            stride: 64,
        };
        let xs: Vec<_> = g.windows(0..1).map(|w| w.x).collect();
        assert_eq!(xs, [0, 64, 128, 192, 256]);
        assert_eq!(g.rows(), 2);
    }

    #[test]
    fn blocks_partition_the_grid() {
        let g = ChipGrid {
            width: 8192,
            height: 5000,
            chip: 256,
            stride: 256,
        };
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
        let g = ChipGrid {
            width: 0,
            height: 10,
            chip: 8,
            stride: 8,
        };
        assert!(g.is_empty());
    }
}
