//! Locations on object storage: URL parsing, canonical URIs and one store
//! per scheme and authority, shared by the worker and the query side.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::ObjectStore;
use url::Url;

/// Why a location cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A path or URL that names no location.
    #[error("invalid location `{url}`: {reason}")]
    Location {
        /// What was given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// The store's builder refused its configuration.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
}

/// A location's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A prefix on an object store, with the canonical URL it was reached by.
#[derive(Clone)]
pub struct Location {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// The prefix inside the store (no leading or trailing `/`).
    pub prefix: Path,
    /// Canonical URL: `file:///abs/dir`, `s3://bucket/prefix`, ...
    pub url: Url,
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Location")
            .field("url", &self.url.as_str())
            .finish()
    }
}

/// Turns a plain path or URL into a canonical URL. Relative paths are made absolute
/// against the current directory; they need not exist.
pub fn canonical_url(s: &str) -> Result<Url> {
    let bad = |reason: String| Error::Location {
        url: s.to_owned(),
        reason,
    };
    if let Ok(url) = Url::parse(s) {
        // One-letter schemes are Windows drive letters, not URLs.
        if url.scheme().len() > 1 {
            return Ok(url);
        }
    }
    let p = std::path::Path::new(s);
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| bad(format!("no current directory: {e}")))?
            .join(p)
    };
    let abs = normalize_path(&abs);
    Url::from_file_path(&abs).map_err(|()| bad("not an absolute path".into()))
}

/// Removes `.` and `..` components without touching the file system.
fn normalize_path(p: &std::path::Path) -> std::path::PathBuf {
    use std::path::Component;
    let mut out = std::path::PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// The key of a store in the cache: scheme and authority.
fn store_key(url: &Url) -> String {
    format!("{}://{}", url.scheme(), url.authority())
}

fn build_store(url: &Url) -> Result<Arc<dyn ObjectStore>> {
    let bad = |reason: String| Error::Location {
        url: url.to_string(),
        reason,
    };
    let store: Arc<dyn ObjectStore> = match url.scheme() {
        "file" => Arc::new(LocalFileSystem::new()),
        "s3" | "s3a" => Arc::new(
            object_store::aws::AmazonS3Builder::from_env()
                .with_url(url.as_str())
                .build()?,
        ),
        "gs" => Arc::new(
            object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_url(url.as_str())
                .build()?,
        ),
        "az" | "abfs" | "abfss" | "azure" => Arc::new(
            object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_url(url.as_str())
                .build()?,
        ),
        "http" | "https" => {
            let base = format!("{}://{}", url.scheme(), url.authority());
            // object_store refuses plain http unless told ("URL scheme is not
            // allowed"); the user chose the scheme, and reads are all there is.
            let options =
                object_store::ClientOptions::new().with_allow_http(url.scheme() == "http");
            Arc::new(
                object_store::http::HttpBuilder::new()
                    .with_url(base)
                    .with_client_options(options)
                    .build()?,
            )
        }
        other => return Err(bad(format!("unsupported scheme `{other}`"))),
    };
    Ok(store)
}

/// The object path a URL addresses inside its store.
fn url_path(url: &Url) -> Result<Path> {
    if url.scheme() == "file" {
        let fs = url.to_file_path().map_err(|()| Error::Location {
            url: url.to_string(),
            reason: "not a local file path".into(),
        })?;
        // `from_absolute_path` would resolve symlinks of existing paths; the raw
        // components keep the URI the user gave.
        let s = fs.to_string_lossy();
        return Ok(Path::from(s.trim_start_matches('/')));
    }
    let decoded = percent_decode(url.path());
    let trimmed = decoded.trim_start_matches('/');
    // Azure URLs carry the container as the first path segment for some forms;
    // object_store's builder took it from the URL already.
    Ok(Path::from(trimmed))
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Caches one store per scheme and authority, so credentials are read once.
#[derive(Default, Clone)]
pub struct StoreCache {
    stores: Arc<Mutex<HashMap<String, Arc<dyn ObjectStore>>>>,
}

impl StoreCache {
    /// The location a path or URL names.
    pub fn location(&self, s: &str) -> Result<Location> {
        let url = canonical_url(s)?;
        let key = store_key(&url);
        let store = {
            let mut stores = self
                .stores
                .lock()
                .expect("store cache lock poisoned: this is a bug");
            match stores.get(&key) {
                Some(s) => s.clone(),
                None => {
                    let s = build_store(&url)?;
                    stores.insert(key, s.clone());
                    s
                }
            }
        };
        let prefix = url_path(&url)?;
        Ok(Location { store, prefix, url })
    }
}

impl Location {
    /// Deletes `rel` under this prefix; an object that is not there is no
    /// error (a rerun, or a cleanup interrupted before).
    pub async fn delete_if_present(&self, rel: &str) -> object_store::Result<()> {
        use object_store::ObjectStoreExt;
        match self.store.delete(&self.child(rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The object path of `rel` (a `/`-separated relative path) under this prefix.
    pub fn child(&self, rel: &str) -> Path {
        let mut p = self.prefix.clone();
        for part in rel.split('/').filter(|s| !s.is_empty()) {
            p = p.join(part);
        }
        p
    }

    /// The canonical URI of an object path of this location's store.
    pub fn uri_of(&self, path: &Path) -> String {
        let mut base = format!("{}://{}", self.url.scheme(), self.url.authority());
        if self.url.scheme() == "file" {
            base = "file://".into();
        }
        format!("{base}/{}", path.as_ref())
    }

    /// Whether this location is read over plain HTTP(S), which has no listing.
    pub fn is_http(&self) -> bool {
        matches!(self.url.scheme(), "http" | "https")
    }

    /// Checks that the file `rel` (`/`-separated, relative to this location;
    /// empty for the location itself) of a local location can be created:
    /// makes its folder, then creates and removes a probe file next to it.
    /// Other stores have nothing to check here: their errors come back from
    /// the write.
    ///
    /// object_store's local writes retry forever where a folder exists but
    /// refuses new files with "not found" (`/proc`): a write there would spin
    /// instead of failing.
    pub fn probe_local_write(&self, rel: &str) -> std::io::Result<()> {
        let Some(base) = self.local_dir().filter(|_| self.is_local()) else {
            return Ok(());
        };
        let file = rel
            .split('/')
            .filter(|s| !s.is_empty())
            .fold(base, |p, s| p.join(s));
        let dir = file.parent().unwrap_or(&file).to_path_buf();
        let cause =
            |what: String, e: std::io::Error| std::io::Error::new(e.kind(), format!("{what}: {e}"));
        std::fs::create_dir_all(&dir)
            .map_err(|e| cause(format!("cannot create folder {}", dir.display()), e))?;
        let mut probe = file.into_os_string();
        probe.push(".rsembed-write-probe");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
            .map_err(|e| cause(format!("cannot create a file in {}", dir.display()), e))?;
        std::fs::remove_file(&probe)
    }

    /// Whether this location is on the local file system.
    pub fn is_local(&self) -> bool {
        self.url.scheme() == "file"
    }

    /// The local directory of a `file://` location.
    pub fn local_dir(&self) -> Option<std::path::PathBuf> {
        self.url.to_file_path().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_paths_become_file_urls() {
        let u = canonical_url("/data/a/../b/./c").unwrap();
        assert_eq!(u.as_str(), "file:///data/b/c");
        let rel = canonical_url("x/y").unwrap();
        assert!(rel.as_str().starts_with("file:///"));
        assert!(rel.as_str().ends_with("/x/y"));
    }

    #[test]
    fn s3_location_keeps_prefix() {
        let cache = StoreCache::default();
        let loc = cache.location("s3://bucket/some/prefix").unwrap();
        assert_eq!(loc.prefix.as_ref(), "some/prefix");
        let child = loc.child("chips/a.parquet");
        assert_eq!(child.as_ref(), "some/prefix/chips/a.parquet");
        assert_eq!(
            loc.uri_of(&child),
            "s3://bucket/some/prefix/chips/a.parquet"
        );
    }

    #[test]
    fn local_uri_round_trips() {
        let cache = StoreCache::default();
        let loc = cache.location("/tmp/in").unwrap();
        let p = loc.child("a b.png");
        assert_eq!(loc.uri_of(&p), "file:///tmp/in/a b.png");
    }
}
