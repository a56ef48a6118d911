//! The answer's columns (id, footprint, source...) of a few chosen rows.
//!
//! A search reads its hits' other columns back after scoring. Through the
//! arrow reader that cost more than scoring a list: parquet-rs makes a zstd
//! compression and a decompression context for every column chunk it opens
//! (`ZSTD_createCCtx` and `ZSTD_createDCtx`, 21 % of a resident search at
//! `--nprobe 1`, sixteen columns a hit's row group), and builds arrow arrays
//! for rows nobody asked for. Here each column chunk is read by parquet's own
//! typed column reader over pages this module decompresses with one zstd
//! context per thread, reused; pages holding no chosen row are skipped from
//! their headers, never decompressed.
//!
//! Only flat columns of the types the answer has (strings, binary, int32,
//! float, double, int64 microseconds), uncompressed or zstd, are taken; any
//! other layout or a malformed page is an `Err` with the reason, and the
//! caller reads the row group with the arrow reader instead, which accepts or
//! rejects it as it always did. A page's decompressed size comes from its
//! zstd frame and must not exceed the column chunk's uncompressed size in the
//! footer: no allocation follows a page alone.

use std::cell::RefCell;
use std::sync::Arc;

use parquet::basic::{Compression, Encoding, Type as PhysicalType};
use parquet::column::page::{Page, PageMetadata, PageReader};
use parquet::column::reader::ColumnReaderImpl;
use parquet::data_type::DataType;
use parquet::errors::{ParquetError, Result as PqResult};
use parquet::file::serialized_reader::SerializedPageReader;

use super::pages::{self, At, Chunk};

thread_local! {
    /// The zstd context of this thread's answers, made once.
    static DCTX: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Decompresses `src` (whole zstd frames) onto the end of `out`, at most
/// `limit` bytes.
fn unzstd(src: &[u8], limit: usize, out: &mut Vec<u8>) -> PqResult<()> {
    if src.is_empty() {
        return Ok(());
    }
    let size = zstd::zstd_safe::get_frame_content_size(src)
        .ok()
        .flatten()
        .ok_or_else(|| ParquetError::General("a zstd page without its size".into()))?;
    let size = usize::try_from(size)
        .ok()
        .filter(|&s| s <= limit)
        .ok_or_else(|| {
            ParquetError::General(format!(
                "a zstd page of {size} bytes in a column chunk of {limit}"
            ))
        })?;
    out.reserve(size);
    DCTX.with_borrow_mut(|d| {
        let d = match d {
            Some(d) => d,
            None => d.insert(
                zstd::bulk::Decompressor::new().map_err(|e| ParquetError::External(Box::new(e)))?,
            ),
        };
        let mut cursor = std::io::Cursor::new(&mut *out);
        cursor.set_position(cursor.get_ref().len() as u64);
        d.decompress_to_buffer(src, &mut cursor)
            .map_err(|e| ParquetError::External(Box::new(e)))
    })?;
    Ok(())
}

/// A column chunk's pages, decompressed here when they are read and passed
/// over from their headers when they are skipped.
struct Pages {
    inner: Source,
    /// The next page as stored, once peeked: parquet-rs's own peek unwraps
    /// a header field a corrupt page may lack (a panic, found by
    /// `corrupt_answer_chunks_are_errors_never_panics`); reading the page
    /// checks it, and costs only a slice while it stays compressed.
    peeked: Option<Page>,
    zstd: bool,
    /// The chunk's uncompressed size in the footer: no page is larger.
    limit: usize,
    /// BYTE_ARRAY values, whose PLAIN pages are checked before parquet's
    /// decoder sees them.
    byte_array: bool,
    max_def: i16,
}

/// Checks that `n` PLAIN byte-array values (a 4-byte length, then the
/// bytes) lie within `buf`. parquet-rs's plain decoder trusts the lengths:
/// one past the page makes it slice out of bounds and panic (found by
/// `corrupt_answer_chunks_are_errors_never_panics`), and zstd without
/// checksums passes a flipped byte through as another length.
fn check_plain_bytes(buf: &[u8], n: usize) -> PqResult<()> {
    let mut rest = buf;
    for _ in 0..n {
        let len = rest
            .split_first_chunk::<4>()
            .map(|(l, r)| (u32::from_le_bytes(*l) as usize, r))
            .filter(|(l, r)| *l <= r.len());
        let Some((len, r)) = len else {
            return Err(ParquetError::General(
                "a byte array past the end of its page".into(),
            ));
        };
        rest = &r[len..];
    }
    Ok(())
}

/// The bytes of a version 2 page's levels, which it keeps uncompressed
/// before its values; checked to fit the page.
fn v2_levels(buf: &[u8], def: u32, rep: u32) -> PqResult<usize> {
    (def as usize)
        .checked_add(rep as usize)
        .filter(|&l| l <= buf.len())
        .ok_or_else(|| bad("levels longer than the page"))
}

fn bad(why: impl Into<String>) -> ParquetError {
    ParquetError::General(why.into())
}

impl Pages {
    /// The next page as its source holds it.
    fn next_stored(&mut self) -> PqResult<Option<Page>> {
        match &mut self.inner {
            Source::Stored(r) => r.get_next_page(),
            Source::Inflated(pages) => Ok(pages.next()),
        }
    }

    /// A reader of `chunk`'s pages, inflated as they are read.
    fn of(chunk: &Chunk) -> Result<Pages, String> {
        let descr = chunk.meta.column_descr_ptr();
        if descr.max_rep_level() != 0 {
            return Err("a repeated column".into());
        }
        let zstd = match chunk.meta.compression() {
            Compression::UNCOMPRESSED => false,
            Compression::ZSTD(_) => true,
            other => return Err(format!("{other:?} compression")),
        };
        let limit =
            usize::try_from(chunk.meta.uncompressed_size()).map_err(|_| "a negative size")?;
        // The page reader is told the chunk is uncompressed, so that it makes
        // no codec: its pages come out as stored and `Pages` inflates them.
        let meta = chunk
            .meta
            .clone()
            .into_builder()
            .set_compression(Compression::UNCOMPRESSED)
            .build()
            .map_err(|e| e.to_string())?;
        let at = At {
            start: meta.byte_range().0,
            data: chunk.data.clone(),
        };
        let inner = SerializedPageReader::new(Arc::new(at), &meta, chunk.rows, None)
            .map_err(|e| e.to_string())?;
        Ok(Pages {
            inner: Source::Stored(inner),
            peeked: None,
            zstd,
            limit,
            byte_array: descr.physical_type() == PhysicalType::BYTE_ARRAY,
            max_def: descr.max_def_level(),
        })
    }

    /// The page decompressed, and for byte arrays checked.
    fn inflate(&self, page: Page) -> PqResult<Page> {
        let page = self.decompress(page)?;
        let (encoding, n, levels, values): (Encoding, usize, &[u8], &[u8]) = match &page {
            Page::DictionaryPage {
                buf, num_values, ..
            } => {
                if self.byte_array {
                    check_plain_bytes(buf, *num_values as usize)?;
                }
                return Ok(page);
            }
            Page::DataPage {
                buf,
                num_values,
                encoding,
                ..
            } => {
                // Version 1: the definition levels behind a 4-byte length
                // (a flat column has no repetition levels).
                let (levels, values) = if self.max_def > 0 {
                    let (len, rest) = buf
                        .split_first_chunk::<4>()
                        .ok_or_else(|| bad("a page shorter than its levels"))?;
                    let len = u32::from_le_bytes(*len) as usize;
                    if len > rest.len() {
                        return Err(bad("levels longer than the page"));
                    }
                    rest.split_at(len)
                } else {
                    (&[][..], &buf[..])
                };
                (*encoding, *num_values as usize, levels, values)
            }
            Page::DataPageV2 {
                buf,
                num_values,
                encoding,
                def_levels_byte_len,
                rep_levels_byte_len,
                ..
            } => {
                // `decompress` checked that the levels fit the page.
                let (r, d) = (*rep_levels_byte_len as usize, *def_levels_byte_len as usize);
                (
                    *encoding,
                    *num_values as usize,
                    &buf[r..r + d],
                    &buf[r + d..],
                )
            }
        };
        if !matches!(
            encoding,
            Encoding::PLAIN | Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY
        ) {
            return Err(bad(format!("{encoding:?} values")));
        }
        if self.byte_array && encoding == Encoding::PLAIN {
            let present = if self.max_def > 0 {
                pages::count_at_max(levels, self.max_def, n).map_err(|e| bad(format!("{e:?}")))?
            } else {
                n
            };
            check_plain_bytes(values, present)?;
        }
        Ok(page)
    }

    /// The page with its values decompressed (a version 2 page's levels
    /// are stored uncompressed before them), its other fields as they were.
    fn decompress(&self, mut page: Page) -> PqResult<Page> {
        match &mut page {
            Page::DataPage { buf, .. } | Page::DictionaryPage { buf, .. } => {
                if self.zstd {
                    let mut out = Vec::new();
                    unzstd(buf, self.limit, &mut out)?;
                    *buf = out.into();
                }
            }
            Page::DataPageV2 {
                buf,
                def_levels_byte_len,
                rep_levels_byte_len,
                is_compressed,
                ..
            } => {
                let levels = v2_levels(buf, *def_levels_byte_len, *rep_levels_byte_len)?;
                if self.zstd && *is_compressed {
                    let mut out = buf[..levels].to_vec();
                    unzstd(&buf[levels..], self.limit, &mut out)?;
                    *buf = out.into();
                    *is_compressed = false;
                }
            }
        }
        Ok(page)
    }
}

/// Where a reader's pages come from.
enum Source {
    /// The chunk as stored: each page is inflated as it is read.
    Stored(SerializedPageReader<At>),
    /// Pages inflated before (by [`inflate`]), handed out as they are.
    Inflated(std::vec::IntoIter<Page>),
}

impl Iterator for Pages {
    type Item = PqResult<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl PageReader for Pages {
    fn get_next_page(&mut self) -> PqResult<Option<Page>> {
        let page = match self.peeked.take() {
            Some(p) => Some(p),
            None => self.next_stored()?,
        };
        match self.inner {
            Source::Stored(_) => page.map(|p| self.inflate(p)).transpose(),
            Source::Inflated(_) => Ok(page),
        }
    }

    fn peek_next_page(&mut self) -> PqResult<Option<PageMetadata>> {
        if self.peeked.is_none() {
            self.peeked = self.next_stored()?;
        }
        Ok(self.peeked.as_ref().map(|p| match p {
            Page::DataPage { num_values, .. } => PageMetadata {
                num_rows: None,
                num_levels: Some(*num_values as usize),
                is_dict: false,
            },
            Page::DataPageV2 {
                num_values,
                num_rows,
                ..
            } => PageMetadata {
                num_rows: Some(*num_rows as usize),
                num_levels: Some(*num_values as usize),
                is_dict: false,
            },
            Page::DictionaryPage { .. } => PageMetadata {
                num_rows: None,
                num_levels: None,
                is_dict: true,
            },
        }))
    }

    fn skip_next_page(&mut self) -> PqResult<()> {
        if self.peeked.take().is_none() {
            self.next_stored()?;
        }
        Ok(())
    }
}

/// Every page of a flat column chunk, decompressed and checked, for
/// [`column()`] to read later: a search reads a likely hit group's answer
/// columns so on an idle core while its list is scored.
pub fn inflate(chunk: &Chunk) -> Result<Vec<Page>, String> {
    Pages::of(chunk)?
        .collect::<PqResult<Vec<Page>>>()
        .map_err(|e| e.to_string())
}

/// Rows `wanted` (ascending, distinct) of a flat column chunk of physical
/// type `T`, `None` where null; from its pages as [`inflate`] gave them
/// when `inflated`, which must be that chunk's.
pub fn column<T: DataType>(
    chunk: &Chunk,
    wanted: &[usize],
    inflated: Option<Vec<Page>>,
) -> Result<Vec<Option<T::T>>, String> {
    let descr = chunk.meta.column_descr_ptr();
    if descr.physical_type() != T::get_physical_type() {
        return Err(format!(
            "{} stored as {:?}",
            descr.path(),
            descr.physical_type()
        ));
    }
    let mut pages = Pages::of(chunk)?;
    if let Some(inflated) = inflated {
        pages.inner = Source::Inflated(inflated.into_iter());
    }
    let max_def = pages.max_def;
    let mut reader = ColumnReaderImpl::<T>::new(descr, Box::new(pages));
    let (mut next, mut def, mut values) = (0, Vec::new(), Vec::new());
    let mut out = Vec::with_capacity(wanted.len());
    for &row in wanted {
        if row < next || row >= chunk.rows {
            return Err(format!(
                "row {row} out of order or past {} rows",
                chunk.rows
            ));
        }
        let skip = row - next;
        if skip > 0 && reader.skip_records(skip).map_err(|e| e.to_string())? != skip {
            return Err("fewer rows than the footer says".into());
        }
        def.clear();
        values.clear();
        let (records, _, _) = reader
            .read_records(1, (max_def > 0).then_some(&mut def), None, &mut values)
            .map_err(|e| e.to_string())?;
        if records != 1 {
            return Err("fewer rows than the footer says".into());
        }
        let present = max_def == 0 || def.first() == Some(&max_def);
        out.push(match (present, values.pop()) {
            (true, Some(v)) => Some(v),
            (false, None) => None,
            _ => return Err("levels and values disagree".into()),
        });
        next = row + 1;
    }
    Ok(out)
}
