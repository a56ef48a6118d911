//! What an embedded run finds of its tasks at the output, and what it leaves
//! there for the next run to find.
//!
//! Each finished task leaves `state/<task>.done` after its files: the done
//! record a worker writes to the job state in distributed mode (each file's
//! rows, bytes, SHA-256 and extent, and how many inputs gave no chip), a
//! hundred-odd bytes. A run resumes a task from its record with one small
//! read, whatever the size of its chip file. A chip file without a record (a
//! run cut off between the two, or an output of a version before the
//! records) is read whole, as before, and its record written then. A record
//! whose files are gone or have another size is dropped and its task runs
//! again.

use object_store::{ObjectStoreExt, PutPayload};
use rsembed_schemas::job::ManifestFile;
use rsembed_schemas::queue::DoneRecord;
use rsembed_schemas::task::Task;
use rsembed_worker::sink::commit::describe_bytes;
use rsembed_worker::sink::parquet::{empty_inputs_at, empty_inputs_of};
use rsembed_worker::store::Location;
use rsembed_worker::task::TaskReport;

use crate::error::{Error, Result};
use crate::job::output::{delete_if_present, size_of, RECORD_SUFFIX, STATE_DIR};

/// A record is a hundred-odd bytes: anything much larger is not one, and is
/// not read into memory.
const RECORD_MAX_BYTES: u64 = 64 * 1024;

/// Where a task's done record goes.
pub(crate) fn record_path(task_id: &str) -> String {
    format!("{STATE_DIR}{task_id}{RECORD_SUFFIX}")
}

/// What resuming finds of a task at the output.
pub(crate) enum Found {
    /// Its chip file (and errors file, if any): the task is not run again.
    Done(Box<TaskReport>),
    /// Finished with failed inputs, and `--retry-failed` asks to run it again.
    Retry,
    /// No chip file: the task runs.
    Missing,
}

/// Looks for a finished task: its done record, or else its files.
pub(crate) async fn finished(out: &Location, task: &Task, retry_failed: bool) -> Result<Found> {
    if let Some(record) = read_record(out, task).await? {
        if !files_match(out, task, &record).await? {
            tracing::warn!(
                task_id = %task.task_id,
                "a file of a finished task is gone or has another size; running the task again"
            );
            forget(out, task).await?;
            return Ok(Found::Missing);
        }
        if retry_failed && record.errors.is_some() {
            return Ok(Found::Retry);
        }
        let without_chips = record.without_chips;
        let done = record.into_task_done(&task.task_id);
        // The names are in the chip file's footer: a ranged read of the few
        // files that have any.
        let empty_inputs = if without_chips > 0 {
            empty_inputs_at(out, &done.chips_file.path).await?
        } else {
            vec![]
        };
        return Ok(Found::Done(Box::new(TaskReport {
            task_id: task.task_id.clone(),
            chips_file: done.chips_file,
            errors_file: done.errors_file,
            failures: vec![],
            empty_inputs,
            cloudy_chips_dropped: 0,
            unclear_cells: 0,
        })));
    }
    let Some((chips_file, empty_inputs)) = describe(out, &task.chips_path()).await? else {
        return Ok(Found::Missing);
    };
    let errors_file = describe(out, &task.errors_path()).await?.map(|(f, _)| f);
    if retry_failed && errors_file.is_some() {
        return Ok(Found::Retry);
    }
    let report = TaskReport {
        task_id: task.task_id.clone(),
        chips_file,
        errors_file,
        failures: vec![],
        empty_inputs,
        cloudy_chips_dropped: 0,
        unclear_cells: 0,
    };
    // The next resume reads the record rather than the files.
    write_record(out, &report, 0.0).await?;
    Ok(Found::Done(Box::new(report)))
}

/// Whether the task's files are there with the sizes its record gives: a
/// HEAD each, which catches a file removed or cut short since, though not
/// one rewritten at the same size (that would take reading it whole).
async fn files_match(out: &Location, task: &Task, record: &DoneRecord) -> Result<bool> {
    let files = [
        (task.chips_path(), Some(record.chips.bytes)),
        (task.errors_path(), record.errors.as_ref().map(|e| e.bytes)),
    ];
    for (path, bytes) in files {
        let Some(bytes) = bytes else { continue };
        if size_of(out, &path).await? != Some(bytes) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Writes a finished task's done record, after its files.
pub(crate) async fn write_record(out: &Location, report: &TaskReport, seconds: f64) -> Result<()> {
    let record = DoneRecord::of(&report.done("", seconds));
    out.store
        .put(
            &out.child(&record_path(&report.task_id)),
            PutPayload::from(record.encode()),
        )
        .await?;
    Ok(())
}

/// Removes a task's done record before the task runs again, so a run cut
/// off while it writes the new files finds them, not the old record.
pub(crate) async fn forget(out: &Location, task: &Task) -> Result<()> {
    delete_if_present(out, &record_path(&task.task_id)).await
}

/// A task's done record; `None` when it has none, or one that does not read
/// (another version's, or damaged), which the files then stand in for.
async fn read_record(out: &Location, task: &Task) -> Result<Option<DoneRecord>> {
    let path = record_path(&task.task_id);
    let got = match out.store.get(&out.child(&path)).await {
        Ok(g) => g,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if got.meta.size > RECORD_MAX_BYTES {
        tracing::warn!(
            path,
            bytes = got.meta.size,
            "not a done record; reading the task's files"
        );
        return Ok(None);
    }
    let bytes = got.bytes().await?;
    match DoneRecord::decode(&bytes) {
        Ok(r) => Ok(Some(r)),
        Err(e) => {
            tracing::warn!(path, error = %e, "unreadable done record; reading the task's files");
            Ok(None)
        }
    }
}

/// Digest and row count of an existing Parquet file, and the empty inputs
/// it lists; `None` when it is absent.
async fn describe(out: &Location, rel: &str) -> Result<Option<(ManifestFile, Vec<String>)>> {
    let bytes = match out.store.get(&out.child(rel)).await {
        Ok(g) => g.bytes().await?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let empty = empty_inputs_of(&bytes);
    describe_bytes(rel, bytes)
        .map(|f| Some((f, empty)))
        .map_err(|source| Error::TaskFile {
            path: rel.to_owned(),
            source,
        })
}
