//! Command-line flags, grouped as the contract groups them. Every flag also
//! reads an `RSEMBED_*` environment variable.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use rsembed_worker::engine::session::{
    parse_byte_size, ArenaExtendStrategy, ArenaShrink, ConvAlgoSearch, Device, GraphOptLevel,
    SessionConfig,
};

/// rsembed: remote-sensing archives to searchable Git-RSCLIP embeddings.
#[derive(Debug, Parser)]
#[command(name = "rsembed", version, about, args_override_self = true)]
pub struct Cli {
    /// Log format: `text` for terminals, `json` for clusters.
    #[arg(
        long,
        env = "RSEMBED_LOG_FORMAT",
        default_value = "text",
        global = true
    )]
    pub log_format: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Embedded mode: plan, embed and write the whole job in this process.
    Run(RunArgs),
    /// Dry run: the inputs and tasks a job would have; writes nothing.
    Plan(PlanArgs),
    /// Text embeddings, one JSON array per line.
    Text(TextArgs),
}

/// How inputs are cut into chips.
#[derive(Debug, Clone, Args)]
pub struct TilingArgs {
    /// Chip size in source pixels. Default: the model's input size, so chips need no resize.
    #[arg(long, env = "RSEMBED_CHIP_SIZE")]
    pub chip_size: Option<u32>,
    /// Stride in source pixels. Default: the chip size (no overlap).
    #[arg(long, env = "RSEMBED_STRIDE")]
    pub stride: Option<u32>,
    /// 1-based band indexes in R,G,B order, e.g. `4,3,2`. Default: 1,2,3 (1 replicated for one-band rasters).
    #[arg(long, env = "RSEMBED_BANDS", value_delimiter = ',')]
    pub bands: Option<Vec<u32>>,
    /// `auto`, `none`, or `MIN:MAX` linear to 0-255. `auto` keeps 8-bit data as it is and
    /// stretches other data by scene-level 2nd-98th percentiles.
    #[arg(long, env = "RSEMBED_SCALE", default_value = "auto")]
    pub scale: String,
    /// Drop chips whose valid fraction is below this. Default: drop only chips with no valid pixel.
    #[arg(long, env = "RSEMBED_MIN_VALID")]
    pub min_valid: Option<f32>,
    /// Inputs per task, on average. Task boundaries are content-defined, so adding
    /// a file to an archive changes one task, not all the tasks after it.
    #[arg(long, env = "RSEMBED_TASK_SIZE", default_value_t = 64)]
    pub task_size: usize,
    /// Scenes stored one file per band: group files whose names differ only in
    /// these suffixes, in R,G,B order (Landsat `B4,B3,B2`, Sentinel-2 `B04,B03,B02`).
    /// Other files are skipped. Bands on a coarser grid are resampled onto the finest.
    #[arg(long, env = "RSEMBED_BAND_FILES", value_delimiter = ',')]
    pub band_files: Option<Vec<String>>,
    /// GeoTIFFs at least this large (bytes) are split into tasks of chip blocks
    /// of about `--task-size` chips each, so one scene spreads over many workers and
    /// a task reads only its region. Smaller TIFFs are one task input.
    #[arg(long, env = "RSEMBED_SHARD_BYTES", default_value_t = 16 << 20)]
    pub shard_bytes: u64,
}

/// How inference runs. `docs/gpu-memory.md` explains each setting and its default.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// `cpu`, `cuda` or `cuda:N`. CUDA that cannot be used is an error with ONNX
    /// Runtime's reason, never a silent fall back to the CPU.
    #[arg(long, env = "RSEMBED_DEVICE", default_value = "cpu")]
    pub device: Device,
    /// Images per inference call: `auto` (adaptive: a warm-up probe picks the
    /// fastest power-of-two bucket up to `--max-batch`, out-of-memory errors split
    /// the batch and lower the ceiling, and it climbs back after a run of
    /// successes) or a fixed number.
    #[arg(long, env = "RSEMBED_BATCH_SIZE", default_value = "auto")]
    pub batch_size: String,
    /// The largest bucket `--batch-size auto` may use. Default: 64 on CUDA, 16 on
    /// CPU, where larger batches are rarely faster and the probe would cost minutes
    /// with a full-size model.
    #[arg(long, env = "RSEMBED_MAX_BATCH")]
    pub max_batch: Option<usize>,
    /// Cap on ONNX Runtime's CUDA memory arena: bytes, or with a unit (`8GiB`,
    /// `512MiB`, `8GB`). It caps the arena only, not the CUDA context or cuDNN's
    /// workspace. Default: no cap. CUDA only; ignored on CPU.
    #[arg(long, env = "RSEMBED_GPU_MEM_LIMIT", value_parser = parse_byte_size)]
    pub gpu_mem_limit: Option<u64>,
    /// How the CUDA arena grows: `same-as-requested` (exactly what is asked for) or
    /// `next-power-of-two` (ORT's own default, which can reserve up to twice what a
    /// run needs).
    #[arg(
        long,
        env = "RSEMBED_ARENA_EXTEND_STRATEGY",
        default_value = "same-as-requested"
    )]
    pub arena_extend_strategy: ArenaExtendStrategy,
    /// cuDNN convolution algorithm search: `heuristic`, `exhaustive` or `default`.
    /// Default `heuristic`: SigLIP's one convolution (the patch embedding) is a tiny
    /// share of the work, and an exhaustive search would benchmark, with a large
    /// workspace, at the first run of every batch bucket.
    #[arg(
        long,
        env = "RSEMBED_CUDNN_CONV_ALGO_SEARCH",
        default_value = "heuristic"
    )]
    pub cudnn_conv_algo_search: ConvAlgoSearch,
    /// TensorFloat-32 for float32 MatMul and Conv on CUDA (Ampere and later): faster,
    /// with a 10-bit mantissa. Off by default, so fp32 embeddings stay fp32.
    #[arg(long, env = "RSEMBED_TF32")]
    pub tf32: bool,
    /// Put the TensorRT execution provider in front of CUDA (needs TensorRT's
    /// libraries; engines are built at start and for each new batch shape).
    #[arg(long, env = "RSEMBED_TENSORRT")]
    pub tensorrt: bool,
    /// Use the model's float16 vision graph (`vision_fp16` in rsembed-model.json).
    #[arg(long, env = "RSEMBED_FP16")]
    pub fp16: bool,
    /// Threads inside one ONNX Runtime operator. Default: ONNX Runtime's choice (one per core).
    #[arg(long, env = "RSEMBED_INTRA_THREADS")]
    pub intra_threads: Option<usize>,
    /// Threads running independent graph nodes at once; more than 1 switches ONNX
    /// Runtime to parallel execution. Default: sequential (SigLIP is one chain of
    /// layers, so there is little to run side by side).
    #[arg(long, env = "RSEMBED_INTER_THREADS")]
    pub inter_threads: Option<usize>,
    /// Graph optimisation level: `disable`, `basic`, `extended` or `all` (default).
    #[arg(long, env = "RSEMBED_GRAPH_OPT_LEVEL", default_value = "all")]
    pub graph_opt_level: GraphOptLevel,
    /// Write ONNX Runtime's profile (Chrome trace JSON, chrome://tracing or Perfetto)
    /// to this file when the session closes. Default: no profiling.
    #[arg(long, env = "RSEMBED_ORT_PROFILE")]
    pub ort_profile: Option<PathBuf>,
    /// When a run returns the arena's free memory to the device: `never`,
    /// `on-change` (after the batch bucket shrinks and on every retry after an
    /// out-of-memory error; default) or `always` (after every run).
    #[arg(long, env = "RSEMBED_ARENA_SHRINK", default_value = "on-change")]
    pub arena_shrink: ArenaShrink,
    /// Path of libonnxruntime.so. Default: ORT_DYLIB_PATH, then next to the executable, then the system.
    #[arg(long, env = "RSEMBED_ORT_LIB")]
    pub ort_lib: Option<PathBuf>,
}

impl EngineArgs {
    /// The ONNX Runtime session settings these flags ask for.
    pub fn session_config(&self) -> SessionConfig {
        SessionConfig {
            device: self.device,
            gpu_mem_limit: self.gpu_mem_limit,
            arena_extend_strategy: self.arena_extend_strategy,
            cudnn_conv_algo_search: self.cudnn_conv_algo_search,
            tf32: self.tf32,
            tensorrt: self.tensorrt,
            intra_threads: self.intra_threads,
            inter_threads: self.inter_threads,
            graph_opt_level: self.graph_opt_level,
            ort_profile: self.ort_profile.clone(),
            arena_shrink: self.arena_shrink,
            ort_lib: self.ort_lib.clone(),
        }
    }

    /// How batches are sized.
    pub fn batch_policy(&self) -> Result<BatchPolicy, String> {
        match self.batch_size.as_str() {
            "auto" => {
                let default = match self.device {
                    Device::Cpu => 16,
                    Device::Cuda(_) => 64,
                };
                match self.max_batch.unwrap_or(default) {
                    v @ 1..=4096 => Ok(BatchPolicy::Auto { max_batch: v }),
                    v => Err(format!("--max-batch must be 1..=4096, not `{v}`")),
                }
            }
            n => match n.parse::<usize>() {
                Ok(v) if (1..=4096).contains(&v) => Ok(BatchPolicy::Fixed(v)),
                _ => Err(format!(
                    "--batch-size must be `auto` or 1..=4096, not `{n}`"
                )),
            },
        }
    }
}

/// `--batch-size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchPolicy {
    /// The adaptive controller, with buckets up to `max_batch`.
    Auto {
        /// The largest bucket.
        max_batch: usize,
    },
    /// Every batch this size (the last of a task may be smaller).
    Fixed(usize),
}

impl BatchPolicy {
    /// The most images one batch may hold.
    pub fn max(self) -> usize {
        match self {
            BatchPolicy::Auto { max_batch } => max_batch,
            BatchPolicy::Fixed(n) => n,
        }
    }
}

/// `rsembed run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Input: a local folder or file, or an object store URL (s3://, gs://, az://, http(s)://).
    #[arg(long, env = "RSEMBED_INPUT")]
    pub input: String,
    /// Output: a local folder or an object store URL; gets job.json, chips/, errors/, manifest.json.
    #[arg(long, env = "RSEMBED_OUTPUT")]
    pub output: String,
    /// Model directory (see tools/export_onnx.py).
    #[arg(long, env = "RSEMBED_MODEL")]
    pub model: PathBuf,
    /// Tiling.
    #[command(flatten)]
    pub tiling: TilingArgs,
    /// Inference.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Tasks processed at once; two keep the model busy while one task is written.
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
    /// Serve Prometheus metrics at `http://<HOST:PORT>/metrics` while the job runs
    /// (chips, failed inputs, batch size and ceiling, out-of-memory count, inference
    /// time, queue depths, GPU memory). Default: off.
    #[arg(long, env = "RSEMBED_METRICS_ADDR", value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// Print the summary as JSON instead of text.
    #[arg(long, env = "RSEMBED_JSON")]
    pub json: bool,
}

/// `rsembed plan`.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// Input: a local folder or file, or an object store URL.
    #[arg(long, env = "RSEMBED_INPUT")]
    pub input: String,
    /// Tiling.
    #[command(flatten)]
    pub tiling: TilingArgs,
    /// Print the plan as JSON.
    #[arg(long, env = "RSEMBED_JSON")]
    pub json: bool,
}

/// `rsembed text`.
#[derive(Debug, Clone, Args)]
pub struct TextArgs {
    /// Model directory.
    #[arg(long, env = "RSEMBED_MODEL")]
    pub model: PathBuf,
    /// Inference (only device, threads and the ORT library matter here).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Texts to embed; each gets one output line.
    #[arg(required = true)]
    pub texts: Vec<String>,
}
