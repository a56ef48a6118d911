//! A job's manifest: built by the query crate's [`ManifestBuilder`] (which
//! `compact` uses too), and read, in the coordinator's errors, through the
//! query crate's reader (`rsembed_query::format::manifest`, over the one
//! reader of `rsembed_schemas::manifest`, format 1 and 2 alike).

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use rsembed_schemas::job::{Manifest, ManifestFile};
use rsembed_schemas::manifest::{FileKind, ListedFile};
use rsembed_store::Location;

use crate::error::{Error, Result};
use rsembed_query::format::manifest;

pub(crate) use manifest::ManifestBuilder;

/// `manifest.json` of the dataset at `loc`, in either format, and its
/// bytes; `None` when there is none.
pub(crate) async fn read(loc: &Location) -> Result<Option<(Manifest, bytes::Bytes)>> {
    Ok(manifest::read(loc).await?)
}

/// The files of the dataset at `loc` whose manifest is `m`, chip and error
/// files, as its list gives them.
pub(crate) fn files(loc: &Location, m: &Manifest) -> BoxStream<'static, Result<ListedFile>> {
    manifest::files(loc, m).map_err(Error::from).boxed()
}

/// The chip files of the dataset at `loc`, as a stream (the STAC output
/// reads them so).
pub(crate) fn chip_file_stream(
    loc: &Location,
    m: &Manifest,
) -> BoxStream<'static, Result<ManifestFile>> {
    files(loc, m)
        .try_filter_map(|f| async move { Ok((f.kind == FileKind::Chips).then_some(f.file)) })
        .boxed()
}
