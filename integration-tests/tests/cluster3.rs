//! The pull worker's acceptance test on a real 3-node JetStream cluster
//! (loopback ports, routes, one store per node): an R3 task stream and state
//! bucket (`--stream-replicas 3`), three `rsembed-worker`s and a
//! `rsembed status --watch`, all given the comma-separated URL list. Mid-job
//! the stream leader is SIGKILLed and restarted, then another node is
//! SIGKILLed and left down. Workers and the watch must ride out the leader
//! elections, and the job must finalize with every chip exactly once.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rsembed_integration_tests::binary;
use rsembed_integration_tests::cluster::{
    chip_counts, finalize, make_images, submit_ok, try_status, wait_finished, Worker,
};
use rsembed_integration_tests::nats::NatsCluster;

/// The task stream (worker/src/queue/mod.rs, `QueueConfig::default`).
const STREAM: &str = "RSEMBED_TASKS";
const IMAGES: u64 = 300;
const FINISH: Duration = Duration::from_secs(150);

/// `rsembed status --watch`, refreshing every 500 ms, as the coordinator
/// Job's middle step. The grace is far shorter than the default: a leader
/// election takes seconds, and an outage it cannot ride out fails the test.
fn watch(nats: &str, output: &Path, log: &Path) -> Child {
    Command::new(binary("rsembed"))
        .args([
            "status",
            "--watch",
            "--interval",
            "500ms",
            "--outage-grace",
            "30s",
        ])
        .arg("--nats")
        .arg(nats)
        .arg("--output")
        .arg(output)
        .env("RSEMBED_LOG", "warn")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("rsembed starts")
}

/// `rsembed status --json`'s done count; `None` while status fails (an
/// election under way).
fn done(nats: &str, output: &Path) -> Option<u64> {
    try_status(nats, output).ok()?["done"].as_u64()
}

/// Waits until at least `n` tasks are done; panics after `limit`.
fn wait_done(nats: &str, output: &Path, n: u64, limit: Duration, workers: &[Worker]) -> u64 {
    let started = Instant::now();
    loop {
        if let Some(d) = done(nats, output).filter(|d| *d >= n) {
            return d;
        }
        assert!(
            started.elapsed() < limit,
            "fewer than {n} tasks done within {limit:?}; worker logs:\n{}",
            logs(workers)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn logs(workers: &[Worker]) -> String {
    workers
        .iter()
        .map(|w| format!("--- {} ---\n{}", w.name, w.log()))
        .collect()
}

/// Whether the worker's process still runs (not exited, not a zombie).
fn alive(w: &Worker) -> bool {
    w.pid()
        .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .is_some_and(|s| s.split_whitespace().nth(2) != Some("Z"))
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
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
fn the_job_rides_out_losing_the_stream_leader_and_another_node() {
    let started = Instant::now();
    let mut cluster = NatsCluster::start();
    let urls = cluster.urls();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, IMAGES as usize);
    let s = submit_ok(
        &urls,
        &input,
        &output,
        &[
            "--task-files",
            "1",
            "--stream-replicas",
            "3",
            "--ack-wait",
            "5s",
        ],
    );
    assert_eq!(
        (s["tasks"].as_u64(), s["published"].as_u64()),
        (Some(IMAGES), Some(IMAGES)),
        "{s}"
    );
    let submitted = started.elapsed();

    let watch_log = dir.path().join("watch.log");
    let mut watcher = watch(&urls, &output, &watch_log);
    // Held a little per task, one task a worker at a time, so the job
    // outlasts the node kills below: about 7 tasks a second, 40 s in all.
    // With the default tasks in flight and 300 ms it ran at 25 a second and
    // once ended during the first election (CI, 2026-12-05).
    let hold = [("RSEMBED_FAULT_TASK_DELAY", "400ms".to_owned())];
    let workers: Vec<Worker> = (0..3)
        .map(|i| Worker::start(&urls, &format!("w{i}"), &["--tasks-in-flight", "1"], &hold))
        .collect();

    let before = wait_done(&urls, &output, 30, FINISH, &workers);
    let first = cluster.wait_stream_leader(STREAM, None, Duration::from_secs(30));
    cluster.kill(first);
    let killed_at = Instant::now();
    let second_leader = cluster.wait_stream_leader(STREAM, Some(first), Duration::from_secs(30));
    let election = killed_at.elapsed();
    std::thread::sleep(Duration::from_secs(3));
    cluster.restart(first);

    // Progress after the first election, then another node goes: the
    // current leader when that is not the node just restarted.
    let after = wait_done(&urls, &output, before + 30, FINISH, &workers);
    assert!(
        after < IMAGES,
        "the job finished before the second kill; hold tasks longer"
    );
    let leader = cluster.wait_stream_leader(STREAM, None, Duration::from_secs(30));
    let second = if leader != first {
        leader
    } else {
        (0..3).find(|&i| i != first).unwrap()
    };
    cluster.kill(second);
    eprintln!(
        "submitted {IMAGES} tasks in {submitted:?}; killed leader {} at {before} done \
         (new leader {} after {election:?}), restarted it; killed {} at {after} done",
        cluster.name(first),
        cluster.name(second_leader),
        cluster.name(second)
    );

    let st = wait_finished(&urls, &output, FINISH);
    assert_eq!(
        (st["done"].as_u64(), st["failed"].as_u64()),
        (Some(IMAGES), Some(0)),
        "{st}"
    );
    for w in &workers {
        assert!(
            w.log().contains("task done"),
            "{} worked:\n{}",
            w.name,
            w.log()
        );
        assert!(alive(w), "{} exited during the job:\n{}", w.name, w.log());
    }

    let st = wait_exit(&mut watcher, Duration::from_secs(30)).unwrap_or_else(|| {
        let _ = watcher.kill();
        panic!(
            "status --watch did not end with the job:\n{}",
            std::fs::read_to_string(&watch_log).unwrap_or_default()
        )
    });
    let text = std::fs::read_to_string(&watch_log).unwrap_or_default();
    assert!(st.success(), "status --watch failed ({st}):\n{text}");
    assert!(
        text.lines()
            .any(|l| l.contains(&format!("{IMAGES}/{IMAGES} done"))),
        "status --watch did not see every task done:\n{text}"
    );
    // What riding it out took, for the record: the warnings each worker
    // logged (failed pulls, unconfirmed acks) and the tasks redelivered.
    for w in &workers {
        let log = w.log();
        eprintln!(
            "{}: {} tasks done, {} warnings, {} redeliveries",
            w.name,
            log.matches("task done").count(),
            log.lines().filter(|l| l.contains("WARN")).count(),
            log.lines()
                .filter(|l| l.contains("task done") && !l.contains("delivered=1"))
                .count(),
        );
    }
    for w in &workers {
        for l in w.log().lines().filter(|l| l.contains("WARN")) {
            eprintln!("{}: {l}", w.name);
        }
    }
    eprintln!(
        "status --watch: {} outage lines",
        text.lines().filter(|l| l.contains("trying again")).count()
    );
    for l in text.lines().filter(|l| l.contains("trying again")) {
        eprintln!("watch: {l}");
    }
    drop(workers);

    assert_eq!(
        chip_counts(&output),
        (IMAGES, IMAGES, IMAGES),
        "every chip exactly once"
    );
    let (code, report) = finalize(&urls, &output);
    assert_eq!(code, Some(0), "finalize: {report}");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(output.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["rows"], IMAGES, "{manifest}");
    assert!(cluster.is_running(first) && !cluster.is_running(second));
    eprintln!("the whole test took {:?}", started.elapsed());
}

/// A task whose files are written while the job-state bucket elects a new
/// leader (its stream `KV_RSEMBED_STATE` lost its leader node) records its
/// completion once the bucket is back, instead of handing the task back to
/// be embedded again. `--ack-wait 30s` keeps JetStream from redelivering a
/// task that is still held, so every task runs exactly once.
#[test]
fn a_state_bucket_election_reruns_no_task() {
    const N: u64 = 60;
    let mut cluster = NatsCluster::start();
    let urls = cluster.urls();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, N as usize);
    submit_ok(
        &urls,
        &input,
        &output,
        &[
            "--task-files",
            "1",
            "--stream-replicas",
            "3",
            "--ack-wait",
            "30s",
        ],
    );
    let hold = [("RSEMBED_FAULT_TASK_DELAY", "300ms".to_owned())];
    let workers: Vec<Worker> = (0..3)
        .map(|i| Worker::start(&urls, &format!("w{i}"), &[], &hold))
        .collect();
    wait_done(&urls, &output, 6, FINISH, &workers);
    let bucket = "KV_RSEMBED_STATE";
    let leader = cluster.wait_stream_leader(bucket, None, Duration::from_secs(30));
    cluster.kill(leader);
    cluster.wait_stream_leader(bucket, Some(leader), Duration::from_secs(30));
    cluster.restart(leader);

    let st = wait_finished(&urls, &output, FINISH);
    assert_eq!(
        (st["done"].as_u64(), st["failed"].as_u64()),
        (Some(N), Some(0)),
        "{st}"
    );
    // The election did catch finished tasks (else this test proves nothing).
    assert!(
        workers
            .iter()
            .any(|w| w.log().contains("completion not recorded yet")),
        "no completion met the election:\n{}",
        logs(&workers)
    );
    // Each run of a task logs this once, before its work.
    let runs: usize = workers
        .iter()
        .map(|w| w.log().matches("holding the task").count())
        .sum();
    assert_eq!(
        runs as u64,
        N,
        "tasks ran again after the bucket's election:\n{}",
        logs(&workers)
    );
    drop(workers);
    assert_eq!(chip_counts(&output), (N, N, N), "every chip exactly once");
    let (code, report) = finalize(&urls, &output);
    assert_eq!(code, Some(0), "finalize: {report}");
}
