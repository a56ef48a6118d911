//! The decoder's state and its output: the frame and its components, then
//! upsampling and colour conversion into the image.
//!
//! Decoding writes IDCT output straight into per-component sample planes
//! (padded to whole MCUs), then upsamples and colour-converts row by row.
//! Whole planes, rather than libjpeg's rolling MCU-row buffers, are what make
//! non-interleaved multi-scan files and vertical upsampling context simple;
//! they cost about one extra image of memory, which `Limits` accounts for.
//! The state itself is in `state.rs`, the markers are parsed in
//! `markers.rs`, and each scan set up in `scan.rs` and decoded in
//! `sequential.rs` or `progressive.rs`.

use super::color::{interleave_row, YccTables};
use super::error::{corrupt, Error};
use super::progressive;
use super::state::{Component, Decoder, Frame, Limits};
use super::upsample::{self, Method};

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
