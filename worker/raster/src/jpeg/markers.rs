//! Marker and segment parsing (`jdmarker.c`): the frame header, tables,
//! restart interval, JFIF/Adobe markers and scan headers, with every length
//! and index checked before use.

use super::error::{corrupt, Error};
use super::huffman::HuffTable;
use super::state::{Component, Decoder, Frame, Header, Scan, ScanComp, MAX_DIMENSION, ZIGZAG};
use super::upsample;

/// libjpeg's `D_MAX_BLOCKS_IN_MCU`.
const MAX_BLOCKS_IN_MCU: usize = 10;

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

impl Decoder<'_> {
    pub(super) fn parse_tables(&mut self, data: &[u8]) -> Result<(), Error> {
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

    pub(super) fn parse_image(&mut self, data: &[u8]) -> Result<(), Error> {
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
}
