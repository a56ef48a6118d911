//! Range reading: the prefetched metadata prefix and coalesced block fetches.

use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use super::{RangeRead, TiffError, TiffFile};

/// Reads ranges, serving those inside the prefetched prefix from memory.
pub(crate) struct Source {
    pub(crate) reader: Arc<dyn RangeRead>,
    pub(crate) size: u64,
    prefix: Bytes,
}

impl Source {
    pub(crate) async fn new(reader: Arc<dyn RangeRead>, prefetch: u64) -> Result<Self, TiffError> {
        let size = reader.size();
        let mut s = Source {
            reader,
            size,
            prefix: Bytes::new(),
        };
        let n = prefetch.min(size);
        if n > 0 {
            s.prefix = s.fetch(0, n).await?;
        }
        Ok(s)
    }

    /// Exactly bytes [start, end), or `Truncated`.
    pub(crate) async fn read(&self, start: u64, end: u64) -> Result<Bytes, TiffError> {
        if end <= self.prefix.len() as u64 {
            return Ok(self.prefix.slice(start as usize..end as usize));
        }
        self.fetch(start, end).await
    }

    pub(crate) async fn fetch(&self, start: u64, end: u64) -> Result<Bytes, TiffError> {
        if start > end || end > self.size {
            return Err(TiffError::Truncated {
                start,
                end,
                size: self.size,
            });
        }
        let b = self
            .reader
            .read_range(start, end)
            .await
            .map_err(|source| TiffError::Io { start, end, source })?;
        if (b.len() as u64) < end - start {
            return Err(TiffError::Truncated {
                start,
                end,
                size: start + b.len() as u64,
            });
        }
        Ok(b.slice(0..(end - start) as usize))
    }
}

/// A block to fetch: which level (data or mask), its index and byte range.
#[derive(Clone)]
pub(crate) struct Want {
    pub(crate) mask: bool,
    pub(crate) index: usize,
    pub(crate) offset: u64,
    pub(crate) count: u64,
}

/// Fetches every wanted block in few requests; `None` marks a sparse (empty) block.
pub(crate) async fn fetch(
    f: &TiffFile,
    wants: &mut [Want],
) -> Result<Vec<Option<Bytes>>, TiffError> {
    let size = f.src.size;
    let mut total = 0u64;
    for w in wants.iter() {
        if w.count == 0 {
            continue;
        }
        let end = w.offset.checked_add(w.count).filter(|&e| e <= size);
        if end.is_none() {
            return Err(TiffError::Truncated {
                start: w.offset,
                end: w.offset.saturating_add(w.count),
                size,
            });
        }
        total += w.count;
    }
    TiffError::limit("window fetch bytes", total, f.limits.max_fetch_bytes)?;
    wants.sort_by_key(|w| (w.offset, w.mask, w.index));
    // Merge byte ranges that are adjacent or close, bounded in size.
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for w in wants.iter().filter(|w| w.count > 0) {
        let end = w.offset + w.count;
        match ranges.last_mut() {
            Some(r)
                if w.offset <= r.1.saturating_add(f.limits.coalesce_gap)
                    && end.max(r.1) - r.0 <= f.limits.max_request_bytes =>
            {
                r.1 = r.1.max(end)
            }
            _ => ranges.push((w.offset, end)),
        }
    }
    let src = &f.src;
    // Owned ranges and a `move` closure: a closure over `&(u64, u64)` makes the
    // future's Send bound higher-ranked, which tokio::spawn cannot prove.
    let owned = ranges.clone();
    let got: Vec<Bytes> =
        futures::stream::iter(owned.into_iter().map(move |(s, e)| src.read(s, e)))
            .buffered(8)
            .try_collect()
            .await?;
    let mut out = Vec::with_capacity(wants.len());
    let mut ri = 0;
    for w in wants.iter() {
        if w.count == 0 {
            out.push(None);
            continue;
        }
        while ranges[ri].1 < w.offset + w.count || ranges[ri].0 > w.offset {
            ri += 1;
        }
        let s = (w.offset - ranges[ri].0) as usize;
        out.push(Some(got[ri].slice(s..s + w.count as usize)));
    }
    Ok(out)
}
