//! Prometheus metrics: one process-global registry of atomics, rendered in the
//! text exposition format 0.0.4, and a small HTTP server for it
//! ([`server::serve`], started by `rsembed run --metrics-addr`).
//!
//! Updating a metric is one relaxed atomic operation, so the stages update
//! them inline. There are no labels: one process serves one worker, and task
//! ids must never become label values.
//!
//! | metric | type | updated by |
//! | --- | --- | --- |
//! | `rsembed_worker_chips_total` | counter | batcher, per embedded batch |
//! | `rsembed_worker_failed_inputs_total` | counter | batcher, per error row |
//! | `rsembed_worker_oom_total` | counter | engine thread, from the adaptive stats (probe included) |
//! | `rsembed_worker_batch_size` | gauge | engine thread (adaptive bucket), or once at start (fixed size) |
//! | `rsembed_worker_batch_ceiling` | gauge | engine thread (adaptive ceiling), or once at start (fixed size) |
//! | `rsembed_worker_inference_seconds` | histogram | engine thread, wall time of each request |
//! | `rsembed_worker_queue_chips` | gauge | decoded chips not yet sent to the engine |
//! | `rsembed_worker_queue_batches` | gauge | batches sent to the engine, not yet answered |
//! | `rsembed_worker_queue_tasks` | gauge | tasks embedded, being encoded and written |
//! | `rsembed_worker_gpu_memory_used_bytes`, `_total_bytes` | gauge | engine thread, when NVML is present |

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::engine::adaptive::StatsHandle;
use crate::engine::{Backend, DeviceMemory};

pub mod server;

/// Metric names, Prometheus style: base units, `_total` on counters.
pub mod names {
    /// Counter: chips embedded.
    pub const CHIPS_TOTAL: &str = "rsembed_worker_chips_total";
    /// Counter: inputs recorded as failed (error rows).
    pub const FAILED_INPUTS_TOTAL: &str = "rsembed_worker_failed_inputs_total";
    /// Counter: out-of-memory runs of the adaptive engine, probe included.
    pub const OOM_TOTAL: &str = "rsembed_worker_oom_total";
    /// Gauge: images per batch now (the adaptive bucket, or the fixed size).
    pub const BATCH_SIZE: &str = "rsembed_worker_batch_size";
    /// Gauge: the largest bucket believed to fit now (the fixed size when fixed).
    pub const BATCH_CEILING: &str = "rsembed_worker_batch_ceiling";
    /// Histogram: wall time of one engine request (one batch), in seconds.
    pub const INFERENCE_SECONDS: &str = "rsembed_worker_inference_seconds";
    /// Gauge: decoded chips waiting for the batcher (in the channel, held by a
    /// decoder waiting for room, or in the batch being filled).
    pub const QUEUE_CHIPS: &str = "rsembed_worker_queue_chips";
    /// Gauge: batches sent to the engine and not yet answered (queued or running).
    pub const QUEUE_BATCHES: &str = "rsembed_worker_queue_batches";
    /// Gauge: tasks whose chips are embedded, being encoded and written.
    pub const QUEUE_TASKS: &str = "rsembed_worker_queue_tasks";
    /// Gauge: device memory in use (all processes), when NVML is present.
    pub const GPU_MEMORY_USED: &str = "rsembed_worker_gpu_memory_used_bytes";
    /// Gauge: device memory in total, when NVML is present.
    pub const GPU_MEMORY_TOTAL: &str = "rsembed_worker_gpu_memory_total_bytes";
}

/// Upper bounds of the inference histogram, in seconds: Prometheus' default
/// buckets, extended for large CPU batches.
pub const INFERENCE_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// A monotonic counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Zero.
    pub const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }
    /// Adds `n`.
    pub fn inc_by(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// Raises the counter to `v` when it is below (for a count kept elsewhere).
    pub fn raise_to(&self, v: u64) {
        self.0.fetch_max(v, Ordering::Relaxed);
    }
    /// The value now.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// An integer gauge.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    /// Zero.
    pub const fn new() -> Gauge {
        Gauge(AtomicI64::new(0))
    }
    /// Sets the value.
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// Adds `d` (negative to subtract).
    pub fn add(&self, d: i64) {
        self.0.fetch_add(d, Ordering::Relaxed);
    }
    /// The value now.
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
    /// Adds `n` now and subtracts it when the guard is dropped or released, so
    /// a queue depth stays right when a task is dropped half way.
    pub fn hold(&self, n: i64) -> Held<'_> {
        self.add(n);
        Held { gauge: self, n }
    }
}

/// What [`Gauge::hold`] added, taken back on drop.
#[derive(Debug)]
pub struct Held<'a> {
    gauge: &'a Gauge,
    n: i64,
}

impl Held<'_> {
    /// Takes the amount back now (the guard's drop then does nothing).
    pub fn release(&mut self) {
        self.gauge.add(-self.n);
        self.n = 0;
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

/// A histogram with the fixed bounds [`INFERENCE_BUCKETS`].
#[derive(Debug)]
pub struct Histogram {
    /// Observations per bucket, not cumulative; the last is above every bound.
    counts: [AtomicU64; INFERENCE_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

impl Histogram {
    /// Empty.
    pub const fn new() -> Histogram {
        Histogram {
            counts: [const { AtomicU64::new(0) }; INFERENCE_BUCKETS.len() + 1],
            sum_ns: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
    /// Records one observation of `seconds`.
    pub fn observe(&self, seconds: f64) {
        let s = if seconds.is_finite() {
            seconds.max(0.0)
        } else {
            0.0
        };
        let i = INFERENCE_BUCKETS
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(INFERENCE_BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add((s * 1e9).round() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }
    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
    /// Sum of the observations, in seconds.
    pub fn sum(&self) -> f64 {
        self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9
    }
}

/// Every metric of the process. See the module documentation.
pub struct Registry {
    /// [`names::CHIPS_TOTAL`].
    pub chips: Counter,
    /// [`names::FAILED_INPUTS_TOTAL`].
    pub failed_inputs: Counter,
    /// [`names::OOM_TOTAL`].
    pub ooms: Counter,
    /// [`names::BATCH_SIZE`].
    pub batch_size: Gauge,
    /// [`names::BATCH_CEILING`].
    pub batch_ceiling: Gauge,
    /// [`names::INFERENCE_SECONDS`].
    pub inference_seconds: Histogram,
    /// [`names::QUEUE_CHIPS`].
    pub queue_chips: Gauge,
    /// [`names::QUEUE_BATCHES`].
    pub queue_batches: Gauge,
    /// [`names::QUEUE_TASKS`].
    pub queue_tasks: Gauge,
    gpu_present: AtomicBool,
    gpu_used: Gauge,
    gpu_total: Gauge,
    adaptive: Mutex<Option<StatsHandle>>,
}

static GLOBAL: Registry = Registry::new();

/// The process's registry.
pub fn global() -> &'static Registry {
    &GLOBAL
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

impl Registry {
    /// Every metric at zero. Tests make their own; the process uses [`global`].
    pub const fn new() -> Registry {
        Registry {
            chips: Counter::new(),
            failed_inputs: Counter::new(),
            ooms: Counter::new(),
            batch_size: Gauge::new(),
            batch_ceiling: Gauge::new(),
            inference_seconds: Histogram::new(),
            queue_chips: Gauge::new(),
            queue_batches: Gauge::new(),
            queue_tasks: Gauge::new(),
            gpu_present: AtomicBool::new(false),
            gpu_used: Gauge::new(),
            gpu_total: Gauge::new(),
            adaptive: Mutex::new(None),
        }
    }

    /// Follows an adaptive engine's statistics: bucket, ceiling and OOM count
    /// are copied from it by [`Registry::publish_adaptive`].
    pub fn watch_adaptive(&self, stats: StatsHandle) {
        *self.adaptive.lock().unwrap_or_else(|p| p.into_inner()) = Some(stats);
        self.publish_adaptive();
    }

    /// Copies the watched adaptive statistics, if any, into the gauges and the
    /// OOM counter.
    pub fn publish_adaptive(&self) {
        let handle = self
            .adaptive
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(h) = handle {
            let s = h.snapshot();
            self.batch_size.set(s.bucket as i64);
            self.batch_ceiling.set(s.ceiling as i64);
            self.ooms.raise_to(s.ooms);
        }
    }

    /// Records device memory, as NVML reports it.
    pub fn set_device_memory(&self, m: DeviceMemory) {
        self.gpu_used.set(m.used.min(i64::MAX as u64) as i64);
        self.gpu_total.set(m.total.min(i64::MAX as u64) as i64);
        self.gpu_present.store(true, Ordering::Relaxed);
    }

    /// What the engine thread publishes after building the backend and after
    /// each request: its preferred batch, device memory when it can measure
    /// it, and the adaptive statistics.
    pub fn observe_backend<B: Backend + ?Sized>(&self, backend: &B) {
        if let Some(n) = backend.preferred_batch() {
            self.batch_size.set(n as i64);
        }
        if let Some(m) = backend.device_memory() {
            self.set_device_memory(m);
        }
        self.publish_adaptive();
    }

    /// The text exposition format, version 0.0.4.
    pub fn render(&self) -> String {
        self.publish_adaptive();
        let mut out = String::with_capacity(4096);
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        metric(
            names::CHIPS_TOTAL,
            "counter",
            "Chips embedded.",
            self.chips.get().to_string(),
        );
        metric(
            names::FAILED_INPUTS_TOTAL,
            "counter",
            "Inputs recorded as failed in errors/.",
            self.failed_inputs.get().to_string(),
        );
        metric(
            names::OOM_TOTAL,
            "counter",
            "Out-of-memory runs of the adaptive engine, warm-up probe included.",
            self.ooms.get().to_string(),
        );
        metric(
            names::BATCH_SIZE,
            "gauge",
            "Images per batch now: the adaptive bucket, or the fixed --batch-size.",
            self.batch_size.get().to_string(),
        );
        metric(
            names::BATCH_CEILING,
            "gauge",
            "Largest batch bucket believed to fit now (the fixed size when fixed).",
            self.batch_ceiling.get().to_string(),
        );
        metric(
            names::QUEUE_CHIPS,
            "gauge",
            "Decoded chips waiting for the batcher.",
            self.queue_chips.get().to_string(),
        );
        metric(
            names::QUEUE_BATCHES,
            "gauge",
            "Batches sent to the engine and not yet answered (queued or running).",
            self.queue_batches.get().to_string(),
        );
        metric(
            names::QUEUE_TASKS,
            "gauge",
            "Tasks embedded and being written.",
            self.queue_tasks.get().to_string(),
        );
        if self.gpu_present.load(Ordering::Relaxed) {
            metric(
                names::GPU_MEMORY_USED,
                "gauge",
                "Device memory in use, all processes (NVML).",
                self.gpu_used.get().to_string(),
            );
            metric(
                names::GPU_MEMORY_TOTAL,
                "gauge",
                "Device memory in total (NVML).",
                self.gpu_total.get().to_string(),
            );
        }
        self.render_histogram(&mut out);
        out
    }

    fn render_histogram(&self, out: &mut String) {
        let h = &self.inference_seconds;
        let name = names::INFERENCE_SECONDS;
        let _ = writeln!(
            out,
            "# HELP {name} Wall time of one inference request (one batch).\n# TYPE {name} histogram"
        );
        let mut cumulative = 0u64;
        for (i, le) in INFERENCE_BUCKETS.iter().enumerate() {
            cumulative += h.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        cumulative += h.counts[INFERENCE_BUCKETS.len()].load(Ordering::Relaxed);
        // Observations are three separate atomic adds; a scrape between them
        // must still see +Inf == _count and cumulative buckets.
        let count = cumulative.max(h.count());
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", h.sum());
        let _ = writeln!(out, "{name}_count {count}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::adaptive::{Adaptive, AdaptiveConfig, ImageShape};
    use crate::engine::sim::{SimConfig, SimulatedDevice};

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_at_the_count() {
        let r = Registry::new();
        for s in [0.001, 0.004, 0.02, 0.7, 500.0] {
            r.inference_seconds.observe(s);
        }
        let t = r.render();
        let n = names::INFERENCE_SECONDS;
        assert_eq!(value(&t, &format!("{n}_bucket{{le=\"0.005\"}}")), Some(2.0));
        assert_eq!(value(&t, &format!("{n}_bucket{{le=\"0.025\"}}")), Some(3.0));
        assert_eq!(value(&t, &format!("{n}_bucket{{le=\"1\"}}")), Some(4.0));
        assert_eq!(value(&t, &format!("{n}_bucket{{le=\"120\"}}")), Some(4.0));
        assert_eq!(value(&t, &format!("{n}_bucket{{le=\"+Inf\"}}")), Some(5.0));
        assert_eq!(value(&t, &format!("{n}_count")), Some(5.0));
        let sum = value(&t, &format!("{n}_sum")).unwrap();
        assert!((sum - 500.725).abs() < 1e-6, "{sum}");
    }

    #[test]
    fn held_gauges_come_back_on_drop_and_release() {
        let r = Registry::new();
        let a = r.queue_chips.hold(3);
        let mut b = r.queue_chips.hold(2);
        assert_eq!(r.queue_chips.get(), 5);
        b.release();
        assert_eq!(r.queue_chips.get(), 3);
        drop(b);
        assert_eq!(r.queue_chips.get(), 3);
        drop(a);
        assert_eq!(r.queue_chips.get(), 0);
    }

    #[test]
    fn gpu_memory_is_rendered_only_once_measured() {
        let r = Registry::new();
        assert!(!r.render().contains(names::GPU_MEMORY_USED));
        r.set_device_memory(DeviceMemory {
            used: 5 << 30,
            total: 140 << 30,
        });
        let t = r.render();
        assert_eq!(value(&t, names::GPU_MEMORY_USED), Some((5u64 << 30) as f64));
        assert_eq!(
            value(&t, names::GPU_MEMORY_TOTAL),
            Some((140u64 << 30) as f64)
        );
    }

    #[test]
    fn adaptive_bucket_ceiling_and_ooms_reach_the_registry() {
        // A device that holds 6 images: the probe runs 1, 2, 4, then 8 fails.
        let dev = SimulatedDevice::new(SimConfig {
            ceiling: 6,
            ..SimConfig::default()
        });
        let clock = dev.handle().clock();
        let cfg = AdaptiveConfig {
            max_batch: 16,
            ..AdaptiveConfig::default()
        };
        let mut a = Adaptive::with_clock(dev, cfg, clock);
        let shape = ImageShape {
            channels: 1,
            height: 1,
            width: 1,
        };
        a.probe(shape).unwrap();
        let r = Registry::new();
        r.watch_adaptive(a.stats_handle());
        r.observe_backend(&a);
        let s = a.stats();
        assert!(s.ooms >= 1, "{s:?}");
        let t = r.render();
        assert_eq!(value(&t, names::OOM_TOTAL), Some(s.ooms as f64));
        assert_eq!(value(&t, names::BATCH_SIZE), Some(s.bucket as f64));
        assert_eq!(value(&t, names::BATCH_CEILING), Some(s.ceiling as f64));
        assert!(s.ceiling < 8, "{s:?}");
    }
}
