//! `rsembed run`: the embedded mode. The planner, an in-process queue and the
//! worker's task runner in one process, with no server.

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use rsembed_raster::scale::ScaleSpec;
use rsembed_schemas::job::{
    check_footprint_tolerance, JobSpec, ManifestFailure, ManifestFile, TilingSpec,
    DEFAULT_FOOTPRINT_TOLERANCE,
};
use rsembed_schemas::meta::FileMeta;
use rsembed_schemas::task::Task;
use rsembed_worker::engine::start::start_engine;
use rsembed_worker::input::InputKind;
use rsembed_worker::metrics;
use rsembed_worker::model::ModelDir;
use rsembed_worker::sink::commit::describe_bytes;
use rsembed_worker::sink::parquet::empty_inputs_of;
use rsembed_worker::store::{Location, StoreCache};
use rsembed_worker::task::{Counters, JobContext, Mode, TaskReport, TaskRunner};

use crate::cli::{RunArgs, TilingArgs};
use crate::error::{Error, Result};
use crate::job::output::{self, Claim, JobOutput, Replace, MANIFEST_FAILURES_LISTED};
use crate::job::plan::{self, ListStats};
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
    if t.task_size == 0 || t.task_chips == Some(0) || t.task_bytes == 0 {
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

/// Looks for a finished task's files, for resume. `None` when the task must run.
async fn finished(out: &Location, task: &Task) -> Result<Option<TaskReport>> {
    let Some((chips_file, empty_inputs)) = describe(out, &task.chips_path()).await? else {
        return Ok(None);
    };
    let errors_file = describe(out, &task.errors_path()).await?.map(|(f, _)| f);
    Ok(Some(TaskReport {
        task_id: task.task_id.clone(),
        chips_file,
        errors_file,
        failures: vec![],
        empty_inputs,
        cloudy_chips_dropped: 0,
    }))
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
    let given = args.tiling.footprint_tolerance.is_some();
    let mut spec = out.as_resumed(spec, given, replace).await?;
    let tiling = spec.tiling.clone();
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
        &args.tiling,
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

    let progress = Progress::start(counters.clone(), stats.clone(), args.progress_interval);
    let resumed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tasks = futures::stream::once(std::future::ready(first))
        .chain(plan::receiver_stream(planner.tasks));
    let mut results = tasks
        .map(|task| {
            let runner = runner.clone();
            let job = job.clone();
            let output = output.clone();
            let resumed = resumed.clone();
            async move {
                if let Some(done) = finished(&output, &task).await? {
                    resumed.fetch_add(1, Ordering::Relaxed);
                    runner
                        .counters
                        .inputs
                        .fetch_add(task.inputs.len() as u64, Ordering::Relaxed);
                    return Ok::<_, Error>(done);
                }
                Ok(runner.run(&job, &task).await?)
            }
        })
        .buffer_unordered(args.pipeline.tasks_in_flight.max(1));

    let mut reports = Vec::new();
    while let Some(r) = results.next().await {
        match r {
            Ok(rep) => reports.push(rep),
            Err(e) => {
                progress.finish();
                return Err(e);
            }
        }
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
    let plan_ids = reports.iter().map(|r| r.task_id.as_str()).collect();
    let superseded = out.remove_stale(&plan_ids).await?;
    let failures: Vec<ManifestFailure> = reports
        .iter()
        .flat_map(|r| r.failures.iter())
        .take(MANIFEST_FAILURES_LISTED)
        .map(|f| ManifestFailure {
            source_uri: f.source_uri.clone(),
            stage: f.stage.as_str().to_owned(),
            error: f.error.clone(),
        })
        .collect();
    let empty_inputs: Vec<String> = reports
        .iter()
        .flat_map(|r| r.empty_inputs.iter().cloned())
        .collect();
    let manifest = output::manifest(
        &spec,
        reports.len() as u64,
        reports.iter().map(|r| r.chips_file.clone()).collect(),
        reports
            .iter()
            .filter_map(|r| r.errors_file.clone())
            .collect(),
        failures,
        vec![],
        empty_inputs,
    );
    out.write_manifest(&manifest).await?;
    let stac = crate::stac::out::write(&output, &spec, &manifest).await?;
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
        tasks_resumed: resumed.load(Ordering::Relaxed),
        inputs: stats.inputs.load(Ordering::Relaxed),
        skipped: stats.skipped.load(Ordering::Relaxed),
        chips: manifest.rows,
        chips_embedded: counters.chips.load(Ordering::Relaxed),
        cloudy_chips_dropped: reports.iter().map(|r| r.cloudy_chips_dropped).sum(),
        failed_inputs: manifest.failed_inputs,
        inputs_without_chips: manifest.inputs_without_chips,
        empty_inputs: manifest.without_chips.clone(),
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

/// One progress line: inputs done of listed, chips, rate and ETA (once the
/// listing has ended, from the rate of inputs so far).
fn progress_line(elapsed: Duration, counters: &Counters, stats: &ListStats) -> String {
    let secs = elapsed.as_secs_f64().max(1e-3);
    let done = counters.inputs.load(Ordering::Relaxed);
    let total = stats.inputs.load(Ordering::Relaxed);
    let chips = counters.chips.load(Ordering::Relaxed);
    let listed = stats.listed.load(Ordering::Relaxed);
    let eta = if listed && done > 0 {
        let left = total.saturating_sub(done) as f64 * secs / done as f64;
        crate::job::status::fmt_secs(left)
    } else {
        "-".into()
    };
    format!(
        "rsembed run: [{}] {done}/{total}{} inputs, {chips} chips, {:.1} chips/s, {} failed, ETA {eta}",
        crate::job::status::fmt_secs(secs),
        if listed { "" } else { "+ (listing)" },
        chips as f64 / secs,
        counters.failed.load(Ordering::Relaxed),
    )
}

/// A progress bar on a terminal; a line every 30 s otherwise.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    ticker: Option<tokio::task::JoinHandle<()>>,
    last_line: Option<Box<dyn Fn() -> String + Send + Sync>>,
}

impl Progress {
    fn start(counters: Arc<Counters>, stats: Arc<ListStats>, every: Duration) -> Progress {
        if !std::io::stderr().is_terminal() {
            // Logs and CI consoles: a line every `every`, so a long run is
            // not silent until its summary.
            let started = Instant::now();
            let (counters_end, stats_end) = (counters.clone(), stats.clone());
            let ticker = tokio::spawn(async move {
                let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
                tick.tick().await;
                loop {
                    tick.tick().await;
                    eprintln!("{}", progress_line(started.elapsed(), &counters, &stats));
                }
            });
            // A last line at the end, so even a short run's log says how
            // far it got.
            let last_line: Box<dyn Fn() -> String + Send + Sync> =
                Box::new(move || progress_line(started.elapsed(), &counters_end, &stats_end));
            return Progress {
                bar: None,
                ticker: Some(ticker),
                last_line: Some(last_line),
            };
        }
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} inputs  {msg}",
            )
            .expect("progress template is valid"),
        );
        let b = bar.clone();
        let ticker = tokio::spawn(async move {
            loop {
                b.set_length(stats.inputs.load(Ordering::Relaxed));
                b.set_position(counters.inputs.load(Ordering::Relaxed));
                b.set_message(format!(
                    "{} chips, {} failed",
                    counters.chips.load(Ordering::Relaxed),
                    counters.failed.load(Ordering::Relaxed)
                ));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Progress {
            bar: Some(bar),
            ticker: Some(ticker),
            last_line: None,
        }
    }

    fn finish(&self) {
        if let Some(t) = &self.ticker {
            t.abort();
        }
        if let Some(last) = &self.last_line {
            eprintln!("{}", last());
        }
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
