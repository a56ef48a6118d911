//! `run --windows P3M --composite best` against `rustac serve` (issue 31):
//! one ground over a year on one UTM lattice, its SCL clouding one cell in
//! some acquisitions. One row per (window, cell); the cloudy acquisition is
//! never chosen where a clear one exists; identical ground gives identical
//! embeddings across windows; a cell all cloud in its window has no row; a
//! change planted in one cell from Q3 on ranks first in `rsembed change`; a
//! rerun does nothing twice and another `--windows` is refused; `submit` and
//! a worker write the same rows.

use std::path::Path;
use std::time::Duration;

use rsembed_integration_tests::cluster::{finalize, wait_finished, Worker};
use rsembed_integration_tests::nats::NatsServer;
use rsembed_integration_tests::rasters::gdal_translate;
use rsembed_integration_tests::stac::{collection, StacServer};
use rsembed_integration_tests::stac_scenes::{item, make_scene, ItemStyle};
use rsembed_integration_tests::*;
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(300);
/// A 128² scene whose corner is on the 64-pixel lattice of 10 m: four
/// cells, the SCL's cloud (its top-left quarter) exactly the first.
const ORIGIN: (f64, f64) = (600_320.0, 5_000_960.0);

fn windowed(input: &str, out: &Path, windows: &str) -> std::process::Output {
    let mut c = run_cmd(Path::new(input), out, &tiny_model());
    c.args([
        "--json",
        "--chip-size",
        "64",
        "--scale",
        "0:0.255",
        "--cloud-mask",
        "SCL",
    ])
    .args(["--windows", windows, "--datetime", "2024-01-01/2024-12-31"]);
    run_timeout(&mut c, LIMIT)
}

#[test]
fn each_cell_of_each_quarter_gets_its_clearest_acquisition() {
    let tmp = tempfile::tempdir().unwrap();
    let scene = make_scene(&tmp.path().join("s"), 128, ORIGIN, 7);
    // The same bands with an SCL that is clear everywhere (class 4).
    let clear = tmp.path().join("clear");
    std::fs::create_dir_all(&clear).unwrap();
    for b in ["o_B04.tif", "o_B03.tif", "o_B02.tif"] {
        std::fs::copy(scene.path(b), clear.join(b)).unwrap();
    }
    gdal_translate(
        &[
            "-of", "GTiff", "-ot", "Byte", "-scale", "0", "255", "4", "4",
        ],
        &scene.path("SCL.tif"),
        &clear.join("SCL.tif"),
    );
    // From Q3 on, the bottom-right cell is other ground (another scene's
    // pixels warped over it): the planted change.
    let other = make_scene(&tmp.path().join("other"), 128, ORIGIN, 8);
    let changed = |dir: &Path, scl: &Path| {
        std::fs::create_dir_all(dir).unwrap();
        for b in ["o_B04.tif", "o_B03.tif", "o_B02.tif"] {
            gdal_translate(&["-of", "GTiff"], &scene.path(b), &dir.join(b));
            let patch = dir.join(format!("patch_{b}"));
            gdal_translate(
                &["-of", "GTiff", "-srcwin", "64", "64", "64", "64"],
                &other.path(b),
                &patch,
            );
            let st = std::process::Command::new("gdalwarp")
                .arg("-q")
                .arg(&patch)
                .arg(dir.join(b))
                .status()
                .unwrap();
            assert!(st.success(), "gdalwarp");
        }
        std::fs::copy(scl, dir.join("SCL.tif")).unwrap();
    };
    let changed_cloudy = tmp.path().join("changed_cloudy");
    let changed_clear = tmp.path().join("changed_clear");
    changed(&changed_cloudy, &scene.path("SCL.tif"));
    changed(&changed_clear, &clear.join("SCL.tif"));
    let in_dir = |dir: &Path| {
        let dir = dir.to_owned();
        move |n: &str| format!("file://{}", dir.join(n).display())
    };
    let mk = |id: &str, t: &str, dir: &Path| {
        let cloudy = dir == scene.dir || dir == changed_cloudy;
        let cover = json!(if cloudy { 25 } else { 0 });
        let mut v = item(
            &scene,
            id,
            "s2",
            t,
            cover,
            ItemStyle::V11Offset,
            &in_dir(dir),
        );
        // Sized from the first scene's files: each variant's are its own.
        for (_, a) in v["assets"].as_object_mut().unwrap() {
            let path = a["href"]
                .as_str()
                .unwrap()
                .trim_start_matches("file://")
                .to_owned();
            a["file:size"] = json!(std::fs::metadata(path).unwrap().len());
        }
        v
    };
    let items = vec![
        // Q1: the clear one earlier, so "the latest" alone would pick the cloudy one.
        mk("q1-clear", "2024-02-01T10:00:00Z", &clear),
        mk("q1-cloudy", "2024-03-01T10:00:00Z", &scene.dir),
        mk("q2-clear", "2024-05-01T10:00:00Z", &clear),
        // Q3: only a cloudy one: its clouded cell has no clear pixel.
        mk("q3-cloudy", "2024-08-01T10:00:00Z", &changed_cloudy),
        mk("q4-clear", "2024-11-01T10:00:00Z", &changed_clear),
    ];
    let c = tmp.path().join("s2.json");
    std::fs::write(&c, collection("s2").to_string()).unwrap();
    let items_file = tmp.path().join("items.json");
    stac::write_feature_collection(&items_file, &items);
    let server = StacServer::start(&[&c, &items_file]);

    let out = tmp.path().join("out");
    let o = windowed(&server.url(), &out, "P3M");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["unclear_cells"], 1, "{summary}");
    let rows = |out: &Path| {
        duckdb(&format!(
            "SELECT cell, strftime(window_start, '%Y-%m'), strftime(window_end, '%Y-%m'), \
             item_id, scenes, cloud_fraction, embedding::VARCHAR \
             FROM '{}/chips/*.parquet' ORDER BY 2, 1",
            out.display()
        ))
    };
    let got = rows(&out);
    let got = got.as_array().unwrap();
    // Four cells a quarter, less the clouded cell of Q3.
    assert_eq!(got.len(), 15, "{got:?}");
    let cells: std::collections::BTreeSet<&str> =
        got.iter().map(|r| r[0].as_str().unwrap()).collect();
    assert_eq!(cells.len(), 4);
    for r in got {
        let (window, item, scenes, cloud) = (
            r[1].as_str().unwrap(),
            r[3].as_str().unwrap(),
            r[4].as_i64().unwrap(),
            r[5].as_f64().unwrap_or(0.0),
        );
        match window {
            "2024-01" => {
                assert_eq!(r[2], "2024-04");
                assert_eq!(scenes, 2, "both Q1 acquisitions cover every cell: {r}");
                // Where the cloudy one is cloudy the clear one is chosen;
                // elsewhere both are clear and the later wins.
                assert_eq!(cloud, 0.0, "{r}");
            }
            "2024-07" => {
                assert_eq!(item, "q3-cloudy");
                assert!(cloud < 1.0, "{r}");
            }
            _ => assert_eq!(scenes, 1, "{r}"),
        }
    }
    let q1: Vec<&str> = got
        .iter()
        .filter(|r| r[1] == "2024-01")
        .map(|r| r[3].as_str().unwrap())
        .collect();
    assert_eq!(q1.iter().filter(|i| **i == "q1-clear").count(), 1, "{q1:?}");
    // Identical ground, identical embeddings, whichever window and item;
    // the planted cell has two grounds, before and after.
    // Rows count south: the bottom-right cell is one column east and one
    // row south of the corner's.
    let planted = &format!(
        "EPSG:32633/10/64/{}/{}",
        (ORIGIN.0 / 640.0) as i64 + 1,
        -(ORIGIN.1 / 640.0) as i64 + 1
    );
    assert!(cells.contains(planted.as_str()), "{cells:?}");
    let distinct = |cell: &str| {
        got.iter()
            .filter(|r| r[0] == cell)
            .map(|r| r[6].as_str().unwrap())
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    for cell in &cells {
        let expected = if cell == planted { 2 } else { 1 };
        assert_eq!(distinct(cell), expected, "{cell}");
    }
    // `rsembed change` ranks the planted cell first.
    let c = tmp.path().join("c.parquet");
    let o = run_timeout(
        rsembed()
            .args(["change", "--index"])
            .arg(&out)
            .arg("--output")
            .arg(&c)
            .args(["--top", "1"]),
        LIMIT,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let printed = String::from_utf8_lossy(&o.stdout);
    let first = printed
        .lines()
        .find(|l| l.trim_start().starts_with("1 "))
        .unwrap_or_else(|| panic!("no ranked line in {printed}"));
    assert!(first.contains(planted), "{planted}: {printed}");

    // A rerun does nothing twice; another --windows is refused.
    let files = |out: &Path| std::fs::read_dir(out.join("chips")).unwrap().count();
    let before = files(&out);
    let o = windowed(&server.url(), &out, "P3M");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(files(&out), before);
    assert_eq!(rows(&out).as_array().unwrap(), got);
    let o = windowed(&server.url(), &out, "P1M");
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--windows: P1M in this command, P3M in the job"),
        "{err}"
    );

    // Distributed: the same job through NATS and a worker gives the same rows.
    let nats = NatsServer::start();
    let dist = tmp.path().join("dist");
    let mut c = rsembed();
    c.args([
        "submit",
        "--nats",
        &nats.url(),
        "--input",
        &server.url(),
        "--output",
    ])
    .arg(&dist)
    .arg("--model")
    .arg(tiny_model())
    .args([
        "--json",
        "--chip-size",
        "64",
        "--scale",
        "0:0.255",
        "--cloud-mask",
        "SCL",
    ])
    .args(["--windows", "P3M", "--datetime", "2024-01-01/2024-12-31"]);
    let o = run_timeout(&mut c, LIMIT);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let submitted: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(submitted["tasks"], 4, "one task a window: {submitted}");
    let worker = Worker::start(&nats.url(), "w0", &[], &[]);
    let st = wait_finished(&nats.url(), &dist, LIMIT);
    assert_eq!(
        (st["done"].as_u64(), st["failed"].as_u64()),
        (Some(4), Some(0)),
        "{st}"
    );
    // The worker's count of cells with no clear pixel reaches status and
    // finalize through its done record, as `run`'s summary has it.
    assert_eq!(st["unclear_cells"], 1, "{st}");
    drop(worker);
    let (code, report) = finalize(&nats.url(), &dist);
    assert_eq!(code, Some(0), "finalize: {report}");
    assert_eq!(report["unclear_cells"], 1, "{report}");
    assert_eq!(rows(&dist).as_array().unwrap(), got);
}
