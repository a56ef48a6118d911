//! `rsembed run --metrics-addr`: the Prometheus endpoint answers while a real
//! run works (real ONNX Runtime, real files), and pipelined inference writes
//! the same rows in the same order as the most sequential settings.
//!
//! The endpoint is scraped from the test over a plain TCP socket while the run
//! is going. There is no option to keep serving after the run, so the test
//! needs one scrape to land during it: the server listens before the model
//! loads and the run embeds a few hundred images over several seconds, while
//! the test scrapes every 20 ms. The endpoint's format, types, values and 404
//! are tested exactly at the library level (`worker/src/http.rs`).

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use rsembed_integration_tests::*;
use serde_json::Value;

/// `copies` copies of every fixture image, under distinct names.
fn many_images(dir: &Path, copies: usize) -> usize {
    std::fs::create_dir_all(dir).unwrap();
    let mut n = 0;
    for e in std::fs::read_dir(fixture_images()).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        for c in 0..copies {
            std::fs::copy(&p, dir.join(format!("c{c:03}_{name}"))).unwrap();
            n += 1;
        }
    }
    n
}

/// The text format: family → type, series → value.
fn parse(text: &str) -> (HashMap<String, String>, HashMap<String, f64>) {
    let mut types = HashMap::new();
    let mut values = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line has a type");
            types.insert(name.to_owned(), kind.to_owned());
        } else if !line.starts_with('#') && !line.is_empty() {
            let (series, v) = line.rsplit_once(' ').expect("series and value");
            values.insert(series.to_owned(), v.parse().expect("a number"));
        }
    }
    (types, values)
}

#[test]
fn metrics_endpoint_answers_while_a_run_works() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let n = many_images(&input, 30);
    let port = free_port();
    let max_batch = 8;
    let mut cmd = run_cmd(&input, &tmp.path().join("out"), &tiny_model());
    cmd.args([
        "--batch-size",
        "auto",
        "--max-batch",
        &max_batch.to_string(),
    ])
    .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("rsembed starts");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));

    let started = Instant::now();
    let mut scrapes = Vec::new();
    let mut not_found = None;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(started.elapsed() < Duration::from_secs(300), "run hangs");
        if let Some((status, body)) = http_get(port, "/metrics") {
            assert_eq!(status, "HTTP/1.1 200 OK");
            scrapes.push(body);
            if not_found.is_none() {
                not_found = http_get(port, "/");
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("stdout:\n{}", stdout.join().unwrap());
    eprintln!("stderr:\n{}", stderr.join().unwrap());
    assert_eq!(status.code(), Some(0));
    eprintln!(
        "{} scrapes; last:\n{}",
        scrapes.len(),
        scrapes.last().map_or("", |s| s)
    );

    assert!(!scrapes.is_empty(), "no scrape answered during the run");
    if let Some((status, _)) = &not_found {
        assert_eq!(status, "HTTP/1.1 404 Not Found");
    }
    let mut last_chips = 0.0;
    let mut working = 0;
    for body in &scrapes {
        let (types, v) = parse(body);
        for (name, kind) in [
            ("rsembed_worker_chips_total", "counter"),
            ("rsembed_worker_failed_inputs_total", "counter"),
            ("rsembed_worker_oom_total", "counter"),
            ("rsembed_worker_batch_size", "gauge"),
            ("rsembed_worker_batch_ceiling", "gauge"),
            ("rsembed_worker_queue_chips", "gauge"),
            ("rsembed_worker_queue_batches", "gauge"),
            ("rsembed_worker_queue_tasks", "gauge"),
            ("rsembed_worker_inference_seconds", "histogram"),
        ] {
            assert_eq!(types.get(name).map(String::as_str), Some(kind), "{name}");
        }
        assert!(
            !types.contains_key("rsembed_worker_gpu_memory_used_bytes"),
            "no NVML on CPU"
        );
        let chips = v["rsembed_worker_chips_total"];
        assert!(chips >= last_chips && chips <= n as f64, "{chips}");
        last_chips = chips;
        assert_eq!(v["rsembed_worker_failed_inputs_total"], 0.0);
        assert_eq!(v["rsembed_worker_oom_total"], 0.0);
        let chips_queued = v["rsembed_worker_queue_chips"];
        let batches = v["rsembed_worker_queue_batches"];
        // Two tasks in flight, each at most 5·B + D decoded chips and two batches.
        let d = std::thread::available_parallelism().map_or(2, |n| n.get());
        let bound = 2 * (5 * max_batch + d);
        assert!(
            chips_queued >= 0.0 && chips_queued <= bound as f64,
            "{chips_queued}"
        );
        assert!((0.0..=4.0).contains(&batches), "{batches}");
        if chips > 0.0 {
            working += 1;
            let bucket = v["rsembed_worker_batch_size"] as usize;
            let ceiling = v["rsembed_worker_batch_ceiling"] as usize;
            assert!(
                bucket.is_power_of_two() && bucket <= ceiling && ceiling <= max_batch,
                "bucket {bucket}, ceiling {ceiling}"
            );
            let runs = v["rsembed_worker_inference_seconds_count"];
            assert!(runs >= 1.0);
            assert_eq!(
                v["rsembed_worker_inference_seconds_bucket{le=\"+Inf\"}"],
                runs
            );
            assert!(v["rsembed_worker_inference_seconds_sum"] > 0.0);
        }
    }
    assert!(working > 0, "no scrape landed while chips were embedded");
    assert!(
        http_get(port, "/metrics").is_none(),
        "the endpoint closes with the run"
    );
}

/// Every row of a dataset, file by file in file order, embedding apart.
fn rows(out: &Path) -> (Vec<Value>, Vec<Vec<f64>>) {
    let glob = format!("{}/chips/*.parquet", out.display());
    let r = duckdb(&format!(
        "SELECT parse_filename(filename), file_row_number, chip_id, source_uri, x, y, \
         width, height, valid_fraction, embedding \
         FROM read_parquet('{glob}', filename = true, file_row_number = true) ORDER BY 1, 2"
    ));
    let mut keys = Vec::new();
    let mut embs = Vec::new();
    for row in r.as_array().unwrap() {
        let mut row = row.as_array().unwrap().clone();
        let e = row.pop().unwrap();
        embs.push(
            e.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect(),
        );
        keys.push(Value::Array(row));
    }
    (keys, embs)
}

/// `rows` with each file name replaced by the chip id of the file's first
/// row, sorted by that and the row index (embeddings kept alongside).
fn by_first_chip((keys, embs): (Vec<Value>, Vec<Vec<f64>>)) -> (Vec<Value>, Vec<Vec<f64>>) {
    let first: std::collections::HashMap<String, Value> = keys
        .iter()
        .filter(|k| k[1] == 0)
        .map(|k| (k[0].to_string(), k[2].clone()))
        .collect();
    let mut rows: Vec<(Value, Vec<f64>)> = keys
        .into_iter()
        .zip(embs)
        .map(|(mut k, e)| {
            k[0] = first[&k[0].to_string()].clone();
            (k, e)
        })
        .collect();
    rows.sort_by_key(|(k, _)| (k[0].to_string(), k[1].as_u64().unwrap()));
    rows.into_iter().unzip()
}

#[test]
fn pipelined_runs_write_the_same_rows_in_the_same_order() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let n = many_images(&input, 10);
    let piped = tmp.path().join("piped");
    let serial = tmp.path().join("serial");
    let task_size = ["--task-size", "16"];
    let o = run(run_cmd(&input, &piped, &tiny_model())
        .args(task_size)
        .args(["--batch-size", "4"]));
    assert_eq!(o.status.code(), Some(0));
    let o = run(run_cmd(&input, &serial, &tiny_model())
        .args(task_size)
        .args(["--batch-size", "4"])
        .args(["--tasks-in-flight", "1", "--decode-threads", "1"]));
    assert_eq!(o.status.code(), Some(0));

    // The outputs differ, so do the job and task ids, and so the file
    // names: each file is named by its first chip instead.
    let (a_keys, a_emb) = by_first_chip(rows(&piped));
    let (b_keys, b_emb) = by_first_chip(rows(&serial));
    assert_eq!(a_keys.len(), n, "one row per image");
    let files: std::collections::BTreeSet<String> =
        a_keys.iter().map(|k| k[0].to_string()).collect();
    assert!(files.len() > 1, "several tasks, so tasks ran side by side");
    assert_eq!(a_keys, b_keys, "same files, same rows, same order");
    for (i, (a, b)) in a_emb.iter().zip(&b_emb).enumerate() {
        assert_eq!(a.len(), b.len());
        // ONNX Runtime's CPU kernels may round a row differently when the rows
        // around it in a batch differ; the tolerance covers that, not mix-ups
        // (two different images' embeddings are far further apart).
        let d = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(d < 1e-5, "row {i}: embeddings differ by {d}");
    }
}
