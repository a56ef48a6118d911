//! `rsembed-worker`: the pull worker, one per GPU.
//!
//! The NATS JetStream loop is not built yet; today the binary loads a model
//! directory, proves it runs (one probe batch) and reports what it loaded, which
//! is what a deployment's readiness check needs.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rsembed_worker::engine::runtime;
use rsembed_worker::engine::session::{Device, SessionConfig};
use rsembed_worker::engine::vision::OrtVision;
use rsembed_worker::model::ModelDir;

/// rsembed pull worker.
#[derive(Debug, Parser)]
#[command(name = "rsembed-worker", version, about)]
struct Args {
    /// NATS server URL. The pull loop is not implemented yet.
    #[arg(long, env = "RSEMBED_NATS")]
    nats: Option<String>,
    /// Model directory.
    #[arg(long, env = "RSEMBED_MODEL")]
    model: PathBuf,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, env = "RSEMBED_DEVICE", default_value = "cpu")]
    device: Device,
    /// Use the float16 vision graph.
    #[arg(long, env = "RSEMBED_FP16")]
    fp16: bool,
    /// Threads inside one ONNX Runtime operator.
    #[arg(long, env = "RSEMBED_INTRA_THREADS")]
    intra_threads: Option<usize>,
    /// Path of libonnxruntime.so.
    #[arg(long, env = "RSEMBED_ORT_LIB")]
    ort_lib: Option<PathBuf>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RSEMBED_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.nats.is_some() {
        eprintln!(
            "error: the NATS pull worker is not implemented yet; use `rsembed run` (embedded mode)"
        );
        return ExitCode::from(2);
    }
    match check(&args) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn check(args: &Args) -> anyhow::Result<String> {
    let model = ModelDir::open(&args.model)?;
    let cfg = SessionConfig {
        device: args.device,
        intra_threads: args.intra_threads,
        ort_lib: args.ort_lib.clone(),
        ..SessionConfig::default()
    };
    let v = OrtVision::open(&model, args.fp16, &cfg)?;
    let (_, lib) = runtime::environment(cfg.ort_lib.as_deref())?;
    Ok(serde_json::json!({
        "model": model.manifest.name,
        "embed_dim": v.embed_dim(),
        "device": args.device.to_string(),
        "fp16": args.fp16,
        "ort_library": lib.path,
        "ort_found_by": lib.found_by,
    })
    .to_string())
}
