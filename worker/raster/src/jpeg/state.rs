//! The decoder's state as the markers build it and the scans fill it: the
//! frame and its components, a scan's header, the tables, and the limits on
//! what a header may make it allocate. Below the markers, the scan decoders
//! and the output, which all share it.

use super::error::{corrupt, Error};
use super::huffman::HuffTable;

/// `jpeg_natural_order`: zigzag index to natural (row-major) index.
pub(crate) const ZIGZAG: [usize; 64] = [
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20,
    13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59,
    52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
];

/// libjpeg's `JPEG_MAX_DIMENSION`.
pub(super) const MAX_DIMENSION: u32 = 65500;

/// Basic facts about an image, from the frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// 1 (greyscale) or 3.
    pub components: u8,
    /// Progressive (SOF2) rather than sequential.
    pub progressive: bool,
}

/// Bounds on what a header may make the decoder allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Widest frame accepted.
    pub max_width: u32,
    /// Tallest frame accepted.
    pub max_height: u32,
    /// Total bytes for sample planes, coefficient buffers and the output.
    pub max_alloc: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_width: MAX_DIMENSION,
            max_height: MAX_DIMENSION,
            max_alloc: 1 << 30,
        }
    }
}

pub(crate) struct Component {
    pub(crate) id: u8,
    pub(crate) h: usize,
    pub(crate) v: usize,
    pub(super) tq: usize,
    /// `downsampled_width` / `downsampled_height` in libjpeg.
    pub(super) dw: usize,
    pub(super) dh: usize,
    /// Blocks per row / column of the MCU-padded plane.
    pub(crate) bw: usize,
    pub(crate) bh: usize,
    /// Blocks a non-interleaved scan covers (`width_in_blocks` etc.).
    pub(crate) wb: usize,
    pub(crate) hb: usize,
    pub(super) stride: usize,
    pub(crate) plane: Vec<u8>,
    pub(super) scanned: bool,
    /// Progressive only: coefficients of every block, natural order.
    pub(crate) coefs: Vec<i16>,
    /// Progressive only: `coef_bits` from jdphuff.c, the successive
    /// approximation bit each coefficient has reached (-1 before any scan).
    pub(crate) coef_bits: [i8; 64],
    /// Progressive only: table latched at the component's first scan, like
    /// `jdinput.c latch_quant_tables`.
    pub(crate) quant: Option<[i32; 64]>,
}

pub(crate) struct Frame {
    pub(super) width: usize,
    pub(super) height: usize,
    pub(crate) progressive: bool,
    pub(crate) comps: Vec<Component>,
    pub(super) max_h: usize,
    pub(super) max_v: usize,
    pub(crate) mcus_x: usize,
    pub(crate) mcus_y: usize,
    pub(super) allocated: bool,
}

pub(crate) struct ScanComp {
    pub(crate) ci: usize,
    pub(crate) td: usize,
    pub(crate) ta: usize,
}

pub(crate) struct Scan {
    pub(crate) comps: Vec<ScanComp>,
    pub(crate) ss: u8,
    pub(crate) se: u8,
    pub(crate) ah: u8,
    pub(crate) al: u8,
}

pub(crate) type HuffSlot = Option<Result<Box<HuffTable>, Error>>;

pub(crate) struct Decoder<'l> {
    pub(super) limits: &'l Limits,
    pub(super) qt: [Option<[u16; 64]>; 4],
    pub(crate) dc: [HuffSlot; 4],
    pub(crate) ac: [HuffSlot; 4],
    pub(crate) restart_interval: u16,
    pub(super) jfif: bool,
    pub(super) adobe: Option<u8>,
    pub(crate) frame: Option<Frame>,
    pub(super) seen_sos: bool,
}

/// The Huffman table in `slot`, which scan `kind` table `n` names.
pub(crate) fn huff_table<'t>(
    slot: &'t HuffSlot,
    kind: &str,
    n: usize,
) -> Result<&'t HuffTable, Error> {
    match slot {
        Some(Ok(t)) => Ok(t),
        Some(Err(e)) => Err(e.clone()),
        None => Err(corrupt(format!(
            "scan uses undefined {kind} Huffman table {n}"
        ))),
    }
}
