//! Distributed mode with real processes: nats-server (SIGKILLed and restarted),
//! `rsembed submit | status | finalize`, and `rsembed-worker`s that are
//! killed or stopped in the middle of tasks. Every scenario checks the final
//! dataset with DuckDB: every chip exactly once, none missing against the plan.

use std::path::Path;
use std::time::{Duration, Instant};

use rsembed_integration_tests::cluster::{
    chip_counts, finalize, make_images, status, submit_ok, wait_finished, Worker,
};
use rsembed_integration_tests::nats::NatsServer;
use rsembed_integration_tests::{manifest_list, rsembed, run};

const FINISH: Duration = Duration::from_secs(120);

fn hold(d: &str) -> Vec<(&'static str, String)> {
    vec![("RSEMBED_FAULT_TASK_DELAY", d.to_owned())]
}

fn plan_tasks(input: &Path) -> u64 {
    let out =
        run(rsembed()
            .arg("plan")
            .arg("--input")
            .arg(input)
            .args(["--task-size", "1", "--json"]));
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["tasks"].as_u64().unwrap()
}

fn assert_complete(nats: &str, input: &Path, output: &Path, images: u64) {
    assert_eq!(plan_tasks(input), images, "one task per image");
    assert_eq!(
        chip_counts(output),
        (images, images, images),
        "every chip exactly once"
    );
    let (code, report) = finalize(nats, output);
    assert_eq!(code, Some(0), "finalize: {report}");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(output.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["rows"], images);
    assert_eq!(manifest["chip_file_count"], images);
    let files = manifest_list(output, "files", "kind = 'chips'");
    assert_eq!(files.len() as u64, images);
}

/// The first row of the failures list (one per input) of a failed task of
/// a finalized output, after checking the manifest counts failed tasks.
fn failed_task(output: &Path) -> serde_json::Value {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(output.join("manifest.json")).unwrap()).unwrap();
    assert!(
        manifest["failed_task_count"].as_u64().unwrap() >= 1,
        "{manifest}"
    );
    let rows = manifest_list(output, "failures", "kind = 'failed_task'");
    assert!(!rows.is_empty(), "{manifest}");
    rows[0].clone()
}

#[test]
fn three_workers_sixty_tasks_every_chip_once() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 60);
    let s = submit_ok(&url, &input, &output, &["--task-size", "1"]);
    assert_eq!(
        (s["tasks"].as_u64(), s["published"].as_u64()),
        (Some(60), Some(60))
    );

    let workers: Vec<Worker> = (0..3)
        .map(|i| Worker::start(&url, &format!("w{i}"), &[], &[]))
        .collect();
    let st = wait_finished(&url, &output, FINISH);
    assert_eq!(
        (st["done"].as_u64(), st["failed"].as_u64()),
        (Some(60), Some(0))
    );
    assert_eq!(st["chips"], 60);
    drop(workers);
    assert_complete(&url, &input, &output, 60);
}

#[test]
fn a_killed_workers_task_is_redelivered_and_done_once() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 6);
    submit_ok(
        &url,
        &input,
        &output,
        &["--task-size", "1", "--ack-wait", "2s"],
    );

    let mut slow = Worker::start(&url, "slow", &["--tasks-in-flight", "1"], &hold("60s"));
    slow.wait_for_log("holding the task", Duration::from_secs(60));
    assert_eq!(status(&url, &output)["in_flight"], 1);
    slow.kill();

    let fast = Worker::start(&url, "fast", &[], &[]);
    wait_finished(&url, &output, FINISH);
    assert!(
        fast.log().contains("delivered=2"),
        "the killed worker's task came back:\n{}",
        fast.log()
    );
    assert_complete(&url, &input, &output, 6);
}

#[test]
fn a_nats_server_restart_mid_job_loses_nothing() {
    let mut nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 24);
    submit_ok(
        &url,
        &input,
        &output,
        &["--task-size", "1", "--ack-wait", "3s"],
    );
    let workers: Vec<Worker> = (0..3)
        .map(|i| Worker::start(&url, &format!("w{i}"), &[], &hold("300ms")))
        .collect();
    let started = Instant::now();
    while status(&url, &output)["done"].as_u64().unwrap() < 3 {
        assert!(started.elapsed() < FINISH, "no progress");
        std::thread::sleep(Duration::from_millis(100));
    }
    nats.kill();
    std::thread::sleep(Duration::from_secs(1));
    nats.restart();
    let st = wait_finished(&url, &output, FINISH);
    assert_eq!(st["done"], 24, "{st}");
    for w in &workers {
        assert!(
            w.log().contains("task done"),
            "{} worked:\n{}",
            w.name,
            w.log()
        );
    }
    drop(workers);
    assert_complete(&url, &input, &output, 24);
}

#[test]
fn a_poison_task_is_dead_lettered_and_retry_failed_completes_the_job() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    let images = make_images(&input, 6);
    submit_ok(
        &url,
        &input,
        &output,
        &["--task-size", "1", "--max-deliver", "3", "--ack-wait", "5s"],
    );
    // Deleted after submit: the task can never succeed until it is back.
    let poison = images[2].clone();
    let saved = std::fs::read(&poison).unwrap();
    std::fs::remove_file(&poison).unwrap();

    let w = Worker::start(&url, "w", &["--retry-delay", "100ms"], &[]);
    let st = wait_finished(&url, &output, FINISH);
    assert_eq!(
        (st["done"].as_u64(), st["failed"].as_u64()),
        (Some(5), Some(1)),
        "{st}"
    );
    assert!(w.log().contains("giving up on the task"), "{}", w.log());

    let (code, report) = finalize(&url, &output);
    assert_eq!(
        code,
        Some(3),
        "a job with a failed task finalizes with exit 3: {report}"
    );
    let failed = &failed_task(&output);
    assert_eq!(failed["deliveries"], 3, "{failed}");
    assert!(
        failed["source_uri"]
            .as_str()
            .unwrap()
            .ends_with("img_002.png"),
        "{failed}"
    );
    assert!(
        failed["error"].as_str().unwrap().contains("img_002.png"),
        "{failed}"
    );

    // Back in place, but without --retry-failed a resubmit leaves it failed.
    std::fs::write(&poison, saved).unwrap();
    let again = submit_ok(&url, &input, &output, &["--task-size", "1"]);
    assert_eq!(
        (again["failed"].as_u64(), again["published"].as_u64()),
        (Some(1), Some(0))
    );
    let retry = submit_ok(
        &url,
        &input,
        &output,
        &["--task-size", "1", "--retry-failed"],
    );
    assert_eq!(
        (retry["requeued"].as_u64(), retry["published"].as_u64()),
        (Some(1), Some(1))
    );
    let st = wait_finished(&url, &output, FINISH);
    assert_eq!(
        (st["done"].as_u64(), st["failed"].as_u64()),
        (Some(6), Some(0)),
        "{st}"
    );
    drop(w);
    assert_complete(&url, &input, &output, 6);
}

#[test]
fn submitting_twice_and_after_a_partial_run_does_no_work_twice() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 12);
    let first = submit_ok(&url, &input, &output, &["--task-size", "1"]);
    assert_eq!(first["published"], 12);
    let second = submit_ok(&url, &input, &output, &["--task-size", "1"]);
    assert_eq!(
        (second["published"].as_u64(), second["duplicates"].as_u64()),
        (Some(0), Some(12))
    );

    let mut partial = Worker::start(&url, "partial", &["--max-tasks", "5"], &[]);
    assert!(partial.wait(FINISH).success(), "{}", partial.log());
    assert_eq!(status(&url, &output)["done"], 5);

    let third = submit_ok(&url, &input, &output, &["--task-size", "1"]);
    assert_eq!(
        (
            third["done"].as_u64(),
            third["duplicates"].as_u64(),
            third["published"].as_u64()
        ),
        (Some(5), Some(7), Some(0)),
        "{third}"
    );
    let rest = Worker::start(&url, "rest", &[], &[]);
    wait_finished(&url, &output, FINISH);
    assert!(!rest.log().contains("delivered=2"), "{}", rest.log());
    assert_complete(&url, &input, &output, 12);
}

#[test]
fn sigterm_during_a_task_drains_without_redelivery() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 4);
    submit_ok(
        &url,
        &input,
        &output,
        &["--task-size", "1", "--ack-wait", "30s"],
    );

    let mut w = Worker::start(
        &url,
        "draining",
        &["--tasks-in-flight", "1", "--shutdown-grace", "20s"],
        &hold("1500ms"),
    );
    w.wait_for_log("holding the task", Duration::from_secs(60));
    let st = w.terminate(Duration::from_secs(30));
    assert!(st.success(), "exit 0 after the drain: {st}\n{}", w.log());
    let log = w.log();
    assert_eq!(log.matches("task done").count(), 1, "{log}");
    assert!(!log.contains("handing the task back"), "{log}");
    assert_eq!(status(&url, &output)["done"], 1);

    let rest = Worker::start(&url, "rest", &[], &[]);
    wait_finished(&url, &output, FINISH);
    assert!(
        !rest.log().contains("delivered=2"),
        "no redelivery:\n{}",
        rest.log()
    );
    assert_complete(&url, &input, &output, 4);
}

#[test]
fn sigterm_past_the_grace_period_hands_the_task_back_at_once() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 2);
    // A long ack wait: the task can only come back this fast by a nak.
    submit_ok(
        &url,
        &input,
        &output,
        &["--task-size", "1", "--ack-wait", "60s"],
    );
    let mut w = Worker::start(
        &url,
        "stuck",
        &["--tasks-in-flight", "1", "--shutdown-grace", "500ms"],
        &hold("120s"),
    );
    w.wait_for_log("holding the task", Duration::from_secs(60));
    let st = w.terminate(Duration::from_secs(10));
    assert!(st.success(), "{st}\n{}", w.log());
    assert!(w.log().contains("handing the task back"), "{}", w.log());

    let started = Instant::now();
    let rest = Worker::start(&url, "rest", &[], &[]);
    wait_finished(&url, &output, Duration::from_secs(40));
    assert!(started.elapsed() < Duration::from_secs(40));
    assert!(rest.log().contains("delivered=2"), "{}", rest.log());
    assert_complete(&url, &input, &output, 2);
}

#[test]
fn a_task_whose_workers_all_die_is_dead_lettered_by_the_advisory() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 1);
    submit_ok(
        &url,
        &input,
        &output,
        &["--task-size", "1", "--ack-wait", "2s", "--max-deliver", "2"],
    );
    // Each delivery dies with its worker: no error is ever reported, so only
    // JetStream's MAX_DELIVERIES advisory can tell that the task is dead.
    for i in 0..2 {
        let mut w = Worker::start(
            &url,
            &format!("doomed{i}"),
            &["--tasks-in-flight", "1"],
            &hold("60s"),
        );
        w.wait_for_log("holding the task", Duration::from_secs(60));
        w.kill();
    }
    // JetStream notices the last delivery ran out when a pull asks for the
    // task again; a healthy worker's pulls are what a fleet always has.
    let _healthy = Worker::start(&url, "healthy", &[], &[]);
    let st = wait_finished(&url, &output, FINISH);
    assert_eq!(
        (st["done"].as_u64(), st["failed"].as_u64()),
        (Some(0), Some(1)),
        "{st}"
    );
    assert_eq!(st["pending"], 0, "the dead task left the stream: {st}");
    let (code, report) = finalize(&url, &output);
    assert_eq!(code, Some(3), "{report}");
    let failed = &failed_task(&output);
    assert_eq!(failed["deliveries"], 2, "{failed}");
    assert!(
        failed["error"].as_str().unwrap().contains("without an ack"),
        "{failed}"
    );

    let retry = submit_ok(
        &url,
        &input,
        &output,
        &["--task-size", "1", "--retry-failed"],
    );
    assert_eq!(retry["requeued"], 1);
    wait_finished(&url, &output, FINISH);
    assert_complete(&url, &input, &output, 1);
}

#[test]
fn a_job_no_worker_serves_ends_dead_lettered_with_the_reason() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 2);
    submit_ok(
        &url,
        &input,
        &output,
        &["--task-size", "1", "--max-deliver", "2"],
    );
    // The same graphs under another name: another model fingerprint.
    let other = dir.path().join("other-model");
    rsembed_integration_tests::copy_dir(&rsembed_integration_tests::tiny_model(), &other);
    let manifest = other.join("rsembed-model.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        text.replace("\"tiny-siglip\"", "\"tiny-siglip-renamed\""),
    )
    .unwrap();

    let w = Worker::start(
        &url,
        "other",
        &[
            "--model",
            other.to_str().unwrap(),
            "--mismatch-delay",
            "200ms",
        ],
        &[],
    );
    let st = wait_finished(&url, &output, FINISH);
    assert_eq!(
        (st["done"].as_u64(), st["failed"].as_u64()),
        (Some(0), Some(2)),
        "{st}"
    );
    assert!(w.log().contains("not my model"), "{}", w.log());
    assert!(
        !output.join("chips").exists(),
        "no file of another model's task"
    );
    let (code, report) = finalize(&url, &output);
    assert_eq!(code, Some(3), "{report}");
    let failed = failed_task(&output);
    let err = failed["error"].as_str().unwrap();
    assert!(
        err.contains("tiny-siglip-renamed") && err.contains("wants model tiny-siglip"),
        "{err}"
    );
}

/// A web server that describes `/denied.png` to HEAD (as the planner asks)
/// but refuses to GET it with `403 Forbidden`, as a bucket policy or an
/// expired presigned URL does. Stops serving when the test process ends.
fn refusing_http_server(len: usize) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let answer = if head.starts_with(b"HEAD ") {
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nContent-Type: image/png\r\n\
                     Last-Modified: Tue, 01 Dec 2026 10:00:00 GMT\r\nETag: \"v1\"\r\n\
                     Connection: close\r\n\r\n"
                )
            } else {
                "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into()
            };
            let _ = c.write_all(answer.as_bytes());
        }
    });
    format!("http://127.0.0.1:{port}/denied.png")
}

/// An input the store refuses to give (403: `PermissionDenied`, hint
/// `Never`) fails its task at once: retrying cannot change a refusal, and an
/// error row would call a good input bad and mark the task done, so fixing
/// the credentials and `submit --retry-failed` could not bring its chips
/// back. Before the one retry decision every store error was redelivered up
/// to `max_deliver` (3 deliveries here); a refusal as a row would be done.
#[test]
fn an_input_the_store_refuses_fails_its_task_at_once() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("out");
    let input = refusing_http_server(1234);
    submit_ok(
        &url,
        Path::new(&input),
        &output,
        &["--task-size", "1", "--max-deliver", "3"],
    );
    let w = Worker::start(&url, "w", &["--retry-delay", "100ms"], &[]);
    let st = wait_finished(&url, &output, FINISH);
    assert_eq!(
        (st["done"].as_u64(), st["failed"].as_u64()),
        (Some(0), Some(1)),
        "{st}\n{}",
        w.log()
    );
    assert!(!w.log().contains("will be retried"), "{}", w.log());
    assert!(!output.join("errors").exists(), "no error row calls it bad");
    let (code, report) = finalize(&url, &output);
    assert_eq!(code, Some(3), "{report}");
    let failed = &failed_task(&output);
    assert_eq!(failed["deliveries"], 1, "{failed}");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("denied.png") && error.contains("403"),
        "names the input and the cause: {error}"
    );
}
