//! Parquet's RLE / bit-packing hybrid encoding as the in-place reader
//! meets it: repetition and definition levels checked run by run, and int8
//! dictionary indices looked up a vector at a time.

use parquet::basic::Encoding;

use super::{layout, Layout};

/// Bits of a level up to `max`.
pub(super) fn bit_width(max: i16) -> u8 {
    (16 - (max.max(0) as u16).leading_zeros()) as u8
}

/// The int8 dictionary of a chunk: at most 256 INT32 values, each an int8.
pub(super) fn int8_dictionary(
    buf: &[u8],
    n: u32,
    encoding: Encoding,
) -> Result<Dictionary, Layout> {
    if !matches!(encoding, Encoding::PLAIN | Encoding::PLAIN_DICTIONARY) {
        return layout(format!("a {encoding} dictionary"));
    }
    if n > 256 || buf.len() != n as usize * 4 {
        return layout(format!("a dictionary of {n} values in {} bytes", buf.len()));
    }
    let values = buf
        .as_chunks::<4>()
        .0
        .iter()
        .map(|v| {
            let v = i32::from_le_bytes(*v);
            i8::try_from(v).or_else(|_| layout(format!("int8 dictionary value {v}")))
        })
        .collect::<Result<Vec<i8>, Layout>>()?;
    Ok(Dictionary::new(&values))
}

/// An int8 dictionary as a full 256-entry table (so a byte index needs no
/// bounds check) and how many entries are real.
pub(super) struct Dictionary {
    table: [i8; 256],
    len: usize,
}

impl Dictionary {
    /// At most 256 values.
    fn new(values: &[i8]) -> Dictionary {
        let mut table = [0i8; 256];
        table[..values.len()].copy_from_slice(values);
        Dictionary {
            table,
            len: values.len(),
        }
    }

    /// Entry `i`, or the error of an index past the dictionary.
    fn get(&self, i: u32) -> Result<i8, Layout> {
        if (i as usize) < self.len {
            Ok(self.table[i as usize])
        } else {
            layout(format!("dictionary index {i} of {}", self.len))
        }
    }
}

/// The repetition levels of values `v0..v0 + n` of a FixedSizeList of `dim`:
/// 0 exactly where a row starts, 1 elsewhere. Checked run by run: a run of
/// 1s is one comparison however long.
pub(super) fn check_rep(levels: &[u8], w: u8, n: usize, v0: u64, dim: u64) -> Result<(), Layout> {
    let mut p = v0;
    let end = v0 + n as u64;
    let mut h = Hybrid::new(levels, w)?;
    while p < end {
        match h.next_run()? {
            Run::Rle { value, count } => {
                let c = count.min(end - p);
                let ok = match value {
                    0 => p.is_multiple_of(dim) && (c == 1 || dim == 1),
                    1 => !p.is_multiple_of(dim) && p % dim + c <= dim,
                    _ => false,
                };
                if !ok {
                    return layout(format!("lists of other than {dim} values"));
                }
                p += c;
            }
            Run::Packed { bytes, count } if w == 1 => {
                // A byte of eight levels at once: its bits are 1 but where
                // a row starts (the writers' pattern: a packed group around
                // each row start, RLE runs of 1s between).
                let c = count.min(end - p);
                for (b, i) in bytes.iter().zip((0..c).step_by(8)) {
                    let k = (c - i).min(8);
                    let mask = ((1u16 << k) - 1) as u8;
                    let mut want = mask;
                    let mut o = (dim - (p + i) % dim) % dim;
                    while o < k {
                        want &= !(1 << o);
                        o += dim;
                    }
                    if b & mask != want {
                        return layout(format!("lists of other than {dim} values"));
                    }
                }
                p += c;
            }
            Run::Packed { bytes, count } => {
                let c = count.min(end - p);
                for i in 0..c {
                    let starts = unpack(bytes, w, i as usize) == 0;
                    if starts != (p + i).is_multiple_of(dim) {
                        return layout(format!("lists of other than {dim} values"));
                    }
                }
                p += c;
            }
        }
    }
    Ok(())
}

/// The definition levels of `n` values are all `max`: no null list, no
/// null value.
pub(super) fn check_def(levels: &[u8], w: u8, n: usize, max: u32) -> Result<(), Layout> {
    let mut left = n as u64;
    let mut h = Hybrid::new(levels, w)?;
    while left > 0 {
        let (ok, c) = match h.next_run()? {
            Run::Rle { value, count } => (value == max, count.min(left)),
            Run::Packed { bytes, count } => {
                let c = count.min(left);
                ((0..c as usize).all(|i| unpack(bytes, w, i) == max), c)
            }
        };
        if !ok {
            return layout("nulls");
        }
        left -= c;
    }
    Ok(())
}

/// Value `i` of a bit-packed run of `w`-bit values (LSB first).
#[inline]
fn unpack(bytes: &[u8], w: u8, i: usize) -> u32 {
    let bit = i * w as usize;
    let mut word = [0u8; 8];
    let from = bit / 8;
    let avail = bytes.len().saturating_sub(from).min(8);
    word[..avail].copy_from_slice(&bytes[from..from + avail]);
    let v = u64::from_le_bytes(word) >> (bit % 8);
    (v & ((1u64 << w) - 1)) as u32
}

/// One run of Parquet's RLE / bit-packing hybrid encoding.
enum Run<'a> {
    /// `count` copies of `value`.
    Rle { value: u32, count: u64 },
    /// `count` values bit-packed in `bytes`.
    Packed { bytes: &'a [u8], count: u64 },
}

/// How many of the first `n` levels in `data` (RLE / bit-packed hybrid,
/// no length prefix) equal `max`: the values a page of a flat column holds.
pub fn count_at_max(data: &[u8], max: i16, n: usize) -> Result<usize, Layout> {
    let w = bit_width(max);
    let mut h = Hybrid::new(data, w)?;
    let (mut left, mut at_max) = (n as u64, 0u64);
    while left > 0 {
        match h.next_run()? {
            Run::Rle { value, count } => {
                let take = count.min(left);
                if value == max as u32 {
                    at_max += take;
                }
                left -= take;
            }
            Run::Packed { bytes, count } => {
                let take = count.min(left);
                for i in 0..take as usize {
                    if unpack(bytes, w, i) == max as u32 {
                        at_max += 1;
                    }
                }
                left -= take;
            }
        }
    }
    Ok(at_max as usize)
}

/// A reader of Parquet's RLE / bit-packing hybrid encoding, `w` bits a value
/// (levels, and dictionary indices).
pub(super) struct Hybrid<'a> {
    data: &'a [u8],
    w: u8,
    /// The run being decoded, and how far into it.
    run: Option<(Run<'a>, u64)>,
}

impl<'a> Hybrid<'a> {
    pub(super) fn new(data: &'a [u8], w: u8) -> Result<Hybrid<'a>, Layout> {
        if w > 8 {
            // More than 256 dictionary entries: not an int8 dictionary.
            return layout(format!("dictionary indices of {w} bits"));
        }
        Ok(Hybrid { data, w, run: None })
    }

    fn next_run(&mut self) -> Result<Run<'a>, Layout> {
        let mut header = 0u64;
        let mut shift = 0;
        loop {
            let Some((&b, rest)) = self.data.split_first() else {
                return layout("RLE data ends before its values");
            };
            self.data = rest;
            header |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 28 {
                return layout("an RLE run header over 32 bits");
            }
        }
        let w = self.w as usize;
        if header & 1 == 1 {
            let groups = (header >> 1) as usize;
            let len = groups * w;
            if len > self.data.len() {
                return layout("a bit-packed run past the end of its data");
            }
            let (bytes, rest) = self.data.split_at(len);
            self.data = rest;
            Ok(Run::Packed {
                bytes,
                count: groups as u64 * 8,
            })
        } else {
            let nb = w.div_ceil(8);
            if nb > self.data.len() {
                return layout("an RLE run past the end of its data");
            }
            let (v, rest) = self.data.split_at(nb);
            self.data = rest;
            let mut word = [0u8; 4];
            word[..nb].copy_from_slice(v);
            Ok(Run::Rle {
                value: u32::from_le_bytes(word),
                count: header >> 1,
            })
        }
    }

    /// Decodes the next `m` indices through `dict` onto `out`.
    pub(super) fn decode_into(
        &mut self,
        m: usize,
        dict: &Dictionary,
        out: &mut Vec<i8>,
    ) -> Result<(), Layout> {
        let mut left = m as u64;
        while left > 0 {
            let (run, at) = match self.run.take() {
                Some(r) => r,
                None => (self.next_run()?, 0),
            };
            let (count, take) = match &run {
                Run::Rle { count, .. } | Run::Packed { count, .. } => {
                    (*count, (*count - at).min(left))
                }
            };
            match &run {
                Run::Rle { value, .. } => {
                    out.extend(std::iter::repeat_n(dict.get(*value)?, take as usize));
                }
                Run::Packed { bytes, .. } if self.w == 8 => {
                    // The chip writer's case (a dictionary of over 128
                    // values): one byte an index, checked at once, looked up
                    // without a bounds check each.
                    let s = &bytes[at as usize..(at + take) as usize];
                    dict.get(u32::from(s.iter().copied().max().unwrap_or(0)))?;
                    lookup(s, &dict.table, out);
                }
                Run::Packed { bytes, .. } => {
                    for i in at..at + take {
                        out.push(dict.get(unpack(bytes, self.w, i as usize))?);
                    }
                }
            }
            left -= take;
            if at + take < count {
                self.run = Some((run, at + take));
            }
        }
        Ok(())
    }
}

/// `table[i]` of each index `i`, onto `out`.
fn lookup(indices: &[u8], table: &[i8; 256], out: &mut Vec<i8>) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512vbmi") && std::is_x86_feature_detected!("avx512bw") {
        // SAFETY: the CPU has AVX-512 VBMI and BW, checked just above.
        unsafe { lookup_vbmi(indices, table, out) };
        return;
    }
    lookup_scalar(indices, table, out);
}

fn lookup_scalar(indices: &[u8], table: &[i8; 256], out: &mut Vec<i8>) {
    out.extend(indices.iter().map(|&i| table[usize::from(i)]));
}

/// [`lookup`] 64 indices an instruction pair: `vpermi2b` looks up 128
/// entries at once, the index's top bit picks the half. The scalar lookup
/// was 42 % of an int8 resident search (one load and one store a byte).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn lookup_vbmi(indices: &[u8], table: &[i8; 256], out: &mut Vec<i8>) {
    use std::arch::x86_64::{
        __m512i, _mm512_loadu_si512, _mm512_mask_blend_epi8, _mm512_movepi8_mask,
        _mm512_permutex2var_epi8, _mm512_storeu_si512,
    };
    let (chunks, rest) = indices.as_chunks::<64>();
    out.reserve(chunks.len() * 64 + rest.len());
    let t = table.as_ptr().cast::<__m512i>();
    // SAFETY: `table` is 256 bytes, four unaligned 64-byte loads; `out` has
    // room for every chunk (reserved above), and its length covers them
    // only once they are written.
    unsafe {
        let (t0, t1, t2, t3) = (
            _mm512_loadu_si512(t),
            _mm512_loadu_si512(t.add(1)),
            _mm512_loadu_si512(t.add(2)),
            _mm512_loadu_si512(t.add(3)),
        );
        let start = out.len();
        let dst = out.as_mut_ptr().add(start).cast::<__m512i>();
        for (k, c) in chunks.iter().enumerate() {
            let i = _mm512_loadu_si512(c.as_ptr().cast());
            let lo = _mm512_permutex2var_epi8(t0, i, t1);
            let hi = _mm512_permutex2var_epi8(t2, i, t3);
            _mm512_storeu_si512(
                dst.add(k),
                _mm512_mask_blend_epi8(_mm512_movepi8_mask(i), lo, hi),
            );
        }
        out.set_len(start + chunks.len() * 64);
    }
    lookup_scalar(rest, table, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RLE run of the hybrid encoding: `count` copies of a value under 256.
    fn rle(value: u8, count: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut h = count << 1;
        loop {
            let b = (h & 0x7f) as u8;
            h >>= 7;
            if h == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        }
        out.push(value);
        out
    }

    #[test]
    fn repetition_levels_must_start_a_row_every_dim_values() {
        // dim 4, 3 rows: 0 then three 1s, thrice.
        let mut good = Vec::new();
        for _ in 0..3 {
            good.extend(rle(0, 1));
            good.extend(rle(1, 3));
        }
        check_rep(&good, 1, 12, 0, 4).unwrap();
        // The same levels for a page that starts mid-row do not fit.
        assert!(check_rep(&good, 1, 12, 2, 4).is_err());
        // Ragged: 0 then four 1s.
        let mut ragged = rle(0, 1);
        ragged.extend(rle(1, 4));
        assert!(check_rep(&ragged, 1, 5, 0, 4).is_err());
        // Bit-packed: one group of 8 levels 0,1,1,1,0,1,1,1 = 0b1110_1110.
        check_rep(&[0b11, 0b1110_1110], 1, 8, 0, 4).unwrap();
        assert!(check_rep(&[0b11, 0b1110_1101], 1, 8, 0, 4).is_err());
        // Two bytes, rows of 3 from value 1: 1,1,0 | 1,1,0 | ... (LSB first).
        let bits = |v: u64, dim: u64, n: u64| -> u16 {
            (0..n)
                .map(|i| u16::from(!(v + i).is_multiple_of(dim)) << i)
                .sum()
        };
        let two = bits(1, 3, 16).to_le_bytes();
        check_rep(&[0b101, two[0], two[1]], 1, 16, 1, 3).unwrap();
        check_rep(&[0b101, two[0], two[1]], 1, 13, 1, 3).unwrap();
        assert!(check_rep(&[0b101, two[0], two[1]], 1, 16, 0, 3).is_err());
        let mut bad = two;
        bad[1] ^= 0b100;
        assert!(check_rep(&[0b101, bad[0], bad[1]], 1, 16, 1, 3).is_err());
        // Past the values given, a packed group's padding is not read.
        check_rep(&[0b101, two[0], two[1] ^ 0x80], 1, 15, 1, 3).unwrap();
        assert!(check_rep(&[0b101, two[0], two[1] ^ 0x80], 1, 16, 1, 3).is_err());
        // Levels that end before their values.
        assert!(check_rep(&rle(0, 1), 1, 4, 0, 4).is_err());
    }

    #[test]
    fn definition_levels_below_the_max_are_nulls() {
        check_def(&rle(2, 10), 2, 10, 2).unwrap();
        assert!(check_def(&rle(1, 10), 2, 10, 2).is_err());
        // A huge run covering fewer values is fine; a short one is not.
        check_def(&rle(2, 1 << 30), 2, 10, 2).unwrap();
        assert!(check_def(&rle(2, 3), 2, 10, 2).is_err());
    }

    #[test]
    fn dictionary_indices_decode_through_the_dictionary() {
        let dict = Dictionary::new(&[-128, 0, 127, 5]);
        // An RLE run of index 2 (5 values), then a bit-packed group of 8
        // 2-bit indices 0..4, 0..4.
        let mut data = rle(2, 5);
        data.push(0b11);
        data.extend([0b1110_0100, 0b1110_0100]);
        let mut h = Hybrid::new(&data, 2).unwrap();
        let mut out = Vec::new();
        h.decode_into(3, &dict, &mut out).unwrap();
        h.decode_into(10, &dict, &mut out).unwrap();
        assert_eq!(
            out,
            [127, 127, 127, 127, 127, -128, 0, 127, 5, -128, 0, 127, 5]
        );
        // An index past the dictionary, and a run past the data.
        let past = rle(9, 1);
        let mut h = Hybrid::new(&past, 8).unwrap();
        assert!(h.decode_into(1, &dict, &mut Vec::new()).is_err());
        let mut h = Hybrid::new(&[0b1001, 1, 2], 8).unwrap();
        assert!(h.decode_into(8, &dict, &mut Vec::new()).is_err());
        assert!(Hybrid::new(&[], 9).is_err());
    }

    #[test]
    fn dictionary_lookups_agree_with_the_scalar_one() {
        let table: [i8; 256] = std::array::from_fn(|i| (i as u8).wrapping_mul(151) as i8);
        for n in [0, 1, 63, 64, 65, 200, 1000] {
            let idx: Vec<u8> = (0..n).map(|i| (i * 89 + 7) as u8).collect();
            let (mut fast, mut slow) = (vec![3i8], vec![3i8]);
            lookup(&idx, &table, &mut fast);
            lookup_scalar(&idx, &table, &mut slow);
            assert_eq!(fast, slow, "{n}");
            assert_eq!(slow[1..].len(), n);
        }
        let all: Vec<u8> = (0..=255).collect();
        let mut out = Vec::new();
        lookup(&all, &table, &mut out);
        assert_eq!(out, table);
    }

    #[test]
    fn run_headers_are_bounded() {
        let mut h = Hybrid::new(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01], 1).unwrap();
        assert!(h.next_run().is_err());
        let mut h = Hybrid::new(&[0x80], 1).unwrap();
        assert!(h.next_run().is_err());
    }
}
