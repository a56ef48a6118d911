//! `rsembed-worker`: the pull worker, one per GPU. It serves every job whose
//! model fingerprint equals its own, from the shared JetStream consumer.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use rsembed_worker::engine::flags::EngineArgs;
use rsembed_worker::engine::start::start_engine;
use rsembed_worker::error::chain;
use rsembed_worker::http::Health;
use rsembed_worker::metrics;
use rsembed_worker::model::ModelDir;
use rsembed_worker::pull::{default_name, ServeConfig, Worker};
use rsembed_worker::queue::{
    parse_duration, ConnectionWatch, NatsArgs, Queue, QueueConfig, QueueError,
};
use rsembed_worker::retry::{with_patience, Retry, RetryHint};
use rsembed_worker::store::StoreCache;
use rsembed_worker::task::{Mode, PipelineArgs, TaskRunner};
use tokio_util::sync::CancellationToken;

/// rsembed pull worker: runs the tasks of every job submitted with this model.
#[derive(Debug, Parser)]
#[command(
    name = "rsembed-worker",
    version,
    about,
    args_override_self = true,
    after_help = "Self-check (no NATS): rsembed-worker check --model <DIR> [--device cuda] [--json]\n\
                  loads the model, runs one batch and prints the execution provider."
)]
struct Args {
    /// NATS connection.
    #[command(flatten)]
    nats: NatsArgs,
    /// Model directory.
    #[arg(long, env = "RSEMBED_MODEL")]
    model: PathBuf,
    /// Inference.
    #[command(flatten)]
    engine: EngineArgs,
    /// Tasks and decoding.
    #[command(flatten)]
    pipeline: PipelineArgs,
    /// After SIGTERM: how long running tasks may take to finish before they are
    /// handed back (nak'd without delay, so another worker takes them at once).
    #[arg(long, env = "RSEMBED_SHUTDOWN_GRACE", default_value = "30s", value_parser = parse_duration)]
    shutdown_grace: Duration,
    /// Redelivery delay after a failed try; doubles with each try, up to 5 min.
    #[arg(long, env = "RSEMBED_RETRY_DELAY", default_value = "5s", value_parser = parse_duration)]
    retry_delay: Duration,
    /// Redelivery delay for a task of another model.
    #[arg(long, env = "RSEMBED_MISMATCH_DELAY", default_value = "30s", value_parser = parse_duration)]
    mismatch_delay: Duration,
    /// In-progress ack interval. Default: a third of the consumer's ack wait.
    #[arg(long, env = "RSEMBED_PROGRESS_INTERVAL", value_parser = parse_duration)]
    progress_interval: Option<Duration>,
    /// Name in job state and logs. Default: `<hostname>-<pid>`.
    #[arg(long, env = "RSEMBED_WORKER_NAME")]
    name: Option<String>,
    /// Exit after taking this many tasks. Default: serve until SIGTERM.
    #[arg(long, env = "RSEMBED_MAX_TASKS")]
    max_tasks: Option<u64>,
    /// Serve `/healthz` (alive), `/readyz` (model loaded, warm-up probe done,
    /// NATS connected, not draining) and Prometheus `/metrics` on
    /// `http://<HOST:PORT>` (`--metrics-addr` is the old name). It listens
    /// before the model loads, so a startup probe sees a slow load.
    #[arg(
        long,
        alias = "metrics-addr",
        env = "RSEMBED_HTTP_ADDR",
        value_name = "HOST:PORT"
    )]
    http_addr: Option<String>,
    /// Fault injection for tests: hold every task this long before running it.
    #[arg(long, env = "RSEMBED_FAULT_TASK_DELAY", hide = true, value_parser = parse_duration)]
    fault_task_delay: Option<Duration>,
    /// Fault injection for tests: abort once a task's files are written,
    /// before its completion is recorded or acked.
    #[arg(long, env = "RSEMBED_FAULT_CRASH_AFTER_FILES", hide = true)]
    fault_crash_after_files: bool,
    /// Log format: `text` or `json`.
    #[arg(long, env = "RSEMBED_LOG_FORMAT", default_value = "text")]
    log_format: String,
}

fn main() -> ExitCode {
    // `check` is the self-check of a container image; it needs no NATS, so
    // it is parsed on its own rather than as a subcommand of the serve flags.
    let mut argv = std::env::args_os();
    let first = argv.nth(1);
    if first.as_deref() == Some(std::ffi::OsStr::new("check")) {
        init_logs("text");
        let code = rsembed_worker::check::main(
            std::iter::once(std::ffi::OsString::from("rsembed-worker check")).chain(argv),
        );
        return rsembed_worker::exit::finish(code);
    }
    let args = Args::parse();
    init_logs(&args.log_format);
    tracing::info!(config = %effective_config(&args), "effective configuration");
    // Before anything opens a TLS connection (NATS, object stores).
    rsembed_worker::queue::install_crypto_provider();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match rt.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    };
    // Ends here after a CUDA session (see rsembed_worker::exit).
    let code = rsembed_worker::exit::finish(code);
    drop(rt);
    code
}

/// Every resolved flag (command line, environment, default) on one line, for
/// the start-up log. Secrets never appear: `NatsArgs`'s `Debug` hides
/// passwords and tokens, and the user information of `--nats` URLs.
fn effective_config(args: &Args) -> String {
    format!("{args:?}")
}

fn init_logs(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RSEMBED_LOG")
        .unwrap_or_else(|_| "info,ort=warn".into());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if format == "json" {
        b.json().init();
    } else {
        b.init();
    }
}

async fn serve(args: Args) -> Result<(), String> {
    let stop = CancellationToken::new();
    listen_for_signals(stop.clone());
    let health = Health::new();
    {
        let (stop, health) = (stop.clone(), health.clone());
        tokio::spawn(async move {
            stop.cancelled().await;
            health.set_draining();
        });
    }
    let _http = match &args.http_addr {
        Some(addr) => {
            let guard = CancellationToken::new();
            let (bound, _task) = rsembed_worker::http::start(
                addr,
                metrics::global(),
                Some(health.clone()),
                guard.clone(),
            )
            .await
            .map_err(|e| format!("--http-addr {addr}: cannot listen: {e}"))?;
            tracing::info!(
                addr = %bound,
                "serving http://{bound}/healthz, /readyz and /metrics"
            );
            Some(guard.drop_guard())
        }
        None => None,
    };
    let model = ModelDir::open(&args.model).map_err(|e| chain(&e))?;
    let model_ref = model.model_ref(args.engine.fp16).map_err(|e| chain(&e))?;
    // NATS before the model loads: a wrong URL should fail in a second, not
    // after the warm-up probe.
    let name = args.name.clone().unwrap_or_else(default_name);
    let watch = ConnectionWatch::new();
    let client = args
        .nats
        .connect_watched(&name, &watch)
        .await
        .map_err(|e| chain(&e))?;
    health.set_nats(client.clone());
    health.set_nats_watch(watch);
    let queue = open_queue(client, &stop).await.map_err(|e| chain(&e))?;
    let (engine, policy) = start_engine(&model, &args.engine).map_err(|e| chain(&e))?;
    // start_engine returns once the graph is loaded and the probe has run.
    health.set_model_loaded();
    health.set_probe_done();
    let runner = Arc::new(TaskRunner::new(
        &args.pipeline,
        &model,
        engine,
        policy,
        StoreCache::default(),
        Mode::Pull,
    ));
    let cfg = ServeConfig {
        name,
        tasks_in_flight: args.pipeline.tasks_in_flight,
        shutdown_grace: args.shutdown_grace,
        retry_delay: args.retry_delay,
        mismatch_delay: args.mismatch_delay,
        progress_interval: args.progress_interval,
        max_tasks: args.max_tasks,
        hold: args.fault_task_delay,
        crash_after_files: args.fault_crash_after_files,
    };
    let worker = Arc::new(Worker::new(queue, runner.clone(), model_ref, cfg));
    let report = worker.serve(stop).await;
    runner.engine.shutdown().await;
    tracing::info!(
        done = report.done,
        retried = report.retried,
        failed = report.failed,
        mismatched = report.mismatched,
        handed_back = report.handed_back,
        "worker stopped"
    );
    Ok(())
}

/// SIGTERM (Kubernetes) and SIGINT (a terminal) both start a graceful drain.
fn listen_for_signals(stop: CancellationToken) {
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let term = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = term => tracing::info!("SIGTERM: draining"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining"),
        }
        stop.cancel();
    });
}

/// How long a starting worker waits out a queue that NATS may fix by itself.
const QUEUE_OPEN_PATIENCE: Duration = Duration::from_secs(60);

/// Opens the queue, trying again while the error's hint is
/// [`RetryHint::Later`] (a JetStream request timing out while a cluster
/// elects a stream leader, say) for up to [`QUEUE_OPEN_PATIENCE`], or until
/// `stop`: a worker started during an election used to exit, and outside
/// Kubernetes nothing restarted it. Anything else (refused credentials, an
/// old server) still ends the process at once.
async fn open_queue(
    client: async_nats::Client,
    stop: &CancellationToken,
) -> Result<Queue, QueueError> {
    let cfg = QueueConfig::default();
    let later = |e: &QueueError| e.retry_hint() == RetryHint::Later;
    with_patience(
        QUEUE_OPEN_PATIENCE,
        stop,
        "the queue is not ready",
        later,
        || Queue::open(client.clone(), &cfg, false),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_config_hides_secrets() {
        let args = Args::try_parse_from([
            "rsembed-worker",
            "--nats",
            "nats://alice:url-secret@a:4222,nats://tok-in-url@b:4222",
            "--nats-user",
            "bob",
            "--nats-password",
            "flag-secret",
            "--nats-token",
            "token-secret",
            "--model",
            "/models/m",
            "--tasks-in-flight",
            "3",
            "--max-pixels",
            "1000",
        ])
        .unwrap();
        let line = effective_config(&args);
        for secret in ["url-secret", "flag-secret", "token-secret", "tok-in-url"] {
            assert!(!line.contains(secret), "{secret} is printed: {line}");
        }
        // Resolved values are there, so the line says how the worker runs.
        for shown in [
            "nats://<hidden>@a:4222,nats://<hidden>@b:4222",
            "bob",
            "tasks_in_flight: 3",
            "max_pixels: 1000",
            "/models/m",
            "shutdown_grace: 30s",
        ] {
            assert!(line.contains(shown), "{shown} is missing: {line}");
        }
    }
}
