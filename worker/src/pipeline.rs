//! Running one task: fetch → decode + preprocess (CPU pool) → batch → infer → write.
//!
//! ```text
//! inputs ─► decoders (buffer_unordered(decode_concurrency), CPU work in spawn_blocking)
//!        ─► channel of 2·B chips ─► batcher (fills a batch to the engine's bucket)
//!        ─► up to BATCHES_IN_FLIGHT batches at the engine thread ─► rows (in order) ─► Parquet
//! ```
//!
//! The stages are joined by bounded channels, so a slow model holds back the
//! decoders instead of letting decoded pixels pile up in memory. The batcher
//! keeps [`BATCHES_IN_FLIGHT`] batches at the engine, so the engine finds the
//! next batch in its queue when it finishes one instead of waiting for the
//! batcher to hear the answer and fill another; while those run, the batcher
//! keeps filling the next batch and the decoders keep filling the channel.
//!
//! # Memory bound
//!
//! With `B` the largest batch (`--batch-size`, or `--max-batch` for `auto`)
//! and `D` the decode concurrency, one task holds at most
//! `(2 + 1 + BATCHES_IN_FLIGHT)·B + D` = `5·B + D` decoded chips that are not
//! yet embedded: `2·B` in the channel, at most `B` in the batch being filled,
//! `BATCHES_IN_FLIGHT·B` in batches at the engine (each chip's pixels are
//! copied into the request and freed at once, so they are held once), and
//! one per decoder waiting for room in the channel (a scene or an archive is
//! read chip by chip). A chip is
//! `3·H·W·4` bytes (768 KiB at 256²). `--tasks-in-flight T` tasks hold
//! `T·(5·B + D)` at most; the engine's own copies (padding a piece to its
//! bucket) come on top, one piece at a time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::stream::FuturesOrdered;
use futures::{Future, StreamExt};
use object_store::ObjectStoreExt;
use rsembed_raster::geo::Footprint;
use rsembed_raster::image::{decode_rgb8, DecodeLimits};
use rsembed_raster::scale::ScaleSpec;
use rsembed_raster::tiff::TiffLimits;
use rsembed_schemas::chip::ErrorStage;
use rsembed_schemas::ids::{chip_id, Window};
use rsembed_schemas::job::ManifestFile;
use rsembed_schemas::meta::FileMeta;
use rsembed_schemas::task::{Task, TaskInput};
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::engine::thread::EngineHandle;
use crate::engine::PixelBatch;
use crate::error::{chain, Error, Result};
use crate::metrics::{self, Held};
use crate::preprocess::Preprocessor;
use crate::sink::parquet::{
    chip_file_metadata, encode, encode_chips, error_file_metadata, put, put_once,
};
use crate::sink::rows::{chip_batch, error_batch, extent, ChipRow, ErrorRow};
use crate::store::{Location, StoreCache};

mod archive;
mod scene;

/// Batches one task keeps sent to the engine and not yet answered: one
/// running, one queued behind it, so the engine never waits for the batcher.
pub const BATCHES_IN_FLIGHT: usize = 2;

/// What the input stage sends on: a chip ready for the model, or an error row.
pub(crate) type Item = std::result::Result<Prepared, ErrorRow>;

/// Live counters a progress display can read while tasks run.
#[derive(Debug, Default)]
pub struct Counters {
    /// Inputs finished, good or bad.
    pub inputs: AtomicU64,
    /// Chip rows produced.
    pub chips: AtomicU64,
    /// Inputs recorded as failed.
    pub failed: AtomicU64,
    /// Bytes read from storage (shared with range readers).
    pub bytes_read: Arc<AtomicU64>,
}

/// What every task a process runs shares, whatever its job.
pub struct TaskRunner {
    /// Stores for input URIs.
    pub stores: StoreCache,
    /// Model preprocessing.
    pub preprocessor: Arc<Preprocessor>,
    /// The inference thread.
    pub engine: EngineHandle,
    /// Images per inference call: the fixed size, or the adaptive engine's
    /// largest bucket (it fills batches to its current bucket below that).
    pub batch_size: usize,
    /// Inputs decoded at once.
    pub decode_concurrency: usize,
    /// Decoder bounds for whole images.
    pub limits: DecodeLimits,
    /// Reader bounds for TIFF scenes.
    pub tiff_limits: TiffLimits,
    /// What a storage error while reading an input does.
    pub store_errors: StoreErrors,
    /// How output files are written.
    pub commit: Commit,
    /// Counters for progress.
    pub counters: Arc<Counters>,
}

/// What one job's tasks share: where they go and how chips are cut and
/// recorded. Embedded mode has one; a pull worker makes one per job it serves.
#[derive(Clone)]
pub struct JobContext {
    /// The output root.
    pub output: Location,
    /// Parsed `--scale`.
    pub scale: ScaleSpec,
    /// Job id, model and tiling, as recorded in each file.
    pub file_meta: FileMeta,
}

/// What a storage error while reading an input (not a decode error: the
/// object is missing, or the store failed after its own retries) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrors {
    /// The input becomes an error row, like a corrupt file (embedded mode: a run
    /// reports it, and a rerun of the job retries the task).
    Record,
    /// The task fails with [`Error::TaskRetry`] before writing anything, so the
    /// queue can redeliver it (pull workers: a 5xx or a briefly missing object
    /// must not become a permanent "bad input" row).
    FailTask,
}

/// How the task's files are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Plain puts (embedded mode, one writer).
    Overwrite,
    /// Conditional creates: a file that exists was written whole by an earlier
    /// delivery of the same task (puts are atomic), so it is kept and described
    /// instead of written again. Stores without conditional puts overwrite.
    CreateOnce,
}

/// The result of a finished task.
#[derive(Debug, Clone)]
pub struct TaskReport {
    /// The task.
    pub task_id: String,
    /// The chip file written.
    pub chips_file: ManifestFile,
    /// The error file, when some input failed.
    pub errors_file: Option<ManifestFile>,
    /// The failed inputs.
    pub failures: Vec<ErrorRow>,
    /// Inputs that gave neither a chip nor an error row (every chip without a
    /// valid pixel, or below `--min-valid`). Blocks of a split scene are left
    /// out: an empty block at a scene's collar is normal.
    pub empty_inputs: Vec<String>,
}

/// The whole inputs of `task` that no row and no failure came from.
fn empty_inputs(task: &Task, rows: &[ChipRow], failures: &[ErrorRow]) -> Vec<String> {
    let produced: std::collections::HashSet<&str> = rows
        .iter()
        .map(|r| r.source_uri.as_str())
        .chain(failures.iter().map(|f| f.source_uri.as_str()))
        // An archive member is `<archive>#<member>`: it counts for the archive.
        .map(|u| u.split_once('#').map_or(u, |(a, _)| a))
        .collect();
    task.inputs
        .iter()
        .filter(|i| i.chips.is_none() && !produced.contains(i.uri.as_str()))
        .map(|i| i.uri.clone())
        .collect()
}

/// One chip ready for the model.
pub(crate) struct Prepared {
    pub(crate) input: TaskInput,
    pub(crate) window: Window,
    pub(crate) valid_fraction: f32,
    pub(crate) crs: Option<String>,
    pub(crate) footprint: Option<Footprint>,
    pub(crate) pixels: Vec<f32>,
    /// Counts the chip in [`metrics::names::QUEUE_CHIPS`] until it is sent to
    /// the engine (or dropped with its task).
    pub(crate) queued: Held<'static>,
}

impl TaskRunner {
    /// Runs a task to completion and commits its files: the error file first,
    /// then the chip file, whose presence marks the task done.
    pub async fn run(&self, job: &JobContext, task: &Task) -> Result<TaskReport> {
        let span = tracing::info_span!("task", task_id = %task.task_id, inputs = task.inputs.len());
        self.run_inner(job, task).instrument(span).await
    }

    async fn run_inner(&self, job: &JobContext, task: &Task) -> Result<TaskReport> {
        let (tx, mut rx) =
            mpsc::channel::<std::result::Result<Prepared, ErrorRow>>(self.batch_size.max(1) * 2);
        let producer = {
            let inputs = task.inputs.clone();
            let stores = self.stores.clone();
            let pre = self.preprocessor.clone();
            let limits = self.limits;
            let counters = self.counters.clone();
            let conc = self.decode_concurrency.max(1);
            let scene_ctx = Arc::new(scene::SceneContext {
                stores: stores.clone(),
                pre: pre.clone(),
                counters: counters.clone(),
                tiling: job.file_meta.tiling.clone(),
                scale: job.scale,
                limits: self.tiff_limits.clone(),
            });
            let archive_ctx = Arc::new(archive::ArchiveContext {
                stores: stores.clone(),
                pre: pre.clone(),
                counters: counters.clone(),
                limits,
                scene: scene_ctx.clone(),
            });
            tokio::spawn(
                async move {
                    // Unordered: a slow input must not hold back the others.
                    // Rows are sorted before writing, so files stay deterministic.
                    let mut s = futures::stream::iter(inputs)
                        .map(move |input| {
                            let tx = tx.clone();
                            let stores = stores.clone();
                            let pre = pre.clone();
                            let counters = counters.clone();
                            let scene_ctx = scene_ctx.clone();
                            let archive_ctx = archive_ctx.clone();
                            async move {
                                if rsembed_raster::tar::is_archive(&input.uri) {
                                    archive::produce_archive(archive_ctx, input, tx).await;
                                } else if rsembed_raster::scene::is_tiff(&input.uri) {
                                    scene::produce_scene(scene_ctx, input, tx).await;
                                } else {
                                    let item =
                                        prepare(stores, pre, limits, counters.clone(), input).await;
                                    // A closed channel means the task is being dropped.
                                    let _ = tx.send(item).await;
                                }
                                counters.inputs.fetch_add(1, Ordering::Relaxed);
                            }
                        })
                        .buffer_unordered(conc);
                    while s.next().await.is_some() {}
                }
                .in_current_span(),
            )
        };

        let tiling_fp = job.file_meta.tiling.fingerprint();
        let mut rows: Vec<ChipRow> = Vec::new();
        let mut failures: Vec<ErrorRow> = Vec::new();
        let mut pending: Vec<Prepared> = Vec::with_capacity(self.batch_size);
        let mut in_flight = FuturesOrdered::new();
        let mut receiving = true;
        loop {
            // The adaptive engine's current bucket, so batches arrive the size it
            // runs best; a fixed batch size otherwise.
            let target = self
                .engine
                .preferred_batch()
                .unwrap_or(self.batch_size)
                .clamp(1, self.batch_size.max(1));
            let ready = pending.len() >= target || (!receiving && !pending.is_empty());
            if ready && in_flight.len() < BATCHES_IN_FLIGHT {
                let batch = std::mem::take(&mut pending);
                in_flight.push_back(self.embed_batch(batch, target, &tiling_fp));
            }
            if !receiving && pending.is_empty() && in_flight.is_empty() {
                break;
            }
            // Here either a batch is in flight, or the input is still open and
            // `pending` has room (a full `pending` was sent above unless the
            // engine already has BATCHES_IN_FLIGHT batches): a branch is live.
            tokio::select! {
                biased;
                // Answers first: they free the most memory.
                Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                    // A fatal engine error fails the task; the other batch in
                    // flight is dropped with it.
                    rows.extend(done?);
                }
                item = rx.recv(), if receiving && pending.len() < target => match item {
                    Some(Ok(p)) => pending.push(p),
                    Some(Err(e)) if e.store_error && self.store_errors == StoreErrors::FailTask => {
                        return Err(Error::TaskRetry(format!("{}: {}", e.source_uri, e.error)));
                    }
                    Some(Err(e)) => {
                        self.counters.failed.fetch_add(1, Ordering::Relaxed);
                        metrics::global().failed_inputs.inc_by(1);
                        failures.push(e);
                    }
                    None => receiving = false,
                },
                else => {
                    return Err(Error::EngineGone(
                        "batcher has nothing to wait for; this is a bug".into(),
                    ))
                }
            }
        }
        producer
            .await
            .map_err(|e| Error::EngineGone(format!("input stage panicked: {e}")))?;

        // Counted until the chip file is written.
        let _writing = metrics::global().queue_tasks.hold(1);
        rows.sort_by(|a, b| {
            (&a.source_uri, a.window.y, a.window.x).cmp(&(&b.source_uri, b.window.y, b.window.x))
        });
        failures.sort_by(|a, b| a.source_uri.cmp(&b.source_uri));
        let meta = FileMeta {
            task_id: task.task_id.clone(),
            ..job.file_meta.clone()
        };
        let errors_file = if failures.is_empty() {
            None
        } else {
            let b = error_batch(&failures)?;
            let bytes = encode(&b, error_file_metadata(&meta)?)?;
            Some(
                self.put(
                    &job.output,
                    &task.errors_path(),
                    bytes,
                    failures.len() as u64,
                )
                .await?,
            )
        };
        let b = chip_batch(&rows, job.file_meta.embed_dim)?;
        let empty_inputs = empty_inputs(task, &rows, &failures);
        let mut kv = chip_file_metadata(&meta, extent(&rows))?;
        kv.extend(crate::sink::parquet::empty_inputs_entry(&empty_inputs)?);
        let chips_file = self
            .put(
                &job.output,
                &task.chips_path(),
                encode_chips(&b, kv)?,
                rows.len() as u64,
            )
            .await?;
        Ok(TaskReport {
            empty_inputs,
            task_id: task.task_id.clone(),
            chips_file,
            errors_file,
            failures,
        })
    }

    async fn put(
        &self,
        root: &Location,
        rel: &str,
        bytes: Vec<u8>,
        rows: u64,
    ) -> Result<ManifestFile> {
        match self.commit {
            Commit::Overwrite => put(root, rel, bytes, rows).await,
            Commit::CreateOnce => put_once(root, rel, bytes, rows).await,
        }
    }

    /// Moves the pixels of `batch` into one request now and returns the
    /// future that sends it to the engine and turns the answer into rows, in
    /// batch order. The future runs in a `batch` span.
    fn embed_batch<'a>(
        &'a self,
        mut batch: Vec<Prepared>,
        bucket: usize,
        tiling_fp: &'a str,
    ) -> impl Future<Output = Result<Vec<ChipRow>>> + 'a {
        let n = batch.len();
        let (h, w) = (
            self.preprocessor.height() as usize,
            self.preprocessor.width() as usize,
        );
        let mut data = Vec::with_capacity(n * self.preprocessor.len());
        for p in &mut batch {
            data.extend_from_slice(&p.pixels);
            // Each chip's pixels live once, in the request.
            p.pixels = Vec::new();
            p.queued.release();
        }
        let pixels = PixelBatch {
            n,
            channels: 3,
            height: h,
            width: w,
            data,
        };
        let at_engine = metrics::global().queue_batches.hold(1);
        let span = tracing::debug_span!("batch", images = n, bucket);
        async move {
            let emb = self.engine.embed(pixels).await?;
            drop(at_engine);
            let rows: Vec<ChipRow> = batch
                .into_iter()
                .enumerate()
                .map(|(i, p)| ChipRow {
                    chip_id: chip_id(
                        &p.input.uri,
                        p.input.version.as_deref(),
                        p.window,
                        tiling_fp,
                    ),
                    source_uri: p.input.uri,
                    source_version: p.input.version,
                    window: p.window,
                    valid_fraction: p.valid_fraction,
                    crs: p.crs,
                    footprint: p.footprint,
                    embedding: emb.row(i).to_vec(),
                })
                .collect();
            self.counters.chips.fetch_add(n as u64, Ordering::Relaxed);
            metrics::global().chips.inc_by(n as u64);
            tracing::debug!(images = n, "batch embedded");
            Ok(rows)
        }
        .instrument(span)
    }
}

pub(crate) fn input_error(
    input: &TaskInput,
    stage: ErrorStage,
    err: &(dyn std::error::Error + 'static),
) -> ErrorRow {
    let message = chain(err);
    tracing::warn!(uri = %input.uri, stage = stage.as_str(), cause = %message, "input failed");
    ErrorRow {
        source_uri: input.uri.clone(),
        stage,
        error: message,
        store_error: crate::error::is_store_error(err),
    }
}

async fn prepare(
    stores: StoreCache,
    pre: Arc<Preprocessor>,
    limits: DecodeLimits,
    counters: Arc<Counters>,
    input: TaskInput,
) -> std::result::Result<Prepared, ErrorRow> {
    let fetch = async {
        let loc = stores.location(&input.uri)?;
        let got = loc.store.get(&loc.prefix).await?;
        let size = got.meta.size;
        if size > limits.max_alloc {
            return Err(Error::Input {
                uri: input.uri.clone(),
                stage: ErrorStage::Fetch,
                message: format!(
                    "{size} bytes is over the {} byte limit for a whole image",
                    limits.max_alloc
                ),
            });
        }
        Ok(got.bytes().await?)
    };
    let bytes = fetch
        .await
        .map_err(|e| input_error(&input, ErrorStage::Fetch, &e))?;
    counters
        .bytes_read
        .fetch_add(bytes.len() as u64, Ordering::Relaxed);
    let work = tokio::task::spawn_blocking(move || {
        let img = decode_rgb8(&bytes, limits).map_err(|e| {
            (
                ErrorStage::Decode,
                Box::new(e) as Box<dyn std::error::Error + Send + Sync>,
            )
        })?;
        let pixels = pre.run(&img).map_err(|e| {
            (
                ErrorStage::Preprocess,
                Box::new(e) as Box<dyn std::error::Error + Send + Sync>,
            )
        })?;
        Ok::<_, (ErrorStage, Box<dyn std::error::Error + Send + Sync>)>((
            img.width, img.height, pixels,
        ))
    });
    match work.await {
        Ok(Ok((width, height, pixels))) => Ok(Prepared {
            input,
            window: Window {
                x: 0,
                y: 0,
                width: width as i32,
                height: height as i32,
            },
            valid_fraction: 1.0,
            crs: None,
            footprint: None,
            pixels,
            queued: crate::metrics::global().queue_chips.hold(1),
        }),
        Ok(Err((stage, e))) => Err(input_error(&input, stage, &*e)),
        Err(join) => {
            // A decoder panic is a bug in a dependency, but it must cost one
            // input, not the task.
            let e = std::io::Error::other(format!("decoder panicked: {join}"));
            Err(input_error(&input, ErrorStage::Decode, &e))
        }
    }
}
