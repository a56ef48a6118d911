//! A scan's setup, then its decoding: the sample planes (and a progressive
//! frame's coefficients) allocated at the first scan, the quantization
//! tables checked, and the scan handed to `sequential.rs` or
//! `progressive.rs`. Above both, so neither calls the other.

use super::error::{corrupt, Error};
use super::idct::quant_for_idct;
use super::progressive;
use super::sequential;
use super::state::{Decoder, Scan};

impl Decoder<'_> {
    pub(super) fn decode_scan(
        &mut self,
        data: &[u8],
        pos: usize,
        scan: &Scan,
    ) -> Result<usize, Error> {
        if !self.seen_sos {
            self.seen_sos = true;
            if !self.frame.as_ref().is_some_and(|f| f.progressive) {
                sequential::default_tables(self);
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
}
