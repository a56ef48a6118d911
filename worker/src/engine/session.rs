//! Building ONNX Runtime sessions from engine settings.
//!
//! Every setting here is a command-line flag (`EngineArgs` in the coordinator);
//! `docs/gpu-memory.md` says what each does inside ONNX Runtime and why the
//! defaults are what they are.

use std::path::{Path, PathBuf};

use ort::ep::{self, ArenaExtendStrategy as OrtArenaExtend, ExecutionProviderDispatch};
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::ValueType;

pub use rsembed_schemas::units::parse_byte_size;

use crate::engine::runtime;
use crate::error::{Error, Result};

/// Where inference runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// ONNX Runtime's CPU execution provider.
    Cpu,
    /// CUDA device N.
    Cuda(u32),
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| format!("`{s}` is not cpu, cuda or cuda:N")),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Declares a settings enum spelled in kebab case on the command line.
macro_rules! kebab_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($(#[$vm])* $v),+ }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                match s {
                    $($s => Ok($name::$v),)+
                    _ => Err(format!(
                        "`{s}` is not one of {}",
                        [$($s),+].join(", ")
                    )),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self { $($name::$v => $s),+ })
            }
        }
    };
}

kebab_enum! {
    /// How the CUDA memory arena grows when it needs more.
    ArenaExtendStrategy {
        /// Each extension doubles the previous one: few `cudaMalloc` calls, but up
        /// to twice the memory a run needs (ORT's own default).
        NextPowerOfTwo = "next-power-of-two",
        /// Extend by exactly what the allocation asks for (our default).
        SameAsRequested = "same-as-requested",
    }
}

kebab_enum! {
    /// How cuDNN picks a convolution algorithm (`cudnn_conv_algo_search`).
    ConvAlgoSearch {
        /// Benchmark every algorithm on the first run of each input shape.
        Exhaustive = "exhaustive",
        /// cuDNN's heuristics, no benchmarking (our default).
        Heuristic = "heuristic",
        /// Always `IMPLICIT_PRECOMP_GEMM`.
        Default = "default",
    }
}

kebab_enum! {
    /// ONNX Runtime's graph optimisation level.
    GraphOptLevel {
        /// No rewrites.
        Disable = "disable",
        /// Constant folding and redundant-node removal.
        Basic = "basic",
        /// Plus fusions (attention, GELU, layer norm) for the assigned provider.
        Extended = "extended",
        /// Everything, including layout rewrites (our default).
        All = "all",
    }
}

kebab_enum! {
    /// When a run returns the arena's unused memory to the device
    /// (`memory.enable_memory_arena_shrinkage`).
    ArenaShrink {
        /// Never shrink.
        Never = "never",
        /// When the batching layer asks for it: after the batch bucket shrinks and
        /// on every retry after an out-of-memory error (our default).
        OnChange = "on-change",
        /// After every run.
        Always = "always",
    }
}

kebab_enum! {
    /// Which vision entry a run feeds (`--input-dtype`).
    InputDtype {
        /// The uint8 entry when the model directory has a valid one, the float
        /// graph otherwise (our default).
        Auto = "auto",
        /// Always the float graph: float32 NCHW pixels from the preprocessor.
        Float = "float",
        /// The uint8 entry; an error when the directory has none or it is stale.
        Uint8 = "uint8",
    }
}

/// Session settings shared by the vision and text graphs.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Execution device.
    pub device: Device,
    /// Cap on the CUDA arena, in bytes (`gpu_mem_limit`); `None` is ORT's
    /// unlimited. Ignored on CPU.
    pub gpu_mem_limit: Option<u64>,
    /// How the CUDA arena grows.
    pub arena_extend_strategy: ArenaExtendStrategy,
    /// cuDNN convolution algorithm search.
    pub cudnn_conv_algo_search: ConvAlgoSearch,
    /// TensorFloat-32 for fp32 MatMul and Conv on CUDA.
    pub tf32: bool,
    /// Put the TensorRT execution provider in front of CUDA.
    pub tensorrt: bool,
    /// Threads inside one operator; `None` lets ORT choose (one per core).
    pub intra_threads: Option<usize>,
    /// Threads running independent nodes at once; `Some(n > 1)` switches the
    /// session to ORT's parallel execution mode. `None`: sequential.
    pub inter_threads: Option<usize>,
    /// Graph optimisation level.
    pub graph_opt_level: GraphOptLevel,
    /// Write ORT's profile (Chrome trace JSON) to this file when the session closes.
    pub ort_profile: Option<PathBuf>,
    /// When runs shrink the arena.
    pub arena_shrink: ArenaShrink,
    /// Explicit `libonnxruntime.so`.
    pub ort_lib: Option<PathBuf>,
    /// Which vision entry to feed. The default here is
    /// [`InputDtype::Float`], what a caller with float pixels needs; the
    /// command line's (`--input-dtype`) is [`InputDtype::Auto`], since the
    /// batcher assembles batches in whichever format the engine takes.
    pub input_dtype: InputDtype,
    /// Run the vision graph through IO binding, with an input and an output
    /// allocated once per batch size (CUDA: page-locked host memory). Off runs
    /// the plain way: ORT reads the batch where it is and allocates each
    /// run's output. The command line binds on CUDA only: on the CPU a bound
    /// input is one more copy of every batch, with no device to copy it to.
    pub io_binding: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            device: Device::Cpu,
            gpu_mem_limit: None,
            arena_extend_strategy: ArenaExtendStrategy::SameAsRequested,
            cudnn_conv_algo_search: ConvAlgoSearch::Heuristic,
            tf32: false,
            tensorrt: false,
            intra_threads: None,
            inter_threads: None,
            graph_opt_level: GraphOptLevel::All,
            ort_profile: None,
            arena_shrink: ArenaShrink::OnChange,
            ort_lib: None,
            input_dtype: InputDtype::Float,
            io_binding: false,
        }
    }
}

impl SessionConfig {
    /// The value of the `memory.enable_memory_arena_shrinkage` run option for
    /// this device: `gpu:N` on CUDA, `cpu:0` on CPU.
    pub fn shrink_target(&self) -> String {
        match self.device {
            Device::Cpu => "cpu:0".into(),
            Device::Cuda(n) => format!("gpu:{n}"),
        }
    }

    /// The execution providers to register, in order, each with
    /// `error_on_failure`: a CUDA that cannot be registered fails the session
    /// with ORT's reason instead of falling back to the CPU. Empty on CPU (ORT's
    /// CPU provider is always there).
    pub(crate) fn execution_providers(&self) -> Vec<ExecutionProviderDispatch> {
        let Device::Cuda(n) = self.device else {
            return vec![];
        };
        let mut eps = Vec::new();
        if self.tensorrt {
            eps.push(
                ep::TensorRT::default()
                    .with_device_id(n as i32)
                    .build()
                    .error_on_failure(),
            );
        }
        let mut cuda = ep::CUDA::default()
            .with_device_id(n as i32)
            .with_arena_extend_strategy(match self.arena_extend_strategy {
                ArenaExtendStrategy::NextPowerOfTwo => OrtArenaExtend::NextPowerOfTwo,
                ArenaExtendStrategy::SameAsRequested => OrtArenaExtend::SameAsRequested,
            })
            .with_conv_algorithm_search(match self.cudnn_conv_algo_search {
                ConvAlgoSearch::Exhaustive => ep::cuda::ConvAlgorithmSearch::Exhaustive,
                ConvAlgoSearch::Heuristic => ep::cuda::ConvAlgorithmSearch::Heuristic,
                ConvAlgoSearch::Default => ep::cuda::ConvAlgorithmSearch::Default,
            })
            .with_tf32(self.tf32);
        if let Some(limit) = self.gpu_mem_limit {
            cuda = cuda.with_memory_limit(usize::try_from(limit).unwrap_or(usize::MAX));
        }
        eps.push(cuda.build().error_on_failure());
        eps
    }

    /// The providers as ORT names them, for logs.
    pub(crate) fn provider_names(&self) -> Vec<&'static str> {
        self.execution_providers()
            .iter()
            .map(|e| e.name())
            .chain(["CPUExecutionProvider"])
            .collect()
    }
}

/// Opens an ONNX graph and checks that it has the named input and output.
///
/// On CUDA the providers are registered with `error_on_failure`: when CUDA
/// cannot be used (a CPU-only `libonnxruntime`, no driver, missing CUDA or
/// cuDNN libraries) this fails with ORT's reason rather than running on the CPU.
pub fn open_graph(cfg: &SessionConfig, file: &Path, input: &str, output: &str) -> Result<Session> {
    let (env, _) = runtime::environment(cfg.ort_lib.as_deref())?;
    let ctx = |what: &str| format!("{what} for {}", file.display());
    let mut b = Session::builder(&env)
        .map_err(|e| Error::ort(ctx("session builder"), e))?
        .with_optimization_level(match cfg.graph_opt_level {
            GraphOptLevel::Disable => GraphOptimizationLevel::Disable,
            GraphOptLevel::Basic => GraphOptimizationLevel::Level1,
            GraphOptLevel::Extended => GraphOptimizationLevel::Level2,
            GraphOptLevel::All => GraphOptimizationLevel::All,
        })
        .map_err(|e| Error::ort(ctx("optimization level"), e))?;
    if let Some(n) = cfg.intra_threads {
        b = b
            .with_intra_threads(n)
            .map_err(|e| Error::ort(ctx("intra-op threads"), e))?;
    }
    if let Some(n) = cfg.inter_threads {
        b = b
            .with_parallel_execution(n > 1)
            .map_err(|e| Error::ort(ctx("execution mode"), e))?
            .with_inter_threads(n)
            .map_err(|e| Error::ort(ctx("inter-op threads"), e))?;
    }
    if let Some(p) = &cfg.ort_profile {
        b = b
            .with_profiling(profile_prefix(p))
            .map_err(|e| Error::ort(ctx("profiling"), e))?;
    }
    if cfg.device == Device::Cpu && cfg.gpu_mem_limit.is_some() {
        tracing::warn!("--gpu-mem-limit applies to the CUDA arena only; ignored on cpu");
    }
    let eps = cfg.execution_providers();
    if matches!(cfg.device, Device::Cuda(_)) {
        crate::exit::CUDA_LOADED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    if !eps.is_empty() {
        let names: Vec<&str> = eps.iter().map(|e| e.name()).collect();
        b = b.with_execution_providers(&eps).map_err(|e| {
            Error::ort(
                format!(
                    "{} cannot run on {} (registering {}; rsembed never falls back to the CPU \
                     silently: fix the CUDA setup, use the onnxruntime-gpu library \
                     (scripts/setup-ort.sh --gpu), or pass --device cpu)",
                    file.display(),
                    cfg.device,
                    names.join(", ")
                ),
                e,
            )
        })?;
    }
    let session = b
        .commit_from_file(file)
        .map_err(|e| Error::ort(ctx("loading graph"), e))?;
    let provider = cfg.provider_names()[0];
    match cfg.device {
        Device::Cpu => tracing::info!(
            graph = %file.display(),
            intra_threads = ?cfg.intra_threads,
            inter_threads = ?cfg.inter_threads,
            graph_opt_level = %cfg.graph_opt_level,
            arena_shrink = %cfg.arena_shrink,
            "execution provider: {provider}"
        ),
        Device::Cuda(n) => tracing::info!(
            graph = %file.display(),
            device = n,
            providers = ?cfg.provider_names(),
            gpu_mem_limit = ?cfg.gpu_mem_limit,
            arena_extend_strategy = %cfg.arena_extend_strategy,
            cudnn_conv_algo_search = %cfg.cudnn_conv_algo_search,
            tf32 = cfg.tf32,
            intra_threads = ?cfg.intra_threads,
            inter_threads = ?cfg.inter_threads,
            graph_opt_level = %cfg.graph_opt_level,
            arena_shrink = %cfg.arena_shrink,
            "execution provider: {provider}"
        ),
    }
    check_outlet(
        file,
        "input",
        input,
        session.inputs().iter().map(|o| o.name()),
    )?;
    check_outlet(
        file,
        "output",
        output,
        session.outputs().iter().map(|o| o.name()),
    )?;
    Ok(session)
}

/// ORT writes its profile to `<prefix>_<timestamp>.json`; the prefix is the
/// requested file without its `.json`, and [`finish_profile`] renames the result.
fn profile_prefix(want: &Path) -> PathBuf {
    if want.extension().is_some_and(|e| e == "json") {
        want.with_extension("")
    } else {
        want.to_owned()
    }
}

/// Ends ORT profiling of a session and moves the profile to `want`. Called when
/// a session configured with [`SessionConfig::ort_profile`] closes; failures are
/// logged, never raised (a profile is a diagnostic).
pub(crate) fn finish_profile(session: &mut Session, want: &Path) {
    match session.end_profiling() {
        Ok(written) => match std::fs::rename(&written, want) {
            Ok(()) => tracing::info!(file = %want.display(), "wrote ONNX Runtime profile"),
            Err(e) => tracing::warn!(
                from = %written, to = %want.display(), cause = %e,
                "ONNX Runtime profile left under ORT's name"
            ),
        },
        Err(e) => tracing::warn!(cause = %e, "ending ONNX Runtime profiling failed"),
    }
}

fn check_outlet<'a>(
    file: &Path,
    kind: &str,
    want: &str,
    have: impl Iterator<Item = &'a str>,
) -> Result<()> {
    let have: Vec<&str> = have.collect();
    if have.contains(&want) {
        return Ok(());
    }
    Err(Error::ModelInvalid {
        path: file.to_owned(),
        reason: format!(
            "the graph has no {kind} tensor `{want}` (rsembed-model.json names it); its {kind}s are {have:?}"
        ),
    })
}

/// The static last dimension of an output, when the graph declares one.
pub(crate) fn static_last_dim(session: &Session, output: &str) -> Option<i64> {
    let o = session.outputs().iter().find(|o| o.name() == output)?;
    match o.dtype() {
        ValueType::Tensor { shape, .. } => shape.last().copied().filter(|d| *d > 0),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_print_as_their_flags() {
        for s in ["next-power-of-two", "same-as-requested"] {
            assert_eq!(s.parse::<ArenaExtendStrategy>().unwrap().to_string(), s);
        }
        for s in ["exhaustive", "heuristic", "default"] {
            assert_eq!(s.parse::<ConvAlgoSearch>().unwrap().to_string(), s);
        }
        for s in ["disable", "basic", "extended", "all"] {
            assert_eq!(s.parse::<GraphOptLevel>().unwrap().to_string(), s);
        }
        for s in ["auto", "float", "uint8"] {
            assert_eq!(s.parse::<InputDtype>().unwrap().to_string(), s);
        }
        for s in ["never", "on-change", "always"] {
            assert_eq!(s.parse::<ArenaShrink>().unwrap().to_string(), s);
        }
        let e = "sometimes".parse::<ArenaShrink>().unwrap_err();
        assert!(e.contains("never, on-change, always"), "{e}");
        assert_eq!("cuda:3".parse::<Device>(), Ok(Device::Cuda(3)));
        assert!("gpu".parse::<Device>().is_err());
    }

    #[test]
    fn shrink_target_names_the_device_arena() {
        let mut cfg = SessionConfig::default();
        assert_eq!(cfg.shrink_target(), "cpu:0");
        cfg.device = Device::Cuda(2);
        assert_eq!(cfg.shrink_target(), "gpu:2");
    }

    #[test]
    fn providers_follow_the_device() {
        let mut cfg = SessionConfig::default();
        assert!(cfg.execution_providers().is_empty());
        assert_eq!(cfg.provider_names(), ["CPUExecutionProvider"]);
        cfg.device = Device::Cuda(1);
        assert_eq!(
            cfg.provider_names(),
            ["CUDAExecutionProvider", "CPUExecutionProvider"]
        );
        cfg.tensorrt = true;
        assert_eq!(
            cfg.provider_names(),
            [
                "TensorrtExecutionProvider",
                "CUDAExecutionProvider",
                "CPUExecutionProvider"
            ]
        );
    }

    #[test]
    fn profile_prefix_drops_json() {
        assert_eq!(
            profile_prefix(Path::new("/t/prof.json")),
            Path::new("/t/prof")
        );
        assert_eq!(profile_prefix(Path::new("/t/prof")), Path::new("/t/prof"));
    }
}
