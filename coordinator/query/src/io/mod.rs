//! The bottom layer: a dataset's bytes. Ranged reads of any store; reads of
//! local files into reused buffers; and, for a resident search, one cache of
//! column chunks the crate owns.

mod cache;
mod local;
mod store;
mod upload;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use rsembed_store::Location;

pub use cache::CACHE_BYTES;
pub use store::{check_output_file, delete_if_present, put_json, StoreReader};
pub use upload::AtomicUpload;

use cache::ChunkCache;
use local::Buffers;

/// How an index reads its parts' bytes, counting every byte fetched.
#[derive(Debug, Clone)]
pub struct Reads {
    store: Arc<dyn ObjectStore>,
    /// Whether the parts are local files (read with `pread`, not the store).
    local: bool,
    /// Bytes fetched so far, footers included.
    read: Arc<AtomicU64>,
    /// Buffers for column chunks read from local files.
    buffers: Arc<Buffers>,
    /// The chunks a resident search keeps ([`Reads::keep_chunks`]).
    cache: Option<Arc<ChunkCache>>,
    /// The local parts a kept chunk was handed out of since
    /// [`Reads::shrunk`] last looked: their files, and the sizes read.
    served: Arc<Mutex<BTreeMap<usize, (std::path::PathBuf, u64)>>>,
}

impl Reads {
    /// Reads of the parts under `root`.
    pub fn new(root: &Location) -> Reads {
        Reads {
            store: root.store.clone(),
            local: root.url.scheme() == "file",
            read: Arc::default(),
            buffers: Arc::default(),
            cache: None,
            served: Arc::default(),
        }
    }

    /// Keeps up to `budget` bytes of the column chunks read from now on, for
    /// a resident search, which reads the same lists again and again.
    pub fn keep_chunks(&mut self, budget: usize) {
        self.cache = Some(Arc::new(ChunkCache::new(budget)));
    }

    /// Bytes fetched so far, footers included (a kept chunk counts each
    /// time it is read, as a chunk of the page cache does).
    pub fn bytes_read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// parquet's reader of one part, `size` bytes at `path`, counted here.
    pub fn reader(&self, path: &Path, size: u64) -> StoreReader {
        StoreReader::new(self.store.clone(), path.clone(), size, self.read.clone())
    }

    /// Bytes `start..end` of part number `part` (the object `path` of
    /// `size` bytes, whose URI is `uri`): from the chunks kept, else into a
    /// reused buffer where the part is local, else from the store.
    pub async fn range(
        &self,
        part: usize,
        (path, uri, size): (&Path, &str, u64),
        start: u64,
        end: u64,
    ) -> Result<Bytes, object_store::Error> {
        let len = (end - start) as usize;
        let keep = match self.cache.as_ref().map(|c| c.get(part, start, len)) {
            Some(Ok(data)) => {
                if let Some(file) = self.local_path(uri) {
                    let mut served = self.served.lock().expect("served lock");
                    served.entry(part).or_insert((file, size));
                }
                self.read.fetch_add(data.len() as u64, Ordering::Relaxed);
                return Ok(data);
            }
            Some(Err(keep)) => keep,
            None => false,
        };
        let local = match self.local_path(uri) {
            Some(file) => local::read(&file, start, len, &self.buffers, keep).await,
            None => None,
        };
        let data = match local {
            Some(data) => data,
            None => self.store.get_range(path, start..end).await?,
        };
        if keep {
            if let Some(c) = &self.cache {
                c.put(part, start, data.clone());
            }
        }
        self.read.fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(data)
    }

    /// A local part a kept chunk was handed out of since the last call,
    /// whose file is now shorter than it was read: a chunk kept of it is no
    /// longer the file's, and an answer made of it is not to be trusted. A
    /// copy of our own cannot be torn as a map of the file was, but a file
    /// cut short under a resident search is still an error, never a
    /// silent answer from what it held.
    pub fn shrunk(&self) -> Option<usize> {
        let served = std::mem::take(&mut *self.served.lock().expect("served lock"));
        served.into_iter().find_map(|(part, (file, size))| {
            let now = std::fs::metadata(&file).map_or(0, |m| m.len());
            (now < size).then_some(part)
        })
    }

    /// The file of a local part.
    fn local_path(&self, uri: &str) -> Option<std::path::PathBuf> {
        if !self.local {
            return None;
        }
        url::Url::parse(uri).ok()?.to_file_path().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the maps guarded against with a SIGBUS handler: a file truncated
    /// under a resident search. A kept chunk is our own copy, still the bytes
    /// that were read; a chunk past the new end is an error, not a crash.
    #[tokio::test]
    async fn a_kept_chunk_outlives_its_file_s_truncation_and_reads_past_the_end_fail() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("part.parquet");
        let bytes: Vec<u8> = (0..3 * 65_536u32).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(&file, &bytes).unwrap();
        let root = rsembed_store::StoreCache::default()
            .location(dir.path().to_str().unwrap())
            .unwrap();
        let path = root.child("part.parquet");
        let uri = root.uri_of(&path);
        let size = bytes.len() as u64;
        let mut reads = Reads::new(&root);
        reads.keep_chunks(1 << 20);
        let a = reads
            .range(0, (&path, &uri, size), 1_000, 71_000)
            .await
            .unwrap();
        assert_eq!(&a[..], &bytes[1_000..71_000]);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(4_096)
            .unwrap();
        assert_eq!(&a[..], &bytes[1_000..71_000], "the bytes held are ours");
        assert_eq!(reads.shrunk(), None, "nothing handed out of the cache yet");
        let again = reads
            .range(0, (&path, &uri, size), 1_000, 71_000)
            .await
            .unwrap();
        assert_eq!(again, a, "kept");
        assert_eq!(reads.shrunk(), Some(0), "handed out of a file cut short");
        assert_eq!(reads.shrunk(), None, "told once");
        assert!(reads
            .range(0, (&path, &uri, size), 80_000, 90_000)
            .await
            .is_err());
        assert_eq!(reads.bytes_read(), 140_000, "a kept chunk counts as read");
    }
}
