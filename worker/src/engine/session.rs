//! Building ONNX Runtime sessions from engine settings.

use std::path::{Path, PathBuf};

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::ValueType;

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

/// Session settings shared by the vision and text graphs.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Execution device.
    pub device: Device,
    /// Threads inside one operator; `None` lets ORT choose (one per core).
    pub intra_threads: Option<usize>,
    /// Explicit `libonnxruntime.so`.
    pub ort_lib: Option<PathBuf>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            device: Device::Cpu,
            intra_threads: None,
            ort_lib: None,
        }
    }
}

/// Opens an ONNX graph and checks that it has the named input and output.
pub fn open_graph(cfg: &SessionConfig, file: &Path, input: &str, output: &str) -> Result<Session> {
    if let Device::Cuda(_) = cfg.device {
        return Err(Error::ModelInvalid {
            path: file.to_owned(),
            reason: "the CUDA execution provider is not in this build yet; use --device cpu".into(),
        });
    }
    let (env, _) = runtime::environment(cfg.ort_lib.as_deref())?;
    let ctx = |what: &str| format!("{what} for {}", file.display());
    let mut b = Session::builder(&env)
        .map_err(|e| Error::ort(ctx("session builder"), e))?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(|e| Error::ort(ctx("optimization level"), e))?;
    if let Some(n) = cfg.intra_threads {
        b = b
            .with_intra_threads(n)
            .map_err(|e| Error::ort(ctx("intra-op threads"), e))?;
    }
    let session = b
        .commit_from_file(file)
        .map_err(|e| Error::ort(ctx("loading graph"), e))?;
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
pub fn static_last_dim(session: &Session, output: &str) -> Option<i64> {
    let o = session.outputs().iter().find(|o| o.name() == output)?;
    match o.dtype() {
        ValueType::Tensor { shape, .. } => shape.last().copied().filter(|d| *d > 0),
        _ => None,
    }
}
