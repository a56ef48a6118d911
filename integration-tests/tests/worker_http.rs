//! `rsembed-worker --http-addr`: `/healthz`, `/readyz` and `/metrics` of a
//! real worker process against a real nats-server, as Kubernetes probes see
//! them: ready once the model is loaded and probed and NATS is connected,
//! not ready while NATS is down, ready again when it is back, and a SIGTERM
//! drains and exits cleanly; and its `/metrics` passes `promtool check
//! metrics`, the linter of the Prometheus project.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rsembed_integration_tests::cluster::Worker;
use rsembed_integration_tests::nats::NatsServer;
use rsembed_integration_tests::{free_port, http_get, skipped};

/// Status code and body of one GET; `None` while nothing listens.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let (status, body) = http_get(port, path)?;
    let code = status.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body))
}

/// Polls `path` until `want` says yes; panics with the worker's log after `limit`.
fn wait_for(
    w: &Worker,
    port: u16,
    path: &str,
    limit: Duration,
    want: impl Fn(u16, &str) -> bool,
) -> String {
    let started = Instant::now();
    loop {
        if let Some((code, body)) = get(port, path) {
            if want(code, &body) {
                return body;
            }
        }
        if started.elapsed() > limit {
            panic!(
                "{path} never answered as expected (last: {:?})\n{}",
                get(port, path),
                w.log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn probes_follow_the_model_nats_and_draining() {
    let mut nats = NatsServer::start();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut w = Worker::start(&nats.url(), "probed", &["--http-addr", &addr], &[]);

    // Alive first (the server listens before the model loads), then ready.
    wait_for(&w, port, "/healthz", Duration::from_secs(60), |c, b| {
        c == 200 && b == "ok\n"
    });
    wait_for(&w, port, "/readyz", Duration::from_secs(120), |c, b| {
        c == 200 && b == "ready\n"
    });
    let (code, metrics) = get(port, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains("# TYPE rsembed_worker_batch_ceiling gauge"),
        "{metrics}"
    );
    assert_eq!(get(port, "/nothing").unwrap().0, 404);

    // NATS down: alive, not ready, and saying why; back: ready again.
    nats.kill();
    let why = wait_for(&w, port, "/readyz", Duration::from_secs(30), |c, _| {
        c == 503
    });
    assert!(why.contains("NATS disconnected"), "{why}");
    assert_eq!(get(port, "/healthz").unwrap().0, 200, "still alive");
    nats.restart();
    wait_for(&w, port, "/readyz", Duration::from_secs(60), |c, _| {
        c == 200
    });

    // SIGTERM drains (no task held here) and exits 0; the endpoint goes with it.
    let st = w.terminate(Duration::from_secs(60));
    assert!(st.success(), "clean exit: {st:?}\n{}", w.log());
    assert!(
        get(port, "/healthz").is_none(),
        "nothing listens after exit"
    );
}

#[test]
fn a_port_in_use_is_a_clear_error() {
    let nats = NatsServer::start();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut w = Worker::start(&nats.url(), "clash", &["--http-addr", &addr], &[]);
    let st = w.wait(Duration::from_secs(60));
    assert!(!st.success());
    let log = w.log();
    assert!(
        log.contains(&format!("--http-addr {addr}: cannot listen")),
        "{log}"
    );
}

/// `promtool check metrics` over `text`: its exit status and what it said.
fn promtool_check(text: &str) -> (std::process::ExitStatus, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .expect("promtool reads the scrape");
    let out = child.wait_with_output().expect("promtool ends");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, said)
}

#[test]
fn metrics_pass_promtool_check() {
    if Command::new("promtool").arg("--version").output().is_err() {
        skipped(
            "promtool is not installed (Debian package `prometheus`; \
             scripts/setup-test-env.sh installs it)",
        );
        return;
    }
    let nats = NatsServer::start();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let w = Worker::start(&nats.url(), "linted", &["--http-addr", &addr], &[]);
    // Ready: the model is loaded and probed, so the batch gauges are set.
    wait_for(&w, port, "/readyz", Duration::from_secs(120), |c, _| {
        c == 200
    });
    let (code, metrics) = get(port, "/metrics").unwrap();
    assert_eq!(code, 200);
    for name in [
        "rsembed_worker_chips_total",
        "rsembed_worker_oom_total",
        "rsembed_worker_batch_size",
        "rsembed_worker_inference_seconds_count",
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(&format!("{name} "))),
            "{name} missing:\n{metrics}"
        );
    }
    let (status, said) = promtool_check(&metrics);
    assert!(
        status.success() && said.trim().is_empty(),
        "promtool check metrics: {status}\n{said}\n--- scrape:\n{metrics}"
    );
    // The check can fail: a counter without `_total` is reported.
    let (status, said) = promtool_check(
        "# HELP bad_counter A counter.\n# TYPE bad_counter counter\nbad_counter 1\n",
    );
    assert!(
        !status.success() && said.contains("_total"),
        "{status}: {said}"
    );
}
