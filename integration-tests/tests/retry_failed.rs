//! `--retry-failed` (issue 28.2): a rerun runs again the tasks that did not
//! finish cleanly, in both modes. Embedded: the item collection
//! whose asset file is missing, then created. Distributed: a done task with
//! a corrupt input, then repaired, requeued by `submit --retry-failed`. Each
//! ends with every chip exactly once (DuckDB) and no errors file left.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use rsembed_integration_tests::cluster::{
    chip_counts, finalize, make_images, status, submit_ok, wait_finished, Worker,
};
use rsembed_integration_tests::nats::NatsServer;
use rsembed_integration_tests::stac::write_feature_collection;
use rsembed_integration_tests::stac_scenes::{item, make_scene, ItemStyle};
use rsembed_integration_tests::*;
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(300);

fn errors_files(out: &Path) -> usize {
    std::fs::read_dir(out.join("errors"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn run_items(items: &Path, out: &Path, extra: &[&str]) -> (Output, Value) {
    let o = run_timeout(
        run_cmd(items, out, &tiny_model())
            .args(["--json"])
            .args(extra),
        LIMIT,
    );
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o, v)
}

#[test]
fn an_embedded_run_retries_an_item_whose_asset_file_came_later() {
    let tmp = tempfile::tempdir().unwrap();
    // 256² pixels: one chip per item at the test model's 256.
    let scene = make_scene(&tmp.path().join("scene"), 256, (500_000.0, 5_000_000.0), 7);
    let late = tmp.path().join("late");
    let here = |f: &str| format!("file://{}", scene.path(f).display());
    let there = |f: &str| format!("file://{}", late.join(f).display());
    let t = "2024-06-15T10:00:00Z";
    let items = tmp.path().join("items.json");
    write_feature_collection(
        &items,
        &[
            item(&scene, "ready", "s2", t, json!(1), ItemStyle::Visual, &here),
            item(&scene, "late", "s2", t, json!(1), ItemStyle::Visual, &there),
        ],
    );
    let out = tmp.path().join("out");

    let (o, s) = run_items(&items, &out, &[]);
    assert_eq!(o.status.code(), Some(3), "an input failed: {s}");
    assert_eq!(s["failed_inputs"], 1, "{s}");
    assert_eq!(errors_files(&out), 1);
    // The text summary says how to retry.
    let o = run_timeout(&mut run_cmd(&items, &out, &tiny_model()), LIMIT);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(
        text.contains("1 input failed (listed in errors/)") && text.contains("--retry-failed"),
        "{text}"
    );

    // The file arrives; a plain rerun keeps the task as it finished.
    std::fs::create_dir_all(&late).unwrap();
    std::fs::copy(scene.path("visual.tif"), late.join("visual.tif")).unwrap();
    let (o, s) = run_items(&items, &out, &[]);
    assert_eq!(o.status.code(), Some(3), "unchanged without the flag: {s}");
    assert_eq!(s["tasks_resumed"], s["tasks"], "{s}");

    let (o, s) = run_items(&items, &out, &["--retry-failed"]);
    assert_eq!(o.status.code(), Some(0), "{s}");
    assert_eq!(s["failed_inputs"], 0, "{s}");
    assert_eq!(s["tasks_retried"], 1, "{s}");
    assert_eq!(errors_files(&out), 0, "the retry removed the errors file");
    let (rows, ids, sources) = chip_counts(&out);
    assert_eq!((rows, ids, sources), (2, 2, 2), "every chip once");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(
        (&manifest["rows"], &manifest["failed_inputs"]),
        (&json!(2), &json!(0))
    );
}

#[test]
fn submit_retry_failed_requeues_a_done_task_with_a_failed_input() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    let images = make_images(&input, 4);
    let good = std::fs::read(&images[1]).unwrap();
    // Read, but not an image: an error row of a task that is done.
    std::fs::write(&images[1], b"not a png").unwrap();
    let flags = ["--task-size", "1"];
    submit_ok(&url, &input, &output, &flags);
    let w = Worker::start(&url, "w", &[], &[]);
    let st = wait_finished(&url, &output, LIMIT);
    assert_eq!(
        (&st["done"], &st["failed"], &st["failed_inputs"]),
        (&json!(4), &json!(0), &json!(1)),
        "{st}"
    );
    assert_eq!(errors_files(&output), 1);

    // Repaired. A plain resubmit leaves the task done, and says how to retry.
    std::fs::write(&images[1], &good).unwrap();
    let again = submit_ok(&url, &input, &output, &flags);
    assert_eq!(
        (&again["done"], &again["published"], &again["failed_inputs"]),
        (&json!(4), &json!(0), &json!(1)),
        "{again}"
    );
    let retry = submit_ok(
        &url,
        &input,
        &output,
        &["--task-size", "1", "--retry-failed"],
    );
    assert_eq!(
        (&retry["retried"], &retry["published"], &retry["done"]),
        (&json!(1), &json!(1), &json!(3)),
        "{retry}"
    );
    let st = wait_finished(&url, &output, LIMIT);
    assert_eq!(
        (&st["done"], &st["failed_inputs"]),
        (&json!(4), &json!(0)),
        "{st}"
    );
    assert_eq!(errors_files(&output), 0, "the retry left no errors file");
    assert_eq!(chip_counts(&output), (4, 4, 4), "every chip once");
    drop(w);
    let (code, report) = finalize(&url, &output);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(status(&url, &output)["failed_inputs"], 0);
}
