//! A finished job as STAC: `rsembed run` and `rsembed finalize` write
//! `<output>/stac/collection.json` and one item per chip file. Each output is
//! checked offline by `python/validate_stac.py`: pystac's bundled STAC 1.1.0
//! core schemas, the embeddings-extension rules, every href resolved, the
//! item bboxes and datetimes against what DuckDB reads from the chip files,
//! and (Shapely) each item's geometry valid and covering every chip. Items
//! are then searched with a real STAC API (`rustac serve`) over the output.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rsembed_integration_tests::cluster::{finalize, submit_ok, wait_finished, Worker};
use rsembed_integration_tests::nats::NatsServer;
use rsembed_integration_tests::rasters::make_jpeg_geotiff;
use rsembed_integration_tests::s3::S3Server;
use rsembed_integration_tests::stac::{collection, write_feature_collection, StacServer};
use rsembed_integration_tests::stac_scenes::{item, make_scene, ItemStyle, SceneFiles};
use rsembed_integration_tests::{
    duckdb, http_get, python, root, rsembed, run, run_cmd, run_timeout, tiny_model,
};
use serde_json::{json, Value};

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
        // The item's bbox is the union of its chips' (DuckDB's), grown by
        // at most a few centimetres: the outline's vertices are on a grid
        // of 1e-7 degrees.
        if !i["bbox"].is_null() {
            let (b, c) = (
                i["bbox"].as_array().unwrap(),
                i["chips_bbox"].as_array().unwrap(),
            );
            for k in 0..4 {
                let (b, c) = (b[k].as_f64().unwrap(), c[k].as_f64().unwrap());
                let out = if k < 2 { c - b } else { b - c };
                assert!((0.0..5e-6).contains(&out), "{i}");
            }
        }
        // No acquisition time: the job's creation, said to be that.
        assert_eq!(i["datetime_source"], "processing");
        assert_eq!(
            i["start"].as_str().unwrap()[..19],
            spec["created_at"].as_str().unwrap()[..19]
        );
        assert!(i["href"].as_str().unwrap().starts_with("../../chips/"));
    }

    // Written again by a rerun: the same job, the same documents. The
    // items' Parquet file holds the same rows in the order the tasks
    // finished (the run holds none of them), so only its digest and the
    // order of the item links may differ.
    let collection = || {
        let mut c: Value =
            serde_json::from_slice(&std::fs::read(output.join("stac/collection.json")).unwrap())
                .unwrap();
        let asset = c["assets"]["geoparquet-items"].as_object_mut().unwrap();
        asset.remove("file:checksum").unwrap();
        asset.remove("file:size").unwrap();
        // The item links follow the same order.
        c["links"]
            .as_array_mut()
            .unwrap()
            .sort_by_key(|l| l["href"].as_str().unwrap().to_owned());
        c
    };
    let parquet_items = || {
        duckdb(&format!(
            "SELECT id, ST_AsText(geometry) FROM '{}' ORDER BY id",
            output.join("stac/items.parquet").display()
        ))
    };
    let (before, before_items) = (collection(), parquet_items());
    embed(&[]);
    assert_eq!(collection(), before);
    assert_eq!(parquet_items(), before_items);

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
    assert_eq!(
        keys.len(),
        5,
        "the collection, items.parquet and three items: {keys:?}"
    );
    assert!(keys.contains(&"collection.json".to_owned()), "{keys:?}");
    assert!(keys.contains(&"items.parquet".to_owned()), "{keys:?}");

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

/// `--task-files` that puts a few inputs in one task: boundaries come from a
/// hash of each input's URL (which holds the temporary folder's random
/// name), one in this many.
const ONE_TASK: &str = "1000000";

/// Two 512² scenes (four chips each) far apart, both near 15°E in UTM 33N:
/// one at 45°N, one at 9°N.
fn two_places(dir: &Path) -> (SceneFiles, SceneFiles) {
    (
        make_scene(&dir.join("north"), 512, (500_000.0, 5_000_000.0), 1),
        make_scene(&dir.join("south"), 512, (500_000.0, 1_000_000.0), 2),
    )
}

/// `rustac serve` over the output's collection and items. The collection
/// goes without its `item` links: rustac resolves `./items/…` against the
/// collection's folder's parent, so the items are given as files instead.
fn serve_output(output: &Path, scratch: &Path) -> StacServer {
    let mut c: Value =
        serde_json::from_slice(&std::fs::read(output.join("stac/collection.json")).unwrap())
            .unwrap();
    c["links"]
        .as_array_mut()
        .unwrap()
        .retain(|l| l["rel"] != "item");
    let cpath = scratch.join("served-collection.json");
    std::fs::write(&cpath, c.to_string()).unwrap();
    let items: Vec<PathBuf> = std::fs::read_dir(output.join("stac/items"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let mut files: Vec<&Path> = vec![&cpath];
    files.extend(items.iter().map(PathBuf::as_path));
    StacServer::start(&files)
}

/// The ids of the items a `GET /search?<query>` returns.
fn search(server: &StacServer, query: &str) -> Vec<String> {
    let (status, body) = http_get(server.port(), &format!("/search?{query}")).unwrap();
    assert!(status.contains(" 200"), "{status}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Every chip's bbox: xmin, ymin, xmax, ymax.
fn chip_bboxes(output: &Path) -> Vec<[f64; 4]> {
    let rows = duckdb(&format!(
        "SELECT bbox.xmin, bbox.ymin, bbox.xmax, bbox.ymax FROM read_parquet('{}/chips/*.parquet') \
         WHERE bbox IS NOT NULL ORDER BY source_uri, y, x",
        output.display()
    ));
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| [0, 1, 2, 3].map(|i| r[i].as_f64().unwrap()))
        .collect()
}

fn bbox_query(b: [f64; 4]) -> String {
    format!("bbox={},{},{},{}", b[0], b[1], b[2], b[3])
}

#[test]
fn an_item_of_two_distant_places_is_found_only_where_its_chips_are() {
    let dir = tempfile::tempdir().unwrap();
    let (north, south) = two_places(dir.path());
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::create_dir_all(&input).unwrap();
    std::fs::copy(north.path("visual.tif"), input.join("north.tif")).unwrap();
    std::fs::copy(south.path("visual.tif"), input.join("south.tif")).unwrap();
    let embed = || {
        let o = run(run_cmd(&input, &output, &tiny_model()).args(["--task-files", ONE_TASK]));
        assert!(o.status.success(), "run failed");
    };
    embed();

    let report = validate(&output);
    let its = items(&report);
    assert_eq!(its.len(), 1, "one task, one item: {report}");
    let it = its[0];
    assert_eq!(it["chips"], 8);
    let id = it["id"].as_str().unwrap().to_owned();

    let server = serve_output(&output, dir.path());
    // Between the two places, inside the item's bbox: nothing there.
    let bbox = it["bbox"].as_array().unwrap();
    assert!(
        bbox[1].as_f64() < Some(20.0) && bbox[3].as_f64() > Some(30.0),
        "{it}"
    );
    assert_eq!(
        search(&server, "bbox=14.9,20,15.1,30"),
        Vec::<String>::new()
    );
    // Each chip's own bbox finds the item that holds it.
    let chips = chip_bboxes(&output);
    assert_eq!(chips.len(), 8);
    for b in [chips[0], chips[7]] {
        assert_eq!(
            search(&server, &bbox_query(b)),
            std::slice::from_ref(&id),
            "{b:?}"
        );
    }
    drop(server);
    assert_eq!(it["geometry_type"], "MultiPolygon", "{it}");
    assert_eq!(it["polygons"], 2, "{it}");

    // A rerun resumes every task from its chip file's footer alone and
    // writes the same item.
    let before = std::fs::read(output.join(format!("stac/items/{id}.json"))).unwrap();
    embed();
    assert_eq!(
        std::fs::read(output.join(format!("stac/items/{id}.json"))).unwrap(),
        before
    );
}

#[test]
fn a_stac_job_links_its_input_items_and_its_search_as_sent() {
    let dir = tempfile::tempdir().unwrap();
    let (north, south) = two_places(dir.path());
    let href = |s: &SceneFiles| {
        let s = s.clone();
        move |name: &str| format!("file://{}", s.path(name).display())
    };
    let (hn, hs) = (href(&north), href(&south));
    let inputs = [
        item(
            &north,
            "n1",
            "s2",
            "2024-06-15T10:00:00Z",
            json!(5),
            ItemStyle::Visual,
            &hn,
        ),
        item(
            &south,
            "s1",
            "s2",
            "2024-07-01T10:00:00Z",
            json!(20),
            ItemStyle::Visual,
            &hs,
        ),
        item(
            &north,
            "cloudy",
            "s2",
            "2024-06-20T10:00:00Z",
            json!(90),
            ItemStyle::Visual,
            &hn,
        ),
    ];
    let colls = dir.path().join("s2.json");
    std::fs::write(&colls, collection("s2").to_string()).unwrap();
    let items_file = dir.path().join("items.json");
    write_feature_collection(&items_file, &inputs);
    // rustac serve conforms to item search only: no filter, no query.
    let api = StacServer::start(&[&colls, &items_file]);
    let output = dir.path().join("out");
    let o = run_timeout(
        run_cmd(Path::new(&api.url()), &output, &tiny_model()).args([
            "--collections",
            "s2",
            "--cloud-cover-max",
            "30",
            "--task-files",
            ONE_TASK,
        ]),
        Duration::from_secs(300),
    );
    assert_eq!(o.status.code(), Some(0), "run:\n{}", api.log());

    // The collection's source link is the search as it was sent: the
    // server never saw the cloud cover, so the link does not carry it, and
    // following it gives every item the job embedded.
    let c: Value =
        serde_json::from_slice(&std::fs::read(output.join("stac/collection.json")).unwrap())
            .unwrap();
    let link = c["links"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["rel"] == "emb:source-data")
        .unwrap()
        .clone();
    let href = link["href"].as_str().unwrap();
    let path = href.strip_prefix(api.url().trim_end_matches('/')).unwrap();
    let (status, body) = http_get(api.port(), path).unwrap();
    assert!(status.contains(" 200"), "{status}");
    let found: Value = serde_json::from_str(&body).unwrap();
    let ids: Vec<&str> = found["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    for embedded in ["n1", "s1"] {
        assert!(
            ids.contains(&embedded),
            "{embedded} not in {ids:?} from {href}"
        );
    }
    assert_eq!(link["rsembed:client_filter"], "\"eo:cloud_cover\" <= 30");
    let (_, query) = href.split_once('?').unwrap();
    assert!(
        query
            .split('&')
            .all(|kv| !kv.starts_with("filter") && !kv.starts_with("query=")),
        "{href}"
    );

    let spec = job(&output);
    assert_eq!(spec["search"]["cloud_cover_by"], "client", "{spec}");
    let report = validate(&output);
    let its = items(&report);
    assert_eq!(its.len(), 1, "{report}");
    let item_url = |id: &str| format!("{}collections/s2/items/{id}", api.url());
    assert_eq!(
        its[0]["derived_from"],
        json!([item_url("n1"), item_url("s1")]),
        "{report}"
    );
    assert_eq!(its[0]["polygons"], 2);
    let doc: Value = serde_json::from_slice(
        &std::fs::read(output.join(format!(
            "stac/items/{}.json",
            its[0]["id"].as_str().unwrap()
        )))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        doc["properties"]["emb:runtime_parameters"]["client_filter"],
        "\"eo:cloud_cover\" <= 30"
    );
}

#[test]
fn finalize_writes_the_items_from_the_done_records_without_reading_a_chip_file() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (north, south) = two_places(dir.path());
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::create_dir_all(&input).unwrap();
    std::fs::copy(north.path("visual.tif"), input.join("north.tif")).unwrap();
    std::fs::copy(south.path("visual.tif"), input.join("south.tif")).unwrap();
    image::RgbImage::from_fn(256, 256, |x, y| image::Rgb([x as u8, y as u8, 99]))
        .save(input.join("plain.png"))
        .unwrap();
    submit_ok(&url, &input, &output, &["--task-files", ONE_TASK]);
    let worker = Worker::start(&url, "w0", &[], &[]);
    wait_finished(&url, &output, Duration::from_secs(120));
    drop(worker);

    // Garbage of the same size in every chip file's place: finalize checks
    // the sizes the done records give, and must not open the files.
    let keep = dir.path().join("keep");
    std::fs::create_dir_all(&keep).unwrap();
    let files: Vec<PathBuf> = std::fs::read_dir(output.join("chips"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!files.is_empty());
    for f in &files {
        let len = std::fs::metadata(f).unwrap().len() as usize;
        std::fs::copy(f, keep.join(f.file_name().unwrap())).unwrap();
        std::fs::write(f, vec![0x55u8; len]).unwrap();
    }
    let (code, rep) = finalize(&url, &output);
    assert_eq!(code, Some(0), "{rep}");
    for f in &files {
        std::fs::copy(keep.join(f.file_name().unwrap()), f).unwrap();
    }

    // The item says what the chip file holds.
    let report = validate(&output);
    let its = items(&report);
    assert_eq!(its.len(), 1, "{report}");
    assert_eq!(its[0]["chips"], 9, "eight chips of the scenes and the PNG");
    assert_eq!(its[0]["polygons"], 2, "{report}");
}
