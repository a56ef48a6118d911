//! `rsembed finalize`: check that the job is complete, then write
//! `manifest.json`.
//!
//! Complete means: `submit` finished planning, nothing of the job is queued
//! or held, and every task of the plan (`tasks.txt`) is either done, with its
//! chip file (and error file, when it has one) present in the output, or
//! recorded as failed. Chip and error files of no planned task (left by an
//! earlier plan of an input that changed since) are removed before the
//! manifest is written: a query of `chips/*.parquet` would read them, and
//! their chips may be in the plan's own files too.

use std::collections::{BTreeMap, HashMap, HashSet};

use futures::StreamExt;
use object_store::ObjectStoreExt;
use rsembed_schemas::job::{ManifestFailedTask, ManifestFailure, ManifestFile, MANIFEST_FILE};
use rsembed_schemas::queue::TaskMessage;
use rsembed_worker::sink::commit::describe;
use rsembed_worker::sink::parquet::read_error_rows;
use rsembed_worker::store::{Location, StoreCache};
use serde::Serialize;

use crate::cli::FinalizeArgs;
use crate::error::Result;
use crate::job::deadletter;
use crate::job::output::{self, JobOutput, TASKS_FILE};
use crate::job::status::{done_for, job_of, open, queued};

/// How many failed inputs the manifest lists by name (the count is exact).
const FAILURES_LISTED: usize = 1000;
/// How many names of missing or stale tasks a gap message lists.
const NAMES_LISTED: usize = 10;

/// What `finalize` found.
#[derive(Debug, Clone, Serialize)]
pub struct FinalizeReport {
    /// The job.
    pub(crate) job_id: String,
    /// Why the job is not complete; empty when the manifest was written.
    pub(crate) gaps: Vec<String>,
    /// Tasks in the plan.
    pub(crate) tasks: u64,
    /// Tasks done.
    pub(crate) done: u64,
    /// Tasks failed (listed in the manifest).
    pub failed: u64,
    /// Chip rows.
    pub(crate) rows: u64,
    /// Failed inputs.
    pub(crate) failed_inputs: u64,
    /// Inputs that gave neither a chip nor an error row.
    pub(crate) inputs_without_chips: u64,
    /// Chip files of no task of the plan, removed (an earlier plan's).
    pub(crate) superseded: u64,
    /// Where the manifest went, when it was written.
    pub manifest: Option<String>,
    /// Where the STAC collection of the job went, when it was written.
    pub(crate) stac: Option<String>,
}

impl FinalizeReport {
    /// Text for a terminal.
    pub fn render(&self) -> String {
        let mut s = format!(
            "rsembed finalize: job {}\n  tasks      {}\n  done       {}\n  failed     {}\n  rows       {}\n  failed inputs {}\n",
            self.job_id, self.tasks, self.done, self.failed, self.rows, self.failed_inputs
        );
        if self.inputs_without_chips > 0 {
            s.push_str(&format!(
                "  without chips {} inputs (no valid pixel, below --min-valid, or over --max-cloud; listed in the manifest)\n",
                self.inputs_without_chips
            ));
        }
        if self.superseded > 0 {
            s.push_str(&format!(
                "  superseded {} chip files of an earlier plan removed\n",
                self.superseded
            ));
        }
        if let Some(hint) = super::summary::how_to_retry("submit", self.failed_inputs, self.failed)
        {
            s.push_str(&format!("  retry      {hint}\n"));
        }
        match &self.manifest {
            Some(m) => {
                s.push_str(&format!("  manifest   {m}\n"));
                if let Some(c) = &self.stac {
                    s.push_str(&format!("  stac       {c}\n"));
                }
            }
            None => {
                s.push_str("  INCOMPLETE: no manifest written\n");
                for g in &self.gaps {
                    s.push_str(&format!("  - {g}\n"));
                }
            }
        }
        s
    }
}

fn names(v: &[String]) -> String {
    let mut s = v
        .iter()
        .take(NAMES_LISTED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if v.len() > NAMES_LISTED {
        s.push_str(&format!(", and {} more", v.len() - NAMES_LISTED));
    }
    s
}

/// Sizes of the files under `dir/` of the output, by path relative to the output.
async fn list_sizes(output: &Location, dir: &str) -> Result<HashMap<String, u64>> {
    let prefix = output.child(dir);
    let root = output.prefix.as_ref().to_owned();
    let mut out = HashMap::new();
    let mut s = output.store.list(Some(&prefix));
    while let Some(meta) = s.next().await {
        let meta = meta?;
        let full = meta.location.as_ref();
        let rel = full
            .strip_prefix(&root)
            .unwrap_or(full)
            .trim_start_matches('/');
        out.insert(rel.to_owned(), meta.size);
    }
    Ok(out)
}

/// Runs `rsembed finalize`.
pub async fn finalize(args: FinalizeArgs) -> Result<FinalizeReport> {
    let stores = StoreCache::default();
    let output = stores.location(&args.output)?;
    let spec = job_of(&output).await?;
    let q = open(&args.nats, "rsembed-finalize").await?;
    deadletter::reconcile(&q).await?;
    let mut snap = q.state.snapshot(&spec.job_id).await?;
    snap.done = done_for(&spec, std::mem::take(&mut snap.done));
    let in_stream = queued(&q, &spec.job_id).await?;

    let mut gaps = Vec::new();
    let planned = snap.record.as_ref().filter(|r| r.planned);
    if planned.is_none() {
        gaps.push("submit has not finished planning this job (run `rsembed submit` again)".into());
    }
    if in_stream > 0 {
        gaps.push(format!(
            "{in_stream} tasks are still queued or held by workers (see `rsembed status`)"
        ));
    }
    let out = JobOutput::new(output.clone());
    let plan: Vec<String> = match out.plan().await? {
        Some(plan) => plan,
        None => {
            gaps.push(format!("{TASKS_FILE} is missing from the output"));
            Vec::new()
        }
    };
    let chips_on_disk = list_sizes(&output, "chips/").await?;
    let errors_on_disk = list_sizes(&output, "errors/").await?;

    let planned_ids: HashSet<&str> = plan.iter().map(String::as_str).collect();
    let mut missing = Vec::new();
    let mut lost_files = Vec::new();
    let mut files = BTreeMap::new();
    let mut error_files = BTreeMap::new();
    let mut failed_tasks = Vec::new();
    for id in &plan {
        if let Some(d) = snap.done.get(id) {
            let mut check = |f: &ManifestFile, on_disk: &HashMap<String, u64>| -> Option<bool> {
                match on_disk.get(&f.path) {
                    None => {
                        lost_files.push(f.path.clone());
                        None
                    }
                    Some(&size) => Some(size == f.bytes),
                }
            };
            match check(&d.chips_file, &chips_on_disk) {
                Some(true) => {
                    files.insert(id.clone(), d.chips_file.clone());
                }
                // Rewritten since it was recorded (a store without
                // conditional puts, and two deliveries): describe what is there.
                Some(false) => {
                    files.insert(id.clone(), describe(&output, &d.chips_file.path).await?);
                }
                None => {}
            }
            if let Some(e) = &d.errors_file {
                match check(e, &errors_on_disk) {
                    Some(true) => {
                        error_files.insert(id.clone(), e.clone());
                    }
                    Some(false) => {
                        error_files.insert(id.clone(), describe(&output, &e.path).await?);
                    }
                    None => {}
                }
            }
        } else if let Some(f) = snap.failed.get(id) {
            let inputs = serde_json::from_str::<TaskMessage>(&f.message)
                .map(|m| m.task.inputs.into_iter().map(|i| i.uri).collect())
                .unwrap_or_default();
            failed_tasks.push(ManifestFailedTask {
                task_id: id.clone(),
                inputs,
                error: f.error.clone(),
                deliveries: f.deliveries,
            });
        } else {
            missing.push(id.clone());
        }
    }
    if !missing.is_empty() {
        gaps.push(format!(
            "{} tasks are neither done nor failed: {}",
            missing.len(),
            names(&missing)
        ));
    }
    if !lost_files.is_empty() {
        gaps.push(format!(
            "{} files recorded as written are missing from the output: {}",
            lost_files.len(),
            names(&lost_files)
        ));
    }
    let without_chips: Vec<String> = plan
        .iter()
        .filter_map(|id| snap.done.get(id))
        .flat_map(|d| d.empty_inputs.iter().cloned())
        .collect();
    let rows = files.values().map(|f| f.rows).sum();
    let failed_inputs = error_files.values().map(|f| f.rows).sum();
    let mut report = FinalizeReport {
        job_id: spec.job_id.clone(),
        gaps,
        tasks: plan.len() as u64,
        done: files.len() as u64,
        failed: failed_tasks.len() as u64,
        rows,
        failed_inputs,
        inputs_without_chips: without_chips.len() as u64,
        superseded: 0,
        manifest: None,
        stac: None,
    };
    if !report.gaps.is_empty() {
        return Ok(report);
    }
    report.superseded = out.remove_stale(&planned_ids).await?;

    let mut failures: Vec<ManifestFailure> = Vec::new();
    for f in error_files.values() {
        if failures.len() >= FAILURES_LISTED {
            break;
        }
        let bytes = output
            .store
            .get(&output.child(&f.path))
            .await?
            .bytes()
            .await?;
        failures.extend(read_error_rows(bytes, FAILURES_LISTED - failures.len())?);
    }
    let manifest = output::manifest(
        &spec,
        plan.len() as u64,
        files.into_values().collect(),
        error_files.into_values().collect(),
        failures,
        failed_tasks,
        without_chips,
    );
    out.write_manifest(&manifest).await?;
    report.stac = Some(
        crate::stac::out::write(
            &output,
            &spec,
            futures::stream::iter(manifest.files.iter().cloned().map(Ok)),
            Some(manifest.files.len() as u64),
        )
        .await?
        .collection,
    );
    report.manifest = Some(format!(
        "{}/{MANIFEST_FILE}",
        output.url.as_str().trim_end_matches('/')
    ));
    Ok(report)
}
