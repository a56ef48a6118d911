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
pub use hybrid::count_at_max;
use hybrid::{bit_width, check_def, check_rep, int8_dictionary, Dictionary, Hybrid};

mod hybrid;

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
}
