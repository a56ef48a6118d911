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
        TarLimits { max_member_bytes: 1 << 30, max_members: 10_000_000 }
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
    /// The archive ends inside a header or a member.
    #[error("tar archive truncated at byte {offset}")]
    Truncated {
        /// Uncompressed bytes read before the end.
        offset: u64,
    },
    /// Extension records between two members exceed [`META_BUDGET`].
    #[error("tar extension headers larger than {limit} bytes")]
    MetadataTooLarge {
        /// The budget.
        limit: u64,
    },
    /// More entries than [`TarLimits::max_members`].
    #[error("tar archive has more than {limit} entries")]
    TooManyMembers {
        /// The limit.
        limit: u64,
    },
    /// The callback asked to stop (e.g. its downstream channel closed).
    #[error("stopped by consumer: {0}")]
    Callback(String),
}

/// Whether a name is a tar archive we read (`.tar`, `.tar.gz`, `.tgz`, case-insensitive).
pub fn is_archive(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [".tar", ".tar.gz", ".tgz"].iter().any(|ext| name.ends_with(ext))
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

/// Sits under the `tar` crate so that an error can be told apart by its origin
/// (the byte source vs. the tar structure), which `tar`'s `io::Error`s do not say.
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
        match self.inner.read(&mut buf[..len]) {
            Ok(n) => {
                if n == 0 && len > 0 {
                    s.eof.set(true);
                }
                s.pos.set(s.pos.get() + n as u64);
                Ok(n)
            }
            Err(e) => {
                if e.kind() != io::ErrorKind::Interrupted {
                    s.source_failed.set(true);
                }
                Err(e)
            }
        }
    }
}
