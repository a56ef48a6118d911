//! Reads of local files: into reused buffers, from the page cache on the
//! calling thread where it holds the bytes, on tokio's blocking pool where
//! a read may wait for a disk.

use std::sync::Arc;

use bytes::Bytes;

/// Column chunk buffers an index reuses, for local files.
///
/// object_store's local reader zero-fills a new buffer for every range
/// before `pread` copies into it. A probed search reads each list's
/// embeddings once a query, so that zeroing was 41 % of a resident search at
/// `--nprobe 63` (190 MiB a query, `perf`; docs/benchmarks.md). A buffer
/// lent here is zeroed once, when it first grows, and comes back when the
/// last page read from it is dropped.
#[derive(Debug, Default)]
pub(crate) struct Buffers {
    held: std::sync::Mutex<Vec<Vec<u8>>>,
}

/// Bytes of buffers held between reads: enough for the groups in flight of
/// a default search at D = 768 and up to 8,192-row groups of int8, or of
/// 1,000-row groups of f32; larger ones are dropped when they come back.
const BUFFERS_HELD_BYTES: usize = 64 << 20;

impl Buffers {
    /// A buffer of at least `len` bytes, the largest held if any.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut buf = self
            .held
            .lock()
            .expect("buffer pool lock")
            .pop()
            .unwrap_or_default();
        if buf.len() < len {
            buf.resize(len, 0);
        }
        buf
    }

    fn give(&self, buf: Vec<u8>) {
        let mut held = self.held.lock().expect("buffer pool lock");
        let bytes: usize = held.iter().map(Vec::len).sum();
        if bytes + buf.len() <= BUFFERS_HELD_BYTES {
            held.push(buf);
            held.sort_by_key(Vec::len);
        }
    }
}

/// Reads the bytes of `file` at `at` into `buf` that the page cache holds,
/// on this thread and without waiting for a disk (`preadv2` with
/// `RWF_NOWAIT`): how many, from the start, fewer where the cache or the
/// file ends, 0 where the kernel or the file system does not take the flag.
///
/// A search reads its lists from warm files. Handing each read to tokio's
/// blocking pool cost a quarter of a resident query at `--nprobe 63` (two
/// hand-offs a row group, and up to `--concurrency` pool threads on top of
/// the workers on the same cores; docs/benchmarks.md); a read the cache
/// cannot serve still goes there ([`read_rest`]).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn read_cached(file: &std::fs::File, buf: &mut [u8], at: u64) -> usize {
    use std::os::fd::AsRawFd;
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        let iov = libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        };
        let Ok(offset) = libc::off_t::try_from(at + done as u64) else {
            break;
        };
        // SAFETY: one iovec over `rest`, alive and not otherwise borrowed
        // for the call; the descriptor is `file`'s, open for the call.
        let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset, libc::RWF_NOWAIT) };
        if n <= 0 {
            break;
        }
        done += n as usize;
    }
    done
}

/// Without `preadv2`, every read goes to the blocking pool.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn read_cached(_file: &std::fs::File, _buf: &mut [u8], _at: u64) -> usize {
    0
}

/// `len` bytes at `start` of the local file `path`: into a buffer of
/// `buffers`, lent out until the last page read from it is dropped, or,
/// for a chunk the caller keeps ([`super::ChunkCache`]), into one of their
/// own; `None` when the file cannot be read so (the store then reads it,
/// and reports why).
#[cfg(unix)]
pub(crate) async fn read(
    path: &std::path::Path,
    start: u64,
    len: usize,
    buffers: &Arc<Buffers>,
    keep: bool,
) -> Option<Bytes> {
    let file = std::fs::File::open(path).ok()?;
    let mut buf = if keep {
        vec![0; len]
    } else {
        buffers.take(len)
    };
    let cached = read_cached(&file, &mut buf[..len], start);
    let buf = read_rest(file, buf, cached, start, len).await?;
    Some(if keep {
        Bytes::from(buf)
    } else {
        Bytes::from_owner(Lent {
            buf,
            len,
            buffers: buffers.clone(),
        })
    })
}

/// Elsewhere every read goes through the store.
#[cfg(not(unix))]
pub(crate) async fn read(
    _path: &std::path::Path,
    _start: u64,
    _len: usize,
    _buffers: &Arc<Buffers>,
    _keep: bool,
) -> Option<Bytes> {
    None
}

/// `buf`, once bytes `from..len` of it are read from `file` at
/// `start + from` on tokio's blocking pool (a read that may wait for a
/// disk); `None` when they cannot be.
#[cfg(unix)]
async fn read_rest(
    file: std::fs::File,
    mut buf: Vec<u8>,
    from: usize,
    start: u64,
    len: usize,
) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    if from < len {
        let read = tokio::task::spawn_blocking(move || {
            file.read_exact_at(&mut buf[from..len], start + from as u64)
                .ok()?;
            Some(buf)
        });
        buf = read.await.ok().flatten()?;
    }
    Some(buf)
}

/// A buffer lent out as [`Bytes`]: its first `len` bytes.
struct Lent {
    buf: Vec<u8>,
    len: usize,
    buffers: Arc<Buffers>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.buffers.give(std::mem::take(&mut self.buf));
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// Whatever part the page cache serves, the bytes are the file's: read
    /// from the cache alone, from the blocking pool alone, or split.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_is_the_file_s_bytes_however_much_the_cache_serves() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chunk");
        let bytes: Vec<u8> = (0..3u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(&path, &bytes).unwrap();
        let (start, len) = (4_096 + 17, (2 << 20) + 5);
        let want = &bytes[start as usize..start as usize + len];
        let file = std::fs::File::open(&path).unwrap();
        let mut buf = vec![0u8; len];
        let cached = read_cached(&file, &mut buf, start);
        // Just written, the file is in the cache where the flag is taken.
        if cfg!(all(target_os = "linux", target_env = "gnu")) && cached > 0 {
            assert_eq!(cached, len);
            assert_eq!(buf, want);
        }
        let buffers = Arc::new(Buffers::default());
        for from in [0, 1, len / 2, len] {
            let file = std::fs::File::open(&path).unwrap();
            let mut buf = buffers.take(len);
            buf[..from].copy_from_slice(&want[..from]);
            let got = read_rest(file, buf, from, start, len)
                .await
                .expect("readable");
            assert_eq!(&got[..len], want, "the first {from} bytes from the cache");
        }
        // Past the end: the cache serves what there is, the rest is refused.
        let file = std::fs::File::open(&path).unwrap();
        let at = bytes.len() as u64 - 10;
        let mut buf = vec![0u8; 100];
        let cached = read_cached(&file, &mut buf, at);
        assert!(cached <= 10);
        let buf = buffers.take(100);
        assert!(read_rest(file, buf, cached, at, 100).await.is_none());
    }

    /// A chunk read to keep is the file's bytes in a buffer of its own; one
    /// read to lend goes back to the pool when its last page is dropped.
    #[tokio::test]
    async fn a_kept_read_owns_its_bytes_and_a_lent_one_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chunk");
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let buffers = Arc::new(Buffers::default());
        let kept = read(&path, 100, 5_000, &buffers, true).await.unwrap();
        assert_eq!(&kept[..], &bytes[100..5_100]);
        assert!(buffers.held.lock().unwrap().is_empty());
        let lent = read(&path, 7, 300, &buffers, false).await.unwrap();
        assert_eq!(&lent[..], &bytes[7..307]);
        drop(lent);
        assert_eq!(buffers.held.lock().unwrap().len(), 1);
        assert!(read(&path, 9_990, 100, &buffers, false).await.is_none());
    }
}
