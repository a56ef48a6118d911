//! Submit throughput: `publish_tasks` against raw async-nats JetStream
//! publishing of the same payloads, and optionally the whole `rsembed submit`
//! binary on a local tree of empty `.png` files (`--task-size 1`).
//!
//! ```text
//! cargo run --release -p rsembed-coordinator --example submit_bench -- \
//!     [--tasks 100000] [--rounds 3] [--nats-server PATH] [--rsembed PATH]
//! ```
//!
//! Every measurement gets its own nats-server with a fresh store directory,
//! so no run pays for the messages of the one before. Rounds alternate the
//! kinds (ours, raw[, e2e], ours, raw, ...) so drift on a noisy machine hits
//! all of them alike.

use std::collections::HashMap;
use std::future::IntoFuture;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use rsembed_coordinator::cli::TilingArgs;
use rsembed_coordinator::job::setup::tiling_spec;
use rsembed_coordinator::job::submit::{publish_tasks, PublishJob, SubmitSummary};
use rsembed_coordinator::queue::{self, Queue, QueueConfig};
use rsembed_schemas::job::{ModelRef, TilingSpec};
use rsembed_schemas::queue::{TaskMessage, MESSAGE_FORMAT};
use rsembed_schemas::task::{Task, TaskInput};
use rsembed_worker::model::ModelDir;
use rsembed_worker::store::StoreCache;
use tokio::sync::mpsc;

/// The window `publish_tasks` uses, so the baseline is not given a bigger one.
const WINDOW: usize = 512;

const JOB: &str = "0123456789abcdef0123456789abcdef";
const OUTPUT: &str = "s3://bucket/out";

struct Args {
    tasks: usize,
    rounds: usize,
    nats_server: PathBuf,
    rsembed: Option<PathBuf>,
}

fn parse_args() -> Args {
    let mut a = Args {
        tasks: 100_000,
        rounds: 3,
        nats_server: std::env::var_os("NATS_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| "nats-server".into()),
        rsembed: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--tasks" => a.tasks = val().parse().expect("--tasks N"),
            "--rounds" => a.rounds = val().parse().expect("--rounds N"),
            "--nats-server" => a.nats_server = val().into(),
            "--rsembed" => a.rsembed = Some(val().into()),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

/// A nats-server child with JetStream on a free port and its own store.
struct Server {
    child: Child,
    url: String,
    _store: tempfile::TempDir,
}

impl Server {
    async fn start(bin: &Path) -> Server {
        let store = tempfile::tempdir().expect("a store dir");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(bin)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", bin.display()));
        let url = format!("nats://127.0.0.1:{port}");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(10), "no server");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Server {
            child,
            url,
            _store: store,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn make_tasks(n: usize) -> Vec<Task> {
    (0..n)
        .map(|i| {
            Task::new(
                JOB,
                vec![TaskInput {
                    uri: format!("s3://bucket/chips/{i:06}.png"),
                    size: 1000,
                    version: Some(format!("{:032x}", i as u128 * 0x9e37_79b9_7f4a_7c15)),
                    chips: None,
                    parts: vec![],
                    item: None,
                }],
            )
        })
        .collect()
}

/// The bytes `publish_tasks` sends for each task, made the same way.
fn payloads(tasks: &[Task], model: &ModelRef, tiling: &TilingSpec) -> Vec<(String, Bytes)> {
    let fingerprint = model.fingerprint();
    tasks
        .iter()
        .map(|t| {
            let msg = TaskMessage {
                format: MESSAGE_FORMAT,
                model_fingerprint: fingerprint.clone(),
                model_name: model.name.clone(),
                output: OUTPUT.into(),
                tiling: tiling.clone(),
                task: t.clone(),
            };
            let body = serde_json::to_vec(&msg).expect("a task serializes");
            (t.task_id.clone(), Bytes::from(body))
        })
        .collect()
}

async fn stored(js: &jetstream::Context) -> u64 {
    let cfg = QueueConfig::default();
    js.get_stream(&cfg.stream)
        .await
        .expect("the stream")
        .get_info()
        .await
        .expect("stream info")
        .state
        .messages
}

async fn ours(bin: &Path, tasks: Vec<Task>, model: &ModelRef, tiling: &TilingSpec) -> f64 {
    let server = Server::start(bin).await;
    let client = queue::connect(&server.url).await.expect("connect");
    let q = Queue::open(client, &QueueConfig::default(), true)
        .await
        .expect("queue");
    let dir = tempfile::tempdir().expect("an output dir");
    let mut output = StoreCache::default()
        .location(dir.path().to_str().expect("a UTF-8 temp path"))
        .expect("a local location");
    // Messages name this output, as in the baseline's payloads.
    output.url = OUTPUT.parse().expect("a URL");
    let (done, failed) = (HashMap::new(), HashMap::new());
    let n = tasks.len() as u64;
    let mut s = SubmitSummary {
        job_id: JOB.into(),
        output: OUTPUT.into(),
        tasks: 0,
        inputs: 0,
        published: 0,
        duplicates: 0,
        done: 0,
        failed: 0,
        requeued: 0,
        retried: 0,
        failed_inputs: 0,
        superseded: 0,
        outside_windows: 0,
        dropped_past_max_scenes: 0,
        seconds: 0.0,
    };
    // The capacity `submit` gives the planner's channel.
    let (tx, rx) = mpsc::channel::<Task>(256);
    let mut rx = std::pin::pin!(rsembed_coordinator::job::plan::receiver_stream(rx));
    let started = Instant::now();
    let producer = tokio::spawn(async move {
        for t in tasks {
            if tx.send(t).await.is_err() {
                break;
            }
        }
    });
    publish_tasks(
        &PublishJob {
            job_id: JOB,
            queue: &q,
            output: &rsembed_coordinator::job::output::JobOutput::new(output.clone()),
            model,
            tiling,
            done: &done,
            failed: &failed,
            retry_failed: false,
        },
        &mut rx,
        &mut s,
    )
    .await
    .expect("publish_tasks");
    let secs = started.elapsed().as_secs_f64();
    producer.await.expect("producer");
    assert_eq!(s.published, n, "every task stored");
    assert_eq!(stored(&q.js).await, n);
    let ids = std::fs::read_to_string(dir.path().join("tasks.txt")).expect("tasks.txt");
    assert_eq!(ids.lines().count() as u64, n);
    secs
}

async fn raw(bin: &Path, payloads: &[(String, Bytes)]) -> f64 {
    let server = Server::start(bin).await;
    let client = async_nats::connect(&server.url).await.expect("connect");
    let js = jetstream::new(client);
    let cfg = QueueConfig::default();
    // The same consumer as `Queue::open` makes, so the server does the same
    // bookkeeping per stored message.
    js.create_stream(cfg.stream_config())
        .await
        .expect("stream")
        .create_consumer(cfg.consumer_config())
        .await
        .expect("consumer");
    let subject = queue::task_subject(JOB);
    let started = Instant::now();
    let mut acks = FuturesUnordered::new();
    for (id, body) in payloads {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
        let ack = js
            .publish_with_headers(subject.clone(), headers, body.clone())
            .await
            .expect("publish");
        // `FuturesUnordered` needs a `Future`; the ack is only `IntoFuture`.
        acks.push(ack.into_future());
        if acks.len() >= WINDOW {
            acks.next().await.expect("an ack").expect("ack ok");
        }
    }
    while let Some(ack) = acks.next().await {
        ack.expect("ack ok");
    }
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(stored(&js).await, payloads.len() as u64);
    secs
}

/// 100 folders of empty `.png` files: the planner only lists and stats them.
fn make_tree(root: &Path, n: usize) {
    for i in 0..n {
        let dir = root.join(format!("d{:02}", i % 100));
        if i < 100 {
            std::fs::create_dir_all(&dir).expect("a folder");
        }
        std::fs::File::create(dir.join(format!("{i:06}.png"))).expect("a file");
    }
}

async fn e2e(bin: &Path, rsembed: &Path, tree: &Path, model: &Path, n: usize) -> f64 {
    let server = Server::start(bin).await;
    let out = tempfile::tempdir().expect("an output dir");
    let started = Instant::now();
    let o = Command::new(rsembed)
        .args([
            "submit",
            "--nats",
            &server.url,
            "--task-size",
            "1",
            "--json",
        ])
        .arg("--input")
        .arg(tree)
        .arg("--output")
        .arg(out.path())
        .arg("--model")
        .arg(model)
        .env("RSEMBED_LOG", "warn")
        .stderr(Stdio::inherit())
        .output()
        .expect("rsembed starts");
    let secs = started.elapsed().as_secs_f64();
    assert!(o.status.success(), "rsembed submit failed");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON summary");
    assert_eq!(v["published"].as_u64(), Some(n as u64), "{v}");
    secs
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

#[tokio::main]
async fn main() {
    let a = parse_args();
    let model_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-siglip");
    let model = ModelDir::open(&model_dir).expect("the test model");
    let model_ref = model.model_ref(false).expect("model ref");
    let tiling_args = TilingArgs {
        chip_size: None,
        stride: None,
        bands: None,
        scale: "auto".into(),
        min_valid: None,
        task_size: Some(1),
        task_bytes: Some(u64::MAX),
        task_chips: None,
        band_files: None,
        assets: None,
        cloud_mask: None,
        max_cloud: None,
        footprint_tolerance: Some(rsembed_schemas::job::DEFAULT_FOOTPRINT_TOLERANCE),
        embedding_type: Default::default(),
        align: Default::default(),
        window: Default::default(),
        shard_bytes: Some(16 << 20),
        stac: Default::default(),
    };
    let tiling = tiling_spec(&tiling_args, &model).expect("tiling");
    let bodies = payloads(&make_tasks(a.tasks), &model_ref, &tiling);
    let mean = bodies.iter().map(|(_, b)| b.len()).sum::<usize>() / bodies.len().max(1);
    println!(
        "{} tasks, {} B per message on average, ack window {WINDOW}",
        a.tasks, mean
    );
    let tree = a.rsembed.as_ref().map(|_| {
        let t = tempfile::tempdir().expect("an input dir");
        make_tree(t.path(), a.tasks);
        t
    });
    let (mut o, mut r, mut e) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=a.rounds {
        let tasks = make_tasks(a.tasks);
        let so = ours(&a.nats_server, tasks, &model_ref, &tiling).await;
        let sr = raw(&a.nats_server, &bodies).await;
        o.push(a.tasks as f64 / so);
        r.push(a.tasks as f64 / sr);
        let mut line = format!(
            "round {round}: ours {:>8.0}/s  raw {:>8.0}/s  ratio {:.2}",
            o[round - 1],
            r[round - 1],
            sr / so
        );
        if let (Some(bin), Some(tree)) = (&a.rsembed, &tree) {
            let se = e2e(&a.nats_server, bin, tree.path(), &model_dir, a.tasks).await;
            e.push(a.tasks as f64 / se);
            line += &format!(
                "  e2e {:>8.0}/s  ratio {:.2}",
                e[round - 1],
                e[round - 1] / r[round - 1]
            );
        }
        println!("{line}");
    }
    let ratios: Vec<f64> = o.iter().zip(&r).map(|(o, r)| o / r).collect();
    println!(
        "median: ours {:.0}/s  raw {:.0}/s  ratio ours/raw {:.2} (per-round median {:.2})",
        median(&o),
        median(&r),
        median(&o) / median(&r),
        median(&ratios)
    );
    if !e.is_empty() {
        let er: Vec<f64> = e.iter().zip(&r).map(|(e, r)| e / r).collect();
        println!(
            "median: e2e submit {:.0}/s  ratio e2e/raw {:.2} (per-round median {:.2})",
            median(&e),
            median(&e) / median(&r),
            median(&er)
        );
    }
}
