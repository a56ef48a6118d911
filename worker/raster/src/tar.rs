//! Streaming reader for tar archives (`.tar`, `.tar.gz`, `.tgz`) of image chips.
//!
//! Archives are untrusted and may be larger than memory or disk, so they are read
//! once, front to back, and never unpacked. Each entry either becomes an
//! [`Entry::Image`], an [`Entry::Rejected`] error record, or is skipped; whatever
//! breaks the archive as a whole (bad gzip, bad header, truncation) ends the walk
//! with a [`TarError`] after everything before it was delivered.

use std::cell::Cell;
use std::io::{self, Read};

use ::tar::{Archive, EntryType};

use crate::kind::InputKind;

/// Extension records (GNU long names, PAX headers) are read whole by the `tar`
/// crate, so the bytes it may consume between two members are capped; real ones
/// are a few KiB, and a gzip bomb disguised as a long name must not exhaust memory.
const META_BUDGET: u64 = 1 << 20;
/// First allocation for a member; the buffer then grows only with data actually read.
const INITIAL_CAPACITY: u64 = 1 << 20;

/// Bounds for one archive.
#[derive(Debug, Clone, Copy)]
pub struct TarLimits {
    /// Members whose size is above this are rejected, and their bytes skipped.
    pub max_member_bytes: u64,
    /// Entries (of every kind) after which the archive is refused.
    pub max_members: u64,
}

impl Default for TarLimits {
    fn default() -> Self {
        TarLimits {
            max_member_bytes: 1 << 30,
            max_members: 10_000_000,
        }
    }
}

/// One image member, read whole into memory (bounded by `max_member_bytes`).
#[derive(Debug, Clone)]
pub struct Member {
    /// Normalized path: `/`-separated, no leading `./`, no empty components.
    pub path: String,
    /// The member's bytes.
    pub data: Vec<u8>,
}

/// What happened to one entry.
#[derive(Debug, Clone)]
pub enum Entry {
    /// An image member to decode.
    Image(Member),
    /// An entry that must be recorded as failed.
    Rejected {
        /// The entry's path (as stored, lossily decoded, when it could not be normalized).
        path: String,
        /// Why it was refused.
        reason: String,
    },
}

/// Counts of one walk.
#[derive(Debug, Default, Clone, Copy)]
pub struct TarStats {
    /// Image members delivered.
    pub members: u64,
    /// Regular files skipped because they are not images (or are dotfiles).
    pub skipped: u64,
    /// Entries delivered as [`Entry::Rejected`].
    pub rejected: u64,
}

/// Failures of an archive as a whole.
#[derive(Debug, thiserror::Error)]
pub enum TarError {
    /// The gzip layer is corrupt or truncated.
    #[error("corrupt gzip stream")]
    Gzip(#[source] io::Error),
    /// The archive bytes could not be read.
    #[error("reading archive")]
    Read(#[source] io::Error),
    /// The tar structure is invalid (bad header checksum, bad number field, …).
    #[error("malformed tar archive")]
    Format(#[source] io::Error),
    /// The archive ends inside a header or a member, at this uncompressed offset.
    #[error("tar archive truncated at byte {0}")]
    Truncated(u64),
    /// Extension records (long names, PAX) between two members exceed this many bytes.
    #[error("tar extension headers larger than {0} bytes")]
    MetadataTooLarge(u64),
    /// More entries than [`TarLimits::max_members`] (this many).
    #[error("tar archive has more than {0} entries")]
    TooManyMembers(u64),
    /// The callback asked to stop (e.g. its downstream channel closed).
    #[error("stopped by consumer: {0}")]
    Callback(String),
}

/// The source_uri of a member: `<archive_uri>#<member_path>`.
pub fn member_uri(archive_uri: &str, member_path: &str) -> String {
    format!("{archive_uri}#{member_path}")
}

/// Shared between the walk and [`Meter`], which the `tar` crate owns while iterating.
#[derive(Default)]
struct MeterState {
    pos: Cell<u64>,
    /// Absolute position past which reads fail (the metadata budget).
    stop_at: Cell<u64>,
    over_budget: Cell<bool>,
    eof: Cell<bool>,
    source_failed: Cell<bool>,
}

impl MeterState {
    /// `tar`'s `io::Error`s do not say whether the bytes or the structure failed;
    /// the meter saw which.
    fn error(&self, e: io::Error, gz: bool) -> TarError {
        match (
            self.over_budget.get(),
            self.source_failed.get(),
            self.eof.get(),
        ) {
            (true, _, _) => TarError::MetadataTooLarge(META_BUDGET),
            (_, true, _) if gz => TarError::Gzip(e),
            (_, true, _) => TarError::Read(e),
            (_, _, true) => TarError::Truncated(self.pos.get()),
            _ => TarError::Format(e),
        }
    }
}

/// The byte source as the `tar` crate sees it: counted, bounded, failures noted.
struct Meter<'a, R> {
    inner: R,
    state: &'a MeterState,
}

impl<R: Read> Read for Meter<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let s = self.state;
        let room = s.stop_at.get().saturating_sub(s.pos.get());
        if room == 0 && !buf.is_empty() {
            s.over_budget.set(true);
            return Err(io::Error::other("tar metadata budget exceeded"));
        }
        let len = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..len]).inspect_err(|e| {
            s.source_failed.set(e.kind() != io::ErrorKind::Interrupted);
        })?;
        s.eof.set(s.eof.get() || (n == 0 && len > 0));
        s.pos.set(s.pos.get() + n as u64);
        Ok(n)
    }
}

/// Streams `reader` (the archive bytes; gzip is detected from the magic bytes
/// `1f 8b`, not the name) and calls `f` for every image member and every rejected
/// entry, in archive order.
///
/// Synchronous: the caller runs it on a blocking thread over a bridged async
/// stream. Archive-level errors are returned after everything before them was
/// delivered; a member cut short by the end of the archive is delivered as
/// [`Entry::Rejected`] and then [`TarError::Truncated`] is returned. `f`
/// returning `Err(e)` stops the walk with [`TarError::Callback`].
pub fn walk<R: Read>(
    mut reader: R,
    limits: TarLimits,
    mut f: impl FnMut(Entry) -> Result<(), String>,
) -> Result<TarStats, TarError> {
    let mut magic = Vec::with_capacity(2);
    let head = reader.by_ref().take(2).read_to_end(&mut magic);
    head.map_err(TarError::Read)?;
    let gz = magic == [0x1f, 0x8b];
    let source = Read::chain(&magic[..], reader);
    // Multi-member gzip (pigz, concatenated streams) is valid `.tar.gz`.
    let source: Box<dyn Read + '_> = match gz {
        true => Box::new(flate2::read::MultiGzDecoder::new(source)),
        false => Box::new(source),
    };
    let state = MeterState::default();
    state.stop_at.set(META_BUDGET);
    let inner = Meter {
        inner: source,
        state: &state,
    };
    let mut archive = Archive::new(inner);
    let mut stats = TarStats::default();
    for (seen, next) in (1u64..).zip(archive.entries().map_err(TarError::Format)?) {
        let mut entry = next.map_err(|e| state.error(e, gz))?;
        if seen > limits.max_members {
            return Err(TarError::TooManyMembers(limits.max_members));
        }
        let (kind, size) = (entry.header().entry_type(), entry.size());
        // Sparse entries report their expanded size; the budget needs the stored one.
        let stored = match kind.is_gnu_sparse() {
            true => entry.header().entry_size().map_err(TarError::Format)?,
            false => size,
        };
        // `tar` skips unread data and padding itself before the next header, so
        // the budget covers them plus the next entry's extension records.
        let entry_end = state.pos.get().saturating_add(stored.div_ceil(512) * 512);
        state.stop_at.set(entry_end.saturating_add(META_BUDGET));
        let delivered = match judge(kind, &entry.path_bytes(), size, &limits) {
            Verdict::Structure => continue,
            Verdict::Skip(path) => {
                tracing::debug!(%path, "skipping non-image tar member");
                stats.skipped += 1;
                continue;
            }
            Verdict::Reject(path, reason) => Entry::Rejected { path, reason },
            Verdict::Read(path) => {
                let mut data = Vec::with_capacity(size.min(INITIAL_CAPACITY) as usize);
                entry
                    .read_to_end(&mut data)
                    .map_err(|e| state.error(e, gz))?;
                let have = data.len() as u64;
                if have < size {
                    let reason = format!("truncated: header says {size} bytes, archive has {have}");
                    f(Entry::Rejected { path, reason }).map_err(TarError::Callback)?;
                    return Err(TarError::Truncated(state.pos.get()));
                }
                Entry::Image(Member { path, data })
            }
        };
        match delivered {
            Entry::Image(_) => stats.members += 1,
            Entry::Rejected { .. } => stats.rejected += 1,
        }
        f(delivered).map_err(TarError::Callback)?;
    }
    if gz {
        // The gzip CRC is only checked at the end of the stream, which `tar` stops
        // short of (end-of-archive blocks, record padding); reading on to it turns
        // silently corrupted data into an archive error. Bounded: trailing junk past
        // the budget is left unread.
        let mut rest = archive.into_inner();
        state
            .stop_at
            .set(state.pos.get().saturating_add(META_BUDGET));
        match io::copy(&mut rest, &mut io::sink()) {
            Err(_) if state.over_budget.get() => {}
            Err(e) => return Err(state.error(e, gz)),
            Ok(_) => {}
        }
    }
    Ok(stats)
}

enum Verdict {
    /// Directories and global PAX headers: structure, not content.
    Structure,
    Skip(String),
    Reject(String, String),
    Read(String),
}

fn judge(kind: EntryType, raw: &[u8], size: u64, limits: &TarLimits) -> Verdict {
    if kind == EntryType::XGlobalHeader {
        return Verdict::Structure;
    }
    let path = match normalize(raw) {
        Ok(path) => path,
        Err(reason) => return Verdict::Reject(String::from_utf8_lossy(raw).into_owned(), reason),
    };
    let not_regular = |what: &str| format!("not a regular file: entry is {what}");
    match kind {
        EntryType::Directory => Verdict::Structure,
        EntryType::Symlink => Verdict::Reject(path, not_regular("a symbolic link")),
        EntryType::Link => Verdict::Reject(path, not_regular("a hard link")),
        EntryType::Regular | EntryType::Continuous => match size {
            _ if path.is_empty() => Verdict::Reject(path, "empty member path".into()),
            _ if !is_image_name(&path) => Verdict::Skip(path),
            n if n > limits.max_member_bytes => {
                let max = limits.max_member_bytes;
                Verdict::Reject(
                    path,
                    format!("member is {n} bytes, above the limit of {max}"),
                )
            }
            _ => Verdict::Read(path),
        },
        other => Verdict::Reject(path, not_regular(&format!("of type {other:?}"))),
    }
}

/// Paths are checked even though nothing is written to disk, because member
/// paths end up in source URIs and may be used to extract by downstream tools.
fn normalize(raw: &[u8]) -> Result<String, String> {
    let path = std::str::from_utf8(raw).map_err(|_| "member path is not UTF-8".to_string())?;
    if path.starts_with(['/', '\\']) {
        return Err("absolute member path".into());
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    // Backslashes count too: a Windows consumer would read them as separators.
    if parts.iter().any(|p| p.split('\\').any(|q| q == "..")) {
        return Err("member path escapes the archive (`..`)".into());
    }
    Ok(parts.join("/"))
}

fn is_image_name(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    // Dotfiles are mostly macOS AppleDouble (`._x.jpg`) resource forks, not images.
    !name.starts_with('.')
        && matches!(
            InputKind::of(name),
            Some(InputKind::Image | InputKind::Scene)
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::tar::{Builder, Header};
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::io::Write;

    /// Per-thread accounting, so tests running in parallel do not disturb the peak.
    struct Counting;
    thread_local! {
        static LIVE: Cell<isize> = const { Cell::new(0) };
        static PEAK: Cell<isize> = const { Cell::new(0) };
    }
    fn track(delta: isize) {
        let _ = LIVE.try_with(|live| {
            live.set(live.get() + delta);
            let _ = PEAK.try_with(|peak| peak.set(peak.get().max(live.get())));
        });
    }
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            track(l.size() as isize);
            unsafe { System.alloc(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            track(-(l.size() as isize));
            unsafe { System.dealloc(p, l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
            track(new as isize - l.size() as isize);
            unsafe { System.realloc(p, l, new) }
        }
    }
    #[global_allocator]
    static ALLOC: Counting = Counting;

    /// A hand-made header, for what `Builder` refuses to write (`..`, absolute
    /// paths, sizes that lie).
    fn raw(path: &[u8], kind: EntryType, claimed: u64, data: &[u8]) -> Vec<u8> {
        let mut h = Header::new_ustar();
        h.set_entry_type(kind);
        h.set_size(claimed);
        h.set_mode(0o644);
        h.as_old_mut().name[..path.len()].copy_from_slice(path);
        h.set_cksum();
        let mut out = h.as_bytes().to_vec();
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
        out
    }
    fn file(path: &str, data: &[u8]) -> Vec<u8> {
        raw(path.as_bytes(), EntryType::Regular, data.len() as u64, data)
    }
    fn finish(parts: &[Vec<u8>]) -> Vec<u8> {
        let mut out = parts.concat();
        out.resize(out.len() + 1024, 0);
        out
    }
    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }
    /// `img:<path>:<len>` / `rej:<path>`, to compare whole walks at a glance.
    fn run(bytes: &[u8], limits: TarLimits) -> (Vec<String>, Result<TarStats, TarError>) {
        let mut seen = Vec::new();
        let res = walk(bytes, limits, |e| {
            seen.push(match e {
                Entry::Image(m) => format!("img:{}:{}", m.path, m.data.len()),
                Entry::Rejected { path, .. } => format!("rej:{path}"),
            });
            Ok(())
        });
        (seen, res)
    }

    /// Everything `Builder` can write, including a GNU long name (> 100 bytes).
    fn built() -> Vec<u8> {
        let long = format!("{}/long.tif", "d".repeat(150));
        let mut b = Builder::new(Vec::new());
        for (path, kind, data) in [
            ("a.png", EntryType::Regular, &b"aaa"[..]),
            ("nested/dir/", EntryType::Directory, b""),
            ("nested/dir/b.PNG", EntryType::Regular, &[7; 700]),
            ("notes.txt", EntryType::Regular, b"hello"),
            ("._c.jpg", EntryType::Regular, b"apple"),
            ("link.png", EntryType::Symlink, b""),
            ("hard.png", EntryType::Link, b""),
            (&long, EntryType::Regular, b"gnu"),
        ] {
            let mut h = Header::new_gnu();
            h.set_entry_type(kind);
            h.set_size(data.len() as u64);
            h.set_link_name("a.png").unwrap();
            b.append_data(&mut h, path, data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn check_built(bytes: &[u8]) {
        let (seen, res) = run(bytes, TarLimits::default());
        let long = format!("img:{}/long.tif:3", "d".repeat(150));
        let want = [
            "img:a.png:3",
            "img:nested/dir/b.PNG:700",
            "rej:link.png",
            "rej:hard.png",
        ];
        assert_eq!(seen[..4], want, "{seen:?}");
        assert_eq!(seen[4..], [long]);
        let stats = res.unwrap();
        assert_eq!((stats.members, stats.skipped, stats.rejected), (3, 2, 2));
    }

    #[test]
    fn plain_and_gzip_archives_walk_the_same() {
        check_built(&built());
        check_built(&gzip(&built()));
        // Multi-member gzip: the same archive split over two concatenated streams.
        let tar = built();
        let mut two = gzip(&tar[..1024]);
        two.extend(gzip(&tar[1024..]));
        check_built(&two);
    }

    #[test]
    fn hostile_paths_are_rejected_and_walk_goes_on() {
        let bytes = finish(&[
            file("../escape.png", b"x"),
            file("/etc/x.png", b"x"),
            file("a/../../b.png", b"x"),
            file("a\\..\\c.png", b"x"),
            raw(b"bad\xff.png", EntryType::Regular, 1, b"x"),
            raw(b"dev.png", EntryType::Char, 0, b""),
            file("./ok/./x.JPEG", b"fine"),
        ]);
        let (seen, res) = run(&bytes, TarLimits::default());
        assert_eq!(res.unwrap().rejected, 6);
        assert_eq!(seen[..2], ["rej:../escape.png", "rej:/etc/x.png"]);
        assert_eq!(seen[5..], ["rej:dev.png", "img:ok/x.JPEG:4"]);
    }

    #[test]
    fn pax_long_path() {
        let long = format!("{}/pax.tiff", "p".repeat(120));
        let rec_len = |n: usize| n + (n + 3).to_string().len();
        let body = format!(" path={long}\n");
        let record = format!("{}{body}", rec_len(body.len()));
        assert_eq!(
            record.len(),
            record.split(' ').next().unwrap().parse::<usize>().unwrap()
        );
        let pax = raw(
            b"PaxHeader",
            EntryType::XHeader,
            record.len() as u64,
            record.as_bytes(),
        );
        let (seen, res) = run(
            &finish(&[pax, file("short.tiff", b"pax")]),
            TarLimits::default(),
        );
        assert_eq!(seen, [format!("img:{long}:3")]);
        assert_eq!(res.unwrap().members, 1);
    }

    #[test]
    fn lying_size_is_a_rejected_member_then_truncation() {
        let mut bytes = file("ok.png", b"ok");
        bytes.extend(raw(b"liar.png", EntryType::Regular, 1 << 20, &[1; 10]));
        bytes.truncate(bytes.len() - 502); // the archive really ends after 10 data bytes
        let (seen, res) = run(&bytes, TarLimits::default());
        assert_eq!(seen, ["img:ok.png:2", "rej:liar.png"]);
        assert!(matches!(res, Err(TarError::Truncated(_))), "{res:?}");
        // A skipped member cut short is an archive error, with no record of its own.
        let mut bytes = raw(b"liar.txt", EntryType::Regular, 1 << 20, &[1; 10]);
        bytes.truncate(522);
        assert!(matches!(
            run(&bytes, TarLimits::default()).1,
            Err(TarError::Truncated(_))
        ));
        // A header cut in half.
        assert!(matches!(
            run(&bytes[..300], TarLimits::default()).1,
            Err(TarError::Truncated(_))
        ));
    }

    #[test]
    fn huge_size_claim_allocates_only_what_is_there() {
        let mut bytes = raw(b"huge.png", EntryType::Regular, 100 << 30, &[1; 10]);
        bytes.truncate(522);
        let limits = TarLimits {
            max_member_bytes: u64::MAX,
            ..TarLimits::default()
        };
        PEAK.with(|p| p.set(LIVE.with(Cell::get)));
        let base = LIVE.with(Cell::get);
        let (seen, res) = run(&bytes, limits);
        let peak = PEAK.with(Cell::get) - base;
        assert_eq!(seen, ["rej:huge.png"]);
        assert!(matches!(res, Err(TarError::Truncated(_))));
        assert!(peak < 4 << 20, "peak allocation {peak} bytes");
    }

    #[test]
    fn oversized_member_is_rejected_and_skipped() {
        // Bigger than the metadata budget, so skipping it and reading it must both fit.
        let big = vec![2; 3 << 20];
        let bytes = finish(&[
            file("a.png", &[1; 10]),
            file("big.png", &big),
            file("c.png", b"c"),
        ]);
        let limits = TarLimits {
            max_member_bytes: 1000,
            ..TarLimits::default()
        };
        let (seen, res) = run(&bytes, limits);
        assert_eq!(seen, ["img:a.png:10", "rej:big.png", "img:c.png:1"]);
        assert_eq!(res.unwrap().rejected, 1);
        let (seen, res) = run(&bytes, TarLimits::default());
        assert_eq!(seen[1], format!("img:big.png:{}", 3 << 20));
        assert_eq!(res.unwrap().members, 3);
    }

    #[test]
    fn corrupt_gzip_is_one_archive_error_after_delivered_members() {
        let text: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i * 7919 % 1000).to_le_bytes())
            .collect();
        let good = gzip(&finish(&[file("a.png", b"first"), file("b.png", &text)]));
        let mut bad = good.clone();
        let mid = bad.len() / 2;
        bad[mid..mid + 64].fill(0xff);
        let (seen, res) = run(&bad, TarLimits::default());
        assert_eq!(seen, ["img:a.png:5"]);
        assert!(matches!(res, Err(TarError::Gzip(_))), "{res:?}");
        let (_, res) = run(&good[..good.len() - 100], TarLimits::default());
        assert!(
            matches!(res, Err(TarError::Gzip(_))),
            "truncated gzip: {res:?}"
        );
        // A flipped CRC is only seen by reading past the end-of-archive blocks.
        let mut crc = good.clone();
        let at = crc.len() - 8;
        crc[at] ^= 1;
        let (seen, res) = run(&crc, TarLimits::default());
        assert_eq!(seen.len(), 2);
        assert!(matches!(res, Err(TarError::Gzip(_))), "bad crc: {res:?}");
        assert!(matches!(
            run(&[0x1f, 0x8b, 1, 2, 3], TarLimits::default()).1,
            Err(TarError::Gzip(_))
        ));
    }

    #[test]
    fn archive_level_failures() {
        let mut bad_sum = finish(&[file("a.png", b"a")]);
        bad_sum[0] = b'b';
        assert!(matches!(
            run(&bad_sum, TarLimits::default()).1,
            Err(TarError::Format(_))
        ));
        // A GNU long name that is really a 2 MiB bomb.
        let name = vec![b'a'; 2 << 20];
        let bomb = raw(b"././@LongLink", EntryType::GNULongName, 2 << 20, &name);
        for parts in [vec![bomb.clone()], vec![file("a.png", &[1; 600]), bomb]] {
            let (seen, res) = run(&gzip(&finish(&parts)), TarLimits::default());
            assert_eq!(seen.len(), parts.len() - 1);
            assert!(matches!(res, Err(TarError::MetadataTooLarge(_))), "{res:?}");
        }
        let three = finish(&[
            file("a.png", b"a"),
            file("b.png", b"b"),
            file("c.png", b"c"),
        ]);
        let (seen, res) = run(
            &three,
            TarLimits {
                max_members: 2,
                ..TarLimits::default()
            },
        );
        assert_eq!(seen.len(), 2);
        assert!(matches!(res, Err(TarError::TooManyMembers(2))));
        let mut calls = 0;
        let res = walk(&three[..], TarLimits::default(), |_| {
            calls += 1;
            Err("channel closed".into())
        });
        assert!(matches!(res, Err(TarError::Callback(_))) && calls == 1);
    }

    #[test]
    fn empty_archives() {
        let empty = Builder::new(Vec::new()).into_inner().unwrap();
        for bytes in [empty.clone(), gzip(&empty), Vec::new()] {
            let (seen, res) = run(&bytes, TarLimits::default());
            assert!(seen.is_empty());
            assert_eq!(res.unwrap().members, 0);
        }
    }

    #[test]
    fn member_uris() {
        assert_eq!(
            member_uri("s3://b/a.tar", "d/x.png"),
            "s3://b/a.tar#d/x.png"
        );
    }
}
