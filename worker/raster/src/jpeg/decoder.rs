//! The decoder's state and its output: the frame and its components, then
//! upsampling and colour conversion into the image.
//!
//! Decoding writes IDCT output straight into per-component sample planes
//! (padded to whole MCUs), then upsamples and colour-converts row by row.
//! Whole planes, rather than libjpeg's rolling MCU-row buffers, are what make
//! non-interleaved multi-scan files and vertical upsampling context simple;
//! they cost about one extra image of memory, which `Limits` accounts for.
//! The markers are parsed in `markers.rs`, sequential scans decoded in
//! `sequential.rs`, progressive ones in `progressive.rs`.

use super::color::{interleave_row, YccTables};
use super::error::{corrupt, Error};
use super::huffman::HuffTable;
use super::progressive;
use super::upsample::{self, Method};

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

/// How three-component data becomes output samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ColorTransform {
    /// libjpeg's colour-space guess (`default_decompress_parms`): JFIF or
    /// Adobe transform != 0 or component ids 1,2,3 or anything unrecognised
    /// means YCbCr, converted to RGB; Adobe transform 0 or ids 'R','G','B'
    /// means RGB, passed through.
    #[default]
    Auto,
    /// Treat the data as YCbCr regardless of markers, as libtiff does for
    /// `Photometric=YCbCr` (`jpeg_color_space = JCS_YCbCr`, output RGB).
    YCbCrToRgb,
    /// Output the (upsampled) components as stored, as libtiff does for
    /// `Photometric=RGB` (`JCS_UNKNOWN`).
    None,
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

/// A decoded image: `width * height * components` interleaved samples.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Samples per pixel: 1 or 3.
    pub components: u8,
    /// Interleaved samples, row-major.
    pub data: Vec<u8>,
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

/// Decodes a complete JPEG image.
///
/// `tables` is an optional tables-only ("abbreviated") stream, SOI DQT/DHT
/// ... EOI, read before `data`, as TIFF's `JPEGTables` tag supplies.
pub fn decode(
    tables: Option<&[u8]>,
    data: &[u8],
    transform: ColorTransform,
    limits: &Limits,
) -> Result<Image, Error> {
    let mut d = Decoder {
        limits,
        qt: [None; 4],
        dc: [None, None, None, None],
        ac: [None, None, None, None],
        restart_interval: 0,
        jfif: false,
        adobe: None,
        frame: None,
        seen_sos: false,
    };
    if let Some(t) = tables {
        d.parse_tables(t)?;
    }
    d.parse_image(data)?;
    d.output(transform)
}

impl Decoder<'_> {
    fn output(mut self, transform: ColorTransform) -> Result<Image, Error> {
        let frame = self
            .frame
            .take()
            .ok_or_else(|| corrupt("no frame header"))?;
        let mut frame = frame;
        if frame.progressive {
            progressive::finish(&mut frame)?;
        }
        let (w, h) = (frame.width, frame.height);
        let nc = frame.comps.len();
        let mut data = vec![0u8; w * h * nc];
        let methods = frame
            .comps
            .iter()
            .map(|c| upsample::choose(c.h, c.v, frame.max_h, frame.max_v, c.dw))
            .collect::<Result<Vec<_>, _>>()?;
        let mut bufs: Vec<Vec<u8>> = frame
            .comps
            .iter()
            .map(|c| vec![0u8; (2 * c.dw).max(w)])
            .collect();

        if nc == 1 {
            let c = &frame.comps[0];
            for (y, out) in data.chunks_exact_mut(w).enumerate() {
                out.copy_from_slice(&c.plane[y * c.stride..y * c.stride + w]);
            }
        } else {
            let convert = match transform {
                ColorTransform::YCbCrToRgb => true,
                ColorTransform::None => false,
                ColorTransform::Auto => self.guess_ycbcr(&frame),
            };
            let tables = YccTables::new();
            let [b0, b1, b2] = &mut bufs[..] else {
                return Err(corrupt("component count"));
            };
            for (y, out) in data.chunks_exact_mut(w * 3).enumerate() {
                let r0 = comp_row(&frame.comps[0], methods[0], y, w, b0);
                let r1 = comp_row(&frame.comps[1], methods[1], y, w, b1);
                let r2 = comp_row(&frame.comps[2], methods[2], y, w, b2);
                if convert {
                    tables.convert_row(r0, r1, r2, out);
                } else {
                    interleave_row(r0, r1, r2, out);
                }
            }
        }
        Ok(Image {
            width: w as u32,
            height: h as u32,
            components: nc as u8,
            data,
        })
    }

    /// `jdapimin.c default_decompress_parms` for three components.
    fn guess_ycbcr(&self, frame: &Frame) -> bool {
        if self.jfif {
            return true;
        }
        if let Some(t) = self.adobe {
            return t != 0;
        }
        let ids: Vec<u8> = frame.comps.iter().map(|c| c.id).collect();
        ids != [b'R', b'G', b'B']
    }
}

fn comp_row<'a>(c: &'a Component, m: Method, y: usize, w: usize, buf: &'a mut [u8]) -> &'a [u8] {
    let row = |r: usize| &c.plane[r * c.stride..r * c.stride + c.dw];
    match m {
        Method::Full => return &c.plane[y * c.stride..y * c.stride + w],
        Method::H2V1Fancy => upsample::h2v1_fancy(row(y), buf),
        Method::H1V2Fancy => {
            let (near, far, below) = upsample::vertical_pair(y, c.dh);
            upsample::h1v2_fancy(row(near), row(far), below, &mut buf[..c.dw]);
        }
        Method::H2V2Fancy => {
            let (near, far, _) = upsample::vertical_pair(y, c.dh);
            upsample::h2v2_fancy(row(near), row(far), buf);
        }
        Method::Replicate { hx, vx } => upsample::replicate(row(y / vx), hx, &mut buf[..w]),
    }
    &buf[..w]
}
