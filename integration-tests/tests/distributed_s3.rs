//! Distributed mode on a real S3-API server (moto) that fails for a while:
//! every process reaches it through a proxy that cuts the open connections
//! and answers `503 Service Unavailable` during the outage. The work is
//! retried and the job completes with every chip exactly once.
//!
//! A test binary of its own: the processes get the S3 settings through this
//! process's environment.

use std::path::Path;
use std::time::{Duration, Instant};

use rsembed_integration_tests::cluster::{
    chip_counts, finalize, make_images, status, submit_ok, wait_finished, Worker,
};
use rsembed_integration_tests::nats::NatsServer;
use rsembed_integration_tests::proxy::FaultProxy;
use rsembed_integration_tests::s3::S3Server;

#[test]
fn s3_errors_for_a_while_are_retried_and_the_job_completes() {
    let s3 = S3Server::start();
    let proxy = FaultProxy::start(s3.port());
    s3.create_bucket("data");
    let dir = tempfile::tempdir().unwrap();
    make_images(&dir.path().join("in"), 20);
    s3.upload(&dir.path().join("in"), "s3://data/in");
    // A developer's own AWS settings must not mix in.
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            std::env::remove_var(k);
        }
    }
    for (k, v) in s3.env() {
        let v = if k == "AWS_ENDPOINT" {
            proxy.endpoint()
        } else {
            v
        };
        std::env::set_var(k, v);
    }

    let nats = NatsServer::start();
    let url = nats.url();
    let (input, output) = (Path::new("s3://data/in"), Path::new("s3://data/out"));
    let s = submit_ok(
        &url,
        input,
        output,
        &["--task-size", "1", "--ack-wait", "10s"],
    );
    assert_eq!(s["tasks"], 20);
    let hold = vec![("RSEMBED_FAULT_TASK_DELAY", "300ms".to_owned())];
    let workers: Vec<Worker> = (0..2)
        .map(|i| Worker::start(&url, &format!("w{i}"), &["--retry-delay", "200ms"], &hold))
        .collect();
    let started = Instant::now();
    while status(&url, output)["done"].as_u64().unwrap() < 3 {
        assert!(started.elapsed() < Duration::from_secs(120), "no progress");
        std::thread::sleep(Duration::from_millis(100));
    }
    proxy.set_up(false);
    std::thread::sleep(Duration::from_secs(4));
    proxy.set_up(true);
    let st = wait_finished(&url, output, Duration::from_secs(180));
    assert_eq!(
        (st["done"].as_u64(), st["failed"].as_u64()),
        (Some(20), Some(0)),
        "{st}"
    );
    assert!(proxy.refused() > 0, "the outage was met");
    drop(workers);

    let local = dir.path().join("out");
    s3.download("s3://data/out", &local);
    assert_eq!(chip_counts(&local), (20, 20, 20), "every chip exactly once");
    let (code, report) = finalize(&url, output);
    assert_eq!(code, Some(0), "{report}");
}
