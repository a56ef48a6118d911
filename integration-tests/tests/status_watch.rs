//! `rsembed status --watch` is the middle step of the Kubernetes coordinator
//! Job: it must ride out a NATS restart (and not fail the Job), finish when the
//! job does, and give up with the error once an outage lasts longer than
//! `--outage-grace`. A real nats-server is SIGKILLed and restarted under it.
//! `status` also names a worker that died holding a task (issue 28.11).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rsembed_integration_tests::cluster::{
    chip_counts, make_images, status, submit_ok, wait_finished, Worker,
};
use rsembed_integration_tests::nats::NatsServer;
use rsembed_integration_tests::{binary, fixture_images, rsembed, run};

fn watch(nats: &str, output: &std::path::Path, grace: &str, log: &std::path::Path) -> Child {
    Command::new(binary("rsembed"))
        .args([
            "status",
            "--watch",
            "--interval",
            "200ms",
            "--outage-grace",
            grace,
        ])
        .arg("--nats")
        .arg(nats)
        .arg("--output")
        .arg(output)
        .env("RSEMBED_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("rsembed starts")
}

/// Waits for the child to exit; `None` past `limit`.
fn wait(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

#[test]
fn watch_rides_out_a_nats_restart() {
    let mut nats = NatsServer::start();
    let url = nats.url();
    let out = tempfile::tempdir().unwrap();
    let tasks = submit_ok(&url, &fixture_images(), out.path(), &["--task-files", "1"])["tasks"]
        .as_u64()
        .unwrap();
    let log = out.path().join("watch.log");
    let mut w = watch(&url, out.path(), "2m", &log);
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        w.try_wait().unwrap().is_none(),
        "watch ended before the job"
    );

    // Longer than a JetStream request's timeout (5 s), so requests fail.
    nats.kill();
    std::thread::sleep(Duration::from_secs(8));
    assert!(
        w.try_wait().unwrap().is_none(),
        "watch gave up during the outage:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    nats.restart();

    let worker = Worker::start(&url, "w0", &[], &[]);
    let st = wait(&mut w, Duration::from_secs(120)).unwrap_or_else(|| {
        let _ = w.kill();
        panic!(
            "watch did not end with the job; worker log:\n{}",
            worker.log()
        )
    });
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(st.success(), "watch failed: {st}\n{text}");
    assert!(text.contains("trying again"), "no outage seen:\n{text}");
    assert!(
        text.lines()
            .any(|l| l.contains(&format!("{tasks}/{tasks} done"))),
        "watch did not see every task done:\n{text}"
    );
    // Without a terminal each refresh is one log line with the rate and ETA.
    let progress: Vec<&str> = text.lines().filter(|l| l.contains(" done, ")).collect();
    assert!(!progress.is_empty(), "{text}");
    for l in progress {
        assert!(
            l.contains(" chips/s, ETA "),
            "a --watch line without chips/s and ETA: {l}"
        );
    }
}

#[test]
fn watch_gives_up_after_the_outage_grace() {
    let mut nats = NatsServer::start();
    let url = nats.url();
    let out = tempfile::tempdir().unwrap();
    submit_ok(&url, &fixture_images(), out.path(), &[]);
    let log = out.path().join("watch.log");
    let mut w = watch(&url, out.path(), "2s", &log);
    std::thread::sleep(Duration::from_secs(1));
    nats.kill();
    let started = Instant::now();
    let st = wait(&mut w, Duration::from_secs(60)).unwrap_or_else(|| {
        let _ = w.kill();
        panic!("watch kept waiting past --outage-grace")
    });
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!st.success(), "{text}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "gave up before the grace: {text}"
    );
    assert!(text.contains("trying again"), "{text}");
}

/// Issue 28.11: after a worker is SIGKILLed mid-task, `status` counted its
/// task in flight with an ETA of a second until JetStream redelivered it.
/// Now it names the silent holder and when the task goes back. With no
/// other worker pulling, the task waits for one, so the state stays until a
/// worker starts: the polls do not race the ack wait.
#[test]
fn status_names_a_killed_holder_and_when_its_task_returns() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 3);
    // Heartbeats every second; silent after two, redelivered after three.
    submit_ok(
        &url,
        &input,
        &output,
        &["--task-size", "1", "--ack-wait", "3s"],
    );
    let mut slow = Worker::start(
        &url,
        "slow",
        &["--tasks-in-flight", "1"],
        &[("RSEMBED_FAULT_TASK_DELAY", "10m".to_owned())],
    );
    slow.wait_for_log("holding the task", Duration::from_secs(60));
    slow.kill();

    let started = Instant::now();
    let st = loop {
        let st = status(&url, &output);
        if st["silent_holders"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            break st;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no silent holder reported: {st}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(st["ack_wait_s"], 3.0, "{st}");
    let h = &st["silent_holders"][0];
    assert_eq!(h["worker"], "slow", "{st}");
    // Silent past two heartbeats; reported to a tenth of a second.
    assert!(h["silent_s"].as_f64().unwrap() >= 2.0, "{st}");
    let back_in = h["redelivery_in_s"].as_f64().unwrap();
    assert!((0.0..=3.0).contains(&back_in), "{st}");
    let silent = st["silent"].as_u64().unwrap() + st["redelivery_due"].as_u64().unwrap();
    assert_eq!(silent, 1, "{st}");

    let text = run(rsembed()
        .arg("status")
        .arg("--nats")
        .arg(&url)
        .arg("--output")
        .arg(&output));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("held by worker slow silent for") && text.contains("JetStream"),
        "{text}"
    );

    let fast = Worker::start(&url, "fast", &[], &[]);
    let st = wait_finished(&url, &output, Duration::from_secs(120));
    assert_eq!(st["done"], 3, "{st}");
    assert_eq!(st["silent_holders"], serde_json::json!([]), "{st}");
    assert!(fast.log().contains("delivered=2"), "{}", fast.log());
    assert_eq!(chip_counts(&output), (3, 3, 3), "every chip once");
}
