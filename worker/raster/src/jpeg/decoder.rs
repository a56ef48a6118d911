//! Marker parsing, scan decoding and output assembly.
//!
//! Decoding writes IDCT output straight into per-component sample planes
//! (padded to whole MCUs), then upsamples and colour-converts row by row.
//! Whole planes, rather than libjpeg's rolling MCU-row buffers, are what make
//! non-interleaved multi-scan files and vertical upsampling context simple;
//! they cost about one extra image of memory, which `Limits` accounts for.

use super::color::{interleave_row, YccTables};
use super::error::{corrupt, Error};
use super::huffman::{BitReader, HuffTable, Restarts};
use super::idct::{dc_only_value, idct_islow};
use super::progressive;
use super::upsample::{self, Method};

/// `jpeg_natural_order`: zigzag index to natural (row-major) index.
pub(crate) const ZIGZAG: [usize; 64] = [
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20,
    13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59,
    52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
];

/// libjpeg's `JPEG_MAX_DIMENSION`.
const MAX_DIMENSION: u32 = 65500;
/// libjpeg's `D_MAX_BLOCKS_IN_MCU`.
const MAX_BLOCKS_IN_MCU: usize = 10;

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
    tq: usize,
    /// `downsampled_width` / `downsampled_height` in libjpeg.
    dw: usize,
    dh: usize,
    /// Blocks per row / column of the MCU-padded plane.
    pub(crate) bw: usize,
    pub(crate) bh: usize,
    /// Blocks a non-interleaved scan covers (`width_in_blocks` etc.).
    pub(crate) wb: usize,
    pub(crate) hb: usize,
    stride: usize,
    pub(crate) plane: Vec<u8>,
    scanned: bool,
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
    width: usize,
    height: usize,
    pub(crate) progressive: bool,
    pub(crate) comps: Vec<Component>,
    max_h: usize,
    max_v: usize,
    pub(crate) mcus_x: usize,
    pub(crate) mcus_y: usize,
    allocated: bool,
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
    limits: &'l Limits,
    qt: [Option<[u16; 64]>; 4],
    pub(crate) dc: [HuffSlot; 4],
    pub(crate) ac: [HuffSlot; 4],
    pub(crate) restart_interval: u16,
    jfif: bool,
    adobe: Option<u8>,
    pub(crate) frame: Option<Frame>,
    seen_sos: bool,
}

fn be16(b: &[u8], at: usize) -> Result<u16, Error> {
    match b.get(at..at + 2) {
        Some(s) => Ok(u16::from_be_bytes([s[0], s[1]])),
        None => Err(Error::Truncated),
    }
}

/// Reads the marker at `pos` (skipping fill bytes). `None` at end of data.
fn next_marker(data: &[u8], pos: &mut usize) -> Result<Option<u8>, Error> {
    match data.get(*pos) {
        None => return Ok(None),
        Some(0xFF) => {}
        Some(_) => return Err(corrupt("garbage where a marker was expected")),
    }
    let mut q = *pos + 1;
    while data.get(q) == Some(&0xFF) {
        q += 1;
    }
    match data.get(q) {
        None => Err(Error::Truncated),
        Some(0) => Err(corrupt("stuffed zero byte outside scan data")),
        Some(&m) => {
            *pos = q + 1;
            Ok(Some(m))
        }
    }
}

/// Returns a marker segment's payload (after the length) and moves past it.
fn segment<'d>(data: &'d [u8], pos: &mut usize) -> Result<&'d [u8], Error> {
    let len = usize::from(be16(data, *pos)?);
    if len < 2 {
        return Err(corrupt("marker segment length below 2"));
    }
    let seg = data.get(*pos + 2..*pos + len).ok_or(Error::Truncated)?;
    *pos += len;
    Ok(seg)
}

fn sof_unsupported(m: u8) -> Option<&'static str> {
    Some(match m {
        0xC3 => "lossless JPEG",
        0xC5..=0xC7 => "hierarchical (differential) JPEG",
        0xC9..=0xCC => "arithmetic-coded JPEG",
        0xCD..=0xCF => "hierarchical arithmetic-coded JPEG",
        _ => return None,
    })
}

fn div_ceil(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// Standard tables from ITU-T T.81 Annex K.3, which libjpeg-turbo's
/// `jinit_huff_decoder` installs in empty slots 0 and 1 (Motion-JPEG streams
/// omit them).
const STD_DC_LUMA_BITS: [u8; 16] = [0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0];
const STD_DC_CHROMA_BITS: [u8; 16] = [0, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0];
const STD_DC_VALS: [u8; 12] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
const STD_AC_LUMA_BITS: [u8; 16] = [0, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 0x7d];
const STD_AC_LUMA_VALS: [u8; 162] = [
    0x01, 0x02, 0x03, 0x00, 0x04, 0x11, 0x05, 0x12, 0x21, 0x31, 0x41, 0x06, 0x13, 0x51, 0x61, 0x07,
    0x22, 0x71, 0x14, 0x32, 0x81, 0x91, 0xa1, 0x08, 0x23, 0x42, 0xb1, 0xc1, 0x15, 0x52, 0xd1, 0xf0,
    0x24, 0x33, 0x62, 0x72, 0x82, 0x09, 0x0a, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x25, 0x26, 0x27, 0x28,
    0x29, 0x2a, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3a, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49,
    0x4a, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5a, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69,
    0x6a, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7a, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89,
    0x8a, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9a, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7,
    0xa8, 0xa9, 0xaa, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9, 0xba, 0xc2, 0xc3, 0xc4, 0xc5,
    0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xd2, 0xd3, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8, 0xd9, 0xda, 0xe1, 0xe2,
    0xe3, 0xe4, 0xe5, 0xe6, 0xe7, 0xe8, 0xe9, 0xea, 0xf1, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8,
    0xf9, 0xfa,
];
const STD_AC_CHROMA_BITS: [u8; 16] = [0, 2, 1, 2, 4, 4, 3, 4, 7, 5, 4, 4, 0, 1, 2, 0x77];
const STD_AC_CHROMA_VALS: [u8; 162] = [
    0x00, 0x01, 0x02, 0x03, 0x11, 0x04, 0x05, 0x21, 0x31, 0x06, 0x12, 0x41, 0x51, 0x07, 0x61, 0x71,
    0x13, 0x22, 0x32, 0x81, 0x08, 0x14, 0x42, 0x91, 0xa1, 0xb1, 0xc1, 0x09, 0x23, 0x33, 0x52, 0xf0,
    0x15, 0x62, 0x72, 0xd1, 0x0a, 0x16, 0x24, 0x34, 0xe1, 0x25, 0xf1, 0x17, 0x18, 0x19, 0x1a, 0x26,
    0x27, 0x28, 0x29, 0x2a, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3a, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48,
    0x49, 0x4a, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5a, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68,
    0x69, 0x6a, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7a, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87,
    0x88, 0x89, 0x8a, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9a, 0xa2, 0xa3, 0xa4, 0xa5,
    0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9, 0xba, 0xc2, 0xc3,
    0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xd2, 0xd3, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8, 0xd9, 0xda,
    0xe2, 0xe3, 0xe4, 0xe5, 0xe6, 0xe7, 0xe8, 0xe9, 0xea, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8,
    0xf9, 0xfa,
];

fn std_table(bits: &[u8; 16], vals: &[u8], is_dc: bool) -> HuffSlot {
    Some(HuffTable::new(bits, vals, is_dc).map(Box::new))
}

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

/// Parses a frame header without decoding anything.
pub fn read_header(tables: Option<&[u8]>, data: &[u8]) -> Result<Header, Error> {
    // Tables never carry the frame header; they are accepted for symmetry
    // with `decode` so callers can pass the same arguments.
    let _ = tables;
    if data.get(..2) != Some(&[0xFF, 0xD8]) {
        return Err(corrupt("missing SOI marker"));
    }
    let mut pos = 2;
    loop {
        let m = next_marker(data, &mut pos)?.ok_or(Error::Truncated)?;
        match m {
            0xC0..=0xC2 => {
                let seg = segment(data, &mut pos)?;
                if seg.len() < 6 {
                    return Err(corrupt("SOF segment too short"));
                }
                return Ok(Header {
                    width: u32::from(be16(seg, 3)?),
                    height: u32::from(be16(seg, 1)?),
                    components: seg[5],
                    progressive: m == 0xC2,
                });
            }
            0xD8 => return Err(corrupt("duplicate SOI marker")),
            0xD9 | 0xDA => return Err(corrupt("no frame header before scan data")),
            0x01 | 0xD0..=0xD7 => {}
            _ => {
                if let Some(what) = sof_unsupported(m) {
                    return Err(Error::Unsupported(what.into()));
                }
                segment(data, &mut pos)?;
            }
        }
    }
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
    fn parse_tables(&mut self, data: &[u8]) -> Result<(), Error> {
        if data.get(..2) != Some(&[0xFF, 0xD8]) {
            return Err(corrupt("tables stream lacks SOI marker"));
        }
        let mut pos = 2;
        loop {
            let Some(m) = next_marker(data, &mut pos)? else {
                // libjpeg's source manager supplies a fake EOI here.
                return Ok(());
            };
            match m {
                0xD9 => return Ok(()),
                0xC4 => self.parse_dht(segment(data, &mut pos)?)?,
                0xDB => self.parse_dqt(segment(data, &mut pos)?)?,
                0xDD | 0xE0..=0xEF | 0xFE => {
                    segment(data, &mut pos)?;
                }
                0x01 | 0xD0..=0xD7 => {}
                0xC0..=0xCF | 0xDA => {
                    return Err(corrupt("tables stream contains image data"));
                }
                _ => return Err(corrupt(format!("unknown marker 0xFF{m:02X}"))),
            }
        }
    }

    fn parse_image(&mut self, data: &[u8]) -> Result<(), Error> {
        if data.get(..2) != Some(&[0xFF, 0xD8]) {
            return Err(corrupt("missing SOI marker"));
        }
        // Parameters that SOI resets in `jdmarker.c get_soi`; tables persist.
        self.restart_interval = 0;
        self.jfif = false;
        self.adobe = None;
        let mut pos = 2;
        let mut saw_eoi = false;
        while let Some(m) = next_marker(data, &mut pos)? {
            match m {
                0xC0 | 0xC1 => self.parse_sof(segment(data, &mut pos)?, false)?,
                0xC2 => self.parse_sof(segment(data, &mut pos)?, true)?,
                0xC4 => self.parse_dht(segment(data, &mut pos)?)?,
                0xDB => self.parse_dqt(segment(data, &mut pos)?)?,
                0xDD => {
                    let seg = segment(data, &mut pos)?;
                    if seg.len() != 2 {
                        return Err(corrupt("bad DRI segment length"));
                    }
                    self.restart_interval = be16(seg, 0)?;
                }
                0xE0 => {
                    let seg = segment(data, &mut pos)?;
                    if seg.len() >= 14 && seg.starts_with(b"JFIF\0") {
                        self.jfif = true;
                    }
                }
                0xEE => {
                    let seg = segment(data, &mut pos)?;
                    if seg.len() >= 12 && seg.starts_with(b"Adobe") {
                        self.adobe = Some(seg[11]);
                    }
                }
                0xE1..=0xED | 0xEF | 0xFE | 0xDC => {
                    segment(data, &mut pos)?;
                }
                0xDA => {
                    let seg = segment(data, &mut pos)?;
                    let scan = self.parse_sos(seg)?;
                    pos = self.decode_scan(data, pos, &scan)?;
                }
                0xD9 => {
                    saw_eoi = true;
                    break;
                }
                0x01 | 0xD0..=0xD7 => {}
                0xD8 => return Err(corrupt("duplicate SOI marker")),
                _ => {
                    if let Some(what) = sof_unsupported(m) {
                        return Err(Error::Unsupported(what.into()));
                    }
                    return Err(corrupt(format!("unknown marker 0xFF{m:02X}")));
                }
            }
        }
        let frame = self.frame.as_ref().ok_or(if saw_eoi {
            corrupt("no frame header")
        } else {
            Error::Truncated
        })?;
        if frame.progressive {
            // Missing scans are undetectable in progressive mode, so only a
            // stream that reaches EOI counts as complete.
            if !saw_eoi {
                return Err(Error::Truncated);
            }
            if frame.comps.iter().any(|c| !c.scanned) {
                return Err(corrupt("component without any scan"));
            }
        } else if frame.comps.iter().any(|c| !c.scanned) {
            return Err(if saw_eoi {
                corrupt("component without any scan")
            } else {
                Error::Truncated
            });
        }
        Ok(())
    }

    fn parse_dqt(&mut self, mut s: &[u8]) -> Result<(), Error> {
        while let Some(&pt) = s.first() {
            let (pq, tq) = (pt >> 4, usize::from(pt & 15));
            if tq > 3 {
                return Err(corrupt(format!("bad quantization table index {tq}")));
            }
            if pq > 1 {
                return Err(corrupt(format!("bad quantization table precision {pq}")));
            }
            let n = if pq == 0 { 64 } else { 128 };
            let body = s
                .get(1..1 + n)
                .ok_or_else(|| corrupt("short DQT segment"))?;
            let mut t = [0u16; 64];
            for (i, &nat) in ZIGZAG.iter().enumerate() {
                t[nat] = if pq == 0 {
                    u16::from(body[i])
                } else {
                    u16::from_be_bytes([body[2 * i], body[2 * i + 1]])
                };
            }
            self.qt[tq] = Some(t);
            s = &s[1 + n..];
        }
        Ok(())
    }

    fn parse_dht(&mut self, mut s: &[u8]) -> Result<(), Error> {
        while let Some(&tcth) = s.first() {
            let (tc, th) = (tcth >> 4, usize::from(tcth & 15));
            if tc > 1 || th > 3 {
                return Err(corrupt(format!("bad Huffman table id 0x{tcth:02X}")));
            }
            let bits: [u8; 16] = s
                .get(1..17)
                .ok_or_else(|| corrupt("short DHT segment"))?
                .try_into()
                .map_err(|_| corrupt("short DHT segment"))?;
            let count: usize = bits.iter().map(|&b| usize::from(b)).sum();
            if count > 256 {
                return Err(corrupt("bad Huffman table"));
            }
            let vals = s
                .get(17..17 + count)
                .ok_or_else(|| corrupt("short DHT segment"))?;
            // Validation errors surface only if a scan uses the table, as in
            // libjpeg, which builds derived tables per scan.
            let table = Some(HuffTable::new(&bits, vals, tc == 0).map(Box::new));
            if tc == 0 {
                self.dc[th] = table;
            } else {
                self.ac[th] = table;
            }
            s = &s[17 + count..];
        }
        Ok(())
    }

    fn parse_sof(&mut self, seg: &[u8], progressive: bool) -> Result<(), Error> {
        if self.frame.is_some() {
            return Err(corrupt("more than one frame header"));
        }
        if seg.len() < 6 {
            return Err(corrupt("SOF segment too short"));
        }
        let precision = seg[0];
        let height = u32::from(be16(seg, 1)?);
        let width = u32::from(be16(seg, 3)?);
        let nc = usize::from(seg[5]);
        if seg.len() != 6 + 3 * nc {
            return Err(corrupt("bad SOF segment length"));
        }
        if precision != 8 {
            return Err(Error::Unsupported(format!(
                "{precision}-bit sample precision"
            )));
        }
        if width == 0 || height == 0 {
            return Err(corrupt(
                "empty image (zero dimension; DNL is not supported)",
            ));
        }
        match nc {
            0 => return Err(corrupt("frame without components")),
            1 | 3 => {}
            4 => return Err(Error::Unsupported("4-component (CMYK/YCCK) JPEG".into())),
            n => return Err(Error::Unsupported(format!("{n}-component JPEG"))),
        }
        for (what, value, limit) in [
            ("width", width, self.limits.max_width.min(MAX_DIMENSION)),
            ("height", height, self.limits.max_height.min(MAX_DIMENSION)),
        ] {
            if value > limit {
                return Err(Error::TooLarge {
                    what,
                    requested: u64::from(value),
                    limit: u64::from(limit),
                });
            }
        }

        let mut raw = Vec::with_capacity(nc);
        for c in seg[6..].chunks_exact(3) {
            let (id, h, v, tq) = (c[0], usize::from(c[1] >> 4), usize::from(c[1] & 15), c[2]);
            if !(1..=4).contains(&h) || !(1..=4).contains(&v) {
                return Err(corrupt("bad sampling factors"));
            }
            if tq > 3 {
                return Err(corrupt(format!("bad quantization table index {tq}")));
            }
            if raw.iter().any(|&(i, _, _, _)| i == id) {
                return Err(corrupt(format!("duplicate component id {id}")));
            }
            raw.push((id, h, v, usize::from(tq)));
        }
        let max_h = raw.iter().map(|c| c.1).max().unwrap_or(1);
        let max_v = raw.iter().map(|c| c.2).max().unwrap_or(1);
        let (w, hgt) = (width as usize, height as usize);
        let mcus_x = div_ceil(w, 8 * max_h);
        let mcus_y = div_ceil(hgt, 8 * max_v);

        let mut comps = Vec::with_capacity(nc);
        let mut samples: u64 = 0;
        for &(id, h, v, tq) in &raw {
            let dw = div_ceil(w * h, max_h);
            let dh = div_ceil(hgt * v, max_v);
            upsample::choose(h, v, max_h, max_v, dw)?;
            let (bw, bh) = (mcus_x * h, mcus_y * v);
            samples += (bw * bh * 64) as u64;
            comps.push(Component {
                id,
                h,
                v,
                tq,
                dw,
                dh,
                bw,
                bh,
                wb: div_ceil(dw, 8),
                hb: div_ceil(dh, 8),
                stride: bw * 8,
                plane: Vec::new(),
                scanned: false,
                coefs: Vec::new(),
                coef_bits: [-1; 64],
                quant: None,
            });
        }
        let coef_bytes = if progressive { samples * 2 } else { 0 };
        let out_bytes = (w * hgt * nc) as u64;
        let total = samples + coef_bytes + out_bytes;
        if total > self.limits.max_alloc {
            return Err(Error::TooLarge {
                what: "allocation in bytes",
                requested: total,
                limit: self.limits.max_alloc,
            });
        }
        self.frame = Some(Frame {
            width: w,
            height: hgt,
            progressive,
            comps,
            max_h,
            max_v,
            mcus_x,
            mcus_y,
            allocated: false,
        });
        Ok(())
    }

    fn parse_sos(&self, seg: &[u8]) -> Result<Scan, Error> {
        let frame = self
            .frame
            .as_ref()
            .ok_or_else(|| corrupt("scan before frame header"))?;
        let ns = usize::from(*seg.first().ok_or_else(|| corrupt("empty SOS segment"))?);
        if ns == 0 || ns > 4 {
            return Err(corrupt(format!("bad component count {ns} in scan")));
        }
        if seg.len() != 4 + 2 * ns {
            return Err(corrupt("bad SOS segment length"));
        }
        let mut comps: Vec<ScanComp> = Vec::with_capacity(ns);
        for c in seg[1..1 + 2 * ns].chunks_exact(2) {
            let ci = frame
                .comps
                .iter()
                .position(|fc| fc.id == c[0])
                .ok_or_else(|| corrupt(format!("scan names unknown component {}", c[0])))?;
            if comps.iter().any(|sc| sc.ci == ci) {
                return Err(corrupt("component repeated within a scan"));
            }
            let (td, ta) = (usize::from(c[1] >> 4), usize::from(c[1] & 15));
            if td > 3 || ta > 3 {
                return Err(corrupt("bad Huffman table selector in scan"));
            }
            comps.push(ScanComp { ci, td, ta });
        }
        if ns > 1 {
            let blocks: usize = comps
                .iter()
                .map(|sc| frame.comps[sc.ci].h * frame.comps[sc.ci].v)
                .sum();
            if blocks > MAX_BLOCKS_IN_MCU {
                return Err(corrupt("too many blocks in MCU"));
            }
        }
        let tail = &seg[1 + 2 * ns..];
        Ok(Scan {
            comps,
            ss: tail[0],
            se: tail[1],
            ah: tail[2] >> 4,
            al: tail[2] & 15,
        })
    }

    fn decode_scan(&mut self, data: &[u8], pos: usize, scan: &Scan) -> Result<usize, Error> {
        if !self.seen_sos {
            self.seen_sos = true;
            // Sequential decoding gets libjpeg-turbo's default tables for
            // empty slots 0 and 1 (jdhuff.c jinit_huff_decoder).
            let progressive = self.frame.as_ref().is_some_and(|f| f.progressive);
            if !progressive {
                if self.dc[0].is_none() {
                    self.dc[0] = std_table(&STD_DC_LUMA_BITS, &STD_DC_VALS, true);
                }
                if self.dc[1].is_none() {
                    self.dc[1] = std_table(&STD_DC_CHROMA_BITS, &STD_DC_VALS, true);
                }
                if self.ac[0].is_none() {
                    self.ac[0] = std_table(&STD_AC_LUMA_BITS, &STD_AC_LUMA_VALS, false);
                }
                if self.ac[1].is_none() {
                    self.ac[1] = std_table(&STD_AC_CHROMA_BITS, &STD_AC_CHROMA_VALS, false);
                }
            }
        }
        let frame = self
            .frame
            .as_mut()
            .ok_or_else(|| corrupt("scan before frame header"))?;
        if !frame.allocated {
            frame.allocated = true;
            for c in &mut frame.comps {
                c.plane = vec![0; c.bw * c.bh * 64];
                if frame.progressive {
                    c.coefs = vec![0; c.bw * c.bh * 64];
                }
            }
        }
        for sc in &scan.comps {
            let c = &frame.comps[sc.ci];
            if self.qt[c.tq].is_none() {
                return Err(corrupt(format!("missing quantization table {}", c.tq)));
            }
        }
        if frame.progressive {
            for sc in &scan.comps {
                let c = &mut frame.comps[sc.ci];
                if c.quant.is_none() {
                    c.quant = self.qt[c.tq].map(quant_for_idct);
                }
                c.scanned = true;
            }
            return progressive::decode_scan(self, data, pos, scan);
        }
        self.decode_sequential(data, pos, scan)
    }

    fn decode_sequential(&mut self, data: &[u8], pos: usize, scan: &Scan) -> Result<usize, Error> {
        let frame = self
            .frame
            .as_mut()
            .ok_or_else(|| corrupt("scan before frame header"))?;
        struct Active<'t> {
            ci: usize,
            dc: &'t HuffTable,
            ac: &'t HuffTable,
            q: [i32; 64],
        }
        let mut active = Vec::with_capacity(scan.comps.len());
        for sc in &scan.comps {
            let c = &mut frame.comps[sc.ci];
            if c.scanned {
                return Err(corrupt("component appears in more than one scan"));
            }
            c.scanned = true;
            let qt = self.qt[c.tq].ok_or_else(|| corrupt("missing quantization table"))?;
            active.push(Active {
                ci: sc.ci,
                dc: huff_table(&self.dc[sc.td], "DC", sc.td)?,
                ac: huff_table(&self.ac[sc.ta], "AC", sc.ta)?,
                q: quant_for_idct(qt),
            });
        }
        let single = active.len() == 1;
        let (per_row, rows) = if single {
            let c = &frame.comps[active[0].ci];
            (c.wb, c.hb)
        } else {
            (frame.mcus_x, frame.mcus_y)
        };
        let mut restarts = Restarts::new(self.restart_interval);
        let mut br = BitReader::new(data, pos);
        let mut preds = [0i32; 4];
        let mut blk = [0i16; 64];
        for my in 0..rows {
            for mx in 0..per_row {
                if restarts.before_mcu(&mut br)? {
                    preds = [0; 4];
                }
                for (a, pred) in active.iter().zip(preds.iter_mut()) {
                    let c = &mut frame.comps[a.ci];
                    let (bh, bv) = if single { (1, 1) } else { (c.h, c.v) };
                    let stride = c.stride;
                    for v in 0..bv {
                        for h in 0..bh {
                            let last = decode_block(&mut br, a.dc, a.ac, pred, &mut blk)?;
                            let (bx, by) = (mx * bh + h, my * bv + v);
                            let out = &mut c.plane[by * 8 * stride + bx * 8..];
                            if last == 0 {
                                let val = dc_only_value(blk[0], a.q[0]);
                                for r in 0..8 {
                                    out[r * stride..r * stride + 8].fill(val);
                                }
                                blk[0] = 0;
                            } else {
                                idct_islow(&blk, &a.q, out, stride);
                                blk = [0; 64];
                            }
                        }
                    }
                }
                br.check()?;
            }
        }
        br.finish()
    }

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

/// `jddctmgr.c` stores ISLOW multipliers as `short`.
pub(crate) fn quant_for_idct(q: [u16; 64]) -> [i32; 64] {
    q.map(|v| i32::from(v as i16))
}

/// One sequential-mode block per `jdhuff.c decode_mcu`, coefficients to
/// natural order. Returns the zigzag index of the last nonzero AC
/// coefficient (0 when there is none).
#[inline(always)]
fn decode_block(
    br: &mut BitReader<'_>,
    dc: &HuffTable,
    ac: &HuffTable,
    pred: &mut i32,
    blk: &mut [i16; 64],
) -> Result<usize, Error> {
    br.ensure();
    let s = u32::from(dc.decode(br)?);
    if s != 0 {
        *pred = pred.wrapping_add(br.receive_extend(s));
    }
    // JCOEF is 16 bits; libjpeg truncates the running DC the same way.
    blk[0] = *pred as i16;
    let mut k = 1usize;
    let mut last = 0usize;
    while k < 64 {
        br.ensure();
        let f = ac.fast_ac(br);
        if f != 0 {
            k += ((f >> 4) & 15) as usize;
            if k > 63 {
                return Err(coef_overflow());
            }
            br.consume((f & 15) as u32);
            blk[ZIGZAG[k]] = f >> 8;
            last = k;
            k += 1;
            continue;
        }
        let rs = ac.decode(br)?;
        let (r, s) = (usize::from(rs >> 4), u32::from(rs & 15));
        if s != 0 {
            k += r;
            if k > 63 {
                return Err(coef_overflow());
            }
            blk[ZIGZAG[k]] = br.receive_extend(s) as i16;
            last = k;
            k += 1;
        } else if r == 15 {
            k += 16;
            if k > 64 {
                return Err(coef_overflow());
            }
        } else {
            break;
        }
    }
    Ok(last)
}

pub(crate) fn coef_overflow() -> Error {
    corrupt("coefficient index past the end of a block")
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
