//! Progressive (SOF2) Huffman decoding, after `jdphuff.c`.
//!
//! Coefficients accumulate over all scans and are transformed once at the
//! end, as libjpeg does when it absorbs a multi-scan file before output.
//! libjpeg smooths blocks whose low-frequency AC coefficients never became
//! exact (`jdcoefct.c` block smoothing); that case is reported as
//! unsupported instead of being approximated.

use super::error::{coef_overflow, corrupt, Error};
use super::huffman::{BitReader, HuffTable, Restarts};
use super::idct::idct_islow;
use super::state::{huff_table, Decoder, Frame, Scan, ZIGZAG};

/// Coefficients 1..SAVED_COEFS decide libjpeg-turbo's `smoothing_ok`.
const SAVED_COEFS: usize = 10;

pub(crate) fn decode_scan(
    d: &mut Decoder<'_>,
    data: &[u8],
    pos: usize,
    scan: &Scan,
) -> Result<usize, Error> {
    let frame = d
        .frame
        .as_mut()
        .ok_or_else(|| corrupt("scan before frame header"))?;
    let (ss, se, ah, al) = (usize::from(scan.ss), usize::from(scan.se), scan.ah, scan.al);
    let dc_band = ss == 0;
    let bad = if dc_band {
        se != 0
    } else {
        ss > se || se > 63 || scan.comps.len() != 1
    } || (ah != 0 && al + 1 != ah)
        || al > 13;
    if bad {
        return Err(corrupt("invalid progressive scan parameters"));
    }
    // libjpeg only warns about an inconsistent progression; a stream that
    // refines bits it never sent is treated as corrupt here.
    for sc in &scan.comps {
        let bits = &mut frame.comps[sc.ci].coef_bits;
        if !dc_band && bits[0] < 0 {
            return Err(corrupt("AC scan before the first DC scan"));
        }
        for b in &mut bits[ss..=se] {
            // A band's first scan may come only once; this also bounds the
            // number of scans, and so the work, a hostile file can demand.
            if ah == 0 && *b >= 0 {
                return Err(corrupt("coefficient band sent twice"));
            }
            let expected = (*b).max(0) as u8;
            if ah != expected {
                return Err(corrupt("inconsistent progressive refinement"));
            }
            *b = al as i8;
        }
    }

    let mut tables: Vec<&HuffTable> = Vec::with_capacity(scan.comps.len());
    for sc in &scan.comps {
        if dc_band {
            if ah == 0 {
                tables.push(huff_table(&d.dc[sc.td], "DC", sc.td)?);
            }
        } else {
            tables.push(huff_table(&d.ac[sc.ta], "AC", sc.ta)?);
        }
    }

    let single = scan.comps.len() == 1;
    let (per_row, rows) = if single {
        let c = &frame.comps[scan.comps[0].ci];
        (c.wb, c.hb)
    } else {
        (frame.mcus_x, frame.mcus_y)
    };
    let mut restarts = Restarts::new(d.restart_interval);
    let mut br = BitReader::new(data, pos);
    let mut preds = [0i32; 4];
    let mut eobrun = 0u32;
    for my in 0..rows {
        for mx in 0..per_row {
            if restarts.before_mcu(&mut br)? {
                preds = [0; 4];
                eobrun = 0;
            }
            for (si, sc) in scan.comps.iter().enumerate() {
                let c = &mut frame.comps[sc.ci];
                let (bh, bv) = if single { (1, 1) } else { (c.h, c.v) };
                for v in 0..bv {
                    for h in 0..bh {
                        let (bx, by) = (mx * bh + h, my * bv + v);
                        let at = (by * c.bw + bx) * 64;
                        let blk: &mut [i16; 64] = (&mut c.coefs[at..at + 64])
                            .try_into()
                            .map_err(|_| corrupt("block index"))?;
                        br.ensure();
                        match (dc_band, ah == 0) {
                            (true, true) => {
                                let s = u32::from(tables[si].decode(&mut br)?);
                                if s != 0 {
                                    preds[si] = preds[si].wrapping_add(br.receive_extend(s));
                                }
                                blk[0] = preds[si].wrapping_shl(u32::from(al)) as i16;
                            }
                            (true, false) => {
                                if br.peek(1) != 0 {
                                    blk[0] |= 1 << al;
                                }
                                br.consume(1);
                            }
                            (false, true) => {
                                ac_first(&mut br, tables[0], blk, ss, se, al, &mut eobrun)?
                            }
                            (false, false) => {
                                ac_refine(&mut br, tables[0], blk, ss, se, al, &mut eobrun)?
                            }
                        }
                    }
                }
            }
            br.check()?;
        }
    }
    br.finish()
}

fn ac_first(
    br: &mut BitReader<'_>,
    table: &HuffTable,
    blk: &mut [i16; 64],
    ss: usize,
    se: usize,
    al: u8,
    eobrun: &mut u32,
) -> Result<(), Error> {
    if *eobrun > 0 {
        *eobrun -= 1;
        return Ok(());
    }
    let mut k = ss;
    while k <= se {
        br.ensure();
        let rs = table.decode(br)?;
        let (r, s) = (usize::from(rs >> 4), u32::from(rs & 15));
        if s != 0 {
            k += r;
            if k > se {
                return Err(coef_overflow());
            }
            let v = br.receive_extend(s);
            blk[ZIGZAG[k]] = v.wrapping_shl(u32::from(al)) as i16;
        } else if r == 15 {
            k += 15;
        } else {
            let mut run = 1u32 << r;
            if r != 0 {
                run += br.peek(r as u32);
                br.consume(r as u32);
            }
            *eobrun = run - 1;
            break;
        }
        k += 1;
    }
    Ok(())
}

fn ac_refine(
    br: &mut BitReader<'_>,
    table: &HuffTable,
    blk: &mut [i16; 64],
    ss: usize,
    se: usize,
    al: u8,
    eobrun: &mut u32,
) -> Result<(), Error> {
    let p1: i16 = 1 << al;
    let m1: i16 = -1i16 << al;
    // Correction bit for an already-nonzero coefficient.
    let refine = |br: &mut BitReader<'_>, coef: &mut i16| {
        br.ensure();
        let bit = br.peek(1);
        br.consume(1);
        if bit != 0 && *coef & p1 == 0 {
            *coef = coef.wrapping_add(if *coef >= 0 { p1 } else { m1 });
        }
    };
    let mut k = ss;
    if *eobrun == 0 {
        while k <= se {
            br.ensure();
            let rs = table.decode(br)?;
            let (mut r, s) = (i32::from(rs >> 4), rs & 15);
            let mut value = 0i16;
            if s != 0 {
                if s != 1 {
                    return Err(corrupt("bad coefficient size in refinement scan"));
                }
                value = if br.peek(1) != 0 { p1 } else { m1 };
                br.consume(1);
            } else if r != 15 {
                let mut run = 1u32 << r;
                if r != 0 {
                    run += br.peek(r as u32);
                    br.consume(r as u32);
                }
                *eobrun = run;
                break;
            }
            // Skip r zero coefficients, refining nonzero ones on the way.
            loop {
                let coef = &mut blk[ZIGZAG[k]];
                if *coef != 0 {
                    refine(br, coef);
                } else {
                    r -= 1;
                    if r < 0 {
                        break;
                    }
                }
                k += 1;
                if k > se {
                    break;
                }
            }
            if value != 0 {
                if k > se {
                    return Err(coef_overflow());
                }
                blk[ZIGZAG[k]] = value;
            }
            k += 1;
        }
    }
    if *eobrun > 0 {
        while k <= se {
            let coef = &mut blk[ZIGZAG[k]];
            if *coef != 0 {
                refine(br, coef);
            }
            k += 1;
        }
        *eobrun -= 1;
    }
    Ok(())
}

/// Transforms the accumulated coefficients into the sample planes.
pub(crate) fn finish(frame: &mut Frame) -> Result<(), Error> {
    for c in &frame.comps {
        if c.coef_bits[1..SAVED_COEFS].iter().any(|&b| b != 0) {
            return Err(Error::Unsupported(
                "progressive JPEG with unrefined low-frequency coefficients (libjpeg block smoothing)"
                    .into(),
            ));
        }
    }
    for c in &mut frame.comps {
        let q = c
            .quant
            .ok_or_else(|| corrupt("component without quantization table"))?;
        let stride = c.bw * 8;
        for by in 0..c.bh {
            for bx in 0..c.bw {
                let at = (by * c.bw + bx) * 64;
                let blk: &[i16; 64] = c.coefs[at..at + 64]
                    .try_into()
                    .map_err(|_| corrupt("block index"))?;
                idct_islow(blk, &q, &mut c.plane[by * 8 * stride + bx * 8..], stride);
            }
        }
    }
    Ok(())
}
