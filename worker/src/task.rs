//! Running one task: the readers ([`crate::input`]) fetch, decode and
//! preprocess (CPU pool) → the batcher ([`crate::batch`]) → the engine
//! ([`crate::engine`]) → rows and files ([`crate::sink`]). A [`TaskReport`]
//! goes back to the caller: `rsembed run`, or the pull worker
//! ([`crate::pull`]), which records it and acks the task.
//!
//! ```text
//! inputs ─► decoders (buffer_unordered(decode_concurrency), CPU work in spawn_blocking)
//!        ─► channel of 2·B chips ─► batcher (fills a batch to the engine's bucket)
//!        ─► up to BATCHES_IN_FLIGHT batches at the engine thread ─► rows (in order) ─► Parquet
//! ```
//!
//! Both binaries build their [`TaskRunner`] the same way: [`TaskRunner::new`]
//! from the one set of [`PipelineArgs`] flags.
//!
//! The stages are joined by bounded channels, so a slow model holds back the
//! decoders instead of letting decoded pixels pile up in memory. The batcher
//! keeps [`BATCHES_IN_FLIGHT`](crate::batch::BATCHES_IN_FLIGHT) batches at the engine, so the engine finds the
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
//!
//! A window's task (`--windows`, `composite/`) sends one prepared chip per
//! cell into the same channel, so the same bound holds for them; before
//! preprocessing its walk holds what its composite reads of `D + 1` cells
//! (a few 8-bit chips each for `best`, every covering acquisition's samples
//! for `median`) and each open file's row of blocks (docs/time.md).

use std::sync::Arc;

use rsembed_schemas::job::ManifestFile;
use rsembed_schemas::meta::FileMeta;
use rsembed_schemas::queue::TaskDone;
use rsembed_schemas::task::Task;
use tokio::sync::mpsc;
use tracing::Instrument;

pub use crate::context::{Counters, JobContext};
use crate::engine::flags::BatchPolicy;
use crate::engine::handle::EngineHandle;
use crate::error::{Error, Result};
use crate::metrics;
use crate::model::ModelDir;
use crate::preprocess::Preprocessor;
use crate::sink::commit::Commit;
use crate::sink::parquet::{chip_file_metadata, encode, encode_chips, error_file_metadata};
use crate::sink::rows::{chip_batch_version, error_batch, extent, CellRow, ErrorRow};
use crate::store::StoreCache;
use rsembed_raster::image::DecodeLimits;
use rsembed_raster::tiff::TiffLimits;

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

/// The task runner's flags, shared by `rsembed run` and `rsembed-worker`.
#[derive(Debug, Clone, clap::Args)]
pub struct PipelineArgs {
    /// Tasks run at once (a pull worker takes a task only when one of these
    /// slots is free); two keep the model busy while one task is written.
    #[arg(long, env = "RSEMBED_TASKS_IN_FLIGHT", default_value_t = 2)]
    pub tasks_in_flight: usize,
    /// Inputs decoded at once. Default: the number of cores.
    #[arg(long, env = "RSEMBED_DECODE_THREADS")]
    pub decode_threads: Option<usize>,
    /// Largest whole image (PNG/JPEG) one input may decode to, in pixels: a hostile
    /// header can claim anything, and this bounds the allocation (4 bytes per pixel).
    /// TIFF scenes are read window by window under the reader's own limits.
    #[arg(long, env = "RSEMBED_MAX_PIXELS", default_value_t = 1 << 28)]
    pub max_pixels: u64,
}

impl Default for PipelineArgs {
    fn default() -> Self {
        PipelineArgs {
            tasks_in_flight: 2,
            decode_threads: None,
            max_pixels: 1 << 28,
        }
    }
}

impl PipelineArgs {
    /// Inputs decoded at once: `--decode-threads`, or the number of cores.
    pub(crate) fn decode_concurrency(&self) -> usize {
        self.decode_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
            .max(1)
    }

    /// Decoder bounds for whole images under `--max-pixels`.
    pub(crate) fn decode_limits(&self) -> DecodeLimits {
        DecodeLimits {
            max_alloc: self.max_pixels.saturating_mul(4),
            ..DecodeLimits::default()
        }
    }
}

/// Who runs the tasks, which decides how failures and files are handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `rsembed run`: one writer; a storage error is an error row
    /// ([`StoreErrors::Record`]) and files are plain puts ([`Commit::Overwrite`]).
    Embedded,
    /// `rsembed-worker`: redeliveries may race; a storage error fails the task
    /// for a retry ([`StoreErrors::FailTask`]) and files are created once
    /// ([`Commit::CreateOnce`]).
    Pull,
}

impl TaskRunner {
    /// The runner of a process: `model`'s preprocessing, `engine` (started
    /// with `policy`), inputs read through `stores`, and the task flags `args`.
    pub fn new(
        args: &PipelineArgs,
        model: &ModelDir,
        engine: EngineHandle,
        policy: BatchPolicy,
        stores: StoreCache,
        mode: Mode,
    ) -> TaskRunner {
        let (store_errors, commit) = match mode {
            Mode::Embedded => (StoreErrors::Record, Commit::Overwrite),
            Mode::Pull => (StoreErrors::FailTask, Commit::CreateOnce),
        };
        TaskRunner {
            stores,
            preprocessor: Arc::new(Preprocessor::new(&model.preprocessor)),
            engine,
            batch_size: policy.max(),
            decode_concurrency: args.decode_concurrency(),
            limits: args.decode_limits(),
            tiff_limits: TiffLimits::default(),
            store_errors,
            commit,
            counters: Arc::new(Counters::default()),
        }
    }
}

/// What an input that the store cannot give does: its error row names a
/// store failure (`ErrorRow::store`: the object is missing, the store failed
/// after its own retries, or it refused our credentials; not a decode error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrors {
    /// The input becomes an error row, like a corrupt file (embedded mode: a run
    /// reports it, and a rerun of the job retries the task).
    Record,
    /// The task fails with [`Error::InputUnavailable`] before writing anything,
    /// with the store error's hint, so the queue redelivers it or records it
    /// as failed (pull workers: a 5xx, a briefly missing object or refused
    /// credentials must not become a permanent "bad input" row).
    FailTask,
}

/// The result of a finished task.
#[derive(Debug)]
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
    /// Chips left out because their cloud fraction exceeds `--max-cloud`
    /// (0 for a task found finished, whose count was not kept).
    pub cloudy_chips_dropped: u64,
    /// A window's cells whose every acquisition was all cloud, so they have
    /// no row (0 for a task found finished).
    pub unclear_cells: u64,
}

impl TaskReport {
    /// What the job state records of the finished task: its files and how
    /// many inputs gave no chip (their names stay in the chip file's footer).
    pub fn done(&self, worker: &str, seconds: f64) -> TaskDone {
        TaskDone {
            output: None,
            empty_inputs: vec![],
            inputs_without_chips: self.empty_inputs.len() as u64,
            unclear_cells: self.unclear_cells,
            chips_file: self.chips_file.clone(),
            errors_file: self.errors_file.clone(),
            worker: worker.to_owned(),
            finished_at: crate::now_rfc3339(),
            seconds,
        }
    }
}

/// The whole inputs of `task` that no row and no failure came from.
fn empty_inputs(task: &Task, rows: &[CellRow], failures: &[ErrorRow]) -> Vec<String> {
    // A row names its input exactly, or, for an archive member
    // (`<archive>#<member>`), the archive before the `#`. Both are kept: an
    // input may hold a `#` itself (an item of an item collection is
    // `items.json#<id>`), and only its exact name says it gave chips.
    let produced: std::collections::HashSet<&str> = rows
        .iter()
        .map(|r| r.chip.source_uri.as_str())
        .chain(failures.iter().map(|f| f.source_uri.as_str()))
        .flat_map(|u| [Some(u), u.split_once('#').map(|(a, _)| a)])
        .flatten()
        .collect();
    task.inputs
        .iter()
        .filter(|i| i.chips.is_none() && !produced.contains(i.uri.as_str()))
        .map(|i| i.uri.clone())
        .collect()
}

impl TaskRunner {
    /// Runs a task to completion and commits its files: the error file first,
    /// then the chip file, whose presence marks the task done.
    pub async fn run(&self, job: &JobContext, task: &Task) -> Result<TaskReport> {
        let span = tracing::info_span!("task", task_id = %task.task_id, inputs = task.inputs.len());
        self.run_inner(job, task).instrument(span).await
    }

    async fn run_inner(&self, job: &JobContext, task: &Task) -> Result<TaskReport> {
        let (tx, rx) = mpsc::channel::<crate::input::Item>(self.batch_size.max(1) * 2);
        let readers = crate::input::Readers {
            stores: &self.stores,
            pre: &self.preprocessor,
            limits: self.limits,
            counters: &self.counters,
            decode_concurrency: self.decode_concurrency,
            tiff_limits: &self.tiff_limits,
        };
        let tiling_fp = job.file_meta.tiling.fingerprint();
        // A window's task is read cell by cell, and only each cell's
        // composite goes on to the batcher (`crate::composite`).
        let (embedded, read, chosen) = match task.window {
            None => {
                let producer = crate::input::spawn_readers(&readers, job, task.inputs.clone(), tx);
                let embedded = self.batch_and_embed(rx, &tiling_fp).await;
                let (rows, failures) = embedded?;
                let read = producer
                    .await
                    .map_err(|e| Error::EngineGone(format!("input stage panicked: {e}")))?;
                ((rows, failures), read, None)
            }
            Some(window) => {
                let producer = crate::composite::spawn_window(&readers, job, task, window, tx);
                let embedded = self.batch_and_embed(rx, &tiling_fp).await;
                let (rows, failures) = embedded?;
                let chosen = producer
                    .await
                    .map_err(|e| Error::EngineGone(format!("window stage panicked: {e}")))?;
                let read = crate::input::ReadStats {
                    cloudy_chips_dropped: chosen.cloudy_chips_dropped,
                };
                ((rows, failures), read, Some(chosen))
            }
        };
        let (mut rows, mut failures) = embedded;
        let unclear_cells = chosen.as_ref().map_or(0, |c| c.unclear_cells);
        if let (Some(w), Some(c)) = (task.window, &chosen) {
            for r in &mut rows {
                r.cells.window_start = Some(w.start);
                r.cells.window_end = Some(w.end);
                r.cells.scenes = r.cells.cell.as_ref().and_then(|k| c.scenes.get(k).copied());
            }
            if unclear_cells > 0 {
                tracing::info!(
                    unclear_cells,
                    "cells with no clear pixel in the window have no row"
                );
            }
        }
        if read.cloudy_chips_dropped > 0 {
            self.counters.cloudy_dropped.fetch_add(
                read.cloudy_chips_dropped,
                std::sync::atomic::Ordering::Relaxed,
            );
            tracing::info!(
                cloudy_chips_dropped = read.cloudy_chips_dropped,
                max_cloud = job.file_meta.tiling.max_cloud,
                "chips over --max-cloud left out"
            );
        }

        // Counted until the chip file is written.
        let _writing = metrics::global().queue_tasks.hold(1);
        rows.sort_by(|a, b| {
            let (a, b) = (&a.chip, &b.chip);
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
                self.commit
                    .put(
                        &job.output,
                        &task.errors_path(),
                        bytes,
                        failures.len() as u64,
                    )
                    .await?,
            )
        };
        // In the job's schema version (the one it started with), which the
        // file metadata records too.
        let b = chip_batch_version(
            &rows,
            job.file_meta.schema_version,
            job.file_meta.embed_dim,
            job.file_meta.embedding_type(),
        )?;
        let empty_inputs = match &chosen {
            None => empty_inputs(task, &rows, &failures),
            // An acquisition of a block of cells that gives no chip in the
            // block is normal (a split scene's collar block is too).
            Some(_) if task.cells.is_some() => vec![],
            // An acquisition whose chips were all bettered is not empty.
            Some(c) => task
                .inputs
                .iter()
                .filter(|i| {
                    !c.inputs_with_chips.contains(&i.uri)
                        && !failures.iter().any(|f| f.source_uri == i.uri)
                })
                .map(|i| i.uri.clone())
                .collect(),
        };
        let mut kv = chip_file_metadata(&meta, extent(&rows))?;
        kv.extend(crate::sink::parquet::empty_inputs_entry(&empty_inputs)?);
        let covers = crate::sink::extent::of_rows(&rows);
        kv.push(crate::sink::extent::entry(&covers)?);
        let mut chips_file = self
            .commit
            .put(
                &job.output,
                &task.chips_path(),
                encode_chips(&b, kv)?,
                rows.len() as u64,
            )
            .await?;
        // A file an earlier delivery wrote is described with its own record.
        chips_file.extent.get_or_insert(covers);
        Ok(TaskReport {
            empty_inputs,
            task_id: task.task_id.clone(),
            chips_file,
            errors_file,
            failures,
            cloudy_chips_dropped: read.cloudy_chips_dropped,
            unclear_cells,
        })
    }
}

#[cfg(test)]
mod tests {
    use rsembed_schemas::ids::Window;
    use rsembed_schemas::task::TaskInput;

    use super::*;

    fn input(uri: &str) -> TaskInput {
        TaskInput {
            uri: uri.into(),
            size: 1,
            version: None,
            chips: None,
            parts: vec![],
            item: None,
        }
    }

    fn row(uri: &str) -> CellRow {
        CellRow {
            chip: crate::sink::rows::ChipRow {
                chip_id: "0".repeat(32),
                source_uri: uri.into(),
                source_version: None,
                window: Window {
                    x: 0,
                    y: 0,
                    width: 8,
                    height: 8,
                },
                valid_fraction: 1.0,
                crs: None,
                footprint: None,
                centre: None,
                embedding: vec![1.0],
                stac: Default::default(),
            },
            cells: Default::default(),
        }
    }

    #[test]
    fn an_input_with_a_hash_in_its_name_that_gave_chips_is_not_empty() {
        // Items of an item collection are `<file>#<item id>`; archive members
        // are `<archive>#<member>` and count for their archive.
        let task = Task::new(
            "job",
            vec![
                input("file:///items.json#aerial-1"),
                input("file:///items.json#aerial-2"),
                input("file:///chips.tar"),
                input("file:///quiet.tar"),
            ],
        );
        let rows = [
            row("file:///items.json#aerial-1"),
            row("file:///chips.tar#a/b.png"),
        ];
        assert_eq!(
            empty_inputs(&task, &rows, &[]),
            ["file:///items.json#aerial-2", "file:///quiet.tar"]
        );
    }
}
