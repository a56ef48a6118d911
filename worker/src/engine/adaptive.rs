//! `--batch-size auto`: a [`Backend`] that runs any batch through another
//! backend in power-of-two buckets, finds the fastest bucket at start, and
//! recovers from out-of-memory errors without losing or duplicating a chip.
//!
//! The decisions live in the controller (`engine/controller.rs`); this file
//! does the running: cutting a batch into pieces, padding, splitting on OOM,
//! the warm-up probe, and the statistics.
//!
//! ```text
//! request of n images ──► pieces of ≤ bucket ──► inner.run(piece padded to its bucket)
//!                                      │ OOM
//!                                      └─► ceiling ↓, halves retried (shrink runs), recursively
//! ```
//!
//! - A piece shorter than the bucket runs at the smallest bucket that holds it,
//!   padded with zero images; the padding rows are dropped. When a request is
//!   exactly one full bucket it goes to the backend without a copy.
//! - Output rows are in input order, exactly `n` of them, or the request fails
//!   as a whole (no partial answer).
//! - A one-image piece that still runs out of memory after a shrink run fails
//!   the request with [`Error::OutOfMemory`] (retryable). The controller keeps
//!   its state and the next request runs normally.
//! - Errors that are not out-of-memory pass through unchanged and are not
//!   retried: a broken graph fails the same way at every size.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::engine::controller::{
    bucket_for, buckets, choose, keep_probing, Change, Controller, ProbeOutcome, ProbeRow,
    DEFAULT_RECOVER_AFTER,
};
use crate::engine::{Backend, DeviceMemory, Embeddings, PixelBatch, PixelFormat, RunHints};
use crate::error::{is_out_of_memory, Error, Result};
use crate::model::ModelDir;

/// Where the probe reads time from: the wall clock in production, the
/// simulated device's virtual clock in tests and benchmarks.
pub trait Clock: Send + Sync {
    /// Time since an arbitrary, fixed origin.
    fn now(&self) -> Duration;
}

/// The monotonic wall clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WallClock {
    origin: Instant,
}

impl Default for WallClock {
    fn default() -> Self {
        WallClock {
            origin: Instant::now(),
        }
    }
}

impl Clock for WallClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// The shape of one image, for the probe's synthetic batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageShape {
    /// Channels.
    pub channels: usize,
    /// Height.
    pub height: usize,
    /// Width.
    pub width: usize,
}

impl ImageShape {
    /// The vision graph's input: 3 channels at the preprocessor's size.
    pub fn of_model(model: &ModelDir) -> ImageShape {
        ImageShape {
            channels: 3,
            height: model.preprocessor.size.height as usize,
            width: model.preprocessor.size.width as usize,
        }
    }

    fn zeros(self, n: usize, format: PixelFormat) -> PixelBatch {
        let len = n * self.channels * self.height * self.width;
        PixelBatch {
            n,
            channels: self.channels,
            height: self.height,
            width: self.width,
            data: match format {
                PixelFormat::F32Nchw => vec![0f32; len].into(),
                PixelFormat::U8Nhwc => vec![0u8; len].into(),
            },
        }
    }
}

/// Settings of the adaptive batch size.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveConfig {
    /// The largest bucket (`--max-batch`), rounded down to a power of two and
    /// to the inner backend's own limit.
    pub max_batch: usize,
    /// Consecutive successes at the current bucket before one bucket up
    /// (see [`DEFAULT_RECOVER_AFTER`]).
    pub recover_after: u32,
    /// The probe's "no better" margin, and how near the best a chosen bucket
    /// must be: 0.03.
    pub tolerance: f64,
    /// Untimed runs per bucket before timing (the first run of a shape builds
    /// ORT's plan and grows the arena): 1.
    pub warm_runs: u32,
    /// Timed runs per bucket; the fastest counts, since on a shared machine
    /// interference only ever slows a run down: 2.
    pub timed_runs: u32,
    /// Stop the probe once device memory in use (all processes) passes this
    /// fraction of the device's total after a bucket, and do not choose that
    /// bucket: 0.9. Ignored when the backend cannot measure memory (CPU).
    pub memory_budget: f64,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig {
            max_batch: 64,
            recover_after: DEFAULT_RECOVER_AFTER,
            tolerance: 0.03,
            warm_runs: 1,
            timed_runs: 2,
            memory_budget: 0.9,
        }
    }
}

/// A snapshot of the controller, for metrics and logs. Cheap: a few loads and
/// one reference-count increment for the probe table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdaptiveStats {
    /// The bucket full pieces run at now.
    pub bucket: usize,
    /// The largest bucket believed to fit now.
    pub ceiling: usize,
    /// The bucket the controller climbs back to (the probe's choice).
    pub target: usize,
    /// The largest bucket.
    pub max_batch: usize,
    /// The bucket no climb may pass, once a size has failed twice.
    pub hard_limit: Option<usize>,
    /// Out-of-memory runs, probe included.
    pub ooms: u64,
    /// Backend runs, probe included.
    pub runs: u64,
    /// Successful runs after the probe.
    pub successes: u64,
    /// Runs that asked the arena to shrink.
    pub shrink_runs: u64,
    /// Zero images run as padding.
    pub padded_images: u64,
    /// Requests that failed (any error).
    pub failed_requests: u64,
    /// The probe's table, once it ran.
    pub probe: Option<Arc<[ProbeRow]>>,
    /// The backend's message for the latest out-of-memory run.
    pub last_oom: Option<Arc<str>>,
}

#[derive(Default)]
struct Shared {
    bucket: AtomicUsize,
    ceiling: AtomicUsize,
    target: AtomicUsize,
    max_batch: AtomicUsize,
    hard_limit: AtomicUsize,
    ooms: AtomicU64,
    runs: AtomicU64,
    successes: AtomicU64,
    shrink_runs: AtomicU64,
    padded_images: AtomicU64,
    failed_requests: AtomicU64,
    probe: Mutex<Option<Arc<[ProbeRow]>>>,
    last_oom: Mutex<Option<Arc<str>>>,
}

/// A cloneable, thread-safe view of an [`Adaptive`]'s statistics, for a
/// metrics exporter on another thread than the engine's.
#[derive(Clone)]
pub(crate) struct StatsHandle(Arc<Shared>);

impl StatsHandle {
    /// The statistics now.
    pub fn snapshot(&self) -> AdaptiveStats {
        let s = &*self.0;
        let hard = s.hard_limit.load(Ordering::Relaxed);
        AdaptiveStats {
            bucket: s.bucket.load(Ordering::Relaxed),
            ceiling: s.ceiling.load(Ordering::Relaxed),
            target: s.target.load(Ordering::Relaxed),
            max_batch: s.max_batch.load(Ordering::Relaxed),
            hard_limit: (hard > 0).then_some(hard),
            ooms: s.ooms.load(Ordering::Relaxed),
            runs: s.runs.load(Ordering::Relaxed),
            successes: s.successes.load(Ordering::Relaxed),
            shrink_runs: s.shrink_runs.load(Ordering::Relaxed),
            padded_images: s.padded_images.load(Ordering::Relaxed),
            failed_requests: s.failed_requests.load(Ordering::Relaxed),
            probe: lock(&s.probe).clone(),
            last_oom: lock(&s.last_oom).clone(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The data is plain values; a panic elsewhere cannot leave it inconsistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The adaptive batch size around a backend. See the module documentation.
pub struct Adaptive<B: Backend> {
    inner: B,
    ctl: Controller,
    cfg: AdaptiveConfig,
    clock: Arc<dyn Clock>,
    shared: Arc<Shared>,
    dim: Option<usize>,
}

impl<B: Backend> Adaptive<B> {
    /// Wraps `inner`, timing the probe by the wall clock. Until [`Adaptive::probe`]
    /// runs, the bucket is the largest one.
    pub fn new(inner: B, cfg: AdaptiveConfig) -> Adaptive<B> {
        Adaptive::with_clock(inner, cfg, Arc::new(WallClock::default()))
    }

    /// Wraps `inner`, timing the probe by `clock`.
    pub fn with_clock(inner: B, cfg: AdaptiveConfig, clock: Arc<dyn Clock>) -> Adaptive<B> {
        let max = inner
            .max_batch()
            .map_or(cfg.max_batch, |m| m.min(cfg.max_batch))
            .max(1);
        let a = Adaptive {
            ctl: Controller::new(max, cfg.recover_after),
            inner,
            cfg,
            clock,
            shared: Arc::default(),
            dim: None,
        };
        a.publish();
        a
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The wrapped backend, mutably.
    pub fn inner_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// The statistics now.
    pub fn stats(&self) -> AdaptiveStats {
        self.stats_handle().snapshot()
    }

    /// A handle that reads the statistics from any thread.
    pub(crate) fn stats_handle(&self) -> StatsHandle {
        StatsHandle(self.shared.clone())
    }

    /// The warm-up probe's table, once [`Adaptive::probe`] has run.
    pub fn probe_table(&self) -> Option<Arc<[ProbeRow]>> {
        lock(&self.shared.probe).clone()
    }

    /// The warm-up probe: measures images/s per bucket upward from 1 until
    /// throughput stops improving by more than the tolerance, a bucket runs
    /// out of memory, or device memory passes the budget; then settles on the
    /// smallest bucket within the tolerance of the best. Logs the table, one
    /// line per bucket. Call once, before serving.
    ///
    /// Fails with [`Error::OutOfMemory`] when not even one image fits, and
    /// with the backend's error when a run fails otherwise.
    pub fn probe(&mut self, shape: ImageShape) -> Result<Arc<[ProbeRow]>> {
        let mut rows: Vec<ProbeRow> = Vec::new();
        let mut one_image_oom = None;
        for b in buckets(self.ctl.max_batch()) {
            if b > self.ctl.ceiling() {
                break;
            }
            let batch = shape.zeros(b, self.inner.pixel_format());
            let row = match self.measure(&batch) {
                Ok(images_per_s) => {
                    let mem = self.inner.device_memory();
                    let over = mem.is_some_and(|m| over_budget(m, self.cfg.memory_budget));
                    if over && b > 1 {
                        self.ctl.limit_below(b);
                    }
                    ProbeRow {
                        bucket: b,
                        images_per_s,
                        memory_used: mem.map(|m| m.used),
                        outcome: if over && b > 1 {
                            ProbeOutcome::OverBudget
                        } else {
                            ProbeOutcome::Measured
                        },
                    }
                }
                Err(e) if is_out_of_memory(&e) => {
                    self.ctl.on_probe_oom(b);
                    self.note_oom(&e);
                    if b == 1 {
                        one_image_oom = Some(e);
                    }
                    ProbeRow {
                        bucket: b,
                        images_per_s: 0.0,
                        memory_used: self.inner.device_memory().map(|m| m.used),
                        outcome: ProbeOutcome::OutOfMemory,
                    }
                }
                Err(e) => {
                    self.publish();
                    return Err(e);
                }
            };
            tracing::info!(
                bucket = row.bucket,
                images_per_s = format_args!("{:.1}", row.images_per_s),
                memory_used = row.memory_used,
                outcome = row.outcome.as_str(),
                "batch probe"
            );
            rows.push(row);
            let budget_hit = b == 1
                && self
                    .inner
                    .device_memory()
                    .is_some_and(|m| over_budget(m, self.cfg.memory_budget));
            if budget_hit || !keep_probing(&rows, self.cfg.tolerance) {
                break;
            }
        }
        let table: Arc<[ProbeRow]> = rows.into();
        *lock(&self.shared.probe) = Some(table.clone());
        let chosen = choose(&table, self.cfg.tolerance);
        self.ctl.set_target(chosen.unwrap_or(1));
        self.publish();
        if let Some(e) = one_image_oom {
            return Err(Error::OutOfMemory {
                source: Box::new(e),
            });
        }
        tracing::info!(
            chosen = self.ctl.bucket(),
            ceiling = self.ctl.ceiling(),
            max_batch = self.ctl.max_batch(),
            "batch probe chose a bucket"
        );
        Ok(table)
    }

    /// Images per second of the fastest timed run of `batch`, after the warm runs.
    fn measure(&mut self, batch: &PixelBatch) -> Result<f64> {
        for _ in 0..self.cfg.warm_runs {
            self.raw_run(batch, RunHints::default())?;
        }
        let mut best = Duration::MAX;
        for _ in 0..self.cfg.timed_runs.max(1) {
            let t0 = self.clock.now();
            self.raw_run(batch, RunHints::default())?;
            best = best.min(self.clock.now().saturating_sub(t0));
        }
        Ok(batch.n as f64 / best.max(Duration::from_nanos(1)).as_secs_f64())
    }

    fn raw_run(&mut self, batch: &PixelBatch, hints: RunHints) -> Result<Embeddings> {
        self.shared.runs.fetch_add(1, Ordering::Relaxed);
        if hints.shrink_arena {
            self.shared.shrink_runs.fetch_add(1, Ordering::Relaxed);
        }
        let _span =
            tracing::trace_span!("backend_run", images = batch.n, shrink = hints.shrink_arena)
                .entered();
        let out = self.inner.run(batch, hints)?;
        if out.n != batch.n || out.data.len() != out.n * out.dim {
            return Err(Error::Device {
                context: "adaptive batching".into(),
                message: format!(
                    "the backend returned {} rows of {} for a batch of {}",
                    out.n, out.dim, batch.n
                ),
            });
        }
        Ok(out)
    }

    fn note_oom(&self, e: &Error) {
        let msg = match e {
            Error::Ort { source, .. } => source.message().to_owned(),
            Error::Device { message, .. } => message.clone(),
            other => other.to_string(),
        };
        *lock(&self.shared.last_oom) = Some(msg.into());
    }

    fn publish(&self) {
        let s = &*self.shared;
        s.bucket.store(self.ctl.bucket(), Ordering::Relaxed);
        s.ceiling.store(self.ctl.ceiling(), Ordering::Relaxed);
        s.target.store(self.ctl.target(), Ordering::Relaxed);
        s.max_batch.store(self.ctl.max_batch(), Ordering::Relaxed);
        s.hard_limit
            .store(self.ctl.hard_limit().unwrap_or(0), Ordering::Relaxed);
        s.ooms.store(self.ctl.ooms(), Ordering::Relaxed);
        s.successes.store(self.ctl.successes(), Ordering::Relaxed);
    }

    fn run_batch(&mut self, batch: &PixelBatch, hints: RunHints) -> Result<Embeddings> {
        let il = batch.image_len();
        if batch.data.len() != batch.n * il {
            return Err(Error::Device {
                context: "adaptive batching".into(),
                message: format!(
                    "a batch of {} images of {il} values holds {} values",
                    batch.n,
                    batch.data.len()
                ),
            });
        }
        let mut out = Out {
            data: Vec::new(),
            dim: self.dim,
            caller_shrink: hints.shrink_arena,
        };
        self.run_range(batch, 0..batch.n, false, &mut out)?;
        let dim = out.dim.unwrap_or(0);
        self.dim = out.dim;
        debug_assert_eq!(out.data.len(), batch.n * dim);
        Ok(Embeddings {
            n: batch.n,
            dim,
            data: out.data,
        })
    }

    /// Runs `range` of `batch` in pieces of at most the current bucket.
    /// `retry`: these images are being retried after an OOM.
    fn run_range(
        &mut self,
        batch: &PixelBatch,
        range: Range<usize>,
        retry: bool,
        out: &mut Out,
    ) -> Result<()> {
        let mut start = range.start;
        while start < range.end {
            let take = self.ctl.bucket().min(range.end - start);
            self.run_piece(batch, start..start + take, retry, out)?;
            start += take;
        }
        Ok(())
    }

    fn run_piece(
        &mut self,
        batch: &PixelBatch,
        range: Range<usize>,
        retry: bool,
        out: &mut Out,
    ) -> Result<()> {
        let len = range.len();
        let size = bucket_for(len);
        let shrink = self.ctl.take_shrink() || retry || std::mem::take(&mut out.caller_shrink);
        let piece = piece(batch, range.clone(), size);
        self.shared
            .padded_images
            .fetch_add((size - len) as u64, Ordering::Relaxed);
        let result = self.raw_run(
            &piece,
            RunHints {
                shrink_arena: shrink,
            },
        );
        drop(piece);
        match result {
            Ok(e) => {
                if *out.dim.get_or_insert(e.dim) != e.dim {
                    return Err(Error::Device {
                        context: "adaptive batching".into(),
                        message: format!(
                            "the backend changed its embedding dimension from {:?} to {}",
                            out.dim, e.dim
                        ),
                    });
                }
                out.data.extend_from_slice(&e.data[..len * e.dim]);
                if self.ctl.on_success(size) == Change::Raised {
                    tracing::info!(
                        bucket = self.ctl.bucket(),
                        ceiling = self.ctl.ceiling(),
                        "batch bucket raised after {} successes",
                        self.cfg.recover_after
                    );
                }
                self.publish();
                Ok(())
            }
            Err(e) if is_out_of_memory(&e) => {
                // The next batch's staged copy gives its memory to the retries.
                self.inner.unstage();
                self.ctl.on_oom(size);
                self.note_oom(&e);
                self.publish();
                tracing::warn!(
                    size,
                    images = len,
                    shrink,
                    bucket = self.ctl.bucket(),
                    ceiling = self.ctl.ceiling(),
                    ooms = self.ctl.ooms(),
                    cause = %crate::error::chain(&e),
                    "out of memory; splitting the batch"
                );
                if len == 1 {
                    if shrink {
                        return Err(Error::OutOfMemory {
                            source: Box::new(e),
                        });
                    }
                    // One retry of the single image, after shrinking the arena.
                    return self.run_piece(batch, range, true, out);
                }
                let mid = range.start + len.div_ceil(2);
                self.run_range(batch, range.start..mid, true, out)?;
                self.run_range(batch, mid..range.end, true, out)
            }
            Err(e) => Err(e),
        }
    }
}

struct Out {
    data: Vec<f32>,
    dim: Option<usize>,
    caller_shrink: bool,
}

fn over_budget(m: DeviceMemory, budget: f64) -> bool {
    m.total > 0 && m.used as f64 > budget * m.total as f64
}

/// Images `range` of `batch`, padded with zero images to `size`; the batch
/// itself when that is all of it.
pub(crate) fn piece(batch: &PixelBatch, range: Range<usize>, size: usize) -> Cow<'_, PixelBatch> {
    if range.start == 0 && range.end == batch.n && size == batch.n {
        return Cow::Borrowed(batch);
    }
    let il = batch.image_len();
    Cow::Owned(PixelBatch {
        n: size,
        channels: batch.channels,
        height: batch.height,
        width: batch.width,
        data: batch
            .data
            .padded(range.start * il..range.end * il, size * il),
    })
}

impl<B: Backend> Backend for Adaptive<B> {
    fn run(&mut self, batch: &PixelBatch, hints: RunHints) -> Result<Embeddings> {
        let span = tracing::debug_span!(
            "adaptive_run",
            images = batch.n,
            bucket = self.ctl.bucket(),
            ceiling = self.ctl.ceiling(),
            ooms = self.ctl.ooms()
        );
        let _enter = span.enter();
        let out = self.run_batch(batch, hints);
        span.record("bucket", self.ctl.bucket());
        span.record("ceiling", self.ctl.ceiling());
        span.record("ooms", self.ctl.ooms());
        if out.is_err() {
            self.shared.failed_requests.fetch_add(1, Ordering::Relaxed);
        }
        self.publish();
        out
    }

    /// None: any batch is accepted and cut into buckets.
    fn max_batch(&self) -> Option<usize> {
        None
    }

    fn preferred_batch(&self) -> Option<usize> {
        Some(self.ctl.bucket())
    }

    fn device_memory(&self) -> Option<DeviceMemory> {
        self.inner.device_memory()
    }

    fn pixel_format(&self) -> PixelFormat {
        self.inner.pixel_format()
    }

    fn input_pool(&self) -> Option<crate::engine::pool::InputPool> {
        self.inner.input_pool()
    }

    /// Staged as the one piece it will run as, when it fits the current
    /// bucket; a batch that will be cut is not staged (no piece of it would
    /// match).
    fn stage(&mut self, next: &PixelBatch) {
        if next.n <= self.ctl.bucket() {
            let p = piece(next, 0..next.n, bucket_for(next.n));
            self.inner.stage(&p);
        }
    }

    fn unstage(&mut self) {
        self.inner.unstage();
    }
}
