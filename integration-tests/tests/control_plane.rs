//! The control plane at a cost that does not grow with the job (issue 29):
//! the job state a finished job leaves in JetStream, and the running totals
//! `status` reads instead of every record, kept exact when records are
//! written twice, taken out and folded by several writers at once. Against a
//! real nats-server, through the worker's own state code and the real
//! binaries.

use std::time::Duration;

use rsembed_integration_tests::cluster::{
    chip_counts, finalize, make_images, status, submit_ok, wait_finished, Worker,
};
use rsembed_integration_tests::nats::NatsServer;
use rsembed_schemas::job::ManifestFile;
use rsembed_schemas::queue::TaskDone;
use rsembed_worker::queue::state::JobState;
use rsembed_worker::queue::QueueConfig;

const FINISH: Duration = Duration::from_secs(180);

fn done(rows: u64, failed_inputs: Option<u64>) -> TaskDone {
    let file = |path: &str, rows| ManifestFile {
        path: path.into(),
        rows,
        sha256: "00".repeat(32),
        bytes: 1000,
        extent: None,
    };
    TaskDone {
        chips_file: file("chips/x.parquet", rows),
        errors_file: failed_inputs.map(|n| file("errors/x.parquet", n)),
        output: None,
        empty_inputs: vec![],
        inputs_without_chips: 0,
        unclear_cells: 0,
        worker: "w".into(),
        finished_at: "2026-12-06T10:00:00Z".into(),
        seconds: 1.0,
    }
}

async fn state(url: &str) -> JobState {
    let client = async_nats::connect(url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    JobState::open(&js, &QueueConfig::default()).await.unwrap()
}

#[test]
fn a_finished_job_leaves_one_small_record_per_task() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    const TASKS: u64 = 40;
    make_images(&input, TASKS as usize);
    let s = submit_ok(&url, &input, &output, &["--task-files", "1"]);
    assert_eq!(s["tasks"], TASKS);
    let worker = Worker::start(&url, "w", &[], &[]);
    let st = wait_finished(&url, &output, FINISH);
    assert_eq!(
        (st["done"].as_u64(), st["chips"].as_u64()),
        (Some(TASKS), Some(TASKS)),
        "{st}"
    );
    drop(worker);
    let (code, report) = finalize(&url, &output);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(chip_counts(&output), (TASKS, TASKS, TASKS));

    let streams = nats.stream_states();
    let kv = &streams["KV_RSEMBED_STATE"];
    // One done record a task, the job record and its totals: no running
    // mark, tombstone or last error is left behind.
    assert_eq!(kv["messages"], TASKS + 2, "{streams:?}");
    let tasks = &streams["RSEMBED_TASKS"];
    assert_eq!(tasks["messages"], 0, "{streams:?}");
    // Every stream's bytes at rest, against the 300 bytes a task
    // (the job record and totals are a few hundred bytes for the job).
    let bytes: u64 = streams.values().map(|s| s["bytes"].as_u64().unwrap()).sum();
    assert!(
        bytes / TASKS <= 300,
        "{} bytes a task: {streams:?}",
        bytes / TASKS
    );
}

#[test]
fn totals_count_every_task_once_whoever_writes_and_folds() {
    let nats = NatsServer::start();
    let url = nats.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let s = state(&url).await;
        let job = "j0";
        // Two deliveries of one task both record it: the second changes nothing.
        s.put_done(job, "t0", &done(5, None)).await.unwrap();
        s.put_done(job, "t0", &done(7, Some(1))).await.unwrap();
        let t = s.totals(job).await.unwrap();
        assert_eq!((t.done, t.chips, t.failed_inputs), (1, 5, 0));

        // Many writers and folders at once.
        let mut handles = Vec::new();
        for w in 0..8 {
            let s = state(&url).await;
            handles.push(tokio::spawn(async move {
                for i in 0..25 {
                    let task = format!("t{}", 1 + (w * 25 + i) % 150);
                    s.put_done(job, &task, &done(2, Some(1))).await.unwrap();
                    if i % 5 == 0 {
                        s.totals(job).await.unwrap();
                    }
                }
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
        let t = s.totals(job).await.unwrap();
        // 150 distinct tasks written 200 times, plus t0.
        assert_eq!((t.done, t.chips, t.failed_inputs), (151, 5 + 300, 150));

        // A record taken out while others fold: counted out exactly once.
        let folders: Vec<_> = (0..4)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move {
                    let s = state(&url).await;
                    for _ in 0..10 {
                        s.totals(job).await.unwrap();
                    }
                })
            })
            .collect();
        for i in 1..=20 {
            s.clear_done(job, &format!("t{i}")).await.unwrap();
        }
        for f in folders {
            f.await.unwrap();
        }
        let t = s.totals(job).await.unwrap();
        assert_eq!((t.done, t.chips, t.failed_inputs), (131, 5 + 260, 130));
        // Written again after it was taken out: counted again, once.
        s.put_done(job, "t1", &done(2, None)).await.unwrap();
        let t = s.totals(job).await.unwrap();
        assert_eq!((t.done, t.chips), (132, 5 + 262));
        // A record not yet folded when it is taken out is never counted.
        s.put_done(job, "fresh", &done(100, None)).await.unwrap();
        s.clear_done(job, "fresh").await.unwrap();
        let t = s.totals(job).await.unwrap();
        assert_eq!((t.done, t.chips), (132, 5 + 262));
        // Failed records likewise.
        let failed = rsembed_schemas::queue::TaskFailed {
            task_id: "f1".into(),
            error: "e".into(),
            deliveries: 3,
            reason: "terminated".into(),
            failed_at: "2026-12-06T10:00:00Z".into(),
            message: "{}".into(),
        };
        s.put_failed(job, &failed).await.unwrap();
        s.put_failed(job, &failed).await.unwrap();
        assert_eq!(s.totals(job).await.unwrap().failed, 1);
        s.clear_failed(job, "f1").await.unwrap();
        assert_eq!(s.totals(job).await.unwrap().failed, 0);
    });
}

#[test]
fn status_after_a_replan_counts_only_the_new_plans_tasks() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 4);
    submit_ok(&url, &input, &output, &["--task-files", "1"]);
    let worker = Worker::start(&url, "w", &[], &[]);
    wait_finished(&url, &output, FINISH);
    // One input goes: its task is no longer planned, and its record and
    // chip file would otherwise still be counted and read.
    let gone = std::fs::read_dir(&input)
        .unwrap()
        .map(|e| e.unwrap().path())
        .min()
        .unwrap();
    std::fs::remove_file(&gone).unwrap();
    let s = submit_ok(&url, &input, &output, &["--task-files", "1"]);
    assert_eq!(
        (s["tasks"].as_u64(), s["superseded"].as_u64()),
        (Some(3), Some(1)),
        "{s}"
    );
    let st = wait_finished(&url, &output, FINISH);
    assert_eq!(
        (st["done"].as_u64(), st["chips"].as_u64()),
        (Some(3), Some(3)),
        "{st}"
    );
    drop(worker);
    let (code, report) = finalize(&url, &output);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(chip_counts(&output), (3, 3, 3));
    let _ = status(&url, &output);
}
