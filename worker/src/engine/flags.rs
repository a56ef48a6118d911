//! The inference flags, shared by `rsembed run` and `rsembed-worker`
//! ([`crate::engine::start`] starts the engine they describe).

use std::path::PathBuf;

use clap::Args;

use crate::engine::session::{
    parse_byte_size, ArenaExtendStrategy, ArenaShrink, ConvAlgoSearch, Device, GraphOptLevel,
    InputDtype, SessionConfig,
};
use crate::error::Result;

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
    /// Which vision entry to feed: `auto` (the model's uint8 entry, `vision_u8`, when
    /// it has a valid one: 8-bit NHWC pixels, a quarter of the bytes, rescaled and
    /// normalized in the graph; the float graph otherwise), `float` (always float32
    /// pixels, for comparison) or `uint8` (an error without the entry).
    #[arg(long, env = "RSEMBED_INPUT_DTYPE", default_value = "auto")]
    pub input_dtype: InputDtype,
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
            input_dtype: self.input_dtype,
            io_binding: matches!(self.device, Device::Cuda(_)),
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
