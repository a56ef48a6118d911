//! The `embedding` column read in place from its Parquet pages.
//!
//! parquet-rs's arrow reader builds a FixedSizeList by materialising every
//! value's repetition and definition level (two `i16` a value) and copying the
//! values into an array: 27 % + 14 % + 12 % of a resident search
//! (docs/benchmarks.md). The chip writer stores an embedding uncompressed, one
//! list level, PLAIN (f32, f16) or dictionary-encoded (int8): the values of a
//! page are already the rows the kernels score. So this reads the pages with
//! parquet's own page reader, checks their levels run by run without
//! materialising them, and hands out whole rows: f32 and f16 straight from the
//! page, int8 through its dictionary in bounded segments.
//!
//! Everything here is judged from the file, which may be hostile: a layout it
//! does not take (another writer's dictionary-encoded floats, byte-stream
//! split, nulls, ragged lists) or a malformed page is a [`Decode::Layout`],
//! and the caller reads the row group again with the arrow reader, which
//! accepts or rejects it as it always did. No allocation follows a count in
//! the file: segments are bounded, and a page's values are checked against
//! the rows the row group may still hold.

use std::io::Cursor;
use std::sync::Arc;

use bytes::Bytes;
use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::column::page::{Page, PageReader};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;
use rsembed_schemas::embedding::EmbeddingType;

use super::Embeddings;
use crate::Error;

/// int8 values decoded at once (256 KiB): bounds the buffer whatever a
/// page's header claims; a row split between segments is joined as a row
/// split between pages is.
const SEGMENT_VALUES: usize = 1 << 18;

/// Rows of embeddings as they are stored, in the order of the row group.
#[derive(Debug, Clone, Copy)]
pub enum Stored<'a> {
    /// Float32 values in memory (the arrow reader's arrays).
    F32(&'a [f32]),
    /// Float32 values as the little-endian bytes of a page.
    F32Le(&'a [[u8; 4]]),
    /// Float16 values in memory.
    F16(&'a [half::f16]),
    /// Float16 values as the little-endian bytes of a page.
    F16Le(&'a [[u8; 2]]),
    /// Int8 values (the scale is not needed to rank: it cancels in the cosine).
    Int8(&'a [i8]),
}

impl<'a> Stored<'a> {
    /// Values in these rows.
    pub fn values(&self) -> usize {
        match self {
            Stored::F32(v) => v.len(),
            Stored::F32Le(v) => v.len(),
            Stored::F16(v) => v.len(),
            Stored::F16Le(v) => v.len(),
            Stored::Int8(v) => v.len(),
        }
    }

    /// Rows `start..start + len`.
    pub fn slice(self, start: usize, len: usize, dim: usize) -> Stored<'a> {
        let r = start * dim..(start + len) * dim;
        match self {
            Stored::F32(v) => Stored::F32(&v[r]),
            Stored::F32Le(v) => Stored::F32Le(&v[r]),
            Stored::F16(v) => Stored::F16(&v[r]),
            Stored::F16Le(v) => Stored::F16Le(&v[r]),
            Stored::Int8(v) => Stored::Int8(&v[r]),
        }
    }
}

impl<'a> From<Embeddings<'a>> for Stored<'a> {
    fn from(e: Embeddings<'a>) -> Stored<'a> {
        match e {
            Embeddings::F32(v) => Stored::F32(v),
            Embeddings::F16(v) => Stored::F16(v),
            Embeddings::Int8 { values, .. } => Stored::Int8(values),
        }
    }
}

/// Why a chunk was not read in place, or what stopped the caller's fold.
#[derive(Debug)]
pub enum Decode<E = Error> {
    /// The chunk is not laid out as this reader takes it, or is malformed:
    /// read it with the arrow reader instead.
    Layout(String),
    /// The fold failed: the search fails.
    Fold(E),
}

/// A chunk not laid out as this reader takes it: [`Decode::Layout`] before
/// the caller's error type is known.
#[derive(Debug)]
pub struct Layout(String);

impl<E> From<Layout> for Decode<E> {
    fn from(l: Layout) -> Decode<E> {
        Decode::Layout(l.0)
    }
}

fn layout<T, L: From<Layout>>(why: impl Into<String>) -> Result<T, L> {
    Err(Layout(why.into()).into())
}

/// Whether the column chunk `meta`, of an `embedding` stored as `ty`, can be
/// read in place: one leaf under one list level, of `ty`'s physical type,
/// and, for floats, without a dictionary. Judged from the footer alone,
/// before anything is fetched.
pub fn check(meta: &ColumnChunkMetaData, ty: EmbeddingType) -> Result<(), String> {
    let d = meta.column_descr();
    if d.max_rep_level() != 1 {
        return Err(format!(
            "{} repetition levels, not one list",
            d.max_rep_level()
        ));
    }
    let want = match ty {
        EmbeddingType::F32 => PhysicalType::FLOAT,
        EmbeddingType::F16 => PhysicalType::FIXED_LEN_BYTE_ARRAY,
        EmbeddingType::Int8 => PhysicalType::INT32,
    };
    if d.physical_type() != want || (ty == EmbeddingType::F16 && d.type_length() != 2) {
        return Err(format!("physical type {}", d.physical_type()));
    }
    if ty != EmbeddingType::Int8 && meta.dictionary_page_offset().is_some() {
        return Err("dictionary-encoded floats".into());
    }
    Ok(())
}

/// One row group's `embedding` column chunk, fetched.
pub struct Chunk {
    /// The chunk's bytes: the file's `meta.byte_range()`.
    pub data: Bytes,
    /// Its column chunk metadata.
    pub meta: ColumnChunkMetaData,
    /// Rows of the row group.
    pub rows: usize,
}

/// The chunk's bytes as parquet's page reader asks for them: at file offsets.
pub struct At {
    pub start: u64,
    pub data: Bytes,
}

impl At {
    fn range(&self, start: u64, len: usize) -> parquet::errors::Result<Bytes> {
        let from = start
            .checked_sub(self.start)
            .map(|s| s as usize)
            .filter(|&s| s <= self.data.len() && len <= self.data.len() - s)
            .ok_or_else(|| {
                parquet::errors::ParquetError::EOF(format!(
                    "page at {start} (+{len}) outside the column chunk"
                ))
            })?;
        Ok(self.data.slice(from..from + len))
    }
}

impl Length for At {
    fn len(&self) -> u64 {
        self.start + self.data.len() as u64
    }
}

impl ChunkReader for At {
    type T = Cursor<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Cursor<Bytes>> {
        let rest = (self.start + self.data.len() as u64).saturating_sub(start) as usize;
        Ok(Cursor::new(self.range(start, rest)?))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.range(start, length)
    }
}

impl Chunk {
    /// Hands every row of the chunk to `f(first_row, rows)`, in order, in
    /// runs of whole rows of `dim` values stored as `ty`.
    pub fn decode<E>(
        &self,
        ty: EmbeddingType,
        dim: usize,
        mut f: impl FnMut(usize, Stored<'_>) -> Result<(), E>,
    ) -> Result<(), Decode<E>> {
        if dim == 0 {
            return Err(Layout("dimension 0".into()).into());
        }
        let d = self.meta.column_descr();
        let (max_rep, max_def) = (d.max_rep_level(), d.max_def_level());
        let at = At {
            start: self.meta.byte_range().0,
            data: self.data.clone(),
        };
        let mut pages = SerializedPageReader::new(Arc::new(at), &self.meta, self.rows, None)
            .map_err(|e| Decode::Layout(e.to_string()))?;
        let total = (self.rows as u64).saturating_mul(dim as u64);
        let mut rows = Rows::new(ty, dim, &mut f);
        let mut dict: Option<Dictionary> = None;
        let mut segment: Vec<i8> = Vec::new();
        loop {
            let page = match pages.get_next_page() {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(e) => return Err(Layout(e.to_string()).into()),
            };
            let (buf, n, encoding, rep, def) = match page {
                Page::DictionaryPage {
                    buf,
                    num_values,
                    encoding,
                    ..
                } => {
                    if ty != EmbeddingType::Int8 || dict.is_some() {
                        return layout("an unexpected dictionary page");
                    }
                    dict = Some(int8_dictionary(&buf, num_values, encoding)?);
                    continue;
                }
                Page::DataPage {
                    buf,
                    num_values,
                    encoding,
                    def_level_encoding,
                    rep_level_encoding,
                    ..
                } => {
                    if rep_level_encoding != Encoding::RLE
                        || (max_def > 0 && def_level_encoding != Encoding::RLE)
                    {
                        return layout("levels not RLE-encoded");
                    }
                    let (rep, rest) = prefixed(&buf)?;
                    let rep = 4..4 + rep.len();
                    let def = if max_def > 0 {
                        let (def, _) = prefixed(rest)?;
                        rep.end + 4..rep.end + 4 + def.len()
                    } else {
                        rep.end..rep.end
                    };
                    (buf, num_values, encoding, rep, def)
                }
                Page::DataPageV2 {
                    buf,
                    num_values,
                    encoding,
                    num_nulls,
                    def_levels_byte_len,
                    rep_levels_byte_len,
                    ..
                } => {
                    if num_nulls != 0 {
                        return layout("nulls");
                    }
                    let (r, d) = (rep_levels_byte_len as usize, def_levels_byte_len as usize);
                    if r.checked_add(d).is_none_or(|l| l > buf.len()) {
                        return layout("levels longer than the page");
                    }
                    (buf, num_values, encoding, 0..r, r..r + d)
                }
            };
            let n = n as u64;
            let v0 = rows.values;
            if n > total - v0 {
                return layout(format!(
                    "{} values past the row group's {} rows",
                    v0 + n,
                    self.rows
                ));
            }
            // Definitions first: a null list is one level, so it also breaks
            // the repetitions, but "nulls" is what the user needs to read.
            if max_def > 0 {
                check_def(
                    &buf[def.clone()],
                    bit_width(max_def),
                    n as usize,
                    max_def as u32,
                )?;
            }
            check_rep(&buf[rep], bit_width(max_rep), n as usize, v0, dim as u64)?;
            let buf = &buf[def.end..];
            let n = n as usize;
            match (ty, encoding) {
                (_, Encoding::PLAIN) => {
                    let width = match ty {
                        EmbeddingType::F32 | EmbeddingType::Int8 => 4,
                        EmbeddingType::F16 => 2,
                    };
                    if buf.len() != n * width {
                        return layout(format!(
                            "{} bytes of values for {n} values: nulls, or not PLAIN",
                            buf.len()
                        ));
                    }
                    if ty == EmbeddingType::Int8 {
                        for part in buf.chunks(SEGMENT_VALUES * 4) {
                            segment.clear();
                            for v in part.as_chunks::<4>().0 {
                                let v = i32::from_le_bytes(*v);
                                let Ok(v) = i8::try_from(v) else {
                                    return layout(format!("int8 value {v} out of range"));
                                };
                                segment.push(v);
                            }
                            rows.push(&segment)?;
                        }
                    } else {
                        rows.push_bytes(buf)?;
                    }
                }
                (EmbeddingType::Int8, Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY) => {
                    let Some(dict) = &dict else {
                        return layout("dictionary indices without a dictionary");
                    };
                    let Some((&w, indices)) = buf.split_first() else {
                        return layout("an empty dictionary-encoded page");
                    };
                    let mut hybrid = Hybrid::new(indices, w)?;
                    let mut left = n;
                    while left > 0 {
                        let m = left.min(SEGMENT_VALUES);
                        segment.clear();
                        hybrid.decode_into(m, dict, &mut segment)?;
                        rows.push(&segment)?;
                        left -= m;
                    }
                }
                (_, e) => return layout(format!("{e} encoding")),
            }
        }
        rows.finish(total)
    }
}

/// A V1 page's level section: a 4-byte little-endian length, then the bytes.
fn prefixed(buf: &[u8]) -> Result<(&[u8], &[u8]), Layout> {
    let Some((len, rest)) = buf.split_first_chunk::<4>() else {
        return layout("a page shorter than its level length");
    };
    let len = u32::from_le_bytes(*len) as usize;
    if len > rest.len() {
        return layout("levels longer than the page");
    }
    Ok(rest.split_at(len))
}

/// Bits of a level up to `max`.
fn bit_width(max: i16) -> u8 {
    (16 - (max.max(0) as u16).leading_zeros()) as u8
}

/// The int8 dictionary of a chunk: at most 256 INT32 values, each an int8.
fn int8_dictionary(buf: &[u8], n: u32, encoding: Encoding) -> Result<Dictionary, Layout> {
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
struct Dictionary {
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
fn check_rep(levels: &[u8], w: u8, n: usize, v0: u64, dim: u64) -> Result<(), Layout> {
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
fn check_def(levels: &[u8], w: u8, n: usize, max: u32) -> Result<(), Layout> {
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
struct Hybrid<'a> {
    data: &'a [u8],
    w: u8,
    /// The run being decoded, and how far into it.
    run: Option<(Run<'a>, u64)>,
}

impl<'a> Hybrid<'a> {
    fn new(data: &'a [u8], w: u8) -> Result<Hybrid<'a>, Layout> {
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
    fn decode_into(
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

/// Assembles whole rows from runs of values that may split a row (a page
/// of another writer may end mid-list), calling the fold with them.
struct Rows<'f, F, E> {
    ty: EmbeddingType,
    dim: usize,
    f: &'f mut F,
    /// Values handed in so far.
    values: u64,
    /// Rows handed out so far.
    rows: usize,
    /// The values of a row split across pages, as stored (int8 as bytes).
    carry: Vec<u8>,
    error: std::marker::PhantomData<fn() -> E>,
}

impl<'f, F, E> Rows<'f, F, E>
where
    F: FnMut(usize, Stored<'_>) -> Result<(), E>,
{
    fn new(ty: EmbeddingType, dim: usize, f: &'f mut F) -> Rows<'f, F, E> {
        Rows {
            ty,
            dim,
            f,
            values: 0,
            rows: 0,
            carry: Vec::new(),
            error: std::marker::PhantomData,
        }
    }

    fn width(&self) -> usize {
        match self.ty {
            EmbeddingType::F32 => 4,
            EmbeddingType::F16 => 2,
            EmbeddingType::Int8 => 1,
        }
    }

    fn push(&mut self, values: &[i8]) -> Result<(), Decode<E>> {
        // SAFETY: i8 and u8 have one size and alignment, and every bit
        // pattern is valid for both.
        let bytes =
            unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), values.len()) };
        self.push_bytes(bytes)
    }

    /// Values as stored: `width` bytes each.
    fn push_bytes(&mut self, mut bytes: &[u8]) -> Result<(), Decode<E>> {
        let row = self.dim * self.width();
        self.values += (bytes.len() / self.width()) as u64;
        if !self.carry.is_empty() {
            let take = (row - self.carry.len()).min(bytes.len());
            self.carry.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.carry.len() < row {
                return Ok(());
            }
            let carry = std::mem::take(&mut self.carry);
            self.emit(&carry)?;
            self.carry = carry;
            self.carry.clear();
        }
        let whole = bytes.len() / row * row;
        if whole > 0 {
            self.emit(&bytes[..whole])?;
        }
        self.carry.extend_from_slice(&bytes[whole..]);
        Ok(())
    }

    fn emit(&mut self, bytes: &[u8]) -> Result<(), Decode<E>> {
        let stored = match self.ty {
            EmbeddingType::F32 => Stored::F32Le(bytes.as_chunks::<4>().0),
            EmbeddingType::F16 => Stored::F16Le(bytes.as_chunks::<2>().0),
            // SAFETY: as in `push`, u8 to i8.
            EmbeddingType::Int8 => Stored::Int8(unsafe {
                std::slice::from_raw_parts(bytes.as_ptr().cast::<i8>(), bytes.len())
            }),
        };
        let n = stored.values() / self.dim;
        (self.f)(self.rows, stored).map_err(Decode::Fold)?;
        self.rows += n;
        Ok(())
    }

    fn finish(self, total: u64) -> Result<(), Decode<E>> {
        if self.values != total || !self.carry.is_empty() {
            return Err(Layout(format!(
                "{} values for {} values of rows",
                self.values, total
            ))
            .into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(ty: EmbeddingType, dim: usize, pieces: &[&[u8]]) -> Vec<(usize, Vec<u8>)> {
        let mut got = Vec::new();
        let mut f = |first: usize, s: Stored<'_>| {
            let bytes = match s {
                Stored::F32Le(v) => v.concat(),
                Stored::F16Le(v) => v.concat(),
                Stored::Int8(v) => v.iter().map(|x| *x as u8).collect(),
                _ => unreachable!(),
            };
            got.push((first, bytes));
            Ok::<(), Error>(())
        };
        let mut rows = Rows::new(ty, dim, &mut f);
        for p in pieces {
            rows.push_bytes(p).unwrap();
        }
        rows.finish(pieces.iter().map(|p| p.len() as u64).sum::<u64>() / 4)
            .unwrap();
        got
    }

    #[test]
    fn rows_split_across_pages_are_joined() {
        let v: Vec<u8> = (0..40u8).collect();
        // Rows of 2 f32 values (8 bytes): pieces end mid-row, and one is
        // less than a row.
        let got = collect(EmbeddingType::F32, 2, &[&v[..12], &v[12..16], &v[16..40]]);
        let rows: Vec<usize> = got.iter().map(|(r, _)| *r).collect();
        assert_eq!(rows, [0, 1, 2]);
        assert_eq!(
            got.iter().flat_map(|(_, b)| b.clone()).collect::<Vec<_>>(),
            v
        );
        assert_eq!(got[1].1.len(), 8, "the split row alone");
    }

    #[test]
    fn a_row_left_unfinished_is_a_layout_error() {
        let mut f = |_: usize, _: Stored<'_>| Ok::<(), Error>(());
        let mut rows = Rows::new(EmbeddingType::F32, 2, &mut f);
        rows.push_bytes(&[0; 12]).unwrap();
        assert!(matches!(rows.finish(3), Err(Decode::Layout(_))));
    }

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
