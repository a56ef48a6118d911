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
//! - `copies`: the engine's time per chip split into compute, copy out and
//!   copy in (from pinned and from pageable host memory), for the float graph
//!   and the uint8 entry, at a few buckets.
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

mod copies;
mod inputs;
mod memory;
mod oom;
mod shrink;
mod sweep;
mod unpack;

use copies::*;
use inputs::*;
use memory::*;
use oom::*;
use shrink::*;
use sweep::*;
use unpack::*;

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
    /// Engine time per chip split into copy in, compute and copy out.
    Copies(CopiesArgs),
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
struct CopiesArgs {
    #[command(flatten)]
    common: Common,
    /// Buckets to time.
    #[arg(long, default_value = "1,16,64,256", value_delimiter = ',')]
    buckets: Vec<usize>,
    /// Timed runs per bucket and way (the median is kept).
    #[arg(long, default_value_t = 5)]
    runs: usize,
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
        Part::Copies(a) => copies(&a),
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
