//! A resident search's local column chunks, read through memory maps of the
//! files instead of copied out of the page cache.
//!
//! Why: a resident search (`--vectors -`) reads the same lists query after
//! query from warm files. Copying each list out of the page cache
//! (`_copy_to_iter` and the page lookups) was 40 % of a query at
//! `--nprobe 1` (`perf`, docs/benchmarks.md), and the page cache hands out
//! bytes 1.7–3.8× slower than a process reads its own memory. A chunk
//! mapped once is read again at memory speed, with no system call.
//!
//! What it costs, and the bounds:
//! - Mapped pages a search touched count in its RSS. The chunks kept
//!   mapped are capped at [`MAPPED_BYTES`], so a session's memory does not
//!   grow with the rows it has read: beyond the cap chunks are copied as
//!   before, and a kept chunk long unread is let go (`MADV_DONTNEED`: the
//!   page-table entries go, the page cache keeps the data) for a new one
//!   ([`Kept`]).
//! - A chunk is mapped only when `mincore` says the page cache holds all of
//!   it: a worker thread must never wait on a disk in a page fault. Anything
//!   else is read as before ([`crate::query::index`]).
//! - A file that shrinks while mapped would kill the process with SIGBUS on
//!   the next touch of a page past its new end. A SIGBUS handler maps a zero
//!   page over such a page instead and marks the file torn; the search that
//!   touched it then fails with an error naming the file
//!   ([`Maps::torn`]). A fault elsewhere goes on to the handler that was
//!   there before (Rust's stack-overflow report, else the default action).

use std::collections::{BTreeMap, HashMap};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;

/// Bytes of column chunks a resident search keeps mapped, at most: the
/// lists of a few hundred queries at `--nprobe 1` (2.8 MiB a list of 1,000
/// rows of f32 at D = 768), a fortieth of FAISS's memory for the same 10^6
/// rows.
pub(crate) const MAPPED_BYTES: usize = 256 << 20;

/// Files mapped at once, at most; reads of any further file are copied.
const SLOTS: usize = 1024;

/// The address range of one file's map, for the SIGBUS handler, which may
/// read nothing but atomics.
struct Slot {
    used: AtomicBool,
    start: AtomicUsize,
    end: AtomicUsize,
    torn: AtomicBool,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            used: AtomicBool::new(false),
            start: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            torn: AtomicBool::new(false),
        }
    }
}

static SLOTS_IN_USE: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];

/// The SIGBUS action before ours, to hand faults that are not ours on to.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

fn page() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    // SAFETY: sysconf reads a constant of the system.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    })
}

/// Installs the SIGBUS handler once; false when it cannot be (no maps then).
fn install() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        // The handler reads the page size: made here, never there.
        page();
        // SAFETY: sigaction with valid pointers to zero-initialised (a
        // valid state for the C struct) actions; the handler only touches
        // atomics and makes async-signal-safe system calls.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return false;
            }
            let _ = PREVIOUS.set(old);
            let mut ours: libc::sigaction = std::mem::zeroed();
            ours.sa_sigaction = on_sigbus as *const () as usize;
            ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut ours.sa_mask);
            libc::sigaction(libc::SIGBUS, &ours, std::ptr::null_mut()) == 0
        }
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for slot in &SLOTS_IN_USE {
        let end = slot.end.load(Ordering::Acquire);
        let start = slot.start.load(Ordering::Acquire);
        if start <= addr && addr < end {
            let at = addr & !(page() - 1);
            // SAFETY: replaces one page of our own read-only map (the range
            // is registered only while the map exists) with a zero page;
            // mmap is a plain system call, safe in a handler.
            let p = unsafe {
                libc::mmap(
                    at as *mut libc::c_void,
                    page(),
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                slot.torn.store(true, Ordering::Release);
                return;
            }
        }
    }
    // Not a page of ours: the handler before ours decides (Rust's reports a
    // stack overflow and resets to the default otherwise); without one, the
    // default action, once the faulting access runs again.
    // SAFETY: calls the previous action as its flags say it takes its
    // arguments, or restores the default action.
    unsafe {
        match PREVIOUS.get() {
            Some(prev)
                if prev.sa_sigaction != libc::SIG_DFL && prev.sa_sigaction != libc::SIG_IGN =>
            {
                if prev.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(prev.sa_sigaction);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(prev.sa_sigaction);
                    f(sig);
                }
            }
            _ => {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            }
        }
    }
}

/// A whole file mapped read-only, its range registered with the handler.
struct FileMap {
    ptr: NonNull<u8>,
    len: usize,
    slot: usize,
}

// SAFETY: the map is read-only and lives until the last owner drops it.
unsafe impl Send for FileMap {}
// SAFETY: as above; shared reads only.
unsafe impl Sync for FileMap {}

impl FileMap {
    fn open(path: &std::path::Path, size: u64) -> Option<FileMap> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(path).ok()?;
        let len = usize::try_from(size).ok().filter(|&n| n > 0)?;
        if file.metadata().ok()?.len() != size {
            return None;
        }
        let slot = SLOTS_IN_USE.iter().position(|s| {
            s.used
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        // SAFETY: a fresh read-only shared map of an open file's first `len`
        // bytes; the descriptor may close after (the map keeps the file).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        let Some(ptr) = NonNull::new(p.cast::<u8>()).filter(|_| p != libc::MAP_FAILED) else {
            SLOTS_IN_USE[slot].used.store(false, Ordering::Release);
            return None;
        };
        let s = &SLOTS_IN_USE[slot];
        s.torn.store(false, Ordering::Release);
        s.start.store(ptr.as_ptr() as usize, Ordering::Release);
        s.end.store(ptr.as_ptr() as usize + len, Ordering::Release);
        Some(FileMap { ptr, len, slot })
    }

    fn torn(&self) -> bool {
        SLOTS_IN_USE[self.slot].torn.load(Ordering::Acquire)
    }

    /// Whether the page cache holds every page of `start..start + len`.
    fn resident(&self, start: usize, len: usize) -> bool {
        let page = page();
        let from = start & !(page - 1);
        let pages = (start + len - from).div_ceil(page);
        let mut vec = vec![0u8; pages];
        // SAFETY: the range lies in our map (checked by the caller) and
        // `vec` has one byte a page.
        let ok = unsafe {
            libc::mincore(
                self.ptr.as_ptr().add(from).cast(),
                start + len - from,
                vec.as_mut_ptr(),
            )
        } == 0;
        ok && vec.iter().all(|b| b & 1 == 1)
    }

    /// Lets the pages of `start..start + len` go from this process (the
    /// page cache keeps them), widened to the 64 KiB the kernel maps around
    /// a fault.
    fn release(&self, start: usize, len: usize) {
        const AROUND: usize = 64 << 10;
        let from = start & !(AROUND - 1);
        let to = (start + len).next_multiple_of(AROUND).min(self.len);
        // SAFETY: advice on a range of our own map; DONTNEED on a shared
        // file map drops page-table entries, and later reads fault the
        // file's bytes in again.
        unsafe {
            libc::madvise(
                self.ptr.as_ptr().add(from).cast(),
                to - from,
                libc::MADV_DONTNEED,
            );
        }
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: our map, unmapped once; no `Window` of it is alive.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        let s = &SLOTS_IN_USE[self.slot];
        s.end.store(0, Ordering::Release);
        s.start.store(0, Ordering::Release);
        s.torn.store(false, Ordering::Release);
        s.used.store(false, Ordering::Release);
    }
}

/// Bytes `start..start + len` of a map, handed out as [`Bytes`].
struct Window {
    map: Arc<FileMap>,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for Window {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the range lies in the map, which `self.map` keeps alive;
        // the map is read-only. A file shrunk under it reads zeros
        // (`on_sigbus`) and the search reports it.
        unsafe { std::slice::from_raw_parts(self.map.ptr.as_ptr().add(self.start), self.len) }
    }
}

/// A chunk kept mapped: (part, start, length).
type Key = (usize, usize, usize);

/// The chunks kept mapped, by when each was last read.
///
/// A chunk is mapped when it fits in the budget, and stays mapped while it
/// is read; one no read has asked for over [`COLD_BUDGETS`] budgets' worth of
/// reads is let go to make room. There is no eviction of warm chunks: when
/// the lists a session reads outgrow the budget, the chunks beyond it are
/// copied as a one-shot search copies them. Mapping them in turn, least
/// recently used out, cost more than copying (page faults, then
/// `MADV_DONTNEED` and TLB shootdowns: 1.2–1.3× the copying search at
/// `--nprobe 8` and 63, docs/benchmarks.md).
#[derive(Default)]
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
    /// it does not fit (the chunk is then read, not mapped).
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

/// The maps of one index's local parts.
pub(crate) struct Maps {
    budget: usize,
    /// Part → its map; `None` once it could not be mapped (or was torn).
    files: Mutex<HashMap<usize, Option<Arc<FileMap>>>>,
    kept: Mutex<Kept>,
}

impl std::fmt::Debug for Maps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Maps")
            .field("budget", &self.budget)
            .finish()
    }
}

impl Maps {
    /// Maps that keep at most `budget` bytes of chunks; `None` where the
    /// SIGBUS handler cannot be installed.
    pub(crate) fn new(budget: usize) -> Option<Maps> {
        install().then(|| Maps {
            budget,
            files: Mutex::default(),
            kept: Mutex::default(),
        })
    }

    /// Bytes `start..start + len` of part `part` (the file `path` of
    /// `size` bytes), mapped; `None` when they are to be read instead: not
    /// all in the page cache, the file not mappable or not of that size, or
    /// more than the budget.
    pub(crate) fn read(
        &self,
        part: usize,
        path: &std::path::Path,
        size: u64,
        start: u64,
        len: usize,
    ) -> Option<Bytes> {
        if len == 0 || len > self.budget {
            return None;
        }
        let map = {
            let mut files = self.files.lock().expect("maps lock");
            files
                .entry(part)
                .or_insert_with(|| FileMap::open(path, size).map(Arc::new))
                .clone()?
        };
        let start = usize::try_from(start).ok()?;
        if start.checked_add(len).is_none_or(|end| end > map.len) {
            return None;
        }
        let key = (part, start, len);
        let kept = {
            let mut chunks = self.kept.lock().expect("maps lock");
            let kept = chunks.touch(key);
            if !kept && chunks.room(len, self.budget).is_none() {
                return None;
            }
            kept
        };
        if !kept {
            if !map.resident(start, len) {
                return None;
            }
            let gone = self
                .kept
                .lock()
                .expect("maps lock")
                .keep(key, self.budget)?;
            if !gone.is_empty() {
                let files = self.files.lock().expect("maps lock");
                for (p, s, n) in gone {
                    if let Some(Some(m)) = files.get(&p) {
                        m.release(s, n);
                    }
                }
            }
        }
        Some(Bytes::from_owner(Window { map, start, len }))
    }

    /// The parts whose files shrank while mapped (their pages past the new
    /// end read as zeros); each is reported once, and read, not mapped,
    /// from then on.
    pub(crate) fn torn(&self) -> Vec<usize> {
        let mut files = self.files.lock().expect("maps lock");
        let torn: Vec<usize> = files
            .iter()
            .filter(|(_, m)| m.as_ref().is_some_and(|m| m.torn()))
            .map(|(&p, _)| p)
            .collect();
        for p in &torn {
            files.insert(*p, None);
        }
        torn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_chunk_is_the_file_s_bytes_and_a_shrunk_file_reads_zeros_and_is_torn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("part.parquet");
        let bytes: Vec<u8> = (0..3 * 65536u32).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(&path, &bytes).unwrap();
        // Warm: the file was just written, so the page cache holds it.
        let maps = Maps::new(1 << 20).unwrap();
        let size = bytes.len() as u64;
        let a = maps.read(0, &path, size, 1000, 70000).expect("mapped");
        assert_eq!(&a[..], &bytes[1000..71000]);
        // Read again: the same bytes, from the chunk kept.
        let again = maps.read(0, &path, size, 1000, 70000).unwrap();
        assert_eq!(&again[..], &a[..]);
        assert!(maps.torn().is_empty());
        // A file of another size than the index saw is not mapped.
        assert!(maps.read(1, &path, size + 1, 0, 10).is_none());
        // Past the end, or over the budget: read, not mapped.
        assert!(maps.read(0, &path, size, size - 5, 10).is_none());
        assert!(maps.read(0, &path, size, 0, 2 << 20).is_none());

        // The file shrinks under the map: a touch past the new end would be
        // SIGBUS; it reads zeros and the part is reported torn, once.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(4096)
            .unwrap();
        let tail = &a[60000..];
        assert!(
            tail.iter().all(|&b| b == 0),
            "pages past the end read zeros"
        );
        assert_eq!(maps.torn(), vec![0]);
        assert!(maps.torn().is_empty());
        // From then on the part is read, not mapped.
        assert!(maps.read(0, &path, size, 1000, 100).is_none());
    }

    /// A SIGBUS on a page that is not one of ours still kills the process
    /// (the handler hands it on): run in a child process of this test.
    #[test]
    fn a_sigbus_elsewhere_still_kills_the_process() {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::ExitStatusExt;
        const CHILD: &str = "RSEMBED_TEST_SIGBUS_CHILD";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "query::mapped::tests::a_sigbus_elsewhere_still_kills_the_process",
                    "--nocapture",
                ])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.signal(),
                Some(libc::SIGBUS),
                "{:?}: {err}",
                out.status
            );
            assert!(err.contains("handler installed"), "{err}");
            return;
        }
        let _maps = Maps::new(1 << 20).unwrap();
        eprintln!("handler installed");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other");
        std::fs::write(&path, vec![7u8; 3 * 4096]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        // SAFETY: a map of our own, read past the file's end on purpose.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * 4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        file.set_len(0).unwrap();
        // SAFETY: deliberately faults (SIGBUS): the page is past the end.
        let b = unsafe { std::ptr::read_volatile(p.cast::<u8>().add(4096)) };
        panic!("read {b} past the end of a file without SIGBUS");
    }

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
}
