//! `rsembed fetch-model`: copies a model directory from object storage to a
//! local folder, for init containers of images without a shell or cloud CLI.
//!
//! `rsembed-model.json` is read and checked first, so a prefix that holds no
//! model, or a malformed manifest, is refused before any graph is copied. Then
//! every object under the prefix (graphs, ONNX external-data files, tokenizer,
//! configs) is streamed to a temporary name next to its destination and renamed
//! into place once complete, a few at a time. A file already there with the
//! object's size is skipped, so a restarted init container resumes. Last, the
//! local copy is opened as a [`ModelDir`], which checks every file the model
//! needs, without loading ONNX Runtime.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectMeta, ObjectStoreExt};
use rsembed_schemas::model::MODEL_MANIFEST;
use rsembed_worker::model::{parse_manifest, ModelDir};
use rsembed_worker::store::{Location, StoreCache};
use serde::Serialize;
use tokio::io::AsyncWriteExt;

use crate::cli::FetchModelArgs;
use crate::summary::human_bytes;

/// Objects copied at once: enough to overlap request latency, few enough that
/// a couple of 1-2 GB graphs do not compete with many small files for bandwidth.
const CONCURRENCY: usize = 4;

/// Suffix of a file being written; it is renamed to its real name when complete.
const PARTIAL: &str = ".rsembed-partial";

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The source prefix has no `rsembed-model.json`.
    #[error("{url} is not an rsembed model directory: {MODEL_MANIFEST} not found")]
    NotAModel {
        /// The `--from` URL.
        url: String,
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
}

/// What a fetch did.
#[derive(Debug, Clone, Serialize)]
pub struct FetchSummary {
    /// The source prefix, as a canonical URL.
    pub from: String,
    /// The local model directory.
    pub to: PathBuf,
    /// The model's name from its manifest.
    pub model: String,
    /// Files downloaded by this run.
    pub files_copied: u64,
    /// Files already present with the right size, left as they were.
    pub files_skipped: u64,
    /// Bytes downloaded by this run.
    pub bytes_copied: u64,
    /// Bytes of the skipped files.
    pub bytes_skipped: u64,
    /// Wall time.
    pub seconds: f64,
}

impl FetchSummary {
    /// The text summary.
    pub fn render(&self) -> String {
        format!(
            "rsembed fetch-model: {} ready in {:.1} s\n  \
             from            {}\n  \
             to              {}\n  \
             copied          {} files, {}\n  \
             skipped         {} files, {} (already present)\n",
            self.model,
            self.seconds,
            self.from,
            self.to.display(),
            self.files_copied,
            human_bytes(self.bytes_copied),
            self.files_skipped,
            human_bytes(self.bytes_skipped),
        )
    }
}

/// Copies the model directory at `args.from` into `args.to` and checks it.
pub async fn fetch_model(args: FetchModelArgs) -> Result<FetchSummary, FetchError> {
    let started = Instant::now();
    let src = StoreCache::default().location(&args.from)?;
    tracing::info!(from = %src.url, to = %args.to.display(), concurrency = CONCURRENCY, "fetch-model");
    let manifest_path = src.child(MODEL_MANIFEST);
    let manifest_url = src.uri_of(&manifest_path);
    let bytes = match src.store.get(&manifest_path).await {
        Ok(g) => g.bytes().await,
        Err(e) => Err(e),
    };
    let bytes = match bytes {
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
    let jobs: Vec<(ObjectMeta, PathBuf)> = files(&src, objects)?
        .into_iter()
        .map(|(meta, rel)| (meta, args.to.join(rel)))
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
        seconds: 0.0,
    };
    let mut copies = futures::stream::iter(jobs)
        .map(|(meta, dst)| {
            let src = &src;
            async move { copy_object(src, &meta, &dst).await.map(|c| (c, meta.size)) }
        })
        .buffer_unordered(CONCURRENCY);
    while let Some(done) = copies.next().await {
        let (copied, size) = done?;
        if copied {
            summary.files_copied += 1;
            summary.bytes_copied += size;
        } else {
            summary.files_skipped += 1;
            summary.bytes_skipped += size;
        }
    }
    drop(copies);

    let invalid = |source| FetchError::Invalid {
        dir: args.to.clone(),
        source,
    };
    let model = ModelDir::open(&args.to).map_err(invalid)?;
    model.check_files().map_err(invalid)?;
    model.tokenizer_path().map_err(invalid)?;
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
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

/// Streams one object to `dst` through a temporary name; `Ok(false)` when a
/// file of the same size is already there.
async fn copy_object(src: &Location, meta: &ObjectMeta, dst: &Path) -> Result<bool, FetchError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| FetchError::Io { path, source }
    };
    if let Ok(m) = tokio::fs::metadata(dst).await {
        if m.is_file() && m.len() == meta.size {
            return Ok(false);
        }
    }
    let url = src.uri_of(&meta.location);
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
    while let Some(chunk) = stream.try_next().await.map_err(store_err)? {
        got += chunk.len() as u64;
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
    tokio::fs::rename(&tmp.path, dst).await.map_err(io(dst))?;
    tmp.renamed = true;
    Ok(true)
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
