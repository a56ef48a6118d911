//! `scale-worker`: `rsembed-worker` with the simulated engine in place of
//! ONNX Runtime, for the control-plane scale benchmark.
//!
//! Everything but the engine is the worker's own code: the pull loop
//! ([`Worker::serve`]: done check, running mark, in-progress acks, done
//! record, double ack), the [`TaskRunner`] (reading and decoding the inputs,
//! preprocessing, batching, the chip and error files written create-once) and
//! the job-state writes. The engine is [`SimulatedDevice`] with no simulated
//! time, so a task costs what the control plane and the files cost.
//!
//! It serves until SIGTERM or SIGINT (the benchmark stops it once the task
//! stream is empty) and prints the worker's tally as one JSON line.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use rsembed_worker::engine::flags::BatchPolicy;
use rsembed_worker::engine::handle::EngineHandle;
use rsembed_worker::engine::sim::{SimConfig, SimulatedDevice};
use rsembed_worker::model::ModelDir;
use rsembed_worker::pull::{ServeConfig, Worker};
use rsembed_worker::queue::{NatsArgs, Queue, QueueConfig};
use rsembed_worker::store::StoreCache;
use rsembed_worker::task::{Mode, PipelineArgs, TaskRunner};
use tokio_util::sync::CancellationToken;

/// The pull worker's loop with the simulated engine.
#[derive(Parser)]
#[command(name = "scale-worker")]
struct Args {
    /// NATS connection.
    #[command(flatten)]
    nats: NatsArgs,
    /// Model directory: its fingerprint must be the submitted job's, and its
    /// preprocessing and embedding width shape the chips.
    #[arg(long)]
    model: PathBuf,
    /// Tasks and decoding (`--tasks-in-flight`, `--decode-threads`).
    #[command(flatten)]
    pipeline: PipelineArgs,
    /// Images per simulated inference call.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Name in job state and logs.
    #[arg(long, default_value = "scale-worker")]
    name: String,
}

fn main() -> anyhow::Result<()> {
    rsembed_bench_scale::init_logs();
    let args = Args::parse();
    rsembed_worker::queue::install_crypto_provider();
    tokio::runtime::Runtime::new()?.block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    rsembed_bench_scale::cancel_on_signals(stop.clone());
    let model = ModelDir::open(&args.model).context("model directory")?;
    let model_ref = model.model_ref(false)?;
    let client = args.nats.connect(&args.name).await?;
    let queue = Queue::open(client, &QueueConfig::default(), false).await?;
    let sim = SimConfig {
        dim: model_ref.embed_dim,
        overhead: Duration::ZERO,
        per_image: Duration::ZERO,
        ceiling: usize::MAX,
        ..SimConfig::default()
    };
    let engine = EngineHandle::spawn("rsembed-engine", 2, move || Ok(SimulatedDevice::new(sim)))?;
    let policy = BatchPolicy::Fixed(args.batch_size.max(1));
    let runner = Arc::new(TaskRunner::new(
        &args.pipeline,
        &model,
        engine,
        policy,
        StoreCache::default(),
        Mode::Pull,
    ));
    let cfg = ServeConfig {
        name: args.name.clone(),
        tasks_in_flight: args.pipeline.tasks_in_flight,
        ..ServeConfig::default()
    };
    let worker = Arc::new(Worker::new(queue, runner.clone(), model_ref, cfg));
    let report = worker.serve(stop).await;
    runner.engine.shutdown().await;
    println!(
        "{}",
        serde_json::json!({
            "worker": args.name,
            "done": report.done,
            "retried": report.retried,
            "failed": report.failed,
            "mismatched": report.mismatched,
            "handed_back": report.handed_back,
        })
    );
    Ok(())
}
