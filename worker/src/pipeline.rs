//! Running one task: fetch → decode + preprocess (CPU pool) → batch → infer → write.
//!
//! The stages are joined by bounded channels, so a slow model holds back the
//! decoders instead of letting decoded pixels pile up in memory, and decoding
//! the next batch overlaps inference of the current one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use object_store::ObjectStoreExt;
use rsembed_schemas::chip::ErrorStage;
use rsembed_schemas::ids::{chip_id, Window};
use rsembed_schemas::job::{ManifestFile, TilingSpec};
use rsembed_schemas::meta::FileMeta;
use rsembed_schemas::task::{Task, TaskInput};
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::engine::thread::EngineHandle;
use crate::engine::PixelBatch;
use crate::error::{chain, Error, Result};
use crate::preprocess::Preprocessor;
use crate::raster::image::{decode_rgb8, DecodeLimits};
use crate::raster::scale::ScaleSpec;
use crate::raster::tiff::TiffLimits;
use crate::sink::parquet::{chip_file_metadata, encode, error_file_metadata, put};
use crate::sink::rows::{chip_batch, error_batch, extent, ChipRow, ErrorRow, Footprint};
use crate::store::{Location, StoreCache};

mod archive;
mod scene;

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

/// What every task of a job shares.
pub struct TaskRunner {
    /// Stores for input URIs.
    pub stores: StoreCache,
    /// The output root.
    pub output: Location,
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
    /// Parsed `--scale`.
    pub scale: ScaleSpec,
    /// Job id, model and tiling, as recorded in each file.
    pub file_meta: FileMeta,
    /// Counters for progress.
    pub counters: Arc<Counters>,
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
}

/// One chip ready for the model.
pub(crate) struct Prepared {
    pub(crate) input: TaskInput,
    pub(crate) window: Window,
    pub(crate) valid_fraction: f32,
    pub(crate) crs: Option<String>,
    pub(crate) footprint: Option<Footprint>,
    pub(crate) pixels: Vec<f32>,
}

impl TaskRunner {
    fn tiling(&self) -> &TilingSpec {
        &self.file_meta.tiling
    }

    /// Runs a task to completion and commits its files: the error file first,
    /// then the chip file, whose presence marks the task done.
    pub async fn run(&self, task: &Task) -> Result<TaskReport> {
        let span = tracing::info_span!("task", task_id = %task.task_id, inputs = task.inputs.len());
        self.run_inner(task).instrument(span).await
    }

    async fn run_inner(&self, task: &Task) -> Result<TaskReport> {
        let (tx, mut rx) =
            mpsc::channel::<std::result::Result<Prepared, ErrorRow>>(self.batch_size.max(1) * 2);
        let producer = {
            let inputs = task.inputs.clone();
            let stores = self.stores.clone();
            let pre = self.preprocessor.clone();
            let limits = self.limits;
            let counters = self.counters.clone();
            let conc = self.decode_concurrency.max(1);
            let archive_ctx = Arc::new(archive::ArchiveContext {
                stores: stores.clone(),
                pre: pre.clone(),
                counters: counters.clone(),
                limits,
            });
            let scene_ctx = Arc::new(scene::SceneContext {
                stores: stores.clone(),
                pre: pre.clone(),
                counters: counters.clone(),
                tiling: self.file_meta.tiling.clone(),
                scale: self.scale,
                limits: self.tiff_limits.clone(),
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
                                if crate::raster::tar::is_archive(&input.uri) {
                                    archive::produce_archive(archive_ctx, input, tx).await;
                                } else if crate::raster::scene::is_tiff(&input.uri) {
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

        let tiling_fp = self.tiling().fingerprint();
        let mut rows: Vec<ChipRow> = Vec::new();
        let mut failures: Vec<ErrorRow> = Vec::new();
        let mut pending: Vec<Prepared> = Vec::with_capacity(self.batch_size);
        loop {
            let item = rx.recv().await;
            let done = item.is_none();
            match item {
                Some(Ok(p)) => pending.push(p),
                Some(Err(e)) => {
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    failures.push(e);
                }
                None => {}
            }
            // The adaptive engine's current bucket, so batches arrive the size it
            // runs best; a fixed batch size otherwise.
            let target = self
                .engine
                .preferred_batch()
                .unwrap_or(self.batch_size)
                .clamp(1, self.batch_size.max(1));
            if pending.len() >= target || (done && !pending.is_empty()) {
                let batch = std::mem::take(&mut pending);
                rows.extend(self.embed_batch(batch, &tiling_fp).await?);
            }
            if done {
                break;
            }
        }
        producer
            .await
            .map_err(|e| Error::EngineGone(format!("input stage panicked: {e}")))?;

        rows.sort_by(|a, b| {
            (&a.source_uri, a.window.y, a.window.x).cmp(&(&b.source_uri, b.window.y, b.window.x))
        });
        failures.sort_by(|a, b| a.source_uri.cmp(&b.source_uri));
        let errors_file = if failures.is_empty() {
            None
        } else {
            let b = error_batch(&failures)?;
            let bytes = encode(&b, error_file_metadata(&self.file_meta_for(task))?)?;
            Some(
                put(
                    &self.output,
                    &task.errors_path(),
                    bytes,
                    failures.len() as u64,
                )
                .await?,
            )
        };
        let b = chip_batch(&rows, self.file_meta.embed_dim)?;
        let kv = chip_file_metadata(&self.file_meta_for(task), extent(&rows))?;
        let chips_file = put(
            &self.output,
            &task.chips_path(),
            encode(&b, kv)?,
            rows.len() as u64,
        )
        .await?;
        Ok(TaskReport {
            task_id: task.task_id.clone(),
            chips_file,
            errors_file,
            failures,
        })
    }

    fn file_meta_for(&self, task: &Task) -> FileMeta {
        FileMeta {
            task_id: task.task_id.clone(),
            ..self.file_meta.clone()
        }
    }

    async fn embed_batch(&self, batch: Vec<Prepared>, tiling_fp: &str) -> Result<Vec<ChipRow>> {
        let n = batch.len();
        let (h, w) = (
            self.preprocessor.height() as usize,
            self.preprocessor.width() as usize,
        );
        let mut data = Vec::with_capacity(n * self.preprocessor.len());
        for p in &batch {
            data.extend_from_slice(&p.pixels);
        }
        let emb = self
            .engine
            .embed(PixelBatch {
                n,
                channels: 3,
                height: h,
                width: w,
                data,
            })
            .await?;
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
        Ok(rows)
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
