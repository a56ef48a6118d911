//! Device memory figures: NVML on CUDA, the resident set on CPU, sampled while runs go.

use super::*;

/// Where memory figures come from: NVML on CUDA (device-wide used bytes),
/// the process's resident set on CPU.
#[derive(Clone)]
pub(crate) enum MemSource {
    Nvml(Arc<Nvml>, u32),
    Rss,
    /// CUDA without NVML: no memory figures, the timings still count.
    Unknown,
}

impl MemSource {
    pub(crate) fn for_device(d: Device) -> Res<MemSource> {
        match d {
            Device::Cpu => Ok(MemSource::Rss),
            Device::Cuda(n) => match Nvml::load().map(Arc::new) {
                Some(nvml) if nvml.cuda_memory(n).is_some() => Ok(MemSource::Nvml(nvml, n)),
                _ => {
                    eprintln!(
                        "gpu_bench: WARNING: NVML (libnvidia-ml.so.1) cannot report CUDA device {n}: \
                         no memory figures"
                    );
                    Ok(MemSource::Unknown)
                }
            },
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            MemSource::Nvml(..) => "nvml device used",
            MemSource::Rss => "process RSS",
            MemSource::Unknown => "none (no NVML)",
        }
    }

    pub(crate) fn used(&self) -> Option<u64> {
        match self {
            MemSource::Nvml(n, i) => n.cuda_memory(*i).map(|m| m.used),
            MemSource::Rss => {
                let s = std::fs::read_to_string("/proc/self/status").ok()?;
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                    .map(|kb| kb * 1024)
            }
            MemSource::Unknown => None,
        }
    }

    pub(crate) fn total(&self) -> Option<u64> {
        match self {
            MemSource::Nvml(n, i) => n.cuda_memory(*i).map(|m| m.total),
            MemSource::Rss | MemSource::Unknown => None,
        }
    }
}

/// Samples memory in a background thread and keeps the maximum.
pub(crate) struct Sampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Sampler {
    pub(crate) fn start(src: &MemSource) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(src.used().unwrap_or(0)));
        let (s, p, src) = (stop.clone(), peak.clone(), src.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(u) = src.used() {
                    p.fetch_max(u, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Sampler { stop, peak, thread }
    }

    pub(crate) fn finish(self, src: &MemSource) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        if let Some(u) = src.used() {
            self.peak.fetch_max(u, Ordering::Relaxed);
        }
        self.peak.load(Ordering::Relaxed)
    }
}

pub(crate) fn mib(b: Option<u64>) -> String {
    b.map_or("-".into(), |b| {
        format!("{:.0}", b as f64 / (1u64 << 20) as f64)
    })
}

pub(crate) fn mib_f(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}
