//! `rsembed finalize`: check that the job is complete, then write
//! `manifest.json`.
//!
//! Complete means: `submit` finished planning, nothing of the job is queued
//! or held, and every task of the plan is either done or recorded as failed:
//! the job's totals count as many done and failed tasks as the plan has
//! (`submit` forgets the records and files of tasks an earlier plan had and
//! this one has not, so every record counted is of a planned task).
//!
//! It costs the job's size in time and a bounded amount of memory: the done
//! records are read as a stream and go to the file list as they come; no chip
//! file is read or hashed (the worker recorded each file's digest, rows and
//! extent when it wrote it), and neither the plan nor the list is held.

use futures::{StreamExt, TryStreamExt};
use std::collections::HashMap;

use rsembed_schemas::job::{JobSpec, Manifest, ManifestFailedTask, MANIFEST_FILE};
use rsembed_schemas::queue::{TaskFailed, TaskMessage};
use rsembed_worker::sink::parquet::empty_inputs_at;
use rsembed_worker::store::StoreCache;

use crate::cli::FinalizeArgs;
use crate::error::Result;
use crate::job::deadletter;
use crate::job::manifest::ManifestBuilder;
use crate::job::output::{self, JobOutput, TASKS_FILE};
use crate::job::status::{job_of, open, queued};
pub use crate::job::summary::FinalizeReport;
use crate::stac::out::StacFeed;
use rsembed_worker::queue::Queue;

/// How many names of missing tasks a gap message lists.
const NAMES_LISTED: usize = 10;
/// How many planned tasks a finalize of an incomplete job probes for their
/// records to name the missing ones (the count is exact without it).
const MISSING_PROBED: usize = 100_000;

/// Up to [`NAMES_LISTED`] tasks of the plan with neither a done nor a failed
/// record, found by probing the first [`MISSING_PROBED`] of them.
async fn missing_tasks(q: &Queue, out: &JobOutput, job: &str) -> Result<Vec<String>> {
    let Some(ids) = out.plan_ids().await? else {
        return Ok(vec![]);
    };
    let probes = ids
        .take(MISSING_PROBED)
        .map(|id| async move {
            let id = id?;
            let settled =
                q.state.done(job, &id).await?.is_some() || q.state.failed_one(job, &id).await?;
            Ok::<_, crate::error::Error>((!settled).then_some(id))
        })
        .buffered(32)
        .try_filter_map(|v| async move { Ok(v) })
        .take(NAMES_LISTED);
    probes.try_collect().await
}

/// Writes the manifest (returned) from the done records, read as a stream,
/// and the failed tasks, giving each chip file to `stac` too. Only the error files'
/// names are kept: a task's failed inputs are read from its error file once
/// the list of chip files is complete.
async fn list(
    q: &Queue,
    out: &JobOutput,
    spec: &JobSpec,
    failed: HashMap<String, TaskFailed>,
    tasks: u64,
    stac: &StacFeed,
) -> Result<Manifest> {
    let mut builder = ManifestBuilder::new(&out.loc, spec)?;
    let mut error_files: Vec<(String, String)> = Vec::new();
    let done = q.state.done_records(&spec.job_id).await?;
    let mut done = std::pin::pin!(done);
    while let Some(r) = done.next().await {
        let (task, d) = r?;
        if d.output.as_deref().is_some_and(|o| o != spec.output) {
            // An older worker's record of another output: not this job's work.
            continue;
        }
        builder.chips_file(&task, &d.chips_file).await?;
        stac.file(&d.chips_file).await;
        if let Some(e) = &d.errors_file {
            builder.errors_file(&task, e).await?;
            error_files.push((task.clone(), e.path.clone()));
        }
        if d.without_chips() > 0 {
            // Records carry the count; the names are in the chip file's
            // footer (older records carried them).
            let names = if d.empty_inputs.is_empty() {
                empty_inputs_at(&out.loc, &d.chips_file.path).await?
            } else {
                d.empty_inputs.clone()
            };
            builder.without_chips(Some(&task), &names).await?;
        }
    }
    builder.failures_of_error_files(error_files).await?;
    for (id, f) in failed {
        builder
            .failed_task(&ManifestFailedTask {
                inputs: serde_json::from_str::<TaskMessage>(&f.message)
                    .map(|m| m.task.inputs.into_iter().map(|i| i.uri).collect())
                    .unwrap_or_default(),
                task_id: id,
                error: f.error,
                deliveries: f.deliveries,
            })
            .await?;
    }
    Ok(builder.finish(tasks).await?.manifest)
}

/// Runs `rsembed finalize`.
pub async fn finalize(args: FinalizeArgs) -> Result<FinalizeReport> {
    let stores = StoreCache::default();
    let output = stores.location(&args.output)?;
    let Some(nats) = &args.nats else {
        return super::convert::convert(&output).await;
    };
    let spec = job_of(&output).await?;
    let q = open(nats, "rsembed-finalize").await?;
    deadletter::reconcile(&q).await?;
    let job = spec.job_id.as_str();
    let record = q.state.record(job).await?;
    let in_stream = queued(&q, job).await?;
    let out = JobOutput::new(output.clone());

    let mut gaps = Vec::new();
    let planned = record.as_ref().filter(|r| r.planned);
    if planned.is_none() {
        gaps.push("submit has not finished planning this job (run `rsembed submit` again)".into());
    }
    if in_stream > 0 {
        gaps.push(format!(
            "{in_stream} tasks are still queued or held by workers (see `rsembed status`)"
        ));
    }
    if output::size_of(&output, TASKS_FILE).await?.is_none() {
        gaps.push(format!("{TASKS_FILE} is missing from the output"));
    }
    let tasks = planned.map_or(0, |r| r.tasks);
    let totals = q.state.totals(job).await?;
    let failed = q.state.failed(job).await?;
    let settled = totals.done + failed.len() as u64;
    if planned.is_some() && settled < tasks {
        let names = missing_tasks(&q, &out, job).await?;
        let mut g = format!("{} tasks are neither done nor failed", tasks - settled);
        if !names.is_empty() {
            g.push_str(&format!(": {}", names.join(", ")));
            if tasks - settled > names.len() as u64 {
                g.push_str(&format!(
                    ", and {} more",
                    tasks - settled - names.len() as u64
                ));
            }
        }
        gaps.push(g);
    }
    let mut report = FinalizeReport {
        job_id: spec.job_id.clone(),
        gaps,
        tasks,
        done: totals.done,
        failed: failed.len() as u64,
        rows: totals.chips,
        failed_inputs: totals.failed_inputs,
        inputs_without_chips: totals.inputs_without_chips,
        superseded: 0,
        windows: crate::job::summary::WindowCounts::of(&totals, record.as_ref()),
        manifest: None,
        stac: None,
        converted: None,
    };
    if !report.gaps.is_empty() {
        return Ok(report);
    }

    // The done records go to the file list as they are read, and to the
    // STAC writer, which builds the items on other threads meanwhile.
    let stac = crate::stac::out::StacFeed::start(&output, &spec, Some(totals.done));
    let listed = match list(&q, &out, &spec, failed, tasks, &stac).await {
        Ok(l) => l,
        Err(e) => {
            stac.abort("finalize stopped before the file list was complete")
                .await;
            return Err(e);
        }
    };
    // What the list holds, which the totals counted too.
    report.done = listed.chip_file_count;
    report.rows = listed.rows;
    report.failed_inputs = listed.failed_inputs;
    report.inputs_without_chips = listed.inputs_without_chips;
    report.stac = Some(stac.finish().await?.collection);
    report.manifest = Some(format!(
        "{}/{MANIFEST_FILE}",
        output.url.as_str().trim_end_matches('/')
    ));
    Ok(report)
}
