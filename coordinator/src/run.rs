//! `rsembed run`: the embedded mode. The planner, an in-process queue and the
//! worker's task runner in one process, with no server.

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use rsembed_schemas::job::{
    JobSpec, Manifest, ManifestFailure, ManifestFile, TilingSpec, JOB_FILE, MANIFEST_FILE,
};
use rsembed_schemas::meta::FileMeta;
use rsembed_schemas::task::Task;
use rsembed_schemas::SOFTWARE_VERSION;
use rsembed_worker::engine::args::start_engine;
use rsembed_worker::metrics;
use rsembed_worker::model::ModelDir;
use rsembed_worker::pipeline::{Commit, Counters, JobContext, StoreErrors, TaskReport, TaskRunner};
use rsembed_worker::preprocess::Preprocessor;
use rsembed_worker::raster::image::DecodeLimits;
use rsembed_worker::raster::scale::ScaleSpec;
use rsembed_worker::raster::tiff::TiffLimits;
use rsembed_worker::sink::parquet::describe_bytes;
use rsembed_worker::store::{Location, StoreCache};
use tokio::sync::mpsc;

use crate::cli::{RunArgs, TilingArgs};
use crate::error::{Error, Result};
use crate::plan::{self, ListStats};
use crate::summary::Summary;

/// How many failures the manifest lists by name; the count is always exact.
const MANIFEST_FAILURES_LISTED: usize = 1000;

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
    })
}

/// Makes sure the output can be written, before any work starts.
pub(crate) async fn check_output(out: &Location) -> Result<()> {
    if let Some(dir) = out.local_dir() {
        std::fs::create_dir_all(&dir).map_err(|e| {
            Error::Output(format!(
                "cannot create output folder {}: {e}",
                dir.display()
            ))
        })?;
    }
    let probe = out.child(".rsembed-write-probe");
    out.store
        .put(&probe, PutPayload::from_static(b"probe"))
        .await
        .map_err(|e| Error::Output(format!("cannot write to {}: {e}", out.url)))?;
    out.store
        .delete(&probe)
        .await
        .map_err(|e| Error::Output(format!("cannot delete in {}: {e}", out.url)))?;
    Ok(())
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

/// Looks for a finished task's files, for resume. `None` when the task must run.
async fn finished(out: &Location, task: &Task) -> Result<Option<TaskReport>> {
    let Some(chips_file) = describe(out, &task.chips_path()).await? else {
        return Ok(None);
    };
    let errors_file = describe(out, &task.errors_path()).await?;
    Ok(Some(TaskReport {
        task_id: task.task_id.clone(),
        chips_file,
        errors_file,
        failures: vec![],
    }))
}

/// Digest and row count of an existing Parquet file; `None` when it is absent.
async fn describe(out: &Location, rel: &str) -> Result<Option<ManifestFile>> {
    let bytes = match out.store.get(&out.child(rel)).await {
        Ok(g) => g.bytes().await?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    describe_bytes(rel, bytes)
        .map(Some)
        .map_err(|e| Error::Output(format!("{rel} exists but is not readable Parquet: {e}")))
}

pub(crate) use rsembed_worker::now_rfc3339;

/// Runs a whole job in this process and returns its summary.
pub async fn run(args: RunArgs) -> Result<Summary> {
    let started = Instant::now();
    let stores = StoreCache::default();
    let input = stores.location(&args.input)?;
    let output = stores.location(&args.output)?;
    check_output(&output).await?;
    // Before the model loads, so the warm-up probe can be watched too. The
    // server stops when the run returns (the guard cancels it).
    let _metrics = match &args.metrics_addr {
        Some(addr) => Some(serve_metrics(addr).await?),
        None => None,
    };

    let model = ModelDir::open(&args.model)?;
    let tiling = tiling_spec(&args.tiling, &model)?;
    let scale: ScaleSpec = tiling.scale.parse().map_err(Error::Usage)?;
    let policy = args.engine.batch_policy().map_err(Error::Usage)?;
    let model_ref = model.model_ref(args.engine.fp16)?;
    let fingerprint = JobSpec::fingerprint_of(&model_ref, &tiling);
    let job_id = JobSpec::job_id_of(&fingerprint, input.url.as_str());

    let existing: Option<JobSpec> = read_json(&output, JOB_FILE).await?;
    if let Some(prev) = &existing {
        if prev.fingerprint != fingerprint || prev.job_id != job_id {
            return Err(Error::Output(format!(
                "{} holds job {} (input {}, model {}); this run is job {} (input {}, model {}). \
                 Rows of two jobs must not mix: choose another --output",
                output.url,
                prev.job_id,
                prev.input,
                prev.model.name,
                job_id,
                input.url,
                model_ref.name
            )));
        }
    }

    // Load the model before writing anything: a broken model directory must
    // leave no job behind.
    let (engine, _) = start_engine(&model, &args.engine)?;
    let batch_size = engine.preferred_batch().unwrap_or(policy.max());
    tracing::info!(
        job_id = %job_id, input = %input.url, output = %output.url, model = %model_ref.name,
        embed_dim = model_ref.embed_dim, batch_size, ?policy, device = %args.engine.device,
        chip_size = tiling.chip_size, stride = tiling.stride, "starting job"
    );

    let spec = JobSpec {
        format: 1,
        job_id: job_id.clone(),
        fingerprint: fingerprint.clone(),
        input: input.url.to_string(),
        output: output.url.to_string(),
        model: model_ref.clone(),
        tiling: tiling.clone(),
        created_at: existing
            .as_ref()
            .map(|e| e.created_at.clone())
            .unwrap_or_else(now_rfc3339),
        software_version: SOFTWARE_VERSION.to_owned(),
    };
    put_json(&output, JOB_FILE, &spec).await?;
    // A manifest from an earlier run must not claim success for this one.
    match output.store.delete(&output.child(MANIFEST_FILE)).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }

    let counters = Arc::new(Counters::default());
    let runner = Arc::new(TaskRunner {
        stores: stores.clone(),
        preprocessor: Arc::new(Preprocessor::new(&model.preprocessor)),
        engine,
        batch_size: policy.max(),
        decode_concurrency: args
            .decode_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
        limits: DecodeLimits {
            max_alloc: args.max_pixels.saturating_mul(4),
            ..DecodeLimits::default()
        },
        tiff_limits: TiffLimits::default(),
        store_errors: StoreErrors::Record,
        commit: Commit::Overwrite,
        counters: counters.clone(),
    });

    let job = Arc::new(JobContext {
        output: output.clone(),
        scale,
        file_meta: FileMeta::of_job(&job_id, &model_ref, &tiling),
    });
    let planner = plan::start(
        &stores,
        input.clone(),
        job_id.clone(),
        tiling.clone(),
        &args.tiling,
        16,
    );
    let stats = planner.stats.clone();

    let progress = Progress::start(counters.clone(), stats.clone());
    let resumed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut results = tokio_stream_of(planner.tasks)
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
        .buffer_unordered(args.tasks_in_flight.max(1));

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
    planner
        .done
        .await
        .map_err(|e| Error::Input(format!("planner panicked: {e}")))??;
    progress.finish();

    // Every task is done: drop the session now, so ORT writes its profile and
    // frees its memory before the process exits.
    runner.engine.shutdown().await;
    // Deterministic manifest order, whatever order tasks finished in.
    reports.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    let files: Vec<ManifestFile> = reports.iter().map(|r| r.chips_file.clone()).collect();
    let error_files: Vec<ManifestFile> = reports
        .iter()
        .filter_map(|r| r.errors_file.clone())
        .collect();
    let rows: u64 = files.iter().map(|f| f.rows).sum();
    let failed_inputs: u64 = error_files.iter().map(|f| f.rows).sum();
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
    let manifest = Manifest {
        format: 1,
        job_id: job_id.clone(),
        fingerprint,
        tasks: reports.len() as u64,
        rows,
        failed_inputs,
        files,
        error_files,
        failures,
        failed_tasks: vec![],
        finalized_at: now_rfc3339(),
        software_version: SOFTWARE_VERSION.to_owned(),
    };
    put_json(&output, MANIFEST_FILE, &manifest).await?;

    let elapsed = started.elapsed();
    Ok(Summary {
        job_id,
        output: output.url.to_string(),
        local_output: output.local_dir(),
        tasks: manifest.tasks,
        tasks_resumed: resumed.load(Ordering::Relaxed),
        inputs: stats.inputs.load(Ordering::Relaxed),
        skipped: stats.skipped.load(Ordering::Relaxed),
        chips: rows,
        chips_embedded: counters.chips.load(Ordering::Relaxed),
        failed_inputs,
        bytes_read: counters.bytes_read.load(Ordering::Relaxed),
        seconds: elapsed.as_secs_f64(),
        embed_dim: model_ref.embed_dim,
    })
}

/// Starts the metrics endpoint on `addr`; it serves until the guard drops.
async fn serve_metrics(addr: &str) -> Result<tokio_util::sync::DropGuard> {
    let stop = tokio_util::sync::CancellationToken::new();
    let (bound, _task) = metrics::server::start(addr, metrics::global(), None, stop.clone())
        .await
        .map_err(|e| Error::Usage(format!("--metrics-addr {addr}: cannot listen: {e}")))?;
    tracing::info!(addr = %bound, "serving metrics at http://{bound}/metrics");
    Ok(stop.drop_guard())
}

fn tokio_stream_of<T: Send + 'static>(mut rx: mpsc::Receiver<T>) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// A progress bar on a terminal; nothing otherwise.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    fn start(counters: Arc<Counters>, stats: Arc<ListStats>) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress {
                bar: None,
                ticker: None,
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
        }
    }

    fn finish(&self) {
        if let Some(t) = &self.ticker {
            t.abort();
        }
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
