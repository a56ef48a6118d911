//! Sequential (baseline and extended) Huffman scan decoding (`jdhuff.c`,
//! `jdcoefct.c`): each block's coefficients, dequantized through the IDCT
//! straight into its component's plane.

use super::error::{coef_overflow, corrupt, Error};
use super::huffman::{BitReader, HuffTable, Restarts};
use super::idct::{dc_only_value, idct_islow, quant_for_idct};
use super::state::{huff_table, Decoder, HuffSlot, Scan, ZIGZAG};

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

/// Sequential decoding gets libjpeg-turbo's default tables for empty slots
/// 0 and 1 (jdhuff.c jinit_huff_decoder).
pub(super) fn default_tables(d: &mut Decoder<'_>) {
    if d.dc[0].is_none() {
        d.dc[0] = std_table(&STD_DC_LUMA_BITS, &STD_DC_VALS, true);
    }
    if d.dc[1].is_none() {
        d.dc[1] = std_table(&STD_DC_CHROMA_BITS, &STD_DC_VALS, true);
    }
    if d.ac[0].is_none() {
        d.ac[0] = std_table(&STD_AC_LUMA_BITS, &STD_AC_LUMA_VALS, false);
    }
    if d.ac[1].is_none() {
        d.ac[1] = std_table(&STD_AC_CHROMA_BITS, &STD_AC_CHROMA_VALS, false);
    }
}

impl Decoder<'_> {
    pub(super) fn decode_sequential(
        &mut self,
        data: &[u8],
        pos: usize,
        scan: &Scan,
    ) -> Result<usize, Error> {
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
