//! The worker engine on a GPU: throughput and device memory per batch bucket,
//! the adaptive probe's choice, out-of-memory recovery under a memory cap, and
//! what arena shrinking returns. Driven by `bench/gpu/run.sh` on the device
//! machine; every part also runs on the CPU (`--device cpu`, memory then read
//! from the process's resident set) so the code is tested without a GPU.
//!
//! ```sh
//! ORT_DYLIB_PATH=$PWD/.cache/ort/libonnxruntime.so.1.31.1 \
//!   cargo run --release -p rsembed-worker --example gpu_bench -- <part> [options]
//! ```
//!
//! Parts (`--help` on each lists its options):
//! - `unpack`: joins the chunks of a zstd-compressed file listed in
//!   `bench/gpu/prepare.sh`'s manifest, checks every chunk's and the result's
//!   sha256, and decompresses it (pure Rust, so the device needs no zstd).
//! - `sweep`: opens the vision graph, checks it against PyTorch's embeddings
//!   (when the model directory has `bench_parity.json`), runs the adaptive
//!   warm-up probe, then times every bucket 1..=`--max-batch`, sampling device
//!   memory while the timed runs go.
//! - `oom`: embeds distinct images through `--batch-size auto` under
//!   `--gpu-mem-limit`, starting at the largest bucket as an unprobed worker
//!   does, and checks that every chip comes back, in order, with the embedding
//!   the same session gives it in a small batch.
//! - `shrink`: one child process per `--arena-shrink` mode runs large batches,
//!   then small ones (the first with the shrink hint); device memory and run
//!   times after each phase.
//!
//! Each part prints a Markdown table and, with `--json FILE`, writes its
//! figures as JSON. Not a test: timings depend on the machine.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use rsembed_worker::engine::adaptive::{Adaptive, AdaptiveConfig, ImageShape};
use rsembed_worker::engine::controller::buckets;
use rsembed_worker::engine::nvml::Nvml;
use rsembed_worker::engine::session::{parse_byte_size, ArenaShrink, Device, SessionConfig};
use rsembed_worker::engine::vision::OrtVision;
use rsembed_worker::engine::{Backend, Embeddings, PixelBatch, RunHints};
use rsembed_worker::error::{chain, is_out_of_memory};
use rsembed_worker::model::ModelDir;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

#[derive(Parser)]
#[command(about = "GPU benchmark of the rsembed worker engine (see bench/gpu/README.md)")]
struct Cli {
    #[command(subcommand)]
    part: Part,
}

#[derive(Subcommand)]
enum Part {
    /// Reassemble and decompress a chunked file from prepare.sh's manifest.
    Unpack(UnpackArgs),
    /// Parity, adaptive probe and per-bucket throughput and memory.
    Sweep(SweepArgs),
    /// Out-of-memory recovery under --gpu-mem-limit; checks no chip is lost.
    Oom(OomArgs),
    /// Device memory with and without arena shrinking after a large batch.
    Shrink(ShrinkArgs),
}

#[derive(Args, Clone)]
struct Common {
    /// Model directory (tools/export_onnx.py layout).
    #[arg(long)]
    model: PathBuf,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cuda:0")]
    device: Device,
    /// Run the model's float16 vision graph.
    #[arg(long)]
    fp16: bool,
    /// TensorFloat-32 for float32 graphs.
    #[arg(long)]
    tf32: bool,
    /// Intra-op threads (ORT's default when absent).
    #[arg(long)]
    threads: Option<usize>,
    /// libonnxruntime.so (else ORT_DYLIB_PATH, next to the executable, the system).
    #[arg(long)]
    ort_lib: Option<PathBuf>,
    /// Also write the figures to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
}

impl Common {
    fn session_config(&self) -> SessionConfig {
        SessionConfig {
            device: self.device,
            tf32: self.tf32,
            intra_threads: self.threads,
            ort_lib: self.ort_lib.clone(),
            ..SessionConfig::default()
        }
    }

    fn precision(&self) -> &'static str {
        match (self.fp16, self.tf32) {
            (true, _) => "fp16",
            (false, true) => "fp32+tf32",
            (false, false) => "fp32",
        }
    }
}

#[derive(Args)]
struct UnpackArgs {
    /// manifest.json written by bench/gpu/prepare.sh.
    #[arg(long)]
    manifest: PathBuf,
    /// Which entry of the manifest's `chunked` list.
    #[arg(long, default_value = "libonnxruntime_providers_cuda.so")]
    name: String,
    /// Folders to look for the chunk files in, first match wins; the manifest's
    /// own folder is tried last.
    #[arg(long = "chunks-dir")]
    chunks_dirs: Vec<PathBuf>,
    /// Folder to write the decompressed file into.
    #[arg(long)]
    dest: PathBuf,
}

#[derive(Args)]
struct SweepArgs {
    #[command(flatten)]
    common: Common,
    /// Largest bucket timed.
    #[arg(long, default_value_t = 256)]
    max_batch: usize,
    /// Largest bucket the adaptive probe may choose (`--max-batch` of rsembed run); 0 skips the probe.
    #[arg(long, default_value_t = 256)]
    probe_max_batch: usize,
    /// Untimed runs per bucket (the first of them shrinks the arena, so the
    /// memory sampled is this bucket's own).
    #[arg(long, default_value_t = 2)]
    warm_runs: usize,
    /// Timed runs per bucket, at least.
    #[arg(long, default_value_t = 2)]
    min_runs: usize,
    /// Timed runs per bucket, at most.
    #[arg(long, default_value_t = 10)]
    max_runs: usize,
    /// Stop timing a bucket once its timed runs took this long (after --min-runs).
    #[arg(long, default_value_t = 1.5)]
    bucket_seconds: f64,
    /// Skip the remaining buckets once the sweep has run this long.
    #[arg(long, default_value_t = 150.0)]
    deadline_seconds: f64,
}

#[derive(Args)]
struct OomArgs {
    #[command(flatten)]
    common: Common,
    /// The CUDA arena cap, e.g. 2GiB.
    #[arg(long, default_value = "2GiB", value_parser = parse_byte_size)]
    gpu_mem_limit: u64,
    /// Largest bucket (`--max-batch`); the controller starts there.
    #[arg(long, default_value_t = 256)]
    max_batch: usize,
    /// Requests (batches handed to the adaptive layer).
    #[arg(long, default_value_t = 3)]
    requests: usize,
    /// Images per request.
    #[arg(long, default_value_t = 256)]
    request_size: usize,
    /// Batch size of the reference embeddings (must fit under the cap).
    #[arg(long, default_value_t = 8)]
    reference_batch: usize,
}

#[derive(Args)]
struct ShrinkArgs {
    #[command(flatten)]
    common: Common,
    /// Images per large batch.
    #[arg(long, default_value_t = 256)]
    big: usize,
    /// Images per small batch.
    #[arg(long, default_value_t = 8)]
    small: usize,
    /// Large batches.
    #[arg(long, default_value_t = 3)]
    big_runs: usize,
    /// Small batches (the first with the shrink hint); at least 2.
    #[arg(long, default_value_t = 10)]
    small_runs: usize,
    /// Modes, comma-separated, each in a fresh child process.
    #[arg(long, default_value = "never,on-change,always", value_delimiter = ',')]
    modes: Vec<ArenaShrink>,
    /// Internal: run one mode in this process and print one JSON line.
    #[arg(long, hide = true)]
    child: Option<ArenaShrink>,
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let res = match Cli::parse().part {
        Part::Unpack(a) => unpack(&a),
        Part::Sweep(a) => sweep(&a),
        Part::Oom(a) => oom(&a),
        Part::Shrink(a) => shrink(&a),
    };
    if let Err(e) = res {
        eprintln!("gpu_bench: error: {e}");
        std::process::exit(1);
    }
}

type Res<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn engine_err(what: &str, e: &rsembed_worker::error::Error) -> String {
    format!("{what}: {}", chain(e))
}

fn write_json(path: Option<&Path>, v: &Value) -> Res<()> {
    if let Some(p) = path {
        let s = serde_json::to_string_pretty(v).map_err(err)?;
        std::fs::write(p, s + "\n").map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    Ok(())
}

// --------------------------------------------------------------------- unpack

/// Reads a list of files one after the other.
struct Concat {
    files: std::vec::IntoIter<PathBuf>,
    cur: Option<std::fs::File>,
}

impl Read for Concat {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if let Some(f) = &mut self.cur {
                let n = f.read(buf)?;
                if n > 0 {
                    return Ok(n);
                }
            }
            match self.files.next() {
                Some(p) => self.cur = Some(std::fs::File::open(p)?),
                None => return Ok(0),
            }
        }
    }
}

fn sha256_of(path: &Path) -> Res<(String, u64)> {
    rsembed_worker::model::sha256_file(path).map_err(|e| engine_err("hashing", &e))
}

fn unpack(a: &UnpackArgs) -> Res<()> {
    let t0 = Instant::now();
    let text = std::fs::read_to_string(&a.manifest)
        .map_err(|e| format!("reading {}: {e}", a.manifest.display()))?;
    let m: Value = serde_json::from_str(&text).map_err(err)?;
    let entry = m["chunked"]
        .as_array()
        .and_then(|l| l.iter().find(|e| e["name"] == a.name.as_str()))
        .ok_or_else(|| format!("{} has no chunked entry {}", a.manifest.display(), a.name))?;
    let want_sha = entry["sha256"].as_str().ok_or("entry without sha256")?;
    let want_bytes = entry["bytes"].as_u64().ok_or("entry without bytes")?;
    let out = a.dest.join(&a.name);
    if out.is_file() && sha256_of(&out)?.0 == want_sha {
        println!("{}: already there, sha256 ok", out.display());
        return Ok(());
    }
    let mut dirs = a.chunks_dirs.clone();
    dirs.push(a.manifest.parent().unwrap_or(Path::new(".")).to_owned());
    let mut files = Vec::new();
    let mut missing = Vec::new();
    for (i, c) in entry["chunks"]
        .as_array()
        .ok_or("entry without chunks")?
        .iter()
        .enumerate()
    {
        let rel = c["file"].as_str().ok_or("chunk without file")?;
        let base = Path::new(rel).file_name().ok_or("bad chunk name")?;
        let Some(p) = dirs
            .iter()
            .flat_map(|d| [d.join(base), d.join(rel)])
            .find(|p| p.is_file())
        else {
            missing.push(format!("#{} {rel} (carried by call {})", i + 1, c["call"]));
            continue;
        };
        let (sha, bytes) = sha256_of(&p)?;
        if sha != c["sha256"].as_str().unwrap_or_default() {
            return Err(format!(
                "chunk #{} {} is damaged: sha256 {sha} ({bytes} bytes), manifest {} ({} bytes); \
                 repeat call {}",
                i + 1,
                p.display(),
                c["sha256"],
                c["bytes"],
                c["call"]
            ));
        }
        files.push(p);
    }
    if !missing.is_empty() {
        return Err(format!(
            "chunks missing (looked in {dirs:?}): {}",
            missing.join(", ")
        ));
    }
    let n_chunks = files.len();
    std::fs::create_dir_all(&a.dest).map_err(err)?;
    let part = out.with_extension("part");
    let src = Concat {
        files: files.into_iter(),
        cur: None,
    };
    let mut dec =
        ruzstd::decoding::StreamingDecoder::new(std::io::BufReader::with_capacity(1 << 20, src))
            .map_err(|e| format!("zstd frame: {e}"))?;
    let mut f = std::io::BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(&part).map_err(|e| format!("{}: {e}", part.display()))?,
    );
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = dec
            .read(&mut buf)
            .map_err(|e| format!("zstd decode: {e}"))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        f.write_all(&buf[..k]).map_err(err)?;
        n += k as u64;
    }
    f.flush().map_err(err)?;
    drop(f);
    let got = hex::encode(h.finalize());
    if got != want_sha || n != want_bytes {
        let _ = std::fs::remove_file(&part);
        return Err(format!(
            "{}: reassembled file has sha256 {got} ({n} bytes), manifest says {want_sha} \
             ({want_bytes} bytes)",
            a.name
        ));
    }
    std::fs::rename(&part, &out).map_err(err)?;
    println!(
        "{}: {n} bytes from {n_chunks} chunks, sha256 ok, {:.1} s",
        out.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

// --------------------------------------------------------------------- memory

/// Where memory figures come from: NVML on CUDA (device-wide used bytes),
/// the process's resident set on CPU.
#[derive(Clone)]
enum MemSource {
    Nvml(Arc<Nvml>, u32),
    Rss,
    /// CUDA without NVML: no memory figures, the timings still count.
    Unknown,
}

impl MemSource {
    fn for_device(d: Device) -> Res<MemSource> {
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

    fn name(&self) -> &'static str {
        match self {
            MemSource::Nvml(..) => "nvml device used",
            MemSource::Rss => "process RSS",
            MemSource::Unknown => "none (no NVML)",
        }
    }

    fn used(&self) -> Option<u64> {
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

    fn total(&self) -> Option<u64> {
        match self {
            MemSource::Nvml(n, i) => n.cuda_memory(*i).map(|m| m.total),
            MemSource::Rss | MemSource::Unknown => None,
        }
    }
}

/// Samples memory in a background thread and keeps the maximum.
struct Sampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Sampler {
    fn start(src: &MemSource) -> Sampler {
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

    fn finish(self, src: &MemSource) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        if let Some(u) = src.used() {
            self.peak.fetch_max(u, Ordering::Relaxed);
        }
        self.peak.load(Ordering::Relaxed)
    }
}

fn mib(b: Option<u64>) -> String {
    b.map_or("-".into(), |b| {
        format!("{:.0}", b as f64 / (1u64 << 20) as f64)
    })
}

fn mib_f(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

// --------------------------------------------------------------------- inputs

/// `n` distinct pseudo-random images in [-1, 1], image `first + i` always the
/// same whatever batch it is in.
fn images(first: usize, n: usize, s: ImageShape) -> PixelBatch {
    let len = s.channels * s.height * s.width;
    let mut data = Vec::with_capacity(n * len);
    for k in first..first + n {
        // xorshift64*, seeded by the image index.
        let mut x = (k as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for _ in 0..len {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40; // 24 bits
            data.push(r as f32 / (1u32 << 23) as f32 - 1.0);
        }
    }
    PixelBatch {
        n,
        channels: s.channels,
        height: s.height,
        width: s.width,
        data,
    }
}

fn prefix(b: &PixelBatch, n: usize) -> PixelBatch {
    PixelBatch {
        n,
        channels: b.channels,
        height: b.height,
        width: b.width,
        data: b.data[..n * b.image_len()].to_vec(),
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (*x as f64, *y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    ab / (aa.sqrt() * bb.sqrt()).max(1e-30)
}

fn read_f32(path: &Path) -> Res<Vec<f32>> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() % 4 != 0 {
        return Err(format!("{}: not float32 data", path.display()));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn open(c: &Common, cfg: &SessionConfig) -> Res<(ModelDir, OrtVision, f64)> {
    let model = ModelDir::open(&c.model).map_err(|e| engine_err("model directory", &e))?;
    let t = Instant::now();
    let v = OrtVision::open(&model, c.fp16, cfg).map_err(|e| engine_err("opening", &e))?;
    Ok((model, v, t.elapsed().as_secs_f64()))
}

// --------------------------------------------------------------------- parity

/// Embeds `bench_parity.json`'s input with this session and compares with
/// PyTorch's float32 embeddings (both L2-normalized).
fn parity(model: &ModelDir, v: &mut OrtVision) -> Res<Value> {
    let spec_path = model.dir.join("bench_parity.json");
    if !spec_path.is_file() {
        return Ok(Value::Null);
    }
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(&spec_path).map_err(err)?).map_err(err)?;
    let n = spec["n"].as_u64().ok_or("bench_parity.json: n")? as usize;
    let dim = spec["dim"].as_u64().ok_or("bench_parity.json: dim")? as usize;
    let input = read_f32(&model.dir.join(spec["input"].as_str().ok_or("input")?))?;
    let reference = read_f32(
        &model
            .dir
            .join(spec["reference"].as_str().ok_or("reference")?),
    )?;
    let s = ImageShape::of_model(model);
    let il = s.channels * s.height * s.width;
    if input.len() != n * il || reference.len() != n * dim {
        return Err(format!(
            "bench_parity.json: {} input / {} reference floats for n={n}, dim={dim}",
            input.len(),
            reference.len()
        ));
    }
    let batch = PixelBatch {
        n,
        channels: s.channels,
        height: s.height,
        width: s.width,
        data: input,
    };
    let got = v.embed(&batch).map_err(|e| engine_err("parity run", &e))?;
    if got.dim != dim {
        return Err(format!(
            "parity: dim {} but the reference has {dim}",
            got.dim
        ));
    }
    let cos: Vec<f64> = (0..n)
        .map(|i| cosine(got.row(i), &reference[i * dim..(i + 1) * dim]))
        .collect();
    let min = cos.iter().copied().fold(1.0, f64::min);
    let max_abs = (0..n * dim)
        .map(|i| (got.data[i] - reference[i]).abs())
        .fold(0f32, f32::max);
    Ok(json!({ "n": n, "min_cosine": min, "max_abs_diff_normalized": max_abs }))
}

// --------------------------------------------------------------------- sweep

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn sweep(a: &SweepArgs) -> Res<()> {
    let c = &a.common;
    let cfg = c.session_config();
    let mem = MemSource::for_device(c.device)?;
    let mem_before_open = mem.used();
    let (model, v, open_s) = open(c, &cfg)?;
    let mem_loaded = mem.used();
    let shape = ImageShape::of_model(&model);
    let mut adaptive = Adaptive::new(
        v,
        AdaptiveConfig {
            max_batch: a.probe_max_batch.max(1),
            ..AdaptiveConfig::default()
        },
    );
    let parity = parity(&model, adaptive.inner_mut())?;

    // The probe, on a fresh session, as `rsembed run --batch-size auto` does it.
    let mut probe = Value::Null;
    if a.probe_max_batch > 0 {
        let t = Instant::now();
        match adaptive.probe(shape) {
            Ok(table) => {
                let st = adaptive.stats();
                let rows: Vec<Value> = table
                    .iter()
                    .map(|r| {
                        json!({
                            "bucket": r.bucket,
                            "images_per_s": r.images_per_s,
                            "memory_used": r.memory_used,
                            "outcome": r.outcome.as_str(),
                        })
                    })
                    .collect();
                probe = json!({
                    "max_batch": a.probe_max_batch,
                    "chosen": st.target,
                    "ceiling": st.ceiling,
                    "seconds": t.elapsed().as_secs_f64(),
                    "rows": rows,
                });
            }
            Err(e) => probe = json!({ "error": chain(&e) }),
        }
    }

    let v = adaptive.inner_mut();
    let all = images(0, a.max_batch, shape);
    let t_sweep = Instant::now();
    let mut rows = Vec::new();
    for b in buckets(a.max_batch) {
        if t_sweep.elapsed().as_secs_f64() > a.deadline_seconds {
            rows.push(json!({ "bucket": b, "status": "skipped (deadline)" }));
            continue;
        }
        let batch = prefix(&all, b);
        let mut status = "ok".to_owned();
        // Warm runs: the first ends with a shrink, returning what larger
        // buckets (the probe) left in the arena; the second grows the arena
        // to this bucket's own size and builds its plan.
        for i in 0..a.warm_runs {
            if let Err(e) = v.run(
                &batch,
                RunHints {
                    shrink_arena: i == 0,
                },
            ) {
                status = if is_out_of_memory(&e) {
                    "oom".into()
                } else {
                    format!("error: {}", chain(&e))
                };
                break;
            }
        }
        if status != "ok" {
            rows.push(json!({ "bucket": b, "status": status }));
            break; // larger buckets need more memory still
        }
        let sampler = Sampler::start(&mem);
        let mut times = Vec::new();
        let t_bucket = Instant::now();
        while times.len() < a.max_runs.max(1)
            && (times.len() < a.min_runs.max(1)
                || t_bucket.elapsed().as_secs_f64() < a.bucket_seconds)
        {
            let t = Instant::now();
            if let Err(e) = v.run(&batch, RunHints::default()) {
                status = if is_out_of_memory(&e) {
                    "oom".into()
                } else {
                    format!("error: {}", chain(&e))
                };
                break;
            }
            times.push(t.elapsed().as_secs_f64());
        }
        let peak = sampler.finish(&mem);
        if times.is_empty() {
            rows.push(json!({ "bucket": b, "status": status }));
            break;
        }
        let best = times.iter().copied().fold(f64::MAX, f64::min);
        let med = median(times.clone());
        rows.push(json!({
            "bucket": b,
            "status": status,
            "runs": times.len(),
            "best_ms": best * 1e3,
            "median_ms": med * 1e3,
            "images_per_s": b as f64 / best,
            "images_per_s_median": b as f64 / med,
            "memory_peak": peak,
            "memory_after": mem.used(),
        }));
        if status != "ok" {
            break;
        }
    }
    let sweep_s = t_sweep.elapsed().as_secs_f64();

    println!(
        "## sweep: {} on {}, {} ({}x{}), memory = {}",
        c.precision(),
        c.device,
        model.manifest.name,
        shape.height,
        shape.width,
        mem.name()
    );
    println!(
        "open {open_s:.1} s; memory before open {} MiB, loaded {} MiB; sweep {sweep_s:.1} s",
        mib(mem_before_open),
        mib(mem_loaded)
    );
    if !parity.is_null() {
        println!("parity vs PyTorch fp32: {parity}");
    }
    if let Some(rows) = probe["rows"].as_array() {
        let line: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{}:{:.1}{}",
                    r["bucket"],
                    r["images_per_s"].as_f64().unwrap_or(0.0),
                    match r["outcome"].as_str() {
                        Some("measured") => "",
                        Some(o) => o,
                        None => "?",
                    }
                )
            })
            .collect();
        println!(
            "adaptive probe (max {}): chose {} (ceiling {}), {:.1} s; bucket:images/s {}",
            probe["max_batch"],
            probe["chosen"],
            probe["ceiling"],
            probe["seconds"].as_f64().unwrap_or(0.0),
            line.join(" ")
        );
    } else if !probe.is_null() {
        println!("adaptive probe: {probe}");
    }
    println!("\n| bucket | images/s (best) | images/s (median) | ms/run (best) | runs | peak MiB | status |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            r["bucket"],
            r["images_per_s"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:.1}")),
            r["images_per_s_median"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:.1}")),
            r["best_ms"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:.2}")),
            r["runs"].as_u64().map_or("-".into(), |x| x.to_string()),
            mib(r["memory_peak"].as_u64()),
            r["status"].as_str().unwrap_or("?"),
        );
    }
    write_json(
        c.json.as_deref(),
        &json!({
            "part": "sweep",
            "precision": c.precision(),
            "device": c.device.to_string(),
            "model": model.manifest.name,
            "image": [shape.height, shape.width],
            "memory_source": mem.name(),
            "memory_total": mem.total(),
            "memory_before_open": mem_before_open,
            "memory_loaded": mem_loaded,
            "open_seconds": open_s,
            "sweep_seconds": sweep_s,
            "parity": parity,
            "probe": probe,
            "rows": rows,
        }),
    )
}

// --------------------------------------------------------------------- oom

fn oom(a: &OomArgs) -> Res<()> {
    let c = &a.common;
    let mut cfg = c.session_config();
    cfg.gpu_mem_limit = Some(a.gpu_mem_limit);
    let mem = MemSource::for_device(c.device)?;
    let (model, mut v, open_s) = open(c, &cfg)?;
    let shape = ImageShape::of_model(&model);
    let total = a.requests * a.request_size;

    // The reference: every image embedded by the same session in small batches.
    let t = Instant::now();
    let mut reference: Vec<f32> = Vec::new();
    let mut dim = 0;
    let mut i = 0;
    while i < total {
        let n = a.reference_batch.max(1).min(total - i);
        let e = v
            .embed(&images(i, n, shape))
            .map_err(|e| engine_err("reference batch (lower --reference-batch)", &e))?;
        dim = e.dim;
        reference.extend_from_slice(&e.data);
        i += n;
    }
    let reference_s = t.elapsed().as_secs_f64();

    // Unprobed, the controller starts at the largest bucket: the first
    // request runs out of memory and is split until the pieces fit.
    let mut ad = Adaptive::new(
        v,
        AdaptiveConfig {
            max_batch: a.max_batch,
            ..AdaptiveConfig::default()
        },
    );
    let start_bucket = ad.stats().bucket;
    let sampler = Sampler::start(&mem);
    let t = Instant::now();
    let mut per_request = Vec::new();
    let mut out: Vec<Embeddings> = Vec::new();
    let mut failures = Vec::new();
    for r in 0..a.requests {
        let before = ad.stats();
        let tr = Instant::now();
        match ad.embed(&images(r * a.request_size, a.request_size, shape)) {
            Ok(e) => {
                let after = ad.stats();
                per_request.push(json!({
                    "request": r,
                    "seconds": tr.elapsed().as_secs_f64(),
                    "ooms": after.ooms - before.ooms,
                    "runs": after.runs - before.runs,
                    "bucket_after": after.bucket,
                    "ceiling_after": after.ceiling,
                }));
                out.push(e);
            }
            Err(e) => {
                failures.push(format!("request {r}: {}", chain(&e)));
                per_request.push(json!({ "request": r, "error": chain(&e) }));
            }
        }
    }
    let run_s = t.elapsed().as_secs_f64();
    let peak = sampler.finish(&mem);
    let st = ad.stats();

    // Every chip back, in order: row k's nearest reference is image k.
    let rows: Vec<&[f32]> = out
        .iter()
        .flat_map(|e| (0..e.n).map(|i| e.row(i)))
        .collect();
    let returned = rows.len();
    let mut misplaced = 0usize;
    let mut min_own = 1f64;
    let mut max_other = -1f64;
    for (k, row) in rows.iter().enumerate() {
        let own = cosine(row, &reference[k * dim..(k + 1) * dim]);
        min_own = min_own.min(own);
        let mut best_other = -1f64;
        for j in (0..total).filter(|&j| j != k) {
            best_other = best_other.max(cosine(row, &reference[j * dim..(j + 1) * dim]));
        }
        max_other = max_other.max(best_other);
        if best_other >= own {
            misplaced += 1;
        }
    }
    let lost = total - returned.min(total);
    let ok = failures.is_empty() && lost == 0 && misplaced == 0;

    println!(
        "## oom: {} on {} under --gpu-mem-limit {} MiB, {} requests of {} images, max bucket {}",
        c.precision(),
        c.device,
        a.gpu_mem_limit >> 20,
        a.requests,
        a.request_size,
        a.max_batch
    );
    println!(
        "open {open_s:.1} s, reference (batches of {}) {reference_s:.1} s",
        a.reference_batch
    );
    println!("| start bucket | OOMs | runs | shrink runs | final bucket | ceiling | hard limit | failed requests | chips in | chips out | lost | misplaced | min cos own | max cos other | images/s | peak MiB |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    println!(
        "| {start_bucket} | {} | {} | {} | {} | {} | {} | {} | {total} | {returned} | {lost} | {misplaced} | {min_own:.6} | {max_other:.6} | {:.1} | {} |",
        st.ooms,
        st.runs,
        st.shrink_runs,
        st.bucket,
        st.ceiling,
        st.hard_limit.map_or("-".into(), |h| h.to_string()),
        st.failed_requests,
        returned as f64 / run_s,
        mib(Some(peak)),
    );
    if let Some(m) = &st.last_oom {
        println!("last OOM message: {}", m.lines().next().unwrap_or(""));
    }
    for f in &failures {
        println!("FAILED {f}");
    }
    println!(
        "{}",
        if ok {
            "RESULT ok: zero lost chips"
        } else {
            "RESULT FAILED"
        }
    );
    write_json(
        c.json.as_deref(),
        &json!({
            "part": "oom",
            "precision": c.precision(),
            "device": c.device.to_string(),
            "gpu_mem_limit": a.gpu_mem_limit,
            "max_batch": a.max_batch,
            "requests": a.requests,
            "request_size": a.request_size,
            "open_seconds": open_s,
            "reference_seconds": reference_s,
            "run_seconds": run_s,
            "images_per_s": returned as f64 / run_s,
            "memory_source": mem.name(),
            "memory_peak": peak,
            "start_bucket": start_bucket,
            "ooms": st.ooms,
            "runs": st.runs,
            "shrink_runs": st.shrink_runs,
            "final_bucket": st.bucket,
            "ceiling": st.ceiling,
            "hard_limit": st.hard_limit,
            "failed_requests": st.failed_requests,
            "padded_images": st.padded_images,
            "last_oom": st.last_oom.as_deref(),
            "chips_in": total,
            "chips_out": returned,
            "lost": lost,
            "misplaced": misplaced,
            "min_cosine_own": min_own,
            "max_cosine_other": max_other,
            "per_request": per_request,
            "ok": ok,
        }),
    )?;
    if ok {
        Ok(())
    } else {
        Err("out-of-memory recovery lost, misplaced or failed chips".into())
    }
}

// --------------------------------------------------------------------- shrink

fn shrink_child(a: &ShrinkArgs, mode: ArenaShrink) -> Res<()> {
    let c = &a.common;
    if a.small_runs < 2 {
        return Err("--small-runs must be at least 2".into());
    }
    let mut cfg = c.session_config();
    cfg.arena_shrink = mode;
    let mem = MemSource::for_device(c.device)?;
    let before = mem.used();
    let (model, mut v, open_s) = open(c, &cfg)?;
    let loaded = mem.used();
    let shape = ImageShape::of_model(&model);
    let big = images(0, a.big, shape);
    let small = images(0, a.small, shape);
    let sampler = Sampler::start(&mem);
    let mut big_t = Vec::new();
    for _ in 0..a.big_runs.max(1) {
        let t = Instant::now();
        v.run(&big, RunHints::default())
            .map_err(|e| engine_err("big batch", &e))?;
        big_t.push(t.elapsed().as_secs_f64());
    }
    let after_big = mem.used();
    let mut small_t = Vec::new();
    let mut after_first_small = None;
    for i in 0..a.small_runs {
        // The bucket just fell: the adaptive layer asks for one shrink.
        let hints = RunHints {
            shrink_arena: i == 0,
        };
        let t = Instant::now();
        v.run(&small, hints)
            .map_err(|e| engine_err("small batch", &e))?;
        small_t.push(t.elapsed().as_secs_f64());
        if i == 0 {
            after_first_small = mem.used();
        }
    }
    let after_small = mem.used();
    let peak = sampler.finish(&mem);
    println!(
        "{}",
        json!({
            "mode": mode.to_string(),
            "open_seconds": open_s,
            "memory_before_open": before,
            "memory_loaded": loaded,
            "memory_after_big": after_big,
            "memory_after_first_small": after_first_small,
            "memory_after_small": after_small,
            "memory_peak": peak,
            "big_ms": median(big_t) * 1e3,
            "small_first_ms": small_t[0] * 1e3,
            "small_second_ms": small_t[1] * 1e3,
            "small_ms": median(small_t[1..].to_vec()) * 1e3,
        })
    );
    Ok(())
}

fn shrink(a: &ShrinkArgs) -> Res<()> {
    if let Some(mode) = a.child {
        return shrink_child(a, mode);
    }
    let c = &a.common;
    let exe = std::env::current_exe().map_err(err)?;
    let mut results = Vec::new();
    for mode in &a.modes {
        let mut cmd = Command::new(&exe);
        cmd.arg("shrink")
            .arg("--child")
            .arg(mode.to_string())
            .arg("--model")
            .arg(&c.model)
            .args(["--device", &c.device.to_string()])
            .args(["--big", &a.big.to_string()])
            .args(["--small", &a.small.to_string()])
            .args(["--big-runs", &a.big_runs.to_string()])
            .args(["--small-runs", &a.small_runs.to_string()]);
        if c.fp16 {
            cmd.arg("--fp16");
        }
        if c.tf32 {
            cmd.arg("--tf32");
        }
        if let Some(t) = c.threads {
            cmd.args(["--threads", &t.to_string()]);
        }
        if let Some(l) = &c.ort_lib {
            cmd.arg("--ort-lib").arg(l);
        }
        let out = cmd.output().map_err(err)?;
        if !out.status.success() {
            return Err(format!(
                "shrink child {mode}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let line = String::from_utf8_lossy(&out.stdout);
        let r: Value = serde_json::from_str(line.trim())
            .map_err(|e| format!("shrink child {mode} printed {line:?}: {e}"))?;
        results.push(r);
    }
    let mem_name = MemSource::for_device(c.device)?.name();
    println!(
        "## shrink: {} on {}, {} x {} images then {} x {} (first with the shrink hint), memory = {mem_name}",
        c.precision(),
        c.device,
        a.big_runs,
        a.big,
        a.small_runs,
        a.small
    );
    println!("| --arena-shrink | loaded MiB | after big | after 1st small | after small | peak | returned MiB | ms/run big | ms small #1 (shrink) | ms small #2 | ms/run small (median) |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let g = |r: &Value, k: &str| r[k].as_u64();
    let f = |r: &Value, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    for r in &results {
        let returned = match (g(r, "memory_after_big"), g(r, "memory_after_small")) {
            (Some(b), Some(s)) => format!("{:.0}", (mib_f(b) - mib_f(s)).round() + 0.0),
            _ => "-".into(),
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {returned} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r["mode"].as_str().unwrap_or("?"),
            mib(g(r, "memory_loaded")),
            mib(g(r, "memory_after_big")),
            mib(g(r, "memory_after_first_small")),
            mib(g(r, "memory_after_small")),
            mib(g(r, "memory_peak")),
            f(r, "big_ms"),
            f(r, "small_first_ms"),
            f(r, "small_second_ms"),
            f(r, "small_ms"),
        );
    }
    write_json(
        c.json.as_deref(),
        &json!({
            "part": "shrink",
            "precision": c.precision(),
            "device": c.device.to_string(),
            "memory_source": mem_name,
            "big": a.big,
            "small": a.small,
            "big_runs": a.big_runs,
            "small_runs": a.small_runs,
            "modes": results,
        }),
    )
}
