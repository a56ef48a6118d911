//! `rsembed fetch-model`: copies a model directory from object storage to a
//! local folder, for init containers of images without a shell or cloud CLI.
//!
//! `rsembed-model.json` is read and checked first, so a prefix that holds no
//! model, or a malformed manifest, is refused before any graph is copied. Then
//! every object under the prefix (graphs, ONNX external-data files, tokenizer,
//! configs) is streamed to a temporary name next to its destination and renamed
//! into place once complete, a few at a time. A file already there with the
//! object's size is kept, so a restarted init container resumes.
//!
//! A size says nothing about content, so two more checks stand between a
//! corrupted file and `ready`:
//! - the manifest's optional `files` record (written by `tools/export_onnx.py`):
//!   every recorded file is hashed as it streams in, and every file kept from an
//!   earlier run is hashed again; a mismatch is an error naming the object and
//!   both digests (a kept file that no longer matches is copied again);
//! - ONNX Runtime loads each graph the manifest names, without optimising it,
//!   so a truncated or garbled graph fails with ORT's reason and the file, even
//!   for a model that records no digests. ORT is a shared library that the
//!   coordinator image does not ship: by default (`--check-graphs auto`) a
//!   library that cannot be found is a warning and the summary says the graphs
//!   were not parsed; `always` makes it an error.

use std::collections::{BTreeMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectMeta, ObjectStoreExt};
use rsembed_schemas::model::{FileRecord, MODEL_MANIFEST};
use rsembed_worker::engine::session::{open_graph, GraphOptLevel, SessionConfig};
use rsembed_worker::model::{parse_manifest, sha256_file, ModelDir};
use rsembed_worker::store::{Location, StoreCache};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::cli::{FetchModelArgs, GraphCheck};
use rsembed_schemas::units::human_bytes;

/// Objects copied at once: enough to overlap request latency, few enough that
/// a couple of 1-2 GB graphs do not compete with many small files for bandwidth.
const CONCURRENCY: usize = 4;

/// Suffix of a file being written; it is renamed to its real name when complete.
const PARTIAL: &str = ".rsembed-partial";

/// The largest `rsembed-model.json` read: a real one is a few kB, even with a
/// digest for every external-data file of a large model.
const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The source prefix has no `rsembed-model.json`.
    #[error("{url} is not an rsembed model directory: {MODEL_MANIFEST} not found")]
    NotAModel {
        /// The `--from` URL.
        url: String,
    },
    /// `rsembed-model.json` is larger than any real manifest.
    #[error(
        "{url}: {bytes} bytes is too large for a model manifest (at most {MAX_MANIFEST_BYTES})"
    )]
    ManifestTooLarge {
        /// The manifest object.
        url: String,
        /// Its size.
        bytes: u64,
    },
    /// The location, the manifest or the fetched directory was refused.
    #[error(transparent)]
    Model(#[from] rsembed_worker::Error),
    /// The copy finished but the local directory is not a usable model.
    #[error("fetched model directory {} is not valid", dir.display())]
    Invalid {
        /// The `--to` folder.
        dir: PathBuf,
        /// What [`ModelDir::open`] found.
        #[source]
        source: rsembed_worker::Error,
    },
    /// Listing or reading an object failed.
    #[error("reading {url}")]
    Store {
        /// The object or prefix.
        url: String,
        /// The store's reason.
        #[source]
        source: object_store::Error,
    },
    /// Writing the local copy failed.
    #[error("writing {}", path.display())]
    Io {
        /// The local file or folder.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An object whose relative path would land outside the destination.
    #[error("refusing {url}: {reason}")]
    UnsafePath {
        /// The object.
        url: String,
        /// What is wrong with its path.
        reason: String,
    },
    /// An object's stream ended before (or after) the size the listing gave.
    #[error("{url}: read {got} bytes, the listing says {want}")]
    SizeMismatch {
        /// The object.
        url: String,
        /// Bytes received.
        got: u64,
        /// Bytes listed.
        want: u64,
    },
    /// The manifest records a file that the prefix does not hold.
    #[error("{manifest} records {file}, but {url} does not exist")]
    RecordedFileMissing {
        /// The manifest's URL.
        manifest: String,
        /// The recorded relative path.
        file: String,
        /// Where it should be.
        url: String,
    },
    /// An object's size differs from the one the manifest records.
    #[error("{url} has {got} bytes, but {MODEL_MANIFEST} records {want}: the object is not the file that was exported")]
    RecordedSize {
        /// The object.
        url: String,
        /// Its listed size.
        got: u64,
        /// The recorded size.
        want: u64,
    },
    /// An object's content differs from the digest the manifest records.
    #[error("{url}: sha256 digest mismatch: the copy has {got}, but {MODEL_MANIFEST} records {want} (the object is corrupted or was changed after the export)")]
    DigestMismatch {
        /// The object.
        url: String,
        /// Digest of the bytes received.
        got: String,
        /// Recorded digest.
        want: String,
    },
    /// ONNX Runtime could not load a fetched graph.
    #[error("{}: ONNX Runtime cannot load this graph (fetched from {url})", path.display())]
    Graph {
        /// The local graph file.
        path: PathBuf,
        /// The object it came from.
        url: String,
        /// ORT's reason.
        #[source]
        source: rsembed_worker::Error,
    },
}

impl From<rsembed_store::Error> for FetchError {
    fn from(e: rsembed_store::Error) -> FetchError {
        FetchError::Model(e.into())
    }
}

/// What a fetch did.
#[derive(Debug, Clone, Serialize)]
pub struct FetchSummary {
    /// The source prefix, as a canonical URL.
    pub(crate) from: String,
    /// The local model directory.
    pub(crate) to: PathBuf,
    /// The model's name from its manifest.
    pub(crate) model: String,
    /// Files downloaded by this run (including kept files copied again
    /// because their content no longer matched the recorded digest).
    pub(crate) files_copied: u64,
    /// Files already present with the right size (and, where recorded, the
    /// right digest), left as they were.
    pub(crate) files_skipped: u64,
    /// Bytes downloaded by this run.
    pub(crate) bytes_copied: u64,
    /// Bytes of the skipped files.
    pub(crate) bytes_skipped: u64,
    /// Files checked against the digest recorded in `rsembed-model.json`.
    pub(crate) files_verified: u64,
    /// Graphs ONNX Runtime loaded.
    pub(crate) graphs_parsed: u64,
    /// Why the graphs were not parsed, when they were not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) graphs_not_parsed: Option<String>,
    /// Wall time.
    pub(crate) seconds: f64,
}

impl FetchSummary {
    /// The text summary.
    pub fn render(&self) -> String {
        let verified = if self.files_verified == 0 {
            format!("no file ({MODEL_MANIFEST} records no digests)")
        } else {
            format!("{} files by sha256", self.files_verified)
        };
        let parsed = match &self.graphs_not_parsed {
            None => format!("{} graphs, by ONNX Runtime", self.graphs_parsed),
            Some(why) => format!("no graph: {why}"),
        };
        format!(
            "rsembed fetch-model: {} ready in {:.1} s\n  \
             from            {}\n  \
             to              {}\n  \
             copied          {} files, {}\n  \
             skipped         {} files, {} (already present)\n  \
             verified        {}\n  \
             parsed          {}\n",
            self.model,
            self.seconds,
            self.from,
            self.to.display(),
            self.files_copied,
            human_bytes(self.bytes_copied),
            self.files_skipped,
            human_bytes(self.bytes_skipped),
            verified,
            parsed,
        )
    }
}

/// How one object ended up in the destination.
struct Copied {
    /// Downloaded (rather than kept).
    copied: bool,
    /// Checked against a recorded digest.
    verified: bool,
}

/// Copies the model directory at `args.from` into `args.to` and checks it.
pub async fn fetch_model(args: FetchModelArgs) -> Result<FetchSummary, FetchError> {
    let started = Instant::now();
    let src = StoreCache::default().location(&args.from)?;
    tracing::info!(from = %src.url, to = %args.to.display(), concurrency = CONCURRENCY, "fetch-model");
    let manifest_path = src.child(MODEL_MANIFEST);
    let manifest_url = src.uri_of(&manifest_path);
    let got = match src.store.get(&manifest_path).await {
        Ok(g) if g.meta.size > MAX_MANIFEST_BYTES => {
            return Err(FetchError::ManifestTooLarge {
                url: manifest_url,
                bytes: g.meta.size,
            })
        }
        Ok(g) => g.bytes().await,
        Err(e) => Err(e),
    };
    let bytes = match got {
        Ok(b) => b,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(FetchError::NotAModel {
                url: src.url.to_string(),
            })
        }
        Err(source) => {
            return Err(FetchError::Store {
                url: manifest_url,
                source,
            })
        }
    };
    let manifest = parse_manifest(Path::new(&manifest_url), &bytes)?;

    let objects: Vec<ObjectMeta> = src
        .store
        .list(Some(&src.prefix))
        .try_collect()
        .await
        .map_err(|source| FetchError::Store {
            url: src.url.to_string(),
            source,
        })?;
    let listed = files(&src, objects)?;
    let records = match_records(&src, &manifest_url, &manifest.files, &listed)?;
    let jobs: Vec<(ObjectMeta, PathBuf, Option<FileRecord>)> = listed
        .into_iter()
        .zip(records)
        .map(|((meta, rel), rec)| (meta, args.to.join(rel), rec))
        .collect();
    tokio::fs::create_dir_all(&args.to)
        .await
        .map_err(|source| FetchError::Io {
            path: args.to.clone(),
            source,
        })?;

    let mut summary = FetchSummary {
        from: src.url.to_string(),
        to: args.to.clone(),
        model: manifest.name,
        files_copied: 0,
        files_skipped: 0,
        bytes_copied: 0,
        bytes_skipped: 0,
        files_verified: 0,
        graphs_parsed: 0,
        graphs_not_parsed: None,
        seconds: 0.0,
    };
    let mut copies = futures::stream::iter(jobs)
        .map(|(meta, dst, rec)| {
            let src = &src;
            async move {
                copy_object(src, &meta, &dst, rec.as_ref())
                    .await
                    .map(|c| (c, meta.size))
            }
        })
        .buffer_unordered(CONCURRENCY);
    while let Some(done) = copies.next().await {
        let (c, size) = done?;
        if c.copied {
            summary.files_copied += 1;
            summary.bytes_copied += size;
        } else {
            summary.files_skipped += 1;
            summary.bytes_skipped += size;
        }
        summary.files_verified += u64::from(c.verified);
    }
    drop(copies);

    let invalid = |source| FetchError::Invalid {
        dir: args.to.clone(),
        source,
    };
    let model = ModelDir::open(&args.to).map_err(invalid)?;
    model.check_files().map_err(invalid)?;
    model.tokenizer_path().map_err(invalid)?;
    match check_graphs(&args, &src, model).await? {
        Ok(n) => summary.graphs_parsed = n,
        Err(why) => {
            tracing::warn!(reason = %why, "fetch-model: graphs not parsed by ONNX Runtime");
            summary.graphs_not_parsed = Some(why);
        }
    }
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// The recorded digest of each listed file, in listing order. Every recorded
/// file must be listed, with the recorded size; files the manifest does not
/// record (a model exported before the record existed, files added by hand)
/// are copied on their size alone.
fn match_records(
    src: &Location,
    manifest_url: &str,
    records: &BTreeMap<String, FileRecord>,
    listed: &[(ObjectMeta, PathBuf)],
) -> Result<Vec<Option<FileRecord>>, FetchError> {
    let key = |rel: &Path| -> String {
        rel.components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/")
    };
    let by_path: BTreeMap<String, &ObjectMeta> =
        listed.iter().map(|(m, rel)| (key(rel), m)).collect();
    for (file, rec) in records {
        match by_path.get(file) {
            None => {
                return Err(FetchError::RecordedFileMissing {
                    manifest: manifest_url.to_owned(),
                    file: file.clone(),
                    url: src.uri_of(&src.child(file)),
                })
            }
            Some(meta) if meta.size != rec.bytes => {
                return Err(FetchError::RecordedSize {
                    url: src.uri_of(&meta.location),
                    got: meta.size,
                    want: rec.bytes,
                })
            }
            Some(_) => {}
        }
    }
    Ok(listed
        .iter()
        .map(|(_, rel)| records.get(&key(rel)).cloned())
        .collect())
}

/// Loads every graph of the fetched model with ONNX Runtime on the CPU,
/// unoptimised (a parse and a check of the named tensors, not a compile).
/// The outer error fails the fetch; the inner one says why nothing was parsed.
async fn check_graphs(
    args: &FetchModelArgs,
    src: &Location,
    model: ModelDir,
) -> Result<Result<u64, String>, FetchError> {
    if args.check_graphs == GraphCheck::Never {
        return Ok(Err("--check-graphs never".into()));
    }
    let named =
        args.ort_lib.is_some() || std::env::var_os("ORT_DYLIB_PATH").is_some_and(|v| !v.is_empty());
    if let Err(e) = rsembed_worker::engine::runtime::environment(args.ort_lib.as_deref()) {
        if args.check_graphs == GraphCheck::Auto && !named {
            tracing::warn!(cause = %e, "no ONNX Runtime library to parse the graphs with");
            return Ok(Err(
                "no ONNX Runtime library found (pass --ort-lib to parse them)".into(),
            ));
        }
        return Err(e.into());
    }
    let cfg = SessionConfig {
        graph_opt_level: GraphOptLevel::Disable,
        intra_threads: Some(1),
        ort_lib: args.ort_lib.clone(),
        ..SessionConfig::default()
    };
    let graphs: Vec<_> = model.graphs().cloned().collect();
    let mut n = 0;
    for g in graphs {
        let path = model.path(&g.file);
        let url = src.uri_of(&src.child(&g.file));
        let (cfg, p) = (cfg.clone(), path.clone());
        let opened = tokio::task::spawn_blocking(move || {
            open_graph(&cfg, &p, &g.input, &g.output).map(drop)
        })
        .await
        .map_err(|e| FetchError::Io {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        opened.map_err(|source| FetchError::Graph { path, url, source })?;
        n += 1;
    }
    Ok(Ok(n))
}

/// The files to copy, each with its local path relative to the destination.
fn files(
    src: &Location,
    objects: Vec<ObjectMeta>,
) -> Result<Vec<(ObjectMeta, PathBuf)>, FetchError> {
    let unsafe_path = |meta: &ObjectMeta, reason: String| FetchError::UnsafePath {
        url: src.uri_of(&meta.location),
        reason,
    };
    let mut listed = Vec::with_capacity(objects.len());
    for meta in objects {
        let parts: Vec<String> = match meta.location.prefix_match(&src.prefix) {
            Some(parts) => parts.map(|p| p.as_ref().to_owned()).collect(),
            None => {
                return Err(unsafe_path(
                    &meta,
                    "listed outside the source prefix".into(),
                ))
            }
        };
        listed.push((meta, parts));
    }
    let sizes: Vec<(&[String], u64)> = listed.iter().map(|(m, p)| (&p[..], m.size)).collect();
    let markers = folder_markers(&sizes);
    let mut out = Vec::with_capacity(listed.len());
    for (i, (meta, parts)) in listed.into_iter().enumerate() {
        if markers.contains(&i) {
            continue;
        }
        let rel = safe_relative(&parts).map_err(|reason| unsafe_path(&meta, reason))?;
        out.push((meta, rel));
    }
    Ok(out)
}

/// Indexes of the zero-byte objects named like a folder of other objects (or
/// like the prefix itself): the `dir/` markers that consoles create, which
/// object_store lists without their trailing slash. They are not files.
fn folder_markers(objects: &[(&[String], u64)]) -> HashSet<usize> {
    let folders: HashSet<&[String]> = objects
        .iter()
        .flat_map(|(parts, _)| (0..parts.len()).map(|n| &parts[..n]))
        .collect();
    objects
        .iter()
        .enumerate()
        .filter(|(_, (parts, size))| *size == 0 && (parts.is_empty() || folders.contains(parts)))
        .map(|(i, _)| i)
        .collect()
}

/// Joins the segments of an object's relative path, refusing any that could
/// leave the destination folder (`..`, absolute or drive components,
/// separators inside a segment) or that is empty.
fn safe_relative(parts: &[String]) -> Result<PathBuf, String> {
    if parts.is_empty() {
        return Err("the object is the prefix itself, not a file below it".into());
    }
    let mut out = PathBuf::new();
    for part in parts {
        if part.contains(['/', '\\', '\0']) {
            return Err(format!("path segment {part:?} contains a separator"));
        }
        let mut comps = Path::new(part).components();
        match (comps.next(), comps.next()) {
            (Some(Component::Normal(c)), None) => out.push(c),
            _ => {
                return Err(format!(
                    "path segment {part:?} is not a plain name (`..`, `.` or absolute)"
                ))
            }
        }
    }
    Ok(out)
}

/// Streams one object to `dst` through a temporary name, checking it against
/// its recorded digest when there is one. A file of the same size already
/// there is kept when it also matches the record (or there is none), and
/// copied again when it does not.
async fn copy_object(
    src: &Location,
    meta: &ObjectMeta,
    dst: &Path,
    rec: Option<&FileRecord>,
) -> Result<Copied, FetchError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| FetchError::Io { path, source }
    };
    let url = src.uri_of(&meta.location);
    if let Ok(m) = tokio::fs::metadata(dst).await {
        if m.is_file() && m.len() == meta.size {
            let Some(rec) = rec else {
                return Ok(Copied {
                    copied: false,
                    verified: false,
                });
            };
            let p = dst.to_owned();
            let (sha, _) = tokio::task::spawn_blocking(move || sha256_file(&p))
                .await
                .map_err(|e| io(dst)(std::io::Error::other(e)))??;
            if sha == rec.sha256 {
                return Ok(Copied {
                    copied: false,
                    verified: true,
                });
            }
            tracing::warn!(
                file = %dst.display(), sha256 = %sha, recorded = %rec.sha256,
                "a file kept from an earlier fetch does not match its recorded digest; copying it again"
            );
            tokio::fs::remove_file(dst).await.map_err(io(dst))?;
        }
    }
    let store_err = |source| FetchError::Store {
        url: url.clone(),
        source,
    };
    if let Some(dir) = dst.parent() {
        tokio::fs::create_dir_all(dir).await.map_err(io(dir))?;
    }
    let mut name = dst.file_name().unwrap_or_default().to_owned();
    name.push(PARTIAL);
    let mut tmp = Partial {
        path: dst.with_file_name(name),
        renamed: false,
    };
    let mut file = tokio::fs::File::create(&tmp.path)
        .await
        .map_err(io(&tmp.path))?;
    let mut stream = src
        .store
        .get(&meta.location)
        .await
        .map_err(store_err)?
        .into_stream();
    let mut got = 0u64;
    let mut hasher = rec.map(|_| Sha256::new());
    while let Some(chunk) = stream.try_next().await.map_err(store_err)? {
        got += chunk.len() as u64;
        if let Some(h) = hasher.as_mut() {
            h.update(&chunk);
        }
        file.write_all(&chunk).await.map_err(io(&tmp.path))?;
    }
    // No fsync: the destination is a pod's emptyDir, which a node crash loses
    // anyway; the rename only has to happen after every byte was written.
    file.flush().await.map_err(io(&tmp.path))?;
    drop(file);
    if got != meta.size {
        return Err(FetchError::SizeMismatch {
            url,
            got,
            want: meta.size,
        });
    }
    if let (Some(h), Some(rec)) = (hasher, rec) {
        let sha = hex::encode(h.finalize());
        if sha != rec.sha256 {
            return Err(FetchError::DigestMismatch {
                url,
                got: sha,
                want: rec.sha256.clone(),
            });
        }
    }
    tokio::fs::rename(&tmp.path, dst).await.map_err(io(dst))?;
    tmp.renamed = true;
    Ok(Copied {
        copied: true,
        verified: rec.is_some(),
    })
}

/// A temporary file, removed unless it was renamed into place (the copy failed
/// or was cancelled by another copy's failure).
struct Partial {
    path: PathBuf,
    renamed: bool,
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(s: &[&str]) -> Vec<String> {
        s.iter().map(|p| (*p).to_owned()).collect()
    }

    #[test]
    fn plain_relative_paths_are_kept() {
        assert_eq!(
            safe_relative(&parts(&["vision_model.onnx"])).unwrap(),
            PathBuf::from("vision_model.onnx")
        );
        assert_eq!(
            safe_relative(&parts(&["weights", "onnx__MatMul_123"])).unwrap(),
            PathBuf::from("weights/onnx__MatMul_123")
        );
        // Dots inside a name are fine.
        assert!(safe_relative(&parts(&["..data"])).is_ok());
    }

    #[test]
    fn folder_markers_are_not_files() {
        let (root, dir, file, empty) = (
            parts(&[]),
            parts(&["weights"]),
            parts(&["weights", "w.bin"]),
            parts(&["empty.txt"]),
        );
        let listed = [
            (&root[..], 0),
            (&dir[..], 0),
            (&file[..], 10),
            (&empty[..], 0),
        ];
        let markers = folder_markers(&listed);
        assert_eq!(markers, HashSet::from([0, 1]), "an empty file is a file");
    }

    #[test]
    fn escaping_paths_are_refused() {
        for bad in [
            &["..", "etc", "passwd"][..],
            &["a", ".."],
            &["."],
            &["/etc"],
            &["a/b"],
            &["a\\..\\b"],
            &[""],
            &[],
        ] {
            assert!(safe_relative(&parts(bad)).is_err(), "{bad:?} was accepted");
        }
    }
}
