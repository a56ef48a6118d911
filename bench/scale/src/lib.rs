//! What the scale benchmark's two binaries share. The benchmark itself is
//! `bench/scale/scale.py`; see `bench/scale/README.md`.

use tokio_util::sync::CancellationToken;

/// Logs to stderr under `RSEMBED_LOG` (default `warn`: a benchmark of a
/// million tasks must not spend its time on one log line per task).
pub fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RSEMBED_LOG")
        .unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

/// Cancels `stop` on SIGTERM or SIGINT, as `rsembed-worker` drains on them.
pub fn cancel_on_signals(stop: CancellationToken) {
    tokio::spawn(async move {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut t) => {
                    t.recv().await;
                }
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = term => {},
            _ = tokio::signal::ctrl_c() => {},
        }
        stop.cancel();
    });
}
