//! A dataset's manifest, built as its files come: the lists
//! (`manifest/files.parquet`, `manifest/failures.parquet`) stream to the
//! output as rows are given, and `manifest.json`, a few KiB of totals and
//! the lists' digests, is written last. Memory stays bounded whatever the
//! dataset's size: the lists' writers hold a batch and a row group, and the
//! builder keeps the first [`SAMPLE`] inputs without chips for the
//! summary that names them. A job's `finalize` and `run` build one, and so
//! does `compact` for its output.

use futures::{StreamExt, TryStreamExt};
use object_store::buffered::BufWriter;
use object_store::ObjectStoreExt;
use rsembed_schemas::chip_file::read_error_rows;
use rsembed_schemas::datetime::now_rfc3339;
use rsembed_schemas::job::{
    JobSpec, Manifest, ManifestFailedTask, ManifestFailure, ManifestFile, ManifestLists,
    MANIFEST_FILE, MANIFEST_FORMAT,
};
use rsembed_schemas::manifest::{
    self as lists, FailureRow, FailuresWriter, FileKind, FilesWriter, ListedFile,
};
use rsembed_schemas::SOFTWARE_VERSION;
use rsembed_store::Location;

use super::list_error;
use crate::io::{delete_if_present, put_json};
use crate::{Error, Result};

/// Inputs without chips the builder keeps by name for the summary; the
/// failures list holds them all.
pub const SAMPLE: usize = 1000;

/// Error files read at once for their failed inputs.
const ERROR_FILES_AT_ONCE: usize = 16;

/// Builds a job's manifest; see the module's documentation.
pub struct ManifestBuilder {
    loc: Location,
    job_id: String,
    fingerprint: String,
    files: FilesWriter<BufWriter>,
    failures: FailuresWriter<BufWriter>,
    rows: u64,
    chip_files: u64,
    error_files: u64,
    failed_inputs: u64,
    failed_tasks: u64,
    without_chips: u64,
    sample_without_chips: Vec<String>,
}

/// What [`ManifestBuilder::finish`] wrote.
#[derive(Debug, Clone)]
pub struct Built {
    /// `manifest.json` (format 2).
    pub manifest: Manifest,
    /// The first [`SAMPLE`] inputs without chips.
    pub without_chips: Vec<String>,
}

impl ManifestBuilder {
    /// A builder of the manifest of `spec`'s job at `loc`.
    pub fn new(loc: &Location, spec: &JobSpec) -> Result<ManifestBuilder> {
        Self::for_job(loc, &spec.job_id, &spec.fingerprint)
    }

    /// A builder of the manifest of job `job_id` at `loc` (a compaction's
    /// output, whose source may have no `job.json`).
    pub fn for_job(loc: &Location, job_id: &str, fingerprint: &str) -> Result<Self> {
        // A put on completion, or a multipart upload past 10 MiB: either
        // way the list appears whole or not at all.
        let sink = |rel: &str| BufWriter::new(loc.store.clone(), loc.child(rel));
        let files = FilesWriter::new(sink(lists::FILES_LIST))
            .map_err(|e| list_error(loc, lists::FILES_LIST, e))?;
        let failures = FailuresWriter::new(sink(lists::FAILURES_LIST))
            .map_err(|e| list_error(loc, lists::FAILURES_LIST, e))?;
        Ok(ManifestBuilder {
            loc: loc.clone(),
            job_id: job_id.to_owned(),
            fingerprint: fingerprint.to_owned(),
            files,
            failures,
            rows: 0,
            chip_files: 0,
            error_files: 0,
            failed_inputs: 0,
            failed_tasks: 0,
            without_chips: 0,
            sample_without_chips: Vec::new(),
        })
    }

    async fn file(&mut self, kind: FileKind, task_id: &str, f: &ManifestFile) -> Result<()> {
        let mut row = ListedFile {
            kind,
            task_id: task_id.to_owned(),
            file: f.clone(),
        };
        // A record the list cannot hold is left out, as a record of an
        // older version is: the STAC output then reads the chip file.
        if let Some(Err(why)) = row.file.extent.as_ref().map(lists::extent_fits) {
            tracing::warn!(path = %f.path, %why, "the recorded extent does not fit the file list: left out");
            row.file.extent = None;
        }
        self.files
            .push(row)
            .await
            .map_err(|e| list_error(&self.loc, lists::FILES_LIST, e))
    }

    /// The chip file of task `task_id`.
    pub async fn chips_file(&mut self, task_id: &str, f: &ManifestFile) -> Result<()> {
        self.file(FileKind::Chips, task_id, f).await?;
        self.chip_files += 1;
        self.rows += f.rows;
        Ok(())
    }

    /// The error file of task `task_id`: its rows are failed inputs.
    pub async fn errors_file(&mut self, task_id: &str, f: &ManifestFile) -> Result<()> {
        self.file(FileKind::Errors, task_id, f).await?;
        self.error_files += 1;
        self.failed_inputs += f.rows;
        Ok(())
    }

    /// A row of the failures list, as it is (a compaction copies its
    /// source's).
    pub async fn failure_row(&mut self, row: FailureRow) -> Result<()> {
        self.failures
            .push(row)
            .await
            .map_err(|e| list_error(&self.loc, lists::FAILURES_LIST, e))
    }

    /// A failed input of task `task_id` (`None`: not recorded, in a format
    /// 1 manifest), as its error file records it.
    pub async fn failure(&mut self, task_id: Option<&str>, f: &ManifestFailure) -> Result<()> {
        self.failure_row(FailureRow::input(task_id, f)).await
    }

    /// The failed inputs of the error files `files` (task id, path), read
    /// from the output a few at a time, in the order given.
    pub async fn failures_of_error_files(
        &mut self,
        files: impl IntoIterator<Item = (String, String)>,
    ) -> Result<()> {
        let loc = self.loc.clone();
        let mut read = futures::stream::iter(files)
            .map(|(task, path)| {
                let loc = loc.clone();
                async move {
                    let bytes = loc.store.get(&loc.child(&path)).await?.bytes().await?;
                    let rows = read_error_rows(bytes, usize::MAX)?;
                    Ok::<_, Error>((task, rows))
                }
            })
            .buffered(ERROR_FILES_AT_ONCE);
        while let Some((task, rows)) = read.try_next().await? {
            for f in &rows {
                self.failure(Some(&task), f).await?;
            }
        }
        Ok(())
    }

    /// A task given up on: a row per input.
    pub async fn failed_task(&mut self, t: &ManifestFailedTask) -> Result<()> {
        self.failed_tasks += 1;
        for row in FailureRow::failed_task(t) {
            self.failure_row(row).await?;
        }
        Ok(())
    }

    /// Inputs of task `task_id` that gave neither a chip nor an error row.
    pub async fn without_chips(&mut self, task_id: Option<&str>, inputs: &[String]) -> Result<()> {
        for uri in inputs {
            self.without_chips += 1;
            if self.sample_without_chips.len() < SAMPLE {
                self.sample_without_chips.push(uri.clone());
            }
            self.failure_row(FailureRow::without_chips(task_id, uri))
                .await?;
        }
        Ok(())
    }

    /// Completes both lists and returns the manifest that names them,
    /// unwritten (a compaction writes its own, with more in it). A
    /// `manifest.json` already at the output goes first: it names the
    /// lists being replaced.
    pub async fn finish_lists(self, tasks: u64) -> Result<Built> {
        delete_if_present(&self.loc, MANIFEST_FILE).await?;
        let loc = self.loc;
        let files = self
            .files
            .finish()
            .await
            .map_err(|e| list_error(&loc, lists::FILES_LIST, e))?
            .file;
        let failures = self
            .failures
            .finish()
            .await
            .map_err(|e| list_error(&loc, lists::FAILURES_LIST, e))?
            .file;
        Ok(Built {
            manifest: Manifest {
                format: MANIFEST_FORMAT,
                job_id: self.job_id,
                fingerprint: self.fingerprint,
                tasks,
                rows: self.rows,
                failed_inputs: self.failed_inputs,
                chip_file_count: self.chip_files,
                error_file_count: self.error_files,
                failed_task_count: self.failed_tasks,
                inputs_without_chips: self.without_chips,
                lists: Some(ManifestLists { files, failures }),
                files: Vec::new(),
                error_files: Vec::new(),
                failures: Vec::new(),
                failed_tasks: Vec::new(),
                without_chips: Vec::new(),
                finalized_at: now_rfc3339(),
                software_version: SOFTWARE_VERSION.to_owned(),
            },
            without_chips: self.sample_without_chips,
        })
    }

    /// Completes both lists, then writes `manifest.json`: a reader never
    /// sees a manifest over lists that are not whole.
    pub async fn finish(self, tasks: u64) -> Result<Built> {
        let loc = self.loc.clone();
        let built = self.finish_lists(tasks).await?;
        put_json(&loc, MANIFEST_FILE, &built.manifest).await?;
        Ok(built)
    }
}
