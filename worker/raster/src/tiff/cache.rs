//! Decoded blocks kept across window reads of one file.
//!
//! Chips rarely align with tiles: 256-pixel chips over 512-pixel COG tiles
//! touch each tile four times, and chips over strips touch every strip once per
//! chip column. Without a cache each touch is a fetch and a decode; with it, a
//! task fetches and decodes each block it needs once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// A block: (level, mask, block index).
pub(crate) type Key = (usize, bool, usize);

/// A decoded block, or `None` for a sparse (empty) one.
pub(crate) type Block = Option<Arc<Vec<u8>>>;

/// First-in-first-out cache bounded in decoded bytes.
pub(crate) struct BlockCache {
    inner: Mutex<Inner>,
    cap: usize,
}

struct Inner {
    map: HashMap<Key, Block>,
    order: VecDeque<Key>,
    bytes: usize,
}

impl BlockCache {
    /// A cache holding at most `cap` decoded bytes.
    pub(crate) fn new(cap: usize) -> BlockCache {
        BlockCache {
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                order: VecDeque::new(),
                bytes: 0,
            }),
            cap,
        }
    }

    /// The block, when cached.
    pub(crate) fn get(&self, k: &Key) -> Option<Block> {
        let g = self
            .inner
            .lock()
            .expect("block cache lock poisoned: this is a bug");
        g.map.get(k).cloned()
    }

    /// Keeps a block, evicting the oldest until it fits; blocks larger than the
    /// whole cache are not kept.
    pub(crate) fn put(&self, k: Key, b: Block) {
        let n = b.as_ref().map_or(0, |v| v.len());
        if n > self.cap {
            return;
        }
        let mut g = self
            .inner
            .lock()
            .expect("block cache lock poisoned: this is a bug");
        if g.map.contains_key(&k) {
            return;
        }
        while g.bytes + n > self.cap {
            let Some(old) = g.order.pop_front() else {
                break;
            };
            if let Some(Some(v)) = g.map.remove(&old) {
                g.bytes -= v.len();
            }
        }
        g.bytes += n;
        g.order.push_back(k);
        g.map.insert(k, b);
    }
}

impl BlockCache {
    /// Drops the blocks `done` says no later read needs.
    pub(crate) fn forget(&self, done: impl Fn(&Key) -> bool) {
        let mut g = self
            .inner
            .lock()
            .expect("block cache lock poisoned: this is a bug");
        let Inner { map, order, bytes } = &mut *g;
        order.retain(|k| {
            if !done(k) {
                return true;
            }
            if let Some(Some(v)) = map.remove(k) {
                *bytes -= v.len();
            }
            false
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_oldest_within_cap() {
        let c = BlockCache::new(10);
        c.put((0, false, 1), Some(Arc::new(vec![0; 6])));
        c.put((0, false, 2), Some(Arc::new(vec![0; 6])));
        assert!(c.get(&(0, false, 1)).is_none(), "evicted to fit");
        assert!(c.get(&(0, false, 2)).is_some());
        c.put((0, false, 3), None);
        assert_eq!(
            c.get(&(0, false, 3)),
            Some(None),
            "sparse blocks are cached too"
        );
        c.put((0, false, 4), Some(Arc::new(vec![0; 11])));
        assert!(c.get(&(0, false, 4)).is_none(), "too large to keep");
    }

    #[test]
    fn forgotten_blocks_free_their_room() {
        let c = BlockCache::new(10);
        c.put((0, false, 1), Some(Arc::new(vec![0; 5])));
        c.put((0, false, 2), Some(Arc::new(vec![0; 5])));
        c.forget(|k| k.2 == 1);
        assert!(c.get(&(0, false, 1)).is_none());
        c.put((0, false, 3), Some(Arc::new(vec![0; 5])));
        assert!(
            c.get(&(0, false, 2)).is_some() && c.get(&(0, false, 3)).is_some(),
            "the forgotten block's room is free: nothing else was evicted"
        );
    }
}
