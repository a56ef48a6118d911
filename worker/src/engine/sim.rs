//! A simulated device: a [`Backend`] with a memory ceiling that can change
//! while it runs, a throughput curve that saturates, a virtual clock, and
//! out-of-memory errors worded exactly as ONNX Runtime words them. Tests and
//! the adaptive-batching benchmark run against it; it never sleeps.
//!
//! - **Memory**: a run of more than `ceiling` images (the images one run can
//!   hold now) fails. The ceiling lives in a shared handle ([`SimHandle`]) and
//!   can be changed from outside or on a schedule of run numbers, so it can
//!   drop and rise in the middle of one request.
//! - **Time**: a run of `n` images advances the virtual clock by
//!   `overhead + per_image · n / efficiency(n)`, where efficiency rises linearly
//!   from `min_efficiency` at one image to 1 at `saturate_at` images and stays
//!   flat above (a GPU that is under-occupied by small batches). A failed run
//!   costs `overhead` plus half its compute time (it fails part way).
//! - **Identity**: row `i` of a run is `[first pixel of image i, run size, i,
//!   shrink]`, cut or zero-padded to `dim`. Rows are *not* normalized, so a test
//!   can check that every input came back exactly once, in order.
//! - **Device memory** (optional): an arena that holds the peak of the runs
//!   since the last shrink run, inside a device whose other tenants use all but
//!   `ceiling` images' worth.
//! - **Copies** (optional, `copy_per_image`): a run first copies its input to
//!   the device, serially, unless that very batch was staged
//!   ([`Backend::stage`]) before the run ahead of it: then the copy ran while
//!   that run computed, and the run waits only for what of it is left. A
//!   staged batch holds `staged_share` of a run's memory per image until it
//!   runs or is dropped ([`Backend::unstage`]); a run that does not match it
//!   leaves it staged.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::engine::adaptive::Clock;
use crate::engine::{Backend, DeviceMemory, Embeddings, PixelBatch, RunHints};
use crate::error::{Error, Result};

/// ONNX Runtime's out-of-memory messages (the `{n}`/`{m}` are byte counts).
/// The first is verbatim from libonnxruntime 1.31.1 on CPU, captured by the
/// real-ORT test in `worker/tests/adaptive.rs`; the others have the shape the
/// arena limit (`max_mem`, `gpu_mem_limit`), the CUDA allocator and cuBLAS
/// print, as seen in ONNX Runtime issue reports (no GPU here to capture them).
pub(crate) const ORT_OOM_MESSAGES: [&str; 4] = [
    "Non-zero status code returned while running FusedMatMul node. \
     Name:'/vision_model/encoder/layers.0/self_attn/MatMul/MatMulScaleFusion/' \
     Status Message: /onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:360 void* \
     onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*) \
     Failed to allocate memory for requested buffer of size {n}\n",
    "Non-zero status code returned while running Gemm node. Name:'/vision_model/head/mlp/fc1/Gemm' \
     Status Message: /onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:360 void* \
     onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*) \
     Available memory of {m} is smaller than requested bytes of {n}",
    "Non-zero status code returned while running Softmax node. \
     Name:'/vision_model/encoder/layers.1/self_attn/Softmax' Status Message: \
     /onnxruntime_src/onnxruntime/core/providers/cuda/cuda_call.cc:129 onnxruntime::CudaCall \
     CUDA failure 2: out of memory ; GPU=0 ; hostname=sim ; \
     file=/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_allocator.cc ; line=53 ; \
     expr=cudaMalloc((void**)&p, size);",
    "Non-zero status code returned while running MatMul node. \
     Name:'/vision_model/encoder/layers.3/mlp/fc2/MatMul' Status Message: \
     /onnxruntime_src/onnxruntime/core/providers/cuda/cuda_call.cc:129 onnxruntime::CudaCall \
     CUBLAS failure 3: CUBLAS_STATUS_ALLOC_FAILED ; GPU=0 ; hostname=sim ; \
     file=/onnxruntime_src/onnxruntime/core/providers/cuda/math/matmul.cc ; line=268 ; \
     expr=cublasGemmHelper(...);",
];

/// Shape of the simulated device.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Embedding dimension (at least 1; 4 keeps the whole identity row).
    pub dim: usize,
    /// Fixed cost of a run (launch, synchronisation, copies).
    pub overhead: Duration,
    /// Cost of one image at full efficiency.
    pub per_image: Duration,
    /// Batch size from which the device is fully occupied.
    pub saturate_at: usize,
    /// Efficiency of a one-image run, in (0, 1].
    pub min_efficiency: f64,
    /// Images one run can hold at the start.
    pub ceiling: usize,
    /// Arena bytes per image of a run.
    pub bytes_per_image: u64,
    /// The device total, when the device reports memory; `None` is a device
    /// without NVML (ONNX Runtime on CPU).
    pub total_memory: Option<u64>,
    /// Cost of copying one image's input to the device (zero: no copies).
    pub copy_per_image: Duration,
    /// Device memory of one staged image, in images of a run's memory.
    pub staged_share: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            dim: 4,
            overhead: Duration::from_millis(1),
            per_image: Duration::from_millis(1),
            saturate_at: 32,
            min_efficiency: 0.25,
            ceiling: 48,
            bytes_per_image: 64 << 20,
            total_memory: None,
            copy_per_image: Duration::ZERO,
            staged_share: 0.0,
        }
    }
}

impl SimConfig {
    /// Virtual time of a successful run of `n` images.
    pub(crate) fn run_time(&self, n: usize) -> Duration {
        let sat = self.saturate_at.max(1) as f64;
        let eff = self.min_efficiency
            + (1.0 - self.min_efficiency) * (n.min(self.saturate_at) as f64 / sat);
        self.overhead + self.per_image.mul_f64(n as f64 / eff.max(1e-9))
    }

    /// Virtual time of copying `n` images' input to the device.
    pub(crate) fn copy_time(&self, n: usize) -> Duration {
        self.copy_per_image * n as u32
    }

    /// Virtual time of a run of `n` images that runs out of memory.
    pub(crate) fn oom_time(&self, n: usize) -> Duration {
        self.overhead + (self.run_time(n) - self.overhead) / 2
    }
}

/// One run, as the device saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimRun {
    /// Images in the run (padding included).
    pub n: usize,
    /// Whether it succeeded.
    pub ok: bool,
    /// Whether it ran out of memory (a failure injected by
    /// [`SimHandle::fail_next`] is neither `ok` nor `oom`).
    pub oom: bool,
    /// Whether it asked for an arena shrink.
    pub shrink: bool,
    /// The ceiling when it ran.
    pub ceiling: usize,
    /// Whether its input had been staged while the run before it computed.
    pub staged: bool,
}

#[derive(Default)]
struct Shared {
    ceiling: AtomicUsize,
    clock_ns: AtomicU64,
    arena_images: AtomicUsize,
    log: Mutex<Vec<SimRun>>,
    schedule: Mutex<VecDeque<(usize, usize)>>,
    fail_next: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The shared side of a [`SimulatedDevice`]: change its ceiling, read its
/// clock and its run log, from the test or the benchmark.
#[derive(Clone)]
pub struct SimHandle(Arc<Shared>);

impl SimHandle {
    /// Images one run can hold now.
    pub fn ceiling(&self) -> usize {
        self.0.ceiling.load(Ordering::Relaxed)
    }

    /// Changes the images one run can hold, from the next run on.
    pub fn set_ceiling(&self, images: usize) {
        self.0.ceiling.store(images, Ordering::Relaxed);
    }

    /// Sets the ceiling to `images` just before run number `run` (0-based,
    /// counting every run), so it can change in the middle of one request.
    pub fn schedule(&self, run: usize, images: usize) {
        let mut s = lock(&self.0.schedule);
        s.push_back((run, images));
        s.make_contiguous().sort_by_key(|(r, _)| *r);
    }

    /// Makes the next run fail with `message` (not an out-of-memory text, for
    /// checking that other errors pass through).
    pub fn fail_next(&self, message: impl Into<String>) {
        *lock(&self.0.fail_next) = Some(message.into());
    }

    /// The virtual time now.
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.0.clock_ns.load(Ordering::Relaxed))
    }

    /// Every run so far.
    pub fn runs(&self) -> Vec<SimRun> {
        lock(&self.0.log).clone()
    }

    /// Number of runs so far.
    pub fn run_count(&self) -> usize {
        lock(&self.0.log).len()
    }

    /// Out-of-memory runs so far.
    pub fn ooms(&self) -> usize {
        lock(&self.0.log).iter().filter(|r| r.oom).count()
    }

    /// The virtual clock, for [`crate::engine::adaptive::Adaptive::with_clock`].
    pub fn clock(&self) -> Arc<dyn Clock> {
        Arc::new(SimClock(self.0.clone()))
    }

    fn advance(&self, d: Duration) {
        self.0
            .clock_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }
}

struct SimClock(Arc<Shared>);

impl Clock for SimClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.0.clock_ns.load(Ordering::Relaxed))
    }
}

/// The simulated device. See the module documentation.
pub struct SimulatedDevice {
    cfg: SimConfig,
    handle: SimHandle,
    ooms: u64,
    /// Batches copied ahead of their runs, oldest first: at most the one
    /// about to run and the one queued behind it.
    staged: VecDeque<Staged>,
}

/// A batch copied to the device ahead of its run.
struct Staged {
    /// The first value of each image: which batch it is.
    key: Vec<f32>,
    /// When its copy is done.
    ready_at: Duration,
}

fn key_of(batch: &PixelBatch) -> Vec<f32> {
    let il = batch.image_len().max(1);
    (0..batch.n)
        .map(|i| batch.data.value(i * il).unwrap_or(f32::NAN))
        .collect()
}

impl SimulatedDevice {
    /// A device shaped by `cfg`.
    pub fn new(cfg: SimConfig) -> SimulatedDevice {
        let handle = SimHandle(Arc::default());
        handle.set_ceiling(cfg.ceiling);
        SimulatedDevice {
            cfg,
            handle,
            ooms: 0,
            staged: VecDeque::new(),
        }
    }

    /// The shared handle.
    pub fn handle(&self) -> SimHandle {
        self.handle.clone()
    }

    /// The device's configuration.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    fn oom_message(&mut self, n: usize) -> String {
        let text = ORT_OOM_MESSAGES[(self.ooms % ORT_OOM_MESSAGES.len() as u64) as usize];
        self.ooms += 1;
        let bytes = n as u64 * self.cfg.bytes_per_image;
        let free = self.handle.ceiling() as u64 * self.cfg.bytes_per_image;
        text.replace("{n}", &bytes.to_string())
            .replace("{m}", &free.to_string())
    }
}

impl Backend for SimulatedDevice {
    fn run(&mut self, batch: &PixelBatch, hints: RunHints) -> Result<Embeddings> {
        let shared = &self.handle.0;
        let run_no = lock(&shared.log).len();
        {
            let mut s = lock(&shared.schedule);
            while s.front().is_some_and(|(r, _)| *r <= run_no) {
                let (_, images) = s.pop_front().expect("checked above");
                shared.ceiling.store(images, Ordering::Relaxed);
            }
        }
        let ceiling = self.handle.ceiling();
        let n = batch.n;
        // Its own staged copy, or the copy now; another batch's stays staged
        // (it may be the next run) and holds its memory meanwhile.
        let key = key_of(batch);
        let staged = match self.staged.iter().position(|st| st.key == key) {
            Some(i) => {
                let st = self.staged.remove(i).expect("found above");
                let now = self.handle.now();
                self.handle.advance(st.ready_at.saturating_sub(now));
                true
            }
            None => {
                self.handle.advance(self.cfg.copy_time(n));
                false
            }
        };
        let held: usize = self
            .staged
            .iter()
            .map(|st| (st.key.len() as f64 * self.cfg.staged_share).ceil() as usize)
            .sum();
        let record = |ok, oom| {
            lock(&shared.log).push(SimRun {
                n,
                ok,
                oom,
                shrink: hints.shrink_arena,
                ceiling,
                staged,
            })
        };
        if let Some(message) = lock(&shared.fail_next).take() {
            record(false, false);
            self.handle.advance(self.cfg.overhead);
            return Err(Error::Device {
                context: format!("simulated vision run of {n} images"),
                message,
            });
        }
        if hints.shrink_arena {
            shared.arena_images.store(0, Ordering::Relaxed);
        }
        if n + held > ceiling {
            record(false, true);
            self.handle.advance(self.cfg.oom_time(n));
            let message = self.oom_message(n);
            return Err(Error::Device {
                context: format!("simulated vision run of {n} images"),
                message,
            });
        }
        record(true, false);
        shared.arena_images.fetch_max(n, Ordering::Relaxed);
        self.handle.advance(self.cfg.run_time(n));
        let dim = self.cfg.dim.max(1);
        let il = batch.image_len().max(1);
        let mut data = vec![0.0f32; n * dim];
        for (i, row) in data.chunks_exact_mut(dim).enumerate() {
            let ident = [
                batch.data.value(i * il).unwrap_or(0.0),
                n as f32,
                i as f32,
                if hints.shrink_arena { 1.0 } else { 0.0 },
            ];
            for (d, v) in row.iter_mut().zip(ident) {
                *d = v;
            }
        }
        Ok(Embeddings { n, dim, data })
    }

    fn stage(&mut self, next: &PixelBatch) {
        if self.cfg.copy_per_image.is_zero() {
            return;
        }
        // The copy starts now, beside the run about to start (which may
        // itself have been staged: two in flight).
        if self.staged.len() >= 2 {
            self.staged.pop_front();
        }
        self.staged.push_back(Staged {
            key: key_of(next),
            ready_at: self.handle.now() + self.cfg.copy_time(next.n),
        });
    }

    fn unstage(&mut self) {
        self.staged.clear();
    }

    fn device_memory(&self) -> Option<DeviceMemory> {
        let total = self.cfg.total_memory?;
        let room = (self.handle.ceiling() as u64 * self.cfg.bytes_per_image).min(total);
        let arena =
            self.handle.0.arena_images.load(Ordering::Relaxed) as u64 * self.cfg.bytes_per_image;
        Some(DeviceMemory {
            used: (total - room + arena).min(total),
            total,
        })
    }
}
