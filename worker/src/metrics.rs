//! Prometheus metrics: one process-global registry, kept with the
//! `prometheus-client` crate and rendered in the text exposition format 0.0.4,
//! and the HTTP endpoint for it ([`crate::http::start`], started by `rsembed run
//! --metrics-addr` and `rsembed-worker --http-addr`).
//!
//! Updating a metric is one relaxed atomic operation (the histogram takes a
//! short lock), so the stages update them inline. There are no labels: one
//! process serves one worker, and task ids must never become label values.
//!
//! | metric | type | updated by |
//! | --- | --- | --- |
//! | `rsembed_worker_chips_total` | counter | batcher, per embedded batch |
//! | `rsembed_worker_failed_inputs_total` | counter | batcher, per error row |
//! | `rsembed_worker_cloudy_chips_dropped_total` | counter | scene reader, per chip over `--max-cloud` |
//! | `rsembed_worker_oom_total` | counter | engine thread, from the adaptive stats (probe included) |
//! | `rsembed_worker_batch_size` | gauge | engine thread (adaptive bucket), or once at start (fixed size) |
//! | `rsembed_worker_batch_ceiling` | gauge | engine thread (adaptive ceiling), or once at start (fixed size) |
//! | `rsembed_worker_inference_seconds` | histogram | engine thread, wall time of each request |
//! | `rsembed_worker_queue_chips` | gauge | decoded chips not yet sent to the engine |
//! | `rsembed_worker_queue_batches` | gauge | batches sent to the engine, not yet answered |
//! | `rsembed_worker_queue_tasks` | gauge | tasks embedded, being encoded and written |
//! | `rsembed_worker_gpu_memory_used_bytes`, `_total_bytes` | gauge | engine thread, when NVML is present |

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::engine::adaptive::StatsHandle;
use crate::engine::{Backend, DeviceMemory};

/// Metric names, Prometheus style: base units, `_total` on counters.
pub(crate) mod names {
    /// Counter: chips embedded.
    pub const CHIPS_TOTAL: &str = "rsembed_worker_chips_total";
    /// Counter: inputs recorded as failed (error rows).
    pub const FAILED_INPUTS_TOTAL: &str = "rsembed_worker_failed_inputs_total";
    /// Counter: chips left out because their `cloud_fraction` exceeds `--max-cloud`.
    pub const CLOUDY_CHIPS_DROPPED_TOTAL: &str = "rsembed_worker_cloudy_chips_dropped_total";
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
pub(crate) const INFERENCE_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// A monotonic counter.
#[derive(Debug, Default, Clone)]
pub(crate) struct Counter(prometheus_client::metrics::counter::Counter<u64, AtomicU64>);

impl Counter {
    /// Zero.
    pub fn new() -> Counter {
        Counter::default()
    }
    /// Adds `n`.
    pub(crate) fn inc_by(&self, n: u64) {
        self.0.inc_by(n);
    }
    /// Raises the counter to `v` when it is below (for a count kept elsewhere).
    pub(crate) fn raise_to(&self, v: u64) {
        self.0.inner().fetch_max(v, Ordering::Relaxed);
    }
}

/// An integer gauge.
#[derive(Debug, Default, Clone)]
pub struct Gauge(prometheus_client::metrics::gauge::Gauge<i64, AtomicI64>);

impl Gauge {
    /// Zero.
    pub(crate) fn new() -> Gauge {
        Gauge::default()
    }
    /// Sets the value.
    pub(crate) fn set(&self, v: i64) {
        self.0.set(v);
    }
    /// Adds `d` (negative to subtract).
    pub(crate) fn add(&self, d: i64) {
        self.0.inner().fetch_add(d, Ordering::Relaxed);
    }
    /// The value now.
    pub fn get(&self) -> i64 {
        self.0.get()
    }
    /// Adds `n` now and subtracts it when the guard is dropped or released, so
    /// a queue depth stays right when a task is dropped half way.
    pub(crate) fn hold(&self, n: i64) -> Held<'_> {
        self.add(n);
        Held { gauge: self, n }
    }
}

/// What [`Gauge::hold`] added, taken back on drop.
#[derive(Debug)]
pub(crate) struct Held<'a> {
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
#[derive(Debug, Clone)]
pub(crate) struct Histogram(prometheus_client::metrics::histogram::Histogram);

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

impl Histogram {
    /// Empty.
    pub fn new() -> Histogram {
        Histogram(prometheus_client::metrics::histogram::Histogram::new(
            INFERENCE_BUCKETS,
        ))
    }
    /// Records one observation of `seconds`; a negative or non-finite one
    /// (a clock step) counts as zero rather than poisoning the sum.
    pub(crate) fn observe(&self, seconds: f64) {
        let s = if seconds.is_finite() {
            seconds.max(0.0)
        } else {
            0.0
        };
        self.0.observe(s);
    }
}

/// Device memory as NVML last reported it; rendered only once measured, so
/// a CPU worker does not claim a 0-byte GPU.
#[derive(Debug, Default)]
struct GpuMemory {
    present: AtomicBool,
    used: AtomicI64,
    total: AtomicI64,
}

impl Collector for GpuMemory {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if !self.present.load(Ordering::Relaxed) {
            return Ok(());
        }
        for (name, help, value) in [
            (
                names::GPU_MEMORY_USED,
                "Device memory in use, all processes (NVML).",
                &self.used,
            ),
            (
                names::GPU_MEMORY_TOTAL,
                "Device memory in total (NVML).",
                &self.total,
            ),
        ] {
            let gauge = ConstGauge::new(value.load(Ordering::Relaxed));
            gauge.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
        }
        Ok(())
    }
}

/// Every metric of the process. See the module documentation.
pub struct Registry {
    /// [`names::CHIPS_TOTAL`].
    pub(crate) chips: Counter,
    /// [`names::FAILED_INPUTS_TOTAL`].
    pub(crate) failed_inputs: Counter,
    /// [`names::CLOUDY_CHIPS_DROPPED_TOTAL`].
    pub(crate) cloudy_chips_dropped: Counter,
    /// [`names::OOM_TOTAL`].
    pub(crate) ooms: Counter,
    /// [`names::BATCH_SIZE`].
    pub(crate) batch_size: Gauge,
    /// [`names::BATCH_CEILING`].
    pub(crate) batch_ceiling: Gauge,
    /// [`names::INFERENCE_SECONDS`].
    pub(crate) inference_seconds: Histogram,
    /// `rsembed_worker_queue_chips`.
    pub queue_chips: Gauge,
    /// `rsembed_worker_queue_batches`.
    pub queue_batches: Gauge,
    /// `rsembed_worker_queue_tasks`.
    pub queue_tasks: Gauge,
    gpu: Arc<GpuMemory>,
    adaptive: Mutex<Option<StatsHandle>>,
    /// The same metrics (shared atomics), as `prometheus-client` encodes them.
    families: prometheus_client::registry::Registry,
}

static GLOBAL: LazyLock<Registry> = LazyLock::new(Registry::new);

/// The process's registry.
pub fn global() -> &'static Registry {
    &GLOBAL
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

/// `prometheus-client` appends `_total` to a counter's name and a full stop
/// to every help text; the names and texts here are the exposed ones.
fn counter_base(name: &'static str) -> &'static str {
    name.strip_suffix("_total")
        .expect("counter names end in _total")
}

fn help(text: &'static str) -> &'static str {
    text.strip_suffix('.').unwrap_or(text)
}

impl Registry {
    /// Every metric at zero. Tests make their own; the process uses [`global`].
    pub fn new() -> Registry {
        let r = Registry {
            chips: Counter::new(),
            failed_inputs: Counter::new(),
            cloudy_chips_dropped: Counter::new(),
            ooms: Counter::new(),
            batch_size: Gauge::new(),
            batch_ceiling: Gauge::new(),
            inference_seconds: Histogram::new(),
            queue_chips: Gauge::new(),
            queue_batches: Gauge::new(),
            queue_tasks: Gauge::new(),
            gpu: Arc::default(),
            adaptive: Mutex::new(None),
            families: prometheus_client::registry::Registry::default(),
        };
        let mut families = prometheus_client::registry::Registry::default();
        for (name, text, c) in [
            (names::CHIPS_TOTAL, "Chips embedded.", &r.chips),
            (
                names::FAILED_INPUTS_TOTAL,
                "Inputs recorded as failed in errors/.",
                &r.failed_inputs,
            ),
            (
                names::CLOUDY_CHIPS_DROPPED_TOTAL,
                "Chips left out because their cloud_fraction exceeds --max-cloud.",
                &r.cloudy_chips_dropped,
            ),
            (
                names::OOM_TOTAL,
                "Out-of-memory runs of the adaptive engine, warm-up probe included.",
                &r.ooms,
            ),
        ] {
            families.register(counter_base(name), help(text), c.0.clone());
        }
        for (name, text, g) in [
            (
                names::BATCH_SIZE,
                "Images per batch now: the adaptive bucket, or the fixed --batch-size.",
                &r.batch_size,
            ),
            (
                names::BATCH_CEILING,
                "Largest batch bucket believed to fit now (the fixed size when fixed).",
                &r.batch_ceiling,
            ),
            (
                names::QUEUE_CHIPS,
                "Decoded chips waiting for the batcher.",
                &r.queue_chips,
            ),
            (
                names::QUEUE_BATCHES,
                "Batches sent to the engine and not yet answered (queued or running).",
                &r.queue_batches,
            ),
            (
                names::QUEUE_TASKS,
                "Tasks embedded and being written.",
                &r.queue_tasks,
            ),
        ] {
            families.register(name, help(text), g.0.clone());
        }
        families.register_collector(Box::new(r.gpu.clone()));
        families.register(
            names::INFERENCE_SECONDS,
            help("Wall time of one inference request (one batch)."),
            r.inference_seconds.0.clone(),
        );
        Registry { families, ..r }
    }

    /// Follows an adaptive engine's statistics: bucket, ceiling and OOM count
    /// are copied from it by [`Registry::publish_adaptive`].
    pub(crate) fn watch_adaptive(&self, stats: StatsHandle) {
        *self.adaptive.lock().unwrap_or_else(|p| p.into_inner()) = Some(stats);
        self.publish_adaptive();
    }

    /// Copies the watched adaptive statistics, if any, into the gauges and the
    /// OOM counter.
    pub(crate) fn publish_adaptive(&self) {
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
    pub(crate) fn set_device_memory(&self, m: DeviceMemory) {
        let clamp = |v: u64| v.min(i64::MAX as u64) as i64;
        self.gpu.used.store(clamp(m.used), Ordering::Relaxed);
        self.gpu.total.store(clamp(m.total), Ordering::Relaxed);
        self.gpu.present.store(true, Ordering::Relaxed);
    }

    /// What the engine thread publishes after building the backend and after
    /// each request: its preferred batch, device memory when it can measure
    /// it, and the adaptive statistics.
    pub(crate) fn observe_backend<B: Backend + ?Sized>(&self, backend: &B) {
        if let Some(n) = backend.preferred_batch() {
            self.batch_size.set(n as i64);
        }
        if let Some(m) = backend.device_memory() {
            self.set_device_memory(m);
        }
        self.publish_adaptive();
    }

    /// The text exposition format, version 0.0.4 (the content type
    /// `/metrics` answers with).
    pub fn render(&self) -> String {
        self.publish_adaptive();
        let mut out = String::with_capacity(4096);
        // Writing to a String cannot fail, and our collector does not either.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.families);
        out
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
