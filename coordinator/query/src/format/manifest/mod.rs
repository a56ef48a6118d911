//! A dataset's `manifest.json` and its list of files, as a reader needs
//! them: which chip files make the finished dataset; and, in `build.rs`, the
//! manifest as a writer builds it.

mod build;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStoreExt;
use rsembed_schemas::job::{Manifest, ManifestFile, ManifestLists, MANIFEST_FILE};
use rsembed_schemas::manifest::{self as lists, FailureRow, FileKind, ListError, ListedFile};
use rsembed_store::Location;

use crate::io::StoreReader;
use crate::{Error, Result};

pub use build::{Built, ManifestBuilder, SAMPLE};

/// `manifest.json` of the dataset at `loc`, in either format, and its
/// bytes; `None` when there is none.
pub async fn read(loc: &Location) -> Result<Option<(Manifest, bytes::Bytes)>> {
    let bytes = match loc.store.get(&loc.child(MANIFEST_FILE)).await {
        Ok(g) => g.bytes().await?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let m = lists::parse_manifest(&bytes).map_err(|e| list_error(loc, MANIFEST_FILE, e))?;
    Ok(Some((m, bytes)))
}

/// The chip files of the dataset at `loc` whose manifest is `m`, in the
/// list's order, with their sizes.
pub async fn chip_files(loc: &Location, m: &Manifest) -> Result<Vec<(Path, u64)>> {
    files(loc, m)
        .try_filter_map(|f| async move {
            Ok((f.kind == FileKind::Chips).then(|| (loc.child(&f.file.path), f.file.bytes)))
        })
        .try_collect()
        .await
}

/// The files of the dataset at `loc` whose manifest is `m`, chip and error
/// files, as its list gives them.
pub fn files(loc: &Location, m: &Manifest) -> BoxStream<'static, Result<ListedFile>> {
    let l = loc.clone();
    let rel = list_path(m, |l| &l.files);
    lists::files(m, |e| reader(loc, e))
        .map_err(move |e| list_error(&l, &rel, e))
        .boxed()
}

/// The failures list of the dataset at `loc` whose manifest is `m`.
pub fn failures(loc: &Location, m: &Manifest) -> BoxStream<'static, Result<FailureRow>> {
    let l = loc.clone();
    let rel = list_path(m, |l| &l.failures);
    lists::failures(m, |e| reader(loc, e))
        .map_err(move |e| list_error(&l, &rel, e))
        .boxed()
}

fn reader(loc: &Location, entry: &ManifestFile) -> StoreReader {
    StoreReader::new(
        loc.store.clone(),
        loc.child(&entry.path),
        entry.bytes,
        Default::default(),
    )
}

/// The error of a list of the dataset at `loc`.
pub fn list_error(loc: &Location, rel: &str, source: ListError) -> Error {
    Error::ManifestList {
        url: format!("{}/{rel}", loc.url.as_str().trim_end_matches('/')),
        source,
    }
}

/// Where a list is, for messages: its path, or `manifest.json` for format 1.
fn list_path(m: &Manifest, which: impl Fn(&ManifestLists) -> &ManifestFile) -> String {
    m.lists
        .as_ref()
        .map_or_else(|| MANIFEST_FILE.to_owned(), |l| which(l).path.clone())
}
