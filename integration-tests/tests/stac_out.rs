//! A finished job as STAC: `rsembed run` and `rsembed finalize` write
//! `<output>/stac/collection.json` and one item per chip file. Each output is
//! checked offline by `python/validate_stac.py`: pystac's bundled STAC 1.1.0
//! core schemas, the embeddings-extension rules, every href resolved, and the
//! item bboxes and datetimes against what DuckDB reads from the chip files.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rsembed_integration_tests::cluster::{finalize, submit_ok, wait_finished, Worker};
use rsembed_integration_tests::nats::NatsServer;
use rsembed_integration_tests::rasters::make_jpeg_geotiff;
use rsembed_integration_tests::s3::S3Server;
use rsembed_integration_tests::{python, root, rsembed, run, run_cmd, tiny_model};
use serde_json::Value;

/// Validates `<output>/stac/` and returns the validator's report.
fn validate(output: &Path) -> Value {
    let out = Command::new(python())
        .arg(root().join("integration-tests/python/validate_stac.py"))
        .arg(output)
        .output()
        .expect("python starts");
    assert!(
        out.status.success(),
        "validate_stac.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the validator prints JSON")
}

fn job(output: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(output.join("job.json")).unwrap()).unwrap()
}

fn items(report: &Value) -> Vec<&Value> {
    let mut v: Vec<&Value> = report["items"].as_array().unwrap().iter().collect();
    v.sort_by_key(|i| i["id"].as_str().unwrap().to_owned());
    v
}

/// Two georeferenced scenes of 512² (four chips each) and a plain image (one
/// chip, without a footprint).
fn make_input(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    make_jpeg_geotiff(&dir.join("a.tif"), 512);
    make_jpeg_geotiff(&dir.join("b.tif"), 512);
    image::RgbImage::from_fn(256, 256, |x, y| image::Rgb([x as u8, y as u8, 99]))
        .save(dir.join("plain.png"))
        .unwrap();
}

#[test]
fn run_writes_a_valid_collection_and_a_rerun_keeps_it_exact() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_input(&input);
    let embed = |extra: &[&str]| {
        let o = run(run_cmd(&input, &output, &tiny_model())
            .args(["--task-size", "1"])
            .args(extra));
        assert!(o.status.success(), "run failed");
    };
    embed(&[]);

    let report = validate(&output);
    let spec = job(&output);
    assert_eq!(report["dimensions"], spec["model"]["embed_dim"]);
    assert_eq!(report["data_type"], "float32");
    // Not a STAC input: the source is the input folder itself.
    assert_eq!(
        report["source"].as_str().unwrap().trim_end_matches('/'),
        format!("file://{}", input.canonicalize().unwrap().display())
    );
    let its = items(&report);
    assert_eq!(its.len(), 3, "one item per chip file: {report}");
    let chips: Vec<u64> = its.iter().map(|i| i["chips"].as_u64().unwrap()).collect();
    assert_eq!(chips.iter().sum::<u64>(), 9, "{chips:?}");
    let with_footprint = its.iter().filter(|i| !i["bbox"].is_null()).count();
    assert_eq!(with_footprint, 2, "the two GeoTIFFs; the PNG has none");
    for i in &its {
        // The item's bbox is exactly the union of its chips' (DuckDB's).
        assert_eq!(i["bbox"], i["chips_bbox"], "{i}");
        // No acquisition time: the job's creation, said to be that.
        assert_eq!(i["datetime_source"], "processing");
        assert_eq!(
            i["start"].as_str().unwrap()[..19],
            spec["created_at"].as_str().unwrap()[..19]
        );
        assert!(i["href"].as_str().unwrap().starts_with("../../chips/"));
    }

    // Written again by a rerun, byte for byte: the same job, the same documents.
    let before = std::fs::read(output.join("stac/collection.json")).unwrap();
    embed(&[]);
    assert_eq!(
        std::fs::read(output.join("stac/collection.json")).unwrap(),
        before
    );

    // A scene gone from the input: its chip file and its item go too.
    std::fs::remove_file(input.join("b.tif")).unwrap();
    embed(&[]);
    let report = validate(&output);
    let left: Vec<String> = items(&report)
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left.len(), 2, "{report}");
    let mut on_disk: Vec<String> = std::fs::read_dir(output.join("stac/items"))
        .unwrap()
        .map(|e| {
            let n = e.unwrap().file_name().into_string().unwrap();
            n.strip_suffix(".json").unwrap().to_owned()
        })
        .collect();
    on_disk.sort();
    assert_eq!(on_disk, left, "no item of a task the job no longer has");

    // Another job over the output (--overwrite): its own collection only.
    embed(&["--overwrite", "--chip-size", "128"]);
    let report = validate(&output);
    let its = items(&report);
    assert_eq!(its.len(), 2);
    assert_eq!(
        its.iter()
            .map(|i| i["chips"].as_u64().unwrap())
            .sum::<u64>(),
        16 + 1,
        "a 512² scene in 128² chips, and the PNG (one chip, as before)"
    );
    let c: Value =
        serde_json::from_slice(&std::fs::read(output.join("stac/collection.json")).unwrap())
            .unwrap();
    assert_eq!(
        c["emb:chip_layout"]["chip_size"],
        serde_json::json!([128, 128])
    );
    assert_eq!(c["rsembed:job_id"], job(&output)["job_id"]);
}

#[test]
fn finalize_writes_the_collection_of_a_distributed_job() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_input(&input);
    submit_ok(&url, &input, &output, &["--task-size", "1"]);
    let worker = Worker::start(&url, "w0", &[], &[]);
    wait_finished(&url, &output, Duration::from_secs(120));
    drop(worker);
    assert!(
        !output.join("stac/collection.json").exists(),
        "no collection before the job is finalized"
    );

    let (code, rep) = finalize(&url, &output);
    assert_eq!(code, Some(0), "{rep}");
    assert!(
        rep["stac"]
            .as_str()
            .unwrap()
            .ends_with("/stac/collection.json"),
        "{rep}"
    );
    let report = validate(&output);
    let its = items(&report);
    assert_eq!(its.len(), 3, "{report}");
    assert_eq!(
        its.iter()
            .map(|i| i["chips"].as_u64().unwrap())
            .sum::<u64>(),
        9
    );
    // Finalize again: the same documents.
    let before = std::fs::read(output.join("stac/collection.json")).unwrap();
    let (code, _) = finalize(&url, &output);
    assert_eq!(code, Some(0));
    assert_eq!(
        std::fs::read(output.join("stac/collection.json")).unwrap(),
        before
    );
}

#[test]
fn an_s3_output_gets_its_collection_in_the_bucket() {
    let s3 = S3Server::start();
    s3.create_bucket("output");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    make_input(&input);
    let mut cmd = rsembed();
    cmd.arg("run")
        .arg("--input")
        .arg(&input)
        .args(["--output", "s3://output/job", "--model"])
        .arg(tiny_model())
        .args(["--batch-size", "16", "--task-size", "1"]);
    let o = run(s3.configure(&mut cmd));
    assert!(o.status.success(), "run to S3 failed");
    let mut keys: Vec<String> = s3
        .list("s3://output/job/stac")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    keys.sort();
    assert_eq!(keys.len(), 4, "the collection and three items: {keys:?}");
    assert!(keys.contains(&"collection.json".to_owned()), "{keys:?}");

    // Downloaded as it is, the folder is a valid, self-contained catalog.
    let dl = dir.path().join("dl");
    s3.download("s3://output/job", &dl);
    let report = validate(&dl);
    assert_eq!(items(&report).len(), 3, "{report}");
    assert_eq!(
        items(&report)
            .iter()
            .filter(|i| !i["bbox"].is_null())
            .count(),
        2
    );
}
