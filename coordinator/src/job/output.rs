//! A job's output: the one place that decides which job an output holds,
//! writes its `job.json`, builds its manifest and removes what no longer
//! belongs to it. `run`, `submit` and `finalize` all go through here, so the
//! rule "one output, one job, every chip once" is written once.
//!
//! The rules (see `docs/decisions.md`, "Job identity"):
//! - A job is identified by [`JobSpec::job_id_of`]: input, output, model,
//!   tiling, `--min-valid` and task grouping (and `--footprint-tolerance`,
//!   the STAC search and cloud flags where a job records them). A command whose job differs from
//!   the one at the output is refused, naming every flag that differs, unless it
//!   asks to replace it (`run --overwrite`, `submit --force-new-job`).
//! - `job.json` is written only once the plan has found an input, so a
//!   mistyped `--input` leaves the output as it was.
//! - `manifest.json` is deleted only when work is actually (re)done: a
//!   resubmit of a finished job keeps it.
//! - Chip and error files of tasks no longer in the plan (the input changed
//!   since an earlier run) are removed before a manifest is written.

use std::collections::HashSet;

use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use rsembed_schemas::job::{JobSpec, JOB_FILE, MANIFEST_FILE};
use rsembed_schemas::manifest::{FAILURES_LIST, FILES_LIST};
use rsembed_worker::store::Location;

use crate::error::{Error, OtherJob, Result};

/// The plan's task ids, one per line, in plan order (distributed mode).
pub(crate) const TASKS_FILE: &str = "tasks.txt";

/// The folder of an embedded run's done records, one a finished task
/// (`job::resume` writes and reads them).
pub(crate) const STATE_DIR: &str = "state/";

/// The suffix of a done record's name.
pub(crate) const RECORD_SUFFIX: &str = ".done";

/// Folders of the output that hold one file per task: its rows, its failed
/// inputs, and the done records of an embedded run.
const TASK_DIRS: [&str; 3] = ["chips/", "errors/", STATE_DIR];

/// What a command found at the output, once it may go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Nothing of a job was there.
    New,
    /// The same job: the command resumes it. Holds the job's `created_at`.
    Resume(String),
    /// Another job is there and is to be replaced, as asked. Holds its id.
    /// Nothing is deleted until [`JobOutput::begin`].
    Replace(String),
}

impl Claim {
    /// `created_at` for the spec the command writes.
    pub(crate) fn created_at(&self) -> Option<&str> {
        match self {
            Claim::Resume(t) => Some(t),
            _ => None,
        }
    }
}

/// Which of the flags that a resumed job may take from its record were given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Given {
    /// `--footprint-tolerance`.
    pub(crate) footprint_tolerance: bool,
    /// Any of `--task-files`, `--task-bytes`, `--task-chips`, `--shard-bytes`.
    pub(crate) grouping: bool,
}

/// What a command may replace at its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replace {
    /// Nothing: another job is refused, the same job resumed.
    No,
    /// Another job (`submit --force-new-job`); the same job is resumed, so a
    /// retried Kubernetes Job with the flag does not restart its own work.
    OtherJob,
    /// Whatever is there, the same job included (`run --overwrite`: start over).
    Anything,
}

impl Replace {
    /// `Anything` when `flag` was given, else `No`.
    pub(crate) fn anything_if(flag: bool) -> Replace {
        if flag {
            Replace::Anything
        } else {
            Replace::No
        }
    }
}

/// An output location and the rules for what it may hold.
#[derive(Debug, Clone)]
pub struct JobOutput {
    /// Where the job's files go.
    pub(crate) loc: Location,
}

impl JobOutput {
    /// The output at `loc`.
    pub fn new(loc: Location) -> JobOutput {
        JobOutput { loc }
    }

    /// The job spec at the output, if any.
    pub(crate) async fn spec(&self) -> Result<Option<JobSpec>> {
        read_json(&self.loc, JOB_FILE).await.map_err(|e| match e {
            Error::Store(source) => Error::ReadOutput {
                path: format!("{}/{JOB_FILE}", self.loc.url.as_str().trim_end_matches('/')),
                source,
            },
            e => e,
        })
    }

    /// The job a command asks for, `ours`, as it resumes: when
    /// `--footprint-tolerance` was not given and the output holds this very
    /// job as written before the flag existed, that job with its footprints
    /// to 5e-8 degrees (see [`JobSpec::resuming_old_footprints`]); when no
    /// grouping flag was given, this job with the grouping it recorded (see
    /// [`JobSpec::resuming_grouping`]); and always this job in the chip
    /// schema version it started with ([`JobSpec::resuming_schema`]).
    /// Starting over (`run --overwrite`) takes the defaults.
    pub(crate) async fn as_resumed(
        &self,
        ours: JobSpec,
        given: Given,
        replace: Replace,
    ) -> Result<JobSpec> {
        if replace == Replace::Anything {
            return Ok(ours);
        }
        let theirs = self.spec().await?;
        let mut spec = ours;
        if !given.grouping {
            spec = spec.resuming_grouping(theirs.as_ref());
        }
        if !given.footprint_tolerance {
            spec = spec.resuming_old_footprints(theirs.as_ref());
        }
        let spec = spec.resuming_schema(theirs.as_ref());
        Ok(spec.resuming_cell_blocks(theirs.as_ref()))
    }

    /// Decides whether the job `ours` may use this output. Without `replace`
    /// another job is refused, naming what differs and the command's `flag`
    /// that would replace it (`--overwrite`). Nothing is written or deleted
    /// here: a refusal changes nothing, and a replacement happens in
    /// [`JobOutput::begin`], once the new job's plan has found an input.
    pub(crate) async fn check(
        &self,
        ours: &JobSpec,
        replace: Replace,
        flag: &'static str,
    ) -> Result<Claim> {
        let theirs = self.spec().await?;
        match &theirs {
            Some(t) if t.job_id == ours.job_id && replace != Replace::Anything => {
                return Ok(Claim::Resume(t.created_at.clone()))
            }
            None if !self.holds_task_files().await? => return Ok(Claim::New),
            _ => {}
        }
        if replace == Replace::No {
            return Err(Error::OtherJob(Box::new(OtherJob {
                output: self.loc.url.to_string(),
                theirs: theirs.as_ref().map(|t| t.job_id.clone()),
                differences: theirs
                    .as_ref()
                    .map(|t| ours.differences(t))
                    .unwrap_or_default(),
                remedy: flag,
            })));
        }
        Ok(Claim::Replace(
            theirs.map_or_else(|| "(no job.json)".into(), |t| t.job_id),
        ))
    }

    /// Opens the job at the output, as [`JobOutput::check`] allowed: deletes
    /// the job it replaces, writes `job.json` and deletes the manifest (the
    /// job is open). Call it only once work will be done.
    pub(crate) async fn begin(&self, spec: &JobSpec, claim: &Claim) -> Result<()> {
        self.replace_if(claim).await?;
        self.write_spec(spec).await?;
        self.delete_manifest().await
    }

    /// Deletes the job a [`Claim::Replace`] names; nothing otherwise.
    pub(crate) async fn replace_if(&self, claim: &Claim) -> Result<()> {
        if let Claim::Replace(old) = claim {
            tracing::warn!(output = %self.loc.url, old_job = %old, "deleting the job this one replaces");
            self.wipe().await?;
        }
        Ok(())
    }

    /// Whether `chips/` or `errors/` holds any file.
    async fn holds_task_files(&self) -> Result<bool> {
        for dir in TASK_DIRS {
            let prefix = self.loc.child(dir);
            if let Some(first) = self.loc.store.list(Some(&prefix)).next().await {
                first?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Writes `job.json`.
    pub(crate) async fn write_spec(&self, spec: &JobSpec) -> Result<()> {
        put_json(&self.loc, JOB_FILE, spec).await
    }

    /// Deletes `manifest.json`, its lists and `stac/collection.json`: the
    /// job is open again, and none may claim it is complete.
    pub(crate) async fn delete_manifest(&self) -> Result<()> {
        // The collection is written after the manifest and describes the
        // same finished job: it goes first. Then `manifest.json`, which is
        // what says the job is complete, so that no reader sees it over
        // lists that are gone.
        delete_if_present(&self.loc, crate::stac::out::COLLECTION_FILE).await?;
        delete_if_present(&self.loc, MANIFEST_FILE).await?;
        for list in [FILES_LIST, FAILURES_LIST] {
            delete_if_present(&self.loc, list).await?;
        }
        Ok(())
    }

    /// Deletes everything a job wrote: the manifest first (so a reader never
    /// sees a manifest over missing files), then the task files, the plan and
    /// `job.json` last.
    pub(crate) async fn wipe(&self) -> Result<()> {
        self.delete_manifest().await?;
        for dir in TASK_DIRS.into_iter().chain([crate::stac::out::STAC_DIR]) {
            let prefix = self.loc.child(dir);
            let mut list = self.loc.store.list(Some(&prefix));
            while let Some(meta) = list.next().await {
                self.loc.store.delete(&meta?.location).await?;
            }
        }
        delete_if_present(&self.loc, TASKS_FILE).await?;
        delete_if_present(&self.loc, JOB_FILE).await
    }

    /// How many chip files and error files the output holds (one listing).
    pub(crate) async fn task_file_counts(&self) -> Result<(u64, u64)> {
        let mut counts = [0u64; 2];
        for (n, dir) in counts.iter_mut().zip(TASK_DIRS) {
            let mut list = self.loc.store.list(Some(&self.loc.child(dir)));
            while let Some(meta) = list.next().await {
                if meta?.location.as_ref().ends_with(".parquet") {
                    *n += 1;
                }
            }
        }
        Ok((counts[0], counts[1]))
    }

    /// Deletes the chip and error files (and done records) of tasks not in `plan`: left by an
    /// earlier plan of an input that changed since, they hold chips the
    /// plan's own files hold too, or chips of inputs that are gone. Returns
    /// how many chip files went.
    pub(crate) async fn remove_stale(&self, plan: &HashSet<&str>) -> Result<u64> {
        let mut removed = 0;
        for dir in TASK_DIRS {
            let prefix = self.loc.child(dir);
            let mut stale = Vec::new();
            let mut list = self.loc.store.list(Some(&prefix));
            while let Some(meta) = list.next().await {
                let meta = meta?;
                let name = meta.location.filename().unwrap_or_default();
                let id = name
                    .strip_suffix(".parquet")
                    .or_else(|| name.strip_suffix(RECORD_SUFFIX))
                    .unwrap_or(name);
                if !plan.contains(id) {
                    stale.push(meta.location);
                }
            }
            drop(list);
            for p in stale {
                tracing::info!(file = %p, "removing a task file of no task of the plan");
                self.loc.store.delete(&p).await?;
                if dir == "chips/" {
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// The plan's task ids from `tasks.txt`, in plan order, read as they
    /// come (a plan of 10⁷ tasks is 330 MB); `None` when the output has none
    /// (no `submit` has run).
    pub(crate) async fn plan_ids(
        &self,
    ) -> Result<Option<impl futures::Stream<Item = Result<String>> + use<>>> {
        let got = match self.loc.store.get(&self.loc.child(TASKS_FILE)).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let chunks = got.into_stream();
        let lines = futures::stream::unfold(
            (
                chunks,
                Vec::<u8>::new(),
                std::collections::VecDeque::new(),
                false,
            ),
            |(mut chunks, mut rest, mut ready, mut ended)| async move {
                loop {
                    if let Some(line) = ready.pop_front() {
                        return Some((Ok(line), (chunks, rest, ready, ended)));
                    }
                    if ended {
                        return None;
                    }
                    match chunks.next().await {
                        Some(Ok(b)) => rest.extend_from_slice(&b),
                        Some(Err(e)) => return Some((Err(e.into()), (chunks, rest, ready, true))),
                        None => {
                            ended = true;
                            rest.push(b'\n');
                        }
                    }
                    while let Some(i) = rest.iter().position(|&c| c == b'\n') {
                        let line: Vec<u8> = rest.drain(..=i).collect();
                        let line = String::from_utf8_lossy(&line[..i]).trim().to_owned();
                        if !line.is_empty() {
                            ready.push_back(line);
                        }
                    }
                }
            },
        );
        Ok(Some(lines))
    }
}

/// How far an unfinished job got: its output has `job.json` and no
/// `manifest.json` (what `compact` refuses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unfinished {
    /// Chip files written so far (one per finished task).
    pub(crate) chip_files: u64,
    /// Tasks in the plan, when `submit` recorded it (`tasks.txt`).
    pub(crate) planned: Option<u64>,
}

impl Unfinished {
    /// The warning `search` prints on stderr.
    pub(crate) fn warning(&self) -> String {
        let progress = match self.planned {
            Some(t) => format!("{} of {t} tasks have chip files", self.chip_files),
            None => format!(
                "{} tasks have chip files so far (the plan's total is known once it finishes)",
                self.chip_files
            ),
        };
        format!(
            "warning: this job is not finished (no {MANIFEST_FILE}): {progress}; \
             results cover those only"
        )
    }
}

impl JobOutput {
    /// `Some` when the output holds a job that has not finished (a
    /// `job.json` and no `manifest.json`), with how far it got. Cheap: two
    /// HEADs and the listing of `chips/`; the plan's size comes from the
    /// size of `tasks.txt` (fixed-width lines), not its contents.
    pub(crate) async fn unfinished(&self) -> Result<Option<Unfinished>> {
        let head = |rel: &'static str| size_of(&self.loc, rel);
        if head(JOB_FILE).await?.is_none() || head(MANIFEST_FILE).await?.is_some() {
            return Ok(None);
        }
        let planned = head(TASKS_FILE).await?.map(|b| b / TASK_LINE);
        let mut chip_files = 0;
        let mut list = self.loc.store.list(Some(&self.loc.child("chips/")));
        while let Some(meta) = list.next().await {
            if meta?.location.as_ref().ends_with(".parquet") {
                chip_files += 1;
            }
        }
        Ok(Some(Unfinished {
            chip_files,
            planned,
        }))
    }
}

/// Bytes of one line of `tasks.txt`: a task id (32 hex digits) and `\n`.
const TASK_LINE: u64 = 33;

/// A format 1 manifest, its lists in it, as rsembed wrote before the
/// Parquet lists (sorted by path): what tests of the readers of older
/// outputs build.
#[cfg(test)]
pub(crate) fn manifest(
    spec: &JobSpec,
    tasks: u64,
    mut files: Vec<rsembed_schemas::job::ManifestFile>,
    mut error_files: Vec<rsembed_schemas::job::ManifestFile>,
    failures: Vec<rsembed_schemas::job::ManifestFailure>,
    mut failed_tasks: Vec<rsembed_schemas::job::ManifestFailedTask>,
    mut without_chips: Vec<String>,
) -> rsembed_schemas::job::Manifest {
    without_chips.sort();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    error_files.sort_by(|a, b| a.path.cmp(&b.path));
    failed_tasks.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    rsembed_schemas::job::Manifest {
        format: 1,
        job_id: spec.job_id.clone(),
        fingerprint: spec.fingerprint.clone(),
        tasks,
        rows: files.iter().map(|f| f.rows).sum(),
        failed_inputs: error_files.iter().map(|f| f.rows).sum(),
        chip_file_count: files.len() as u64,
        error_file_count: error_files.len() as u64,
        failed_task_count: failed_tasks.len() as u64,
        inputs_without_chips: without_chips.len() as u64,
        lists: None,
        files,
        error_files,
        failures,
        failed_tasks,
        without_chips,
        finalized_at: rsembed_worker::now_rfc3339(),
        software_version: rsembed_schemas::SOFTWARE_VERSION.to_owned(),
    }
}

pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
    out: &Location,
    rel: &str,
) -> Result<Option<T>> {
    match out.store.get(&out.child(rel)).await {
        Ok(got) => Ok(Some(serde_json::from_slice(&got.bytes().await?)?)),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub(crate) async fn put_json<T: serde::Serialize>(out: &Location, rel: &str, v: &T) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(v)?;
    out.store
        .put(&out.child(rel), PutPayload::from(bytes))
        .await?;
    Ok(())
}

/// The size of `rel` in the output; `None` when it is not there.
pub(crate) async fn size_of(out: &Location, rel: &str) -> Result<Option<u64>> {
    match out.store.head(&out.child(rel)).await {
        Ok(m) => Ok(Some(m.size)),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub(crate) async fn delete_if_present(out: &Location, rel: &str) -> Result<()> {
    Ok(out.delete_if_present(rel).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn deleting_the_manifest_deletes_its_lists_and_the_collection() {
        let dir = tempfile::tempdir().unwrap();
        let files = [
            MANIFEST_FILE,
            FILES_LIST,
            FAILURES_LIST,
            crate::stac::out::COLLECTION_FILE,
        ];
        for f in files {
            let p = dir.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"x").unwrap();
        }
        std::fs::create_dir_all(dir.path().join("chips")).unwrap();
        std::fs::write(dir.path().join("chips/a.parquet"), b"x").unwrap();
        let loc = rsembed_worker::store::StoreCache::default()
            .location(dir.path().to_str().unwrap())
            .unwrap();
        JobOutput::new(loc.clone()).delete_manifest().await.unwrap();
        for f in files {
            assert!(!dir.path().join(f).exists(), "{f} is deleted");
        }
        assert!(dir.path().join("chips/a.parquet").exists(), "the job stays");
        JobOutput::new(loc).wipe().await.unwrap();
        assert!(!dir.path().join("chips/a.parquet").exists());
    }

    #[test]
    fn the_unfinished_warning_gives_the_progress_it_knows() {
        let u = Unfinished {
            chip_files: 12,
            planned: Some(96),
        };
        assert_eq!(
            u.warning(),
            "warning: this job is not finished (no manifest.json): 12 of 96 tasks have \
             chip files; results cover those only"
        );
        let u = Unfinished {
            chip_files: 3,
            planned: None,
        };
        assert!(u.warning().contains(": 3 tasks have chip files so far"));
    }
}
