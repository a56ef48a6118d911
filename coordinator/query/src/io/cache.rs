//! The column chunks a resident search keeps, in memory the crate owns.
//!
//! A resident search (`--vectors -`) reads the same lists query after query.
//! Reading each list again out of the page cache (`_copy_to_iter` and the
//! page lookups) was 40 % of a query at `--nprobe 1` (`perf`,
//! docs/benchmarks.md); a chunk kept here is handed out again as the same
//! bytes, with no system call and no copy. Memory maps did the same before,
//! at the price of a process-wide SIGBUS handler for files truncated under
//! them; a copy of our own cannot be torn (docs/decisions.md, "Query crate").
//!
//! The chunks kept are capped at a budget, so a session's memory does not
//! grow with the rows it has read: beyond it chunks are read as a one-shot
//! search reads them, and a kept chunk long unread is let go for a new one
//! ([`Kept`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use bytes::Bytes;

/// Bytes of column chunks a resident search keeps, at most: the lists of a
/// few hundred queries at `--nprobe 1` (2.8 MiB a list of 1,000 rows of f32
/// at D = 768), a fortieth of FAISS's memory for the same 10^6 rows.
pub const CACHE_BYTES: usize = 256 << 20;

/// A chunk: its part, its first byte, its length.
type Key = (usize, usize, usize);

/// Column chunks kept in memory, up to a budget.
#[derive(Debug)]
pub(crate) struct ChunkCache {
    budget: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    kept: Kept,
    chunks: HashMap<Key, Bytes>,
}

impl ChunkCache {
    /// A cache that keeps at most `budget` bytes of chunks.
    pub(crate) fn new(budget: usize) -> ChunkCache {
        ChunkCache {
            budget,
            inner: Mutex::default(),
        }
    }

    /// Counts a read of bytes `start..start + len` of part `part` now, and
    /// hands them out when they are kept; `Err(keep)` when they are to be
    /// read, `keep` telling whether they would be kept once read.
    pub(crate) fn get(&self, part: usize, start: u64, len: usize) -> Result<Bytes, bool> {
        let Ok(start) = usize::try_from(start) else {
            return Err(false);
        };
        let key = (part, start, len);
        let mut inner = self.inner.lock().expect("chunk cache lock");
        if inner.kept.touch(key) {
            if let Some(b) = inner.chunks.get(&key) {
                return Ok(b.clone());
            }
        }
        Err(len > 0 && len <= self.budget && inner.kept.room(len, self.budget).is_some())
    }

    /// Keeps `data`, bytes `start..` of part `part`, when they fit, letting
    /// cold chunks go to make room.
    pub(crate) fn put(&self, part: usize, start: u64, data: Bytes) {
        let Ok(start) = usize::try_from(start) else {
            return;
        };
        let key = (part, start, data.len());
        let mut inner = self.inner.lock().expect("chunk cache lock");
        if let Some(gone) = inner.kept.keep(key, self.budget) {
            for old in gone {
                inner.chunks.remove(&old);
            }
            inner.chunks.insert(key, data);
        }
    }
}

/// Which chunks are kept, and when each was last read.
///
/// A chunk is kept when it fits in the budget, and stays while it is read;
/// one no read has asked for over [`COLD_BUDGETS`] budgets' worth of reads is
/// let go to make room. There is no eviction of warm chunks: when the lists
/// a session reads outgrow the budget, the chunks beyond it are read as a
/// one-shot search reads them. Keeping them in turn, least recently used
/// out, cost more than reading them (1.2–1.3× at `--nprobe 8` and 63 with
/// maps, docs/benchmarks.md).
#[derive(Debug, Default)]
struct Kept {
    /// Bytes asked for so far, kept or not: the clock of last uses.
    clock: u64,
    last_use: HashMap<Key, u64>,
    by_use: BTreeMap<u64, Key>,
    bytes: usize,
}

/// Budgets' worth of reads after which an unread chunk is let go for a new
/// one: long enough that lists read in turn (a session at a large nprobe)
/// stay put, short enough that a session's kept chunks follow what it reads.
const COLD_BUDGETS: u64 = 64;

impl Kept {
    /// Counts a read of `key` now; true when it is kept (and now warmest).
    fn touch(&mut self, key: Key) -> bool {
        self.clock += key.2 as u64;
        let Some(t) = self.last_use.get_mut(&key) else {
            return false;
        };
        self.by_use.remove(t);
        *t = self.clock;
        self.by_use.insert(self.clock, key);
        true
    }

    /// Cold chunks to let go so that `len` more bytes fit in `budget`;
    /// `None` when that takes letting warm ones go.
    fn room(&self, len: usize, budget: usize) -> Option<Vec<Key>> {
        let cold = COLD_BUDGETS * budget as u64;
        let mut need = (self.bytes + len).saturating_sub(budget);
        let mut gone = Vec::new();
        for (&t, &key) in &self.by_use {
            if need == 0 {
                break;
            }
            if self.clock - t < cold {
                return None;
            }
            need = need.saturating_sub(key.2);
            gone.push(key);
        }
        (need == 0).then_some(gone)
    }

    /// Keeps `key`, letting the chunks [`Kept::room`] names go; `None` when
    /// it does not fit (the chunk is then read, not kept).
    fn keep(&mut self, key: Key, budget: usize) -> Option<Vec<Key>> {
        if self.last_use.contains_key(&key) {
            return Some(Vec::new());
        }
        let gone = self.room(key.2, budget)?;
        for old in &gone {
            if let Some(t) = self.last_use.remove(old) {
                self.by_use.remove(&t);
                self.bytes -= old.2;
            }
        }
        self.last_use.insert(key, self.clock);
        self.by_use.insert(self.clock, key);
        self.bytes += key.2;
        Some(gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_beyond_the_budget_are_read_until_a_kept_one_goes_cold() {
        let cold = COLD_BUDGETS * 100;
        let mut kept = Kept::default();
        for key in [(0, 0, 40), (0, 100, 40)] {
            assert!(!kept.touch(key));
            assert_eq!(kept.keep(key, 100), Some(vec![]));
        }
        assert!(kept.touch((0, 0, 40)));
        // No room without letting a warm chunk go: read, not kept.
        assert!(!kept.touch((1, 0, 40)));
        assert_eq!(kept.keep((1, 0, 40), 100), None);
        assert_eq!(kept.bytes, 80);
        // Reads of other chunks, until (0, 100) has not been read for
        // COLD_BUDGETS budgets; (0, 0), read since, is still warm.
        while kept.clock < cold + 100 {
            assert!(!kept.touch((2, 0, 50)));
        }
        assert!(kept.touch((0, 0, 40)));
        assert_eq!(kept.keep((1, 0, 40), 100), Some(vec![(0, 100, 40)]));
        assert_eq!(kept.bytes, 80);
        assert!(!kept.touch((0, 100, 40)));
        // Both kept chunks are warm: no room.
        assert_eq!(kept.keep((1, 50, 90), 100), None);
    }

    #[test]
    fn a_kept_chunk_is_handed_out_again_and_one_over_the_budget_is_not_kept() {
        let cache = ChunkCache::new(100);
        assert_eq!(cache.get(0, 10, 40), Err(true));
        cache.put(0, 10, Bytes::from(vec![7u8; 40]));
        assert_eq!(cache.get(0, 10, 40), Ok(Bytes::from(vec![7u8; 40])));
        // Another range of the same part is another chunk.
        assert_eq!(cache.get(0, 11, 40), Err(true));
        // Over the budget: read, never kept.
        assert_eq!(cache.get(1, 0, 101), Err(false));
        cache.put(1, 0, Bytes::from(vec![1u8; 101]));
        assert_eq!(cache.get(1, 0, 101), Err(false));
    }
}
