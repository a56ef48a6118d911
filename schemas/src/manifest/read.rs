//! THE reader of a dataset's lists: `manifest.json` parsed in either
//! format, and its file and failure lists as streams of rows, read batch by
//! batch from `manifest/*.parquet` (format 2) or taken from the JSON arrays
//! of a format 1 manifest.

use std::panic::AssertUnwindSafe;

use futures::stream::{self, BoxStream};
use futures::{StreamExt, TryStreamExt};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::arrow::ParquetRecordBatchStreamBuilder;

use super::{
    check_relative_path, task_id_of, FailureRow, FileKind, ListError, ListRow, ListedFile, Result,
    BATCH_ROWS, MAX_ROW_GROUP_BYTES,
};
use crate::job::{Manifest, ManifestFile, MANIFEST_FILE, MANIFEST_FORMAT};

/// `manifest.json` of either format, checked: format 1 or 2, a format 2
/// one with its lists at relative paths. The counts a format 1 manifest
/// did not record (`chip_file_count`, ...) are filled from its lists.
pub fn parse_manifest(bytes: &[u8]) -> Result<Manifest> {
    let mut m: Manifest = serde_json::from_slice(bytes)?;
    match m.format {
        1 => {
            m.chip_file_count = m.files.len() as u64;
            m.error_file_count = m.error_files.len() as u64;
            m.failed_task_count = m.failed_tasks.len() as u64;
        }
        MANIFEST_FORMAT => {
            let lists = m
                .lists
                .as_ref()
                .ok_or_else(|| ListError::invalid(MANIFEST_FILE, "format 2 without its `lists`"))?;
            for l in [&lists.files, &lists.failures] {
                check_relative_path(&l.path).map_err(|e| ListError::invalid(MANIFEST_FILE, e))?;
            }
        }
        f => {
            return Err(ListError::invalid(
                MANIFEST_FILE,
                format!(
                    "format {f}, which a newer rsembed wrote: this one reads formats 1 and \
                     {MANIFEST_FORMAT}"
                ),
            ))
        }
    }
    Ok(m)
}

/// A dataset's files, chip and error files alike (see
/// [`ListedFile::kind`]), in the list's order: format 2 reads
/// `manifest.lists.files` through the reader `open` gives for it (a
/// `ParquetObjectReader` with the entry's size, a local file), batch by
/// batch; format 1 gives the manifest's `files`, then its `error_files`.
pub fn files<R, F>(manifest: &Manifest, open: F) -> BoxStream<'static, Result<ListedFile>>
where
    R: AsyncFileReader + Unpin + Send + 'static,
    F: FnOnce(&ManifestFile) -> R,
{
    match &manifest.lists {
        Some(l) => rows(l.files.clone(), open(&l.files)),
        None => {
            let listed = |kind: FileKind, v: &[ManifestFile]| {
                v.iter()
                    .map(|f| {
                        Ok(ListedFile {
                            kind,
                            task_id: task_id_of(&f.path).to_owned(),
                            file: f.clone(),
                        })
                    })
                    .collect::<Vec<_>>()
            };
            let mut all = listed(FileKind::Chips, &manifest.files);
            all.extend(listed(FileKind::Errors, &manifest.error_files));
            stream::iter(all).boxed()
        }
    }
}

/// A dataset's failed inputs, failed tasks and inputs without chips:
/// format 2 reads `manifest.lists.failures`; format 1 gives what its JSON
/// kept (the first 1000 failed inputs and inputs without chips, without
/// their tasks, and every failed task).
pub fn failures<R, F>(manifest: &Manifest, open: F) -> BoxStream<'static, Result<FailureRow>>
where
    R: AsyncFileReader + Unpin + Send + 'static,
    F: FnOnce(&ManifestFile) -> R,
{
    match &manifest.lists {
        Some(l) => rows(l.failures.clone(), open(&l.failures)),
        None => {
            let mut all: Vec<FailureRow> = manifest
                .failures
                .iter()
                .map(|f| FailureRow::input(None, f))
                .collect();
            all.extend(
                manifest
                    .failed_tasks
                    .iter()
                    .flat_map(FailureRow::failed_task),
            );
            all.extend(
                manifest
                    .without_chips
                    .iter()
                    .map(|u| FailureRow::without_chips(None, u)),
            );
            stream::iter(all.into_iter().map(Ok)).boxed()
        }
    }
}

/// The rows of the list `entry`, read through `reader`: its schema must be
/// `R`'s, its row count the entry's, each row group at most
/// [`MAX_ROW_GROUP_BYTES`] compressed (a row group's column chunks are
/// fetched whole); rows are decoded [`BATCH_ROWS`] at a time. A panic of
/// the Parquet reader on a hostile file ends the stream with an error.
fn rows<R, T>(entry: ManifestFile, reader: T) -> BoxStream<'static, Result<R>>
where
    R: ListRow,
    T: AsyncFileReader + Unpin + Send + 'static,
{
    let what = entry.path.clone();
    let opened = async move {
        let b = ParquetRecordBatchStreamBuilder::new(reader).await?;
        let bad = |p: String| ListError::invalid(entry.path.clone(), p);
        let theirs = b.schema().fields();
        let ours = R::schema();
        let same = theirs.len() == ours.fields().len()
            && theirs.iter().zip(ours.fields()).all(|(a, b)| {
                a.name() == b.name()
                    && a.data_type() == b.data_type()
                    && a.is_nullable() == b.is_nullable()
            });
        if !same {
            return Err(bad(format!(
                "its columns are not those rsembed writes: {:?}",
                theirs.iter().map(|f| f.name()).collect::<Vec<_>>()
            )));
        }
        let meta = b.metadata();
        let n = meta.file_metadata().num_rows();
        if u64::try_from(n).ok() != Some(entry.rows) {
            return Err(bad(format!(
                "{n} rows, but {MANIFEST_FILE} says {}: it changed since the job finished",
                entry.rows
            )));
        }
        for (i, g) in meta.row_groups().iter().enumerate() {
            let size = u64::try_from(g.compressed_size()).unwrap_or(u64::MAX);
            if size > MAX_ROW_GROUP_BYTES {
                return Err(bad(format!(
                    "row group {i} is {size} bytes, more than {MAX_ROW_GROUP_BYTES}"
                )));
            }
        }
        Ok::<_, ListError>(b.with_batch_size(BATCH_ROWS).build()?)
    };
    let batches = stream::once(opened)
        .map_ok(|s| s.map_err(ListError::from))
        .try_flatten();
    AssertUnwindSafe(batches)
        .catch_unwind()
        .map(move |r| {
            r.unwrap_or_else(|_| {
                Err(ListError::invalid(
                    what.clone(),
                    "the Parquet reader failed on it: not a list rsembed wrote",
                ))
            })
        })
        .scan(false, |failed, r| {
            // After a panic or an error nothing more is read.
            let done = *failed;
            *failed |= r.is_err();
            futures::future::ready((!done).then_some(r))
        })
        .and_then({
            let what = R::PATH;
            move |b| futures::future::ready(R::from_batch(what, &b))
        })
        .map_ok(|rows| stream::iter(rows.into_iter().map(Ok)))
        .try_flatten()
        .boxed()
}
