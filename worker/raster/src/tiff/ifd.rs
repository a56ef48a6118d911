//! Header and IFD chain parsing: classic and BigTIFF, either byte order.
//!
//! Only tags the reader uses have their out-of-line payload fetched, so a file
//! cannot make us read (or allocate) megabytes for a tag we ignore.

use std::collections::{BTreeMap, HashSet};

use bytes::Bytes;

use super::fetch::Source;
use super::{TiffError, TiffLimits};

/// Tags whose payload we fetch.
const WANTED: &[u16] = &[
    254, 256, 257, 258, 259, 262, 273, 277, 278, 279, 284, 317, 322, 323, 324, 325, 338, 339, 347,
    33550, 33922, 34264, 34735, 34736, 34737, 42113,
];

/// Byte order and offset width of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Format {
    pub(crate) big_endian: bool,
    pub(crate) bigtiff: bool,
}

impl Format {
    pub(crate) fn u16(&self, b: &[u8]) -> u16 {
        let a = [b[0], b[1]];
        if self.big_endian {
            u16::from_be_bytes(a)
        } else {
            u16::from_le_bytes(a)
        }
    }
    pub(crate) fn u32(&self, b: &[u8]) -> u32 {
        let a = [b[0], b[1], b[2], b[3]];
        if self.big_endian {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        }
    }
    pub(crate) fn u64(&self, b: &[u8]) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        if self.big_endian {
            u64::from_be_bytes(a)
        } else {
            u64::from_le_bytes(a)
        }
    }
    fn offset(&self, b: &[u8]) -> u64 {
        if self.bigtiff {
            self.u64(b)
        } else {
            self.u32(b) as u64
        }
    }
}

/// One tag's type and payload (raw bytes, file byte order).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) typ: u16,
    pub(crate) count: u64,
    pub(crate) data: Bytes,
}

/// The wanted tags of one IFD.
#[derive(Debug, Clone)]
pub(crate) struct Ifd {
    pub(crate) index: usize,
    /// Most values decoded from one tag: a BYTE-typed offset table within the
    /// tag budget would otherwise expand eightfold into `Vec<u64>`.
    pub(crate) max_values: u64,
    pub(crate) tags: BTreeMap<u16, Entry>,
}

fn type_size(typ: u16) -> Option<u64> {
    Some(match typ {
        1 | 2 | 6 | 7 => 1,
        3 | 8 => 2,
        4 | 9 | 11 | 13 => 4,
        5 | 10 | 12 | 16 | 17 | 18 => 8,
        _ => return None,
    })
}

/// Parses the header and walks the IFD chain.
pub(crate) async fn read_ifds(
    src: &Source,
    limits: &TiffLimits,
) -> Result<(Format, Vec<Ifd>), TiffError> {
    let head = src.read(0, 16.min(src.size)).await?;
    if head.len() < 8 {
        return Err(TiffError::NotTiff(format!(
            "{} bytes is too short for a TIFF header",
            head.len()
        )));
    }
    let big_endian = match &head[0..2] {
        b"II" => false,
        b"MM" => true,
        _ => return Err(TiffError::NotTiff("bad byte-order mark".into())),
    };
    let mut fmt = Format {
        big_endian,
        bigtiff: false,
    };
    let first = match fmt.u16(&head[2..4]) {
        42 => fmt.u32(&head[4..8]) as u64,
        43 => {
            if head.len() < 16 || fmt.u16(&head[4..6]) != 8 || fmt.u16(&head[6..8]) != 0 {
                return Err(TiffError::NotTiff("bad BigTIFF header".into()));
            }
            fmt.bigtiff = true;
            fmt.u64(&head[8..16])
        }
        m => return Err(TiffError::NotTiff(format!("bad magic number {m}"))),
    };
    let (count_len, entry_len) = if fmt.bigtiff { (8u64, 20u64) } else { (2, 12) };
    let mut seen = HashSet::new();
    let mut ifds = Vec::new();
    let mut tag_budget = limits.max_tag_bytes;
    let mut next = first;
    while next != 0 {
        if !seen.insert(next) {
            return Err(TiffError::malformed(format!("IFD offset loop at {next}")));
        }
        if ifds.len() >= limits.max_ifds {
            return Err(TiffError::Limit {
                what: "IFD count",
                value: ifds.len() as u64 + 1,
                limit: limits.max_ifds as u64,
            });
        }
        let cb = src.read(next, next.saturating_add(count_len)).await?;
        let n = if fmt.bigtiff {
            fmt.u64(&cb)
        } else {
            fmt.u16(&cb) as u64
        };
        TiffError::limit("IFD entry count", n, limits.max_ifd_entries)?;
        let start = next + count_len;
        let tail = if fmt.bigtiff { 8 } else { 4 };
        let body = src.read(start, start + n * entry_len + tail).await?;
        let mut tags = BTreeMap::new();
        for i in 0..n as usize {
            let e = &body[i * entry_len as usize..(i + 1) * entry_len as usize];
            let tag = fmt.u16(&e[0..2]);
            if !WANTED.contains(&tag) {
                continue;
            }
            let typ = fmt.u16(&e[2..4]);
            let count = if fmt.bigtiff {
                fmt.u64(&e[4..12])
            } else {
                fmt.u32(&e[4..8]) as u64
            };
            let ts = type_size(typ)
                .ok_or_else(|| TiffError::malformed(format!("tag {tag} has unknown type {typ}")))?;
            let len = count.checked_mul(ts).ok_or_else(|| {
                TiffError::malformed(format!("tag {tag} count {count} overflows"))
            })?;
            TiffError::limit("tag payload bytes", len, tag_budget)?;
            tag_budget -= len;
            let inline = if fmt.bigtiff { 8 } else { 4 };
            let vpos = if fmt.bigtiff { 12 } else { 8 };
            let data = if len <= inline {
                body.slice(
                    i * entry_len as usize + vpos..i * entry_len as usize + vpos + len as usize,
                )
            } else {
                let off = fmt.offset(&e[vpos..]);
                let end = off
                    .checked_add(len)
                    .ok_or_else(|| TiffError::malformed(format!("tag {tag} offset overflows")))?;
                src.read(off, end).await?
            };
            tags.insert(tag, Entry { typ, count, data });
        }
        let np = n as usize * entry_len as usize;
        next = fmt.offset(&body[np..]);
        let max_values = limits.max_blocks.max(1 << 16);
        ifds.push(Ifd {
            index: ifds.len(),
            max_values,
            tags,
        });
    }
    if ifds.is_empty() {
        return Err(TiffError::malformed("no IFD"));
    }
    Ok((fmt, ifds))
}

impl Ifd {
    /// Integer values of a tag (any unsigned/signed integer type).
    pub(crate) fn ints(&self, fmt: &Format, tag: u16) -> Result<Option<Vec<u64>>, TiffError> {
        let Some(e) = self.tags.get(&tag) else {
            return Ok(None);
        };
        TiffError::limit("values in one tag", e.count, self.max_values)?;
        let d = &e.data;
        let n = e.count as usize;
        let v = match e.typ {
            1 | 7 => d.iter().map(|&b| b as u64).collect(),
            6 => d.iter().map(|&b| b as i8 as u64).collect(),
            3 | 8 => (0..n).map(|i| fmt.u16(&d[2 * i..]) as u64).collect(),
            4 | 9 | 13 => (0..n).map(|i| fmt.u32(&d[4 * i..]) as u64).collect(),
            16..=18 => (0..n).map(|i| fmt.u64(&d[8 * i..])).collect(),
            t => {
                return Err(TiffError::malformed(format!(
                    "tag {tag}: type {t} is not an integer type"
                )))
            }
        };
        Ok(Some(v))
    }

    /// First integer value of a tag, or `default` when absent.
    pub(crate) fn int(
        &self,
        fmt: &Format,
        tag: u16,
        default: Option<u64>,
    ) -> Result<u64, TiffError> {
        match self.ints(fmt, tag)? {
            Some(v) if !v.is_empty() => Ok(v[0]),
            Some(_) => Err(TiffError::malformed(format!("tag {tag} has no values"))),
            None => {
                default.ok_or_else(|| TiffError::malformed(format!("required tag {tag} missing")))
            }
        }
    }

    /// Floating-point values of a tag (double, float, rational or integer types).
    pub(crate) fn floats(&self, fmt: &Format, tag: u16) -> Result<Option<Vec<f64>>, TiffError> {
        let Some(e) = self.tags.get(&tag) else {
            return Ok(None);
        };
        TiffError::limit("values in one tag", e.count, self.max_values)?;
        let d = &e.data;
        let n = e.count as usize;
        let v = match e.typ {
            12 => (0..n)
                .map(|i| f64::from_bits(fmt.u64(&d[8 * i..])))
                .collect(),
            11 => (0..n)
                .map(|i| f32::from_bits(fmt.u32(&d[4 * i..])) as f64)
                .collect(),
            5 => (0..n)
                .map(|i| fmt.u32(&d[8 * i..]) as f64 / fmt.u32(&d[8 * i + 4..]) as f64)
                .collect(),
            10 => (0..n)
                .map(|i| {
                    fmt.u32(&d[8 * i..]) as i32 as f64 / fmt.u32(&d[8 * i + 4..]) as i32 as f64
                })
                .collect(),
            _ => {
                return Ok(self
                    .ints(fmt, tag)?
                    .map(|v| v.into_iter().map(|x| x as f64).collect()))
            }
        };
        Ok(Some(v))
    }

    /// ASCII payload without trailing NULs (lossy for non-UTF-8 bytes).
    pub(crate) fn ascii(&self, tag: u16) -> Option<String> {
        let e = self.tags.get(&tag)?;
        let s = String::from_utf8_lossy(&e.data);
        Some(s.trim_end_matches('\0').to_string())
    }

    pub(crate) fn raw(&self, tag: u16) -> Option<Bytes> {
        self.tags.get(&tag).map(|e| e.data.clone())
    }
}
