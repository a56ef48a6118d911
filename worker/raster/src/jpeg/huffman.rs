//! Huffman tables and the entropy-coded-segment bit reader.
//!
//! Table construction follows `jdhuff.c jpeg_make_d_derived_tbl` so that the
//! same tables are rejected; decoding is canonical Huffman, so any correct
//! lookup strategy yields libjpeg's symbols.

use super::error::{corrupt, Error};

/// Bits resolved by one table lookup; longer codes take the bit-serial path.
const LOOKAHEAD: u32 = 9;

pub(crate) struct HuffTable {
    /// `(code length << 8) | symbol`, or 0 when the code is longer than
    /// `LOOKAHEAD` bits (or the bit pattern is not a code at all).
    lookup: [u16; 1 << LOOKAHEAD],
    /// For AC tables: entries for codes whose length plus extra bits fit in
    /// `LOOKAHEAD`, packed as `(value << 8) | (run << 4) | total_len`; 0 when
    /// the fast path does not apply. Saves a second refill/peek per coefficient.
    fast_ac: [i16; 1 << LOOKAHEAD],
    maxcode: [i32; 18],
    valoffset: [i32; 18],
    vals: [u8; 256],
    nvals: usize,
}

impl HuffTable {
    pub(crate) fn new(bits: &[u8; 16], vals: &[u8], is_dc: bool) -> Result<HuffTable, Error> {
        let bad = || corrupt("bad Huffman table");
        let mut huffsize = [0u8; 257];
        let mut huffcode = [0u32; 257];
        let mut p = 0usize;
        for (l, &count) in bits.iter().enumerate() {
            let count = usize::from(count);
            if p + count > 256 {
                return Err(bad());
            }
            huffsize[p..p + count].fill((l + 1) as u8);
            p += count;
        }
        let numsymbols = p;
        if vals.len() < numsymbols {
            return Err(bad());
        }

        // A code that ends up all ones (or overflows its length) means the
        // counts do not describe a prefix code; libjpeg rejects the table.
        let mut code = 0u32;
        let mut si = u32::from(huffsize[0]);
        p = 0;
        while huffsize[p] != 0 {
            while u32::from(huffsize[p]) == si {
                huffcode[p] = code;
                p += 1;
                code += 1;
            }
            if u64::from(code) >= 1u64 << si {
                return Err(bad());
            }
            code <<= 1;
            si += 1;
        }

        let mut maxcode = [-1i32; 18];
        let mut valoffset = [0i32; 18];
        p = 0;
        for l in 1..=16usize {
            let count = usize::from(bits[l - 1]);
            if count != 0 {
                valoffset[l] = p as i32 - huffcode[p] as i32;
                p += count;
                maxcode[l] = huffcode[p - 1] as i32;
            }
        }
        maxcode[17] = 0xFFFFF;

        let mut lookup = [0u16; 1 << LOOKAHEAD];
        p = 0;
        for l in 1..=LOOKAHEAD {
            for _ in 0..bits[l as usize - 1] {
                let first = (huffcode[p] << (LOOKAHEAD - l)) as usize;
                let n = 1usize << (LOOKAHEAD - l);
                lookup[first..first + n].fill(((l as u16) << 8) | u16::from(vals[p]));
                p += 1;
            }
        }

        if is_dc && vals[..numsymbols].iter().any(|&s| s > 15) {
            return Err(bad());
        }

        let mut fast_ac = [0i16; 1 << LOOKAHEAD];
        if !is_dc {
            for (i, entry) in fast_ac.iter_mut().enumerate() {
                let e = lookup[i];
                if e == 0 {
                    continue;
                }
                let len = u32::from(e >> 8);
                let rs = e as u8;
                let run = u32::from(rs >> 4);
                let size = u32::from(rs & 15);
                if size == 0 || len + size > LOOKAHEAD {
                    continue;
                }
                let bits_after = (i as u32) & ((1 << (LOOKAHEAD - len)) - 1);
                let raw = (bits_after >> (LOOKAHEAD - len - size)) as i32;
                let value = extend(raw, size);
                // Values of up to 8 bits fit the packed i16 entry.
                if !(-128..=127).contains(&value) {
                    continue;
                }
                *entry = ((value << 8) | ((run << 4) | (len + size)) as i32) as i16;
            }
        }

        let mut table_vals = [0u8; 256];
        table_vals[..numsymbols].copy_from_slice(&vals[..numsymbols]);
        Ok(HuffTable {
            lookup,
            fast_ac,
            maxcode,
            valoffset,
            vals: table_vals,
            nvals: numsymbols,
        })
    }

    /// Caller guarantees at least 16 buffered bits (`BitReader::ensure`).
    #[inline(always)]
    pub(crate) fn decode(&self, br: &mut BitReader<'_>) -> Result<u8, Error> {
        let e = self.lookup[br.peek(LOOKAHEAD) as usize];
        if e != 0 {
            br.consume(u32::from(e >> 8));
            return Ok(e as u8);
        }
        self.decode_slow(br)
    }

    #[inline(never)]
    fn decode_slow(&self, br: &mut BitReader<'_>) -> Result<u8, Error> {
        for l in (LOOKAHEAD + 1)..=16 {
            let code = br.peek(l) as i32;
            if code <= self.maxcode[l as usize] {
                br.consume(l);
                let idx = code + self.valoffset[l as usize];
                return match usize::try_from(idx) {
                    Ok(i) if i < self.nvals => Ok(self.vals[i]),
                    _ => Err(br.bad_code()),
                };
            }
        }
        Err(br.bad_code())
    }

    /// AC fast path: returns `(run, value)` packed entry or 0.
    #[inline(always)]
    pub(crate) fn fast_ac(&self, br: &BitReader<'_>) -> i16 {
        self.fast_ac[br.peek(LOOKAHEAD) as usize]
    }
}

/// `HUFF_EXTEND`: map `s` raw magnitude bits to a signed value.
#[inline(always)]
pub(crate) fn extend(v: i32, s: u32) -> i32 {
    if v < (1 << (s - 1)) {
        v - (1 << s) + 1
    } else {
        v
    }
}

/// Reads entropy-coded bits, unstuffing `FF 00` and stopping at markers.
///
/// Past a marker (or the end of input) it supplies zero bits like libjpeg,
/// but counts them so the decoder can fail instead of emitting data made of
/// padding: `nbits < fake` means padding has been consumed.
pub(crate) struct BitReader<'a> {
    data: &'a [u8],
    pos: usize,
    /// Unconsumed bits, MSB first; bits below `nbits` are always zero.
    buf: u64,
    nbits: u32,
    fake: u32,
    at_marker: bool,
}

impl<'a> BitReader<'a> {
    pub(crate) fn new(data: &'a [u8], pos: usize) -> BitReader<'a> {
        BitReader {
            data,
            pos,
            buf: 0,
            nbits: 0,
            fake: 0,
            at_marker: false,
        }
    }

    /// Makes at least 32 bits available: enough for a 16-bit code plus
    /// 16 extra bits.
    #[inline(always)]
    pub(crate) fn ensure(&mut self) {
        if self.nbits < 32 {
            self.refill();
        }
    }

    #[inline(never)]
    fn refill(&mut self) {
        if !self.at_marker {
            if let Some(chunk) = self.data.get(self.pos..self.pos + 8) {
                let mut be = [0u8; 8];
                be.copy_from_slice(chunk);
                let w = u64::from_be_bytes(be);
                let x = !w;
                let has_ff = x.wrapping_sub(0x0101_0101_0101_0101) & !x & 0x8080_8080_8080_8080;
                if has_ff == 0 {
                    let take = (64 - self.nbits) / 8;
                    let newbits = self.nbits + take * 8;
                    let keep = !u64::MAX.checked_shr(newbits).unwrap_or(0);
                    self.buf |= (w >> self.nbits) & keep;
                    self.nbits = newbits;
                    self.pos += take as usize;
                    return;
                }
            }
        }
        while self.nbits <= 56 {
            let byte = self.next_byte();
            self.buf |= u64::from(byte) << (56 - self.nbits);
            self.nbits += 8;
        }
    }

    fn next_byte(&mut self) -> u8 {
        if !self.at_marker {
            if let Some(&b) = self.data.get(self.pos) {
                if b != 0xFF {
                    self.pos += 1;
                    return b;
                }
                // libjpeg treats FF FF ... 00 as one stuffed FF data byte.
                let mut j = self.pos + 1;
                while self.data.get(j) == Some(&0xFF) {
                    j += 1;
                }
                if self.data.get(j) == Some(&0) {
                    self.pos = j + 1;
                    return 0xFF;
                }
            }
            // `pos` stays on the marker's first FF for the marker parser.
            self.at_marker = true;
        }
        self.fake += 8;
        0
    }

    #[inline(always)]
    pub(crate) fn peek(&self, n: u32) -> u32 {
        (self.buf >> (64 - n)) as u32
    }

    #[inline(always)]
    pub(crate) fn consume(&mut self, n: u32) {
        self.buf <<= n;
        self.nbits -= n;
    }

    /// `s` in 1..=15 magnitude bits, sign-extended per `HUFF_EXTEND`.
    #[inline(always)]
    pub(crate) fn receive_extend(&mut self, s: u32) -> i32 {
        let v = self.peek(s) as i32;
        self.consume(s);
        extend(v, s)
    }

    #[inline(always)]
    pub(crate) fn overran(&self) -> bool {
        self.nbits < self.fake
    }

    #[inline(always)]
    pub(crate) fn check(&self) -> Result<(), Error> {
        if self.overran() {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    fn bad_code(&self) -> Error {
        if self.overran() {
            Error::Truncated
        } else {
            corrupt("invalid Huffman code in scan data")
        }
    }

    /// Ends an entropy-coded segment: everything but the final byte's padding
    /// must have been used. Returns the position of the terminating marker.
    pub(crate) fn finish(&self) -> Result<usize, Error> {
        self.check()?;
        let real = self.nbits - self.fake;
        if real >= 8 {
            return Err(corrupt("extraneous bytes in scan data"));
        }
        if self.at_marker || self.pos >= self.data.len() {
            return Ok(self.pos);
        }
        let mut p = self.pos;
        while self.data.get(p) == Some(&0xFF) {
            p += 1;
        }
        match self.data.get(p) {
            Some(&m) if p > self.pos && m != 0 => Ok(self.pos),
            None if p > self.pos => Ok(self.pos),
            _ => Err(corrupt("extraneous bytes in scan data")),
        }
    }

    /// Consumes the expected RSTn marker and resets the bit state.
    pub(crate) fn restart(&mut self, n: u8) -> Result<(), Error> {
        let mut p = self.finish()?;
        while self.data.get(p) == Some(&0xFF) {
            p += 1;
        }
        match self.data.get(p) {
            None => return Err(Error::Truncated),
            Some(&m) if m == 0xD0 + n => {}
            Some(&m) => {
                return Err(corrupt(format!(
                    "expected RST{n} marker, found 0xFF{m:02X}"
                )))
            }
        }
        self.pos = p + 1;
        self.buf = 0;
        self.nbits = 0;
        self.fake = 0;
        self.at_marker = false;
        Ok(())
    }
}

/// Restart-interval bookkeeping, shared by sequential and progressive scans.
pub(crate) struct Restarts {
    interval: usize,
    left: usize,
    next: u8,
}

impl Restarts {
    pub(crate) fn new(interval: u16) -> Restarts {
        let interval = usize::from(interval);
        Restarts {
            interval,
            left: interval,
            next: 0,
        }
    }

    /// Called before each MCU: at the end of an interval, consumes the
    /// expected RSTn marker. Returns true when it did, so the caller resets
    /// its DC predictions (and EOB run).
    pub(crate) fn before_mcu(&mut self, br: &mut BitReader<'_>) -> Result<bool, Error> {
        if self.interval == 0 {
            return Ok(false);
        }
        let restarted = self.left == 0;
        if restarted {
            br.restart(self.next)?;
            self.next = (self.next + 1) & 7;
            self.left = self.interval;
        }
        self.left -= 1;
        Ok(restarted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_all_ones_code() {
        let mut bits = [0u8; 16];
        bits[0] = 2;
        assert!(HuffTable::new(&bits, &[0, 1], false).is_err());
    }

    #[test]
    fn rejects_large_dc_symbol() {
        let mut bits = [0u8; 16];
        bits[1] = 1;
        assert!(HuffTable::new(&bits, &[16], true).is_err());
        assert!(HuffTable::new(&bits, &[16], false).is_ok());
    }

    #[test]
    fn unstuffs_and_pads() {
        let data = [0xFF, 0x00, 0x12, 0xFF, 0xD9];
        let mut br = BitReader::new(&data, 0);
        br.ensure();
        assert_eq!(br.peek(16), 0xFF12);
        br.consume(16);
        assert!(!br.overran());
        br.consume(1);
        assert!(br.overran());
    }
}
