//! `rsembed run`: the embedded mode. The planner, an in-process queue and the
//! worker's task runner in one process, with no server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use rsembed_raster::scale::ScaleSpec;
use rsembed_schemas::job::{
    check_footprint_tolerance, JobSpec, ManifestFailure, TilingSpec, DEFAULT_FOOTPRINT_TOLERANCE,
};
use rsembed_schemas::meta::FileMeta;
use rsembed_schemas::task::Task;
use rsembed_worker::engine::start::start_engine;
use rsembed_worker::input::InputKind;
use rsembed_worker::metrics;
use rsembed_worker::model::ModelDir;
use rsembed_worker::store::{Location, StoreCache};
use rsembed_worker::task::{JobContext, Mode, TaskReport, TaskRunner};

use crate::cli::{RunArgs, TilingArgs};
use crate::error::{Error, Result};
use crate::job::manifest::ManifestBuilder;
use crate::job::output::{self, Claim, JobOutput, Replace};
use crate::job::plan::{self, ListStats};
use crate::job::progress::{Progress, TaskCounts};
use crate::job::resume::{self, finished, Found};
use crate::job::summary::Summary;

/// The tiling a job records, with defaults filled from the model.
pub fn tiling_spec(t: &TilingArgs, model: &ModelDir) -> Result<TilingSpec> {
    let chip_size = t.chip_size.unwrap_or(model.preprocessor.size.width);
    if chip_size == 0 || t.stride == Some(0) {
        return Err(Error::Usage(
            "--chip-size and --stride must be positive".into(),
        ));
    }
    if let Some(v) = t.min_valid {
        if !(0.0..=1.0).contains(&v) {
            return Err(Error::Usage(format!(
                "--min-valid must be within 0..=1, not {v}"
            )));
        }
    }
    let bands = t.bands.clone().unwrap_or_else(|| vec![1, 2, 3]);
    if bands.len() != 3 || bands.contains(&0) {
        return Err(Error::Usage(format!(
            "--bands needs three 1-based band indexes (R,G,B), not {bands:?}"
        )));
    }
    if let Some(files) = &t.band_files {
        if files.len() != 3 || files.iter().any(|f| f.is_empty()) {
            return Err(Error::Usage(format!(
                "--band-files needs three name suffixes in R,G,B order (e.g. B4,B3,B2), not {files:?}"
            )));
        }
    }
    check_stac_tiling(t)?;
    if t.task_size == Some(0) || t.task_chips == Some(0) || t.task_bytes == Some(0) {
        return Err(Error::Usage(
            "--task-files, --task-chips and --task-bytes must be positive".into(),
        ));
    }
    Ok(TilingSpec {
        chip_size,
        stride: t.stride.unwrap_or(chip_size),
        bands,
        scale: t.scale.clone(),
        min_valid: t.min_valid,
        band_files: t.band_files.clone(),
        assets: t.assets.clone(),
        cloud_mask: t.cloud_mask.clone(),
        max_cloud: t.max_cloud,
        footprint_tolerance: Some(footprint_tolerance(t)?),
        embedding_type: t.embedding_type,
        align: t.align,
        schema_version: rsembed_schemas::SCHEMA_VERSION,
    })
}

/// `--footprint-tolerance`, checked, or its default.
pub fn footprint_tolerance(t: &TilingArgs) -> Result<f64> {
    t.footprint_tolerance
        .map_or(Ok(DEFAULT_FOOTPRINT_TOLERANCE), check_footprint_tolerance)
        .map_err(Error::Usage)
}

/// `--assets`, `--cloud-mask` and `--max-cloud`, checked.
pub fn check_stac_tiling(t: &TilingArgs) -> Result<()> {
    if let Some(a) = &t.assets {
        if !(a.len() == 1 || a.len() == 3) || a.iter().any(|a| a.trim().is_empty()) {
            return Err(Error::Usage(format!(
                "--assets needs three asset keys or band common names in R,G,B order \
                 (red,green,blue), or one 3-band asset (visual), not {a:?}"
            )));
        }
    }
    if let Some(m) = &t.cloud_mask {
        rsembed_schemas::task::parse_cloud_mask(m).map_err(Error::Usage)?;
    }
    if let Some(v) = t.max_cloud {
        if !(0.0..=1.0).contains(&v) {
            return Err(Error::Usage(format!(
                "--max-cloud is a fraction of a chip's valid pixels (0-1), not {v}"
            )));
        }
        if t.cloud_mask.is_none() {
            return Err(Error::Usage(
                "--max-cloud needs --cloud-mask: which asset says where the clouds are".into(),
            ));
        }
    }
    Ok(())
}

/// A local output folder this command created, removed again (when still
/// empty) unless [`CreatedDir::keep`] is called: a refused or failed command
/// must not leave an empty folder behind.
#[derive(Default)]
pub(crate) struct CreatedDir(Option<std::path::PathBuf>);

impl CreatedDir {
    /// The folder stays.
    pub(crate) fn keep(&mut self) {
        self.0 = None;
    }
}

impl Drop for CreatedDir {
    fn drop(&mut self) {
        if let Some(d) = &self.0 {
            // Only an empty folder goes; anything in it is someone's.
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Makes sure the output can be written, before any work starts. The folder
/// it creates (locally) is removed on drop of the guard unless kept.
pub(crate) async fn check_output(out: &Location) -> Result<CreatedDir> {
    let mut created = CreatedDir::default();
    if let Some(dir) = out.local_dir() {
        if !dir.exists() {
            // The topmost missing ancestor is what this command creates.
            let mut top = dir.clone();
            while let Some(p) = top.parent() {
                if p.exists() {
                    break;
                }
                top = p.to_path_buf();
            }
            std::fs::create_dir_all(&dir).map_err(|source| Error::CreateOutputDir {
                dir: dir.clone(),
                source,
            })?;
            if top == dir {
                created.0 = Some(dir.clone());
            }
        }
    }
    if out.is_local() {
        // object_store's local put retries forever where a folder refuses new
        // files (`/proc`): the probe goes through std::fs, which fails.
        out.probe_local_write(".rsembed-write-probe")
            .map_err(|e| not_writable(out, e))?;
        return Ok(created);
    }
    let probe = out.child(".rsembed-write-probe");
    out.store
        .put(&probe, PutPayload::from_static(b"probe"))
        .await
        .map_err(|e| not_writable(out, e))?;
    out.store
        .delete(&probe)
        .await
        .map_err(|source| Error::OutputNotDeletable {
            url: out.url.to_string(),
            source,
        })?;
    Ok(created)
}

fn not_writable(out: &Location, e: impl Into<crate::error::BoxError>) -> Error {
    Error::OutputNotWritable {
        url: out.url.to_string(),
        source: e.into(),
    }
}

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

/// Fails with "input … does not exist" when `input` names nothing: a local
/// path that is not there, or an object store prefix with no object at or
/// under it. Checked before the job is compared with the one at the output,
/// so a mistyped `--input` into a used output is reported as what it is
/// rather than as another job. HTTP(S) inputs have no listing; their first
/// read says whether they exist.
pub(crate) async fn check_input_exists(stores: &StoreCache, input: &str) -> Result<()> {
    let loc = stores.location(input)?;
    let missing = || {
        Error::Input(format!(
            "{} does not exist: no file or folder, and no object at or under it; \
             nothing was written",
            loc.url
        ))
    };
    if loc.is_http() {
        return Ok(());
    }
    if let Some(path) = loc.local_dir().filter(|_| loc.is_local()) {
        return match std::fs::metadata(&path) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(missing()),
            // Unreadable (permissions): the listing reports it with its cause.
            Err(_) => Ok(()),
        };
    }
    match loc.store.head(&loc.prefix).await {
        Ok(_) => return Ok(()),
        Err(object_store::Error::NotFound { .. }) => {}
        // A prefix is no object: some stores answer a HEAD of it otherwise.
        Err(e) => tracing::debug!(error = %e, "input is no object; listing it"),
    }
    let prefix = (!loc.prefix.as_ref().is_empty()).then_some(&loc.prefix);
    match loc.store.list(prefix).next().await {
        Some(Ok(_)) => Ok(()),
        None => Err(missing()),
        Some(Err(source)) => Err(Error::InputStore {
            url: loc.url.to_string(),
            source,
        }),
    }
}

pub(crate) use rsembed_worker::now_rfc3339;

/// Runs a whole job in this process and returns its summary.
pub async fn run(args: RunArgs) -> Result<Summary> {
    let started = Instant::now();
    super::log_config("run", &super::redacted_run(&args));
    let stores = StoreCache::default();
    let output = stores.location(&args.output)?;

    // Every flag is checked, and the job compared with the one at the output,
    // before anything is created or written.
    let model = ModelDir::open(&args.model)?;
    let tiling = tiling_spec(&args.tiling, &model)?;
    let resolved = crate::stac::resolve(&stores, &args.input, &tiling, &args.tiling.stac).await?;
    let input = resolved.location.clone();
    let scale: ScaleSpec = tiling.scale.parse().map_err(Error::Usage)?;
    let policy = args.engine.batch_policy().map_err(Error::Usage)?;
    let model_ref = model.model_ref(args.engine.fp16)?;
    let out = JobOutput::new(output.clone());
    let spec = JobSpec::new(
        input.url.to_string(),
        output.url.to_string(),
        model_ref.clone(),
        tiling,
        args.tiling.grouping_spec(),
        now_rfc3339(),
    )
    .with_search(resolved.search.clone());
    let replace = Replace::anything_if(args.overwrite);
    let given = output::Given {
        footprint_tolerance: args.tiling.footprint_tolerance.is_some(),
        grouping: args.tiling.grouping_given(),
    };
    let mut spec = out.as_resumed(spec, given, replace).await?;
    let grouping = spec.grouping.unwrap_or_else(|| args.tiling.grouping_spec());
    let tiling = spec.tiling.clone();
    // A mistyped --input is named as such, not as another job.
    check_input_exists(&stores, &args.input).await?;
    let claim = out.check(&spec, replace, "--overwrite").await?;
    if let Some(t) = claim.created_at() {
        spec.created_at = t.to_owned();
    }
    let job_id = spec.job_id.clone();
    let mut created_dir = check_output(&output).await?;
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
        resolved.source,
        job_id.clone(),
        tiling.clone(),
        &grouping,
        16,
    );
    let stats = planner.stats.clone();

    // The job exists once its plan has found an input: a mistyped --input
    // must leave the output (and the job it holds) as it was.
    let Some(first) = planner.tasks.recv().await else {
        planner.done.await.map_err(|source| Error::Panicked {
            what: "planner",
            source,
        })??;
        runner.engine.shutdown().await;
        return Err(no_inputs(&input.url, &stats));
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
    let mut builder = ManifestBuilder::new(&out, &spec)?;
    let mut plan_ids = PlanSpool::new()?;
    let (mut tasks_total, mut with_errors, mut cloudy) = (0u64, 0u64, 0u64);
    let collected: Result<()> = async {
        while let Some(r) = results.next().await {
            let r = r?;
            tasks_total += 1;
            cloudy += r.cloudy_chips_dropped;
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

/// The error of a plan that found nothing to embed.
pub(crate) fn no_inputs(input: &url::Url, stats: &ListStats) -> Error {
    let skipped = stats.skipped.load(Ordering::Relaxed);
    Error::NoInputs(format!(
        "{input} holds no inputs: {skipped} files were skipped as not images \
         (inputs are {} files and {} archives); nothing was written",
        [InputKind::IMAGE.as_slice(), &InputKind::SCENE]
            .concat()
            .join(" "),
        InputKind::ARCHIVE.join(", ")
    ))
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
