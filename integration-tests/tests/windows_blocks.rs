//! A window split into blocks of cells (issue 31, distributed item) against
//! `rustac serve`: acquisitions placed by their items' `proj:transform`,
//! one cropped so its corner differs, cut into one-cell blocks
//! (`--task-chips 1`), give exactly the rows of the same window read whole;
//! an acquisition whose file is not where its item says is an error record,
//! not cells of another block.

use std::path::Path;
use std::time::Duration;

use rsembed_integration_tests::cluster::{finalize, wait_finished, Worker};
use rsembed_integration_tests::nats::NatsServer;
use rsembed_integration_tests::rasters::gdal_translate;
use rsembed_integration_tests::stac::{collection, StacServer};
use rsembed_integration_tests::stac_scenes::{item, make_scene, ItemStyle, SceneFiles};
use rsembed_integration_tests::*;
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(300);
/// A 128² scene on the 64-pixel lattice of 10 m: 2 × 2 cells of 64.
const ORIGIN: (f64, f64) = (600_320.0, 5_000_960.0);

fn serve(tmp: &Path, items: &[Value]) -> StacServer {
    let c = tmp.join("c.json");
    std::fs::write(&c, collection("sentinel-2-l2a").to_string()).unwrap();
    let f = tmp.join(format!("items-{}.json", items.len()));
    stac::write_feature_collection(&f, items);
    StacServer::start(&[&c, &f])
}

fn windowed(input: &str, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut c = run_cmd(Path::new(input), out, &tiny_model());
    c.args(["--json", "--chip-size", "64", "--scale", "0:0.255"])
        .args(["--assets", "red,green,blue", "--cloud-mask", "scl"])
        .args(["--windows", "P3M", "--datetime", "2024-01-01/2024-12-31"])
        .args(extra);
    run_timeout(&mut c, LIMIT)
}

fn rows(out: &Path) -> Value {
    duckdb(&format!(
        "SELECT cell, strftime(window_start, '%Y-%m'), item_id, scenes, chip_id, \
         embedding::VARCHAR FROM '{}/chips/*.parquet' ORDER BY 2, 1",
        out.display()
    ))
}

/// `scene` cut `off` pixels in from its top-left (its SCL, at 20 m, half).
fn cropped(scene: &SceneFiles, dir: &Path, off: u32) -> SceneFiles {
    std::fs::create_dir_all(dir).unwrap();
    let n = scene.size - off;
    for b in ["o_B04.tif", "o_B03.tif", "o_B02.tif"] {
        let win = [off, off, n, n].map(|v| v.to_string());
        let mut args = vec!["-of", "COG", "-srcwin"];
        args.extend(win.iter().map(String::as_str));
        gdal_translate(&args, &scene.path(b), &dir.join(b));
    }
    let win = [off / 2, off / 2, n / 2, n / 2].map(|v| v.to_string());
    let mut args = vec!["-of", "COG", "-srcwin"];
    args.extend(win.iter().map(String::as_str));
    gdal_translate(&args, &scene.path("SCL.tif"), &dir.join("SCL.tif"));
    SceneFiles {
        dir: dir.to_owned(),
        size: n,
        origin: (
            scene.origin.0 + f64::from(off) * 10.0,
            scene.origin.1 - f64::from(off) * 10.0,
        ),
    }
}

fn items_of(scenes: &[(&SceneFiles, &str, &str)]) -> Vec<Value> {
    scenes
        .iter()
        .map(|(s, id, t)| {
            let dir = s.dir.clone();
            let href = move |n: &str| format!("file://{}", dir.join(n).display());
            item(
                s,
                id,
                "sentinel-2-l2a",
                t,
                json!(5),
                ItemStyle::EarthSearch,
                &href,
            )
        })
        .collect()
}

/// The same items without the projection fields the planner places by.
fn unplaced(items: &[Value]) -> Vec<Value> {
    let mut items = items.to_vec();
    for i in &mut items {
        i["properties"].as_object_mut().unwrap().remove("proj:epsg");
        for (_, a) in i["assets"].as_object_mut().unwrap() {
            a.as_object_mut().unwrap().remove("proj:transform");
        }
    }
    items
}

#[test]
fn one_cell_blocks_give_the_rows_of_the_whole_window() {
    let tmp = tempfile::tempdir().unwrap();
    let full = make_scene(&tmp.path().join("full"), 128, ORIGIN, 7);
    let other = make_scene(&tmp.path().join("other"), 128, ORIGIN, 8);
    // 32 pixels in: it covers the other three cells' parts only, from
    // another corner.
    let crop = cropped(&other, &tmp.path().join("crop"), 32);
    let items = items_of(&[
        (&full, "q1-full", "2024-02-01T10:00:00Z"),
        (&crop, "q1-crop", "2024-03-01T10:00:00Z"),
        (&other, "q2-other", "2024-05-01T10:00:00Z"),
    ]);

    let placed = serve(tmp.path(), &items);
    let blocks = tmp.path().join("blocks");
    let o = windowed(&placed.url(), &blocks, &["--task-chips", "1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    // Q1: 4 one-cell blocks; Q2: 4.
    assert_eq!(summary["tasks"], 8, "{summary}");

    let whole_server = serve(tmp.path(), &unplaced(&items));
    let whole = tmp.path().join("whole");
    let o = windowed(&whole_server.url(), &whole, &["--task-chips", "1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["tasks"], 2, "unplaced: a task a window: {summary}");

    let (a, b) = (rows(&blocks), rows(&whole));
    // The SCL clouds the top-left cell in every acquisition: 3 cells a
    // quarter have a row.
    assert_eq!(a.as_array().unwrap().len(), 6, "3 cells, 2 quarters: {a}");
    // The same rows: cell, window, chosen item, scenes; the embeddings equal
    // up to the batch they ran in (one chip a batch against three). The
    // chip ids differ only because the two servers' items differ.
    let key = |v: &Value| -> Vec<Value> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| json!([r[0], r[1], r[2], r[3]]))
            .collect()
    };
    assert_eq!(key(&a), key(&b), "blocks cut the window's rows exactly");
    let vector = |r: &Value| -> Vec<f64> { serde_json::from_str(r[5].as_str().unwrap()).unwrap() };
    for (x, y) in a.as_array().unwrap().iter().zip(b.as_array().unwrap()) {
        let (x, y) = (vector(x), vector(y));
        let d = x
            .iter()
            .zip(&y)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0, f64::max);
        assert!(d < 1e-5, "{d}");
    }
    // The cropped acquisition reaches three cells of Q1, and is the later:
    // where both are clear it is chosen, where it covers a cell at all.
    let q1_crop = a
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r[1] == "2024-01" && r[2] == "q1-crop")
        .count();
    assert!(q1_crop >= 1, "{a}");
    let chip_files = |out: &Path| std::fs::read_dir(out.join("chips")).unwrap().count();
    assert_eq!(chip_files(&blocks), 8);
    // Resuming does nothing twice.
    let o = windowed(&placed.url(), &blocks, &["--task-chips", "1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(chip_files(&blocks), 8);
    assert_eq!(rows(&blocks), a);

    // Distributed: submit plans the same blocks, two workers share them,
    // and the rows are those of the embedded run.
    let nats = NatsServer::start();
    let dist = tmp.path().join("dist");
    let mut c = rsembed();
    c.args([
        "submit",
        "--nats",
        &nats.url(),
        "--input",
        &placed.url(),
        "--output",
    ])
    .arg(&dist)
    .arg("--model")
    .arg(tiny_model())
    .args(["--json", "--chip-size", "64", "--scale", "0:0.255"])
    .args(["--assets", "red,green,blue", "--cloud-mask", "scl"])
    .args(["--windows", "P3M", "--datetime", "2024-01-01/2024-12-31"])
    .args(["--task-chips", "1"]);
    let o = run_timeout(&mut c, LIMIT);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let submitted: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(submitted["tasks"], 8, "{submitted}");
    let workers = [
        Worker::start(&nats.url(), "w0", &[], &[]),
        Worker::start(&nats.url(), "w1", &[], &[]),
    ];
    let st = wait_finished(&nats.url(), &dist, LIMIT);
    assert_eq!(
        (st["done"].as_u64(), st["failed"].as_u64()),
        (Some(8), Some(0)),
        "{st}"
    );
    assert_eq!(
        st["unclear_cells"], 2,
        "the clouded cell, each quarter: {st}"
    );
    drop(workers);
    let (code, report) = finalize(&nats.url(), &dist);
    assert_eq!(code, Some(0), "finalize: {report}");
    assert_eq!(rows(&dist), a);
}

#[test]
fn a_file_not_where_its_item_says_is_an_error_not_another_block_s_cells() {
    let tmp = tempfile::tempdir().unwrap();
    let full = make_scene(&tmp.path().join("full"), 128, ORIGIN, 7);
    let mut items = items_of(&[
        (&full, "q1-full", "2024-02-01T10:00:00Z"),
        (&full, "q1-liar", "2024-03-01T10:00:00Z"),
    ]);
    // The item says one cell further east than its file is.
    for (_, a) in items[1]["assets"].as_object_mut().unwrap() {
        let t = a["proj:transform"].as_array_mut().unwrap();
        t[2] = json!(t[2].as_f64().unwrap() + 640.0);
    }
    let server = serve(tmp.path(), &items);
    let out = tmp.path().join("out");
    let o = windowed(&server.url(), &out, &["--task-chips", "1"]);
    // Failed inputs: exit code 3, the rows of the others written.
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let got = rows(&out);
    let got = got.as_array().unwrap();
    // The top-left cell is all cloud (the SCL): the other three.
    assert_eq!(
        got.len(),
        3,
        "every clear cell, from the honest item: {got:?}"
    );
    assert!(got.iter().all(|r| r[2] == "q1-full"), "{got:?}");
    let errors = duckdb(&format!(
        "SELECT DISTINCT source_uri, error FROM '{}/errors/*.parquet'",
        out.display()
    ));
    let errors = errors.as_array().unwrap();
    assert_eq!(errors.len(), 1, "{errors:?}");
    let e = errors[0][1].as_str().unwrap();
    assert!(e.contains("the item places the scene"), "{e}");
}
