//! `rsembed run`: the embedded mode. The planner, an in-process queue and the
//! worker's task runner in one process, with no server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use rsembed_schemas::job::ManifestFailure;
use rsembed_schemas::meta::FileMeta;
use rsembed_schemas::task::Task;
use rsembed_worker::engine::start::start_engine;
use rsembed_worker::metrics;
use rsembed_worker::task::{JobContext, Mode, TaskReport, TaskRunner};

use crate::cli::RunArgs;
use crate::error::{Error, Result};
use crate::job::manifest::ManifestBuilder;
use crate::job::output::{self, Claim, Replace};
use crate::job::plan;
use crate::job::progress::{Progress, TaskCounts};
use crate::job::resume::{self, finished, Found};
use crate::job::setup::{first_task, setup, JobFlags, JobSetup};
use crate::job::summary::Summary;

/// Runs `task` and, when none of its inputs failed, removes the errors file
/// an earlier try left (a retry whose inputs now all succeed, or a run cut
/// off between its two files): the runner only writes one when there are
/// failures. It goes after the chip file is written, so a crash in between
/// leaves the old failures listed and the task still to retry, never a task
/// that looks clean without its chips.
async fn run_task(runner: &TaskRunner, job: &JobContext, task: &Task) -> Result<TaskReport> {
    let started = Instant::now();
    let report = runner.run(job, task).await?;
    if report.errors_file.is_none() {
        output::delete_if_present(&job.output, &task.errors_path()).await?;
    }
    resume::write_record(&job.output, &report, started.elapsed().as_secs_f64()).await?;
    Ok(report)
}

/// Runs a whole job in this process and returns its summary.
pub async fn run(args: RunArgs) -> Result<Summary> {
    let started = Instant::now();
    super::log_config("run", &super::redacted_run(&args));
    // Flags of its own first, then the setup `submit` shares.
    let policy = args.engine.batch_policy().map_err(Error::Usage)?;
    let JobSetup {
        stores,
        input,
        source,
        output,
        model,
        model_ref,
        scale,
        out,
        spec,
        tiling,
        grouping,
        claim,
        mut created_dir,
    } = setup(JobFlags {
        input: &args.input,
        output: &args.output,
        model: &args.model,
        fp16: args.engine.fp16,
        tiling: &args.tiling,
        replace: Replace::anything_if(args.overwrite),
        replace_flag: "--overwrite",
    })
    .await?;
    let job_id = spec.job_id.clone();
    // Before the model loads, so the warm-up probe can be watched too. The
    // server stops when the run returns (the guard cancels it).
    let _metrics = match &args.metrics_addr {
        Some(addr) => Some(serve_metrics(addr).await?),
        None => None,
    };

    // Load the model before writing anything: a broken model directory must
    // leave no job behind.
    let (engine, _) = start_engine(&model, &args.engine)?;
    let batch_size = engine.preferred_batch().unwrap_or(policy.max());
    tracing::info!(
        job_id = %job_id, input = %input.url, output = %output.url, model = %model_ref.name,
        embed_dim = model_ref.embed_dim, batch_size, ?policy, device = %args.engine.device,
        chip_size = tiling.chip_size, stride = tiling.stride, ?claim, "starting job"
    );

    let runner = Arc::new(TaskRunner::new(
        &args.pipeline,
        &model,
        engine,
        policy,
        stores.clone(),
        Mode::Embedded,
    ));
    let counters = runner.counters.clone();

    let job = Arc::new(JobContext {
        output: output.clone(),
        scale,
        file_meta: FileMeta::of_job(&job_id, &model_ref, &tiling),
    });
    let mut planner = plan::start(
        &stores,
        source,
        job_id.clone(),
        tiling.clone(),
        &grouping,
        16,
    );
    let stats = planner.stats.clone();

    let first = match first_task(&mut planner, &input.url).await {
        Ok(first) => first,
        Err(e) => {
            runner.engine.shutdown().await;
            return Err(e);
        }
    };
    out.begin(&spec, &claim).await?;
    created_dir.keep();

    let tasks_done = Arc::new(TaskCounts::default());
    let progress = Progress::start(
        tasks_done.clone(),
        counters.clone(),
        stats.clone(),
        args.progress_interval,
    );
    let retried = Arc::new(AtomicU64::new(0));
    let tasks = futures::stream::once(std::future::ready(first))
        .chain(plan::receiver_stream(planner.tasks));
    let retry_failed = args.retry_failed;
    let mut results = tasks
        .map(|task| {
            let runner = runner.clone();
            let job = job.clone();
            let output = output.clone();
            let (done, retried) = (tasks_done.clone(), retried.clone());
            async move {
                let report = match finished(&output, &task, retry_failed).await? {
                    Found::Done(report) => {
                        done.resumed.fetch_add(1, Ordering::Relaxed);
                        *report
                    }
                    Found::Retry => {
                        retried.fetch_add(1, Ordering::Relaxed);
                        resume::forget(&job.output, &task).await?;
                        run_task(&runner, &job, &task).await?
                    }
                    Found::Missing => run_task(&runner, &job, &task).await?,
                };
                done.done.fetch_add(1, Ordering::Relaxed);
                Ok::<_, Error>(report)
            }
        })
        .buffer_unordered(args.pipeline.tasks_in_flight.max(1));

    // Reports go to the manifest's lists as they come, in the order tasks
    // finish: the run holds none of them. The plan's ids go to a local
    // spool, read back only when the output holds files of no planned task.
    let mut builder = ManifestBuilder::new(&out.loc, &spec)?;
    let mut plan_ids = PlanSpool::new()?;
    let (mut tasks_total, mut with_errors, mut cloudy, mut unclear) = (0u64, 0u64, 0u64, 0u64);
    let collected: Result<()> = async {
        while let Some(r) = results.next().await {
            let r = r?;
            tasks_total += 1;
            cloudy += r.cloudy_chips_dropped;
            unclear += r.unclear_cells;
            plan_ids.push(&r.task_id)?;
            builder.chips_file(&r.task_id, &r.chips_file).await?;
            if let Some(e) = &r.errors_file {
                with_errors += 1;
                builder.errors_file(&r.task_id, e).await?;
                // A task found finished reports no failures: its error file has them.
                if r.failures.is_empty() {
                    builder
                        .failures_of_error_files([(r.task_id.clone(), e.path.clone())])
                        .await?;
                }
            }
            for f in &r.failures {
                let f = ManifestFailure {
                    source_uri: f.source_uri.clone(),
                    stage: f.stage.as_str().to_owned(),
                    error: f.error.clone(),
                };
                builder.failure(Some(&r.task_id), &f).await?;
            }
            builder
                .without_chips(Some(&r.task_id), &r.empty_inputs)
                .await?;
        }
        Ok(())
    }
    .await;
    if let Err(e) = collected {
        progress.finish();
        return Err(e);
    }
    drop(results);
    planner.done.await.map_err(|source| Error::Panicked {
        what: "planner",
        source,
    })??;
    progress.finish();

    // Every task is done: drop the session now, so ORT writes its profile and
    // frees its memory before the process exits.
    let (engine_busy, engine_up) = runner.engine.busy();
    runner.engine.shutdown().await;
    // Files of tasks an earlier plan had and this one has not (the input
    // changed) would hold some chips twice: they go before the manifest.
    // Each planned task has its chip file, so as many files as tasks means
    // none is stale, and only then is the plan read back.
    let superseded = if out.task_file_counts().await? == (tasks_total, with_errors) {
        0
    } else {
        let ids = plan_ids.read_back()?;
        out.remove_stale(&ids.iter().map(String::as_str).collect())
            .await?
    };
    let built = builder.finish(tasks_total).await?;
    let manifest = &built.manifest;
    let stac = crate::stac::out::write(
        &output,
        &spec,
        crate::job::manifest::chip_file_stream(&output, manifest),
        Some(manifest.chip_file_count),
    )
    .await?;
    tracing::info!(
        collection = %stac.collection, items = stac.items, removed = stac.removed,
        "wrote the job's STAC collection"
    );

    let elapsed = started.elapsed();
    let dropped_past_max_scenes = stats.dropped_past_max_scenes();
    Ok(Summary {
        job_id,
        output: output.url.to_string(),
        local_output: output.local_dir(),
        tasks: manifest.tasks,
        tasks_resumed: tasks_done.resumed.load(Ordering::Relaxed),
        tasks_retried: retried.load(Ordering::Relaxed),
        inputs: stats.inputs.load(Ordering::Relaxed),
        skipped: stats.skipped.load(Ordering::Relaxed),
        chips: manifest.rows,
        chips_embedded: counters.chips.load(Ordering::Relaxed),
        cloudy_chips_dropped: cloudy,
        unclear_cells: unclear,
        outside_windows: stats.outside_windows.load(Ordering::Relaxed),
        dropped_past_max_scenes,
        failed_inputs: manifest.failed_inputs,
        inputs_without_chips: manifest.inputs_without_chips,
        empty_inputs: built.without_chips.clone(),
        superseded_files: superseded,
        replaced_job: match claim {
            Claim::Replace(id) => Some(id),
            _ => None,
        },
        bytes_read: counters.bytes_read.load(Ordering::Relaxed),
        seconds: elapsed.as_secs_f64(),
        engine_seconds: engine_busy.as_secs_f64(),
        engine_busy: if engine_up.is_zero() {
            0.0
        } else {
            (engine_busy.as_secs_f64() / engine_up.as_secs_f64()).min(1.0)
        },
        embed_dim: model_ref.embed_dim,
    })
}

/// The task ids of a run's plan, spooled to a local temporary file (33 bytes
/// a task) rather than held: they are needed again only when the output
/// holds task files of no planned task.
struct PlanSpool {
    file: std::io::BufWriter<tempfile::NamedTempFile>,
}

impl PlanSpool {
    fn new() -> Result<PlanSpool> {
        let file = tempfile::NamedTempFile::new()
            .map_err(|e| Error::Output(format!("a temporary file for the plan's task ids: {e}")))?;
        Ok(PlanSpool {
            file: std::io::BufWriter::new(file),
        })
    }

    fn push(&mut self, id: &str) -> Result<()> {
        use std::io::Write;
        writeln!(self.file, "{id}")
            .map_err(|e| Error::Output(format!("spooling the plan's task ids: {e}")))
    }

    fn read_back(self) -> Result<Vec<String>> {
        let fail =
            |e: std::io::Error| Error::Output(format!("reading the plan's task ids back: {e}"));
        let file = self.file.into_inner().map_err(|e| fail(e.into_error()))?;
        let text = std::fs::read_to_string(file.path()).map_err(fail)?;
        Ok(text.lines().map(str::to_owned).collect())
    }
}

/// Starts the metrics endpoint on `addr`; it serves until the guard drops.
async fn serve_metrics(addr: &str) -> Result<tokio_util::sync::DropGuard> {
    let stop = tokio_util::sync::CancellationToken::new();
    let (bound, _task) = rsembed_worker::http::start(addr, metrics::global(), None, stop.clone())
        .await
        .map_err(|source| Error::MetricsListen {
            addr: addr.to_owned(),
            source,
        })?;
    tracing::info!(addr = %bound, "serving metrics at http://{bound}/metrics");
    Ok(stop.drop_guard())
}
