//! `rsembed-worker check`: the self-check a container runs before it is
//! trusted with work. It loads the model's vision and text graphs on the
//! requested device, runs one batch through each, checks the outputs, and
//! prints the execution provider that ran them. CUDA is registered with
//! `error_on_failure`, so a session that opens on `cuda` ran on CUDA: a
//! missing driver or cuDNN is an error here, never a silent CPU fallback.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use serde::Serialize;

use crate::engine::flags::EngineArgs;
use crate::engine::text::TextEncoder;
use crate::engine::vision::OrtVision;
use crate::engine::{Backend, PixelBatch, PixelFormat, Pixels};
use crate::error::{chain, Error, Result};
use crate::model::ModelDir;

/// `rsembed-worker check`: load the model, run one batch, print the execution provider.
#[derive(Debug, Parser)]
#[command(name = "rsembed-worker check", version, args_override_self = true)]
pub(crate) struct CheckArgs {
    /// Model directory (in the image: `/models/<name>`).
    #[arg(long, env = "RSEMBED_MODEL")]
    pub model: PathBuf,
    /// Images in the check batch.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Inference (device, fp16, ORT library, threads).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What the check found.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CheckReport {
    /// Model name.
    pub model: String,
    /// Embedding dimension.
    pub embed_dim: usize,
    /// The execution provider that ran the graphs.
    pub execution_provider: String,
    /// The providers registered, in order.
    pub providers: Vec<String>,
    /// The vision graph used (fp32 or fp16 file).
    pub vision_graph: String,
    /// Images in the batch.
    pub batch: usize,
    /// Seconds to open the vision graph (with its one-image probe run).
    pub vision_load_seconds: f64,
    /// Seconds of the batch run.
    pub vision_batch_seconds: f64,
    /// Seconds to open the text graph and embed one text.
    pub text_seconds: f64,
}

impl CheckReport {
    /// The report for a terminal.
    pub fn render(&self) -> String {
        format!(
            "rsembed-worker check: ok\n  model               {} (D = {})\n  execution provider  {}\n  \
             providers           {}\n  vision graph        {}\n  batch               {} images in {:.3} s (load {:.2} s)\n  \
             text graph          {:.3} s\n",
            self.model,
            self.embed_dim,
            self.execution_provider,
            self.providers.join(", "),
            self.vision_graph,
            self.batch,
            self.vision_batch_seconds,
            self.vision_load_seconds,
            self.text_seconds
        )
    }
}

/// Runs the check.
pub(crate) fn check(args: &CheckArgs) -> Result<CheckReport> {
    if args.batch == 0 || args.batch > 1024 {
        return Err(Error::Usage(format!(
            "--batch {}: want 1 to 1024",
            args.batch
        )));
    }
    let model = ModelDir::open(&args.model)?;
    let cfg = args.engine.session_config();
    let providers: Vec<String> = cfg.provider_names().iter().map(|s| s.to_string()).collect();
    let t = Instant::now();
    let mut vision = OrtVision::open(&model, args.engine.fp16, &cfg)?;
    let vision_load_seconds = t.elapsed().as_secs_f64();
    let (h, w) = (
        model.preprocessor.size.height as usize,
        model.preprocessor.size.width as usize,
    );
    // Distinct images (a gradient shifted per image), so the rows must differ.
    let n = args.batch;
    let value = |i: usize| (i + 7919 * (i / (3 * h * w))) % 251;
    let data: Pixels = match vision.pixel_format() {
        PixelFormat::F32Nchw => (0..n * 3 * h * w)
            .map(|i| (value(i) as f32 / 125.0) - 1.0)
            .collect::<Vec<f32>>()
            .into(),
        PixelFormat::U8Nhwc => (0..n * 3 * h * w)
            .map(|i| value(i) as u8)
            .collect::<Vec<u8>>()
            .into(),
    };
    let batch = PixelBatch {
        n,
        channels: 3,
        height: h,
        width: w,
        data,
    };
    let t = Instant::now();
    let out = vision.embed(&batch)?;
    let vision_batch_seconds = t.elapsed().as_secs_f64();
    check_rows(
        "vision",
        &out.data,
        out.n,
        out.dim,
        n,
        model.manifest.embed_dim,
    )?;
    let t = Instant::now();
    let mut text = TextEncoder::open(&model, &cfg)?;
    let rows = text.embed(&["a satellite image of a river".to_owned()])?;
    let flat: Vec<f32> = rows.concat();
    check_rows(
        "text",
        &flat,
        rows.len(),
        model.manifest.embed_dim,
        1,
        model.manifest.embed_dim,
    )?;
    let text_seconds = t.elapsed().as_secs_f64();
    Ok(CheckReport {
        model: model.manifest.name.clone(),
        embed_dim: model.manifest.embed_dim,
        execution_provider: providers[0].clone(),
        providers,
        vision_graph: vision_graph_name(&model, &vision),
        batch: n,
        vision_load_seconds,
        vision_batch_seconds,
        text_seconds,
    })
}

/// Every row finite and of unit length: a graph that runs but computes
/// garbage (a broken fp16 export, a wrong provider build) fails here.
fn check_rows(
    what: &str,
    data: &[f32],
    n: usize,
    dim: usize,
    want_n: usize,
    want_dim: usize,
) -> Result<()> {
    if n != want_n || dim != want_dim || data.len() != n * dim {
        return Err(Error::Usage(format!(
            "check failed: the {what} graph returned {n} rows of {dim}, expected {want_n} of {want_dim}"
        )));
    }
    for (i, row) in data.chunks_exact(dim).enumerate() {
        let norm: f64 = row
            .iter()
            .map(|x| f64::from(*x) * f64::from(*x))
            .sum::<f64>()
            .sqrt();
        if !row.iter().all(|x| x.is_finite()) || (norm - 1.0).abs() > 1e-3 {
            return Err(Error::Usage(format!(
                "check failed: {what} row {i} is not a finite unit vector (norm {norm})"
            )));
        }
    }
    Ok(())
}

/// `rsembed-worker check ...` from the process arguments after `check`.
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> std::process::ExitCode {
    let a = CheckArgs::parse_from(args);
    match check(&a) {
        Ok(r) => {
            use std::io::Write;
            let text = if a.json {
                serde_json::to_string_pretty(&r).unwrap_or_default() + "\n"
            } else {
                r.render()
            };
            // A closed pipe (`| head`) is the reader's choice, not a failure.
            let _ = std::io::stdout().write_all(text.as_bytes());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rsembed-worker check: FAILED: {}", chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The graph file the check ran, relative to the model directory.
fn vision_graph_name(model: &ModelDir, vision: &OrtVision) -> String {
    let f = vision.graph_file();
    f.strip_prefix(&model.dir)
        .unwrap_or(f)
        .to_string_lossy()
        .into_owned()
}
