//! `run --windows P3M --composite median` against `rustac serve` (issue 31):
//! one ground on one UTM lattice (`windows_best.rs`'s scenes, in physical
//! units with an offset). Q1 has one clear acquisition, whose median is that
//! acquisition: the same embedding as its chip in a `best` run. Q2 has four,
//! one of them cloudy over the top-left cell: there the median is that of
//! the other three, which a fifth scene planted in Q3 holds pixel for pixel.
//! Q4 has only the cloudy one, whose clouded cell has no row.
//! Rows are named `rsembed:median/<cell>/<window>`, with stable chip ids; a
//! rerun writes nothing twice; `--scale auto` is refused. An acquisition
//! whose pixels cannot be read is one error row, and every cell keeps its row.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rsembed_integration_tests::rasters::gdal_translate;
use rsembed_integration_tests::stac::{collection, StacServer};
use rsembed_integration_tests::stac_scenes::{item, make_scene, ItemStyle, SceneFiles};
use rsembed_integration_tests::*;
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(300);
/// A 128² scene on the 64-pixel lattice of 10 m: four cells, the SCL's
/// cloud exactly the top-left one.
const ORIGIN: (f64, f64) = (600_320.0, 5_000_960.0);
const BANDS: [&str; 3] = ["o_B04.tif", "o_B03.tif", "o_B02.tif"];

fn windowed(input: &str, out: &Path, composite: &str, scale: &str) -> std::process::Output {
    let mut c = run_cmd(Path::new(input), out, &tiny_model());
    c.args([
        "--json",
        "--chip-size",
        "64",
        "--scale",
        scale,
        "--cloud-mask",
        "SCL",
    ])
    .args(["--windows", "P3M", "--datetime", "2024-01-01/2024-12-31"])
    .args(["--composite", composite]);
    run_timeout(&mut c, LIMIT)
}

/// `scene`'s bands with an SCL clear everywhere (class 4), in `dir`.
fn clear_copy(scene: &SceneFiles, dir: &Path) -> SceneFiles {
    std::fs::create_dir_all(dir).unwrap();
    for b in BANDS {
        std::fs::copy(scene.path(b), dir.join(b)).unwrap();
    }
    gdal_translate(
        &[
            "-of", "GTiff", "-ot", "Byte", "-scale", "0", "255", "4", "4",
        ],
        &scene.path("SCL.tif"),
        &dir.join("SCL.tif"),
    );
    SceneFiles {
        dir: dir.to_owned(),
        ..scene.clone()
    }
}

/// Writes into `dir` the bands whose stored numbers are, pixel by pixel, the
/// median of `three`'s (an odd count: one of their samples), with a clear
/// SCL; and checks that the median of those three and `fourth` differs
/// somewhere in the top-left cell, so a median that kept the fourth's
/// cloudy samples there could not equal it.
fn plant_median(three: [&SceneFiles; 3], fourth: &SceneFiles, dir: &Path) -> SceneFiles {
    let planted = clear_copy(three[0], dir);
    const SCRIPT: &str = r#"
import sys, subprocess, os
import numpy as np
out, size = sys.argv[1], int(sys.argv[2])
files = sys.argv[3:]
def raw(path):
    tmp = f"{out}/tmp.envi"
    subprocess.run(["gdal_translate", "-q", "-of", "ENVI", path, tmp], check=True)
    a = np.fromfile(tmp, dtype="<u2").reshape(size, size)
    for f in (tmp, f"{out}/tmp.hdr"):
        os.remove(f)
    return a
differs = False
for b in ["o_B04.tif", "o_B03.tif", "o_B02.tif"]:
    a = [raw(f"{d}/{b}") for d in files]
    three = np.median(np.stack(a[:3]), axis=0)
    four = np.median(np.stack(a), axis=0)
    differs |= bool((three[:64, :64] != four[:64, :64]).any())
    subprocess.run(["gdal_translate", "-q", "-of", "ENVI", f"{out}/{b}", f"{out}/m.envi"], check=True)
    three.astype("<u2").tofile(f"{out}/m.envi")
    os.remove(f"{out}/{b}")
    subprocess.run(["gdal_translate", "-q", "-of", "GTiff", "-co", "TILED=YES", "-co", "BLOCKXSIZE=256",
                    "-co", "BLOCKYSIZE=256", f"{out}/m.envi", f"{out}/{b}"], check=True)
    for f in (f"{out}/m.envi", f"{out}/m.hdr"):
        os.remove(f)
assert differs, "the fourth scene must move the median of the top-left cell"
"#;
    let mut c = Command::new(python());
    c.args(["-c", SCRIPT])
        .arg(dir)
        .arg(three[0].size.to_string());
    for s in three.iter().copied().chain([fourth]) {
        c.arg(&s.dir);
    }
    let st = c.status().unwrap();
    assert!(st.success(), "planting the median");
    planted
}

#[test]
fn median_of_clear_samples_in_physical_units() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path();
    let raw = |n: &str, seed: u64| make_scene(&p.join(n), 128, ORIGIN, seed);
    let (a, b, c, d) = (raw("a", 7), raw("b", 8), raw("c", 9), raw("d", 10));
    let a = clear_copy(&a, &p.join("a_clear"));
    let b = clear_copy(&b, &p.join("b_clear"));
    let c = clear_copy(&c, &p.join("c_clear"));
    // `d` keeps its SCL: cloud over the top-left cell.
    let e = plant_median([&a, &b, &c], &d, &p.join("e"));

    let mk = |id: &str, t: &str, s: &SceneFiles| {
        let dir = s.dir.clone();
        let href = move |n: &str| format!("file://{}", dir.join(n).display());
        item(s, id, "s2", t, json!(0), ItemStyle::V11Offset, &href)
    };
    let items = vec![
        mk("q1-a", "2024-02-01T10:00:00Z", &a),
        mk("q2-a", "2024-04-10T10:00:00Z", &a),
        mk("q2-b", "2024-05-01T10:00:00Z", &b),
        mk("q2-c", "2024-05-20T10:00:00Z", &c),
        mk("q2-d", "2024-06-01T10:00:00Z", &d),
        mk("q3-e", "2024-08-01T10:00:00Z", &e),
        // Q4: only `d`, whose top-left cell is all cloud: no row there.
        mk("q4-d", "2024-11-01T10:00:00Z", &d),
    ];
    let coll = p.join("s2.json");
    std::fs::write(&coll, collection("s2").to_string()).unwrap();
    let items_file = p.join("items.json");
    stac::write_feature_collection(&items_file, &items);
    let server = StacServer::start(&[&coll, &items_file]);

    // `auto` has no common meaning across scenes: refused, naming why.
    let o = windowed(&server.url(), &p.join("auto"), "median", "auto");
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("needs a fixed --scale"), "{err}");

    let out = p.join("median");
    let o = windowed(&server.url(), &out, "median", "0:0.255");
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
            "SELECT cell, strftime(window_start, '%Y-%m'), source_uri, item_id, datetime, \
             scenes, cloud_fraction, valid_fraction, x, y, width, height, chip_id, \
             embedding::VARCHAR, grid_cell, crs \
             FROM '{}/chips/*.parquet' ORDER BY 2, 1",
            out.display()
        ))
    };
    let got = rows(&out);
    let got = got.as_array().unwrap();
    assert_eq!(
        got.len(),
        15,
        "four cells a window, less Q4's cloudy one: {got:?}"
    );
    let (col0, row0) = ((ORIGIN.0 / 640.0) as i64, -(ORIGIN.1 / 640.0) as i64);
    let top_left = format!("EPSG:32633/10/64/{col0}/{row0}");
    let window_text = |w: &str| match w {
        "2024-01" => "2024-01-01T00:00:00Z/2024-04-01T00:00:00Z",
        "2024-04" => "2024-04-01T00:00:00Z/2024-07-01T00:00:00Z",
        "2024-07" => "2024-07-01T00:00:00Z/2024-10-01T00:00:00Z",
        "2024-10" => "2024-10-01T00:00:00Z/2025-01-01T00:00:00Z",
        other => panic!("no window {other}"),
    };
    for r in got {
        let (cell, window) = (r[0].as_str().unwrap(), r[1].as_str().unwrap());
        assert_eq!(
            r[2],
            format!("rsembed:median/{cell}/{}", window_text(window)),
            "{r}"
        );
        assert!(r[3].is_null() && r[4].is_null(), "no item, no time: {r}");
        // The lattice position of the cell, the chip's size.
        let parts: Vec<i64> = cell
            .rsplit('/')
            .take(2)
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(
            (r[8].as_i64(), r[9].as_i64()),
            (Some(parts[1] * 64), Some(parts[0] * 64))
        );
        assert_eq!((r[10].as_i64(), r[11].as_i64()), (Some(64), Some(64)));
        assert_eq!(
            r[6].as_f64(),
            Some(0.0),
            "every valid pixel had a clear sample: {r}"
        );
        assert_eq!(r[7].as_f64(), Some(1.0), "{r}");
        assert!(r[14].is_string() && r[15] == "EPSG:32633", "{r}");
        assert!(!(window == "2024-10" && cell == top_left), "all cloud: {r}");
        let scenes = r[5].as_i64().unwrap();
        let expected = match window {
            "2024-04" if cell == top_left => 3,
            "2024-04" => 4,
            _ => 1,
        };
        assert_eq!(scenes, expected, "{r}");
    }
    let embedding = |window: &str, cell: &str| -> String {
        got.iter()
            .find(|r| r[1] == window && r[0] == cell)
            .unwrap_or_else(|| panic!("no row {window} {cell}"))[13]
            .as_str()
            .unwrap()
            .to_owned()
    };
    // Where `d` is cloudy the median is that of the three others: the
    // planted scene's pixels, so its embedding.
    assert_eq!(
        embedding("2024-04", &top_left),
        embedding("2024-07", &top_left)
    );

    // The median of one clear acquisition is that acquisition's chip: the
    // same embedding as `best` gives it in a job of the same tiling.
    let best = p.join("best");
    let o = windowed(&server.url(), &best, "best", "0:0.255");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let chosen = duckdb(&format!(
        "SELECT cell, embedding::VARCHAR, item_id FROM '{}/chips/*.parquet' \
         WHERE strftime(window_start, '%Y-%m') = '2024-01' ORDER BY 1",
        best.display()
    ));
    let chosen = chosen.as_array().unwrap();
    assert_eq!(chosen.len(), 4, "{chosen:?}");
    for r in chosen {
        assert_eq!(r[2], "q1-a");
        assert_eq!(
            r[1].as_str().unwrap(),
            embedding("2024-01", r[0].as_str().unwrap()),
            "{}",
            r[0]
        );
    }

    // Read cell by cell, the window job reads no more bytes than the same
    // acquisitions embedded one by one (a job without windows on the lattice).
    let one_by_one = p.join("one_by_one");
    let mut cmd = run_cmd(Path::new(&server.url()), &one_by_one, &tiny_model());
    cmd.args(["--json", "--chip-size", "64", "--scale", "0:0.255"])
        .args(["--cloud-mask", "SCL", "--align", "crs"])
        .args(["--datetime", "2024-01-01/2024-12-31"]);
    let o = run_timeout(&mut cmd, LIMIT);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let alone: Value = serde_json::from_slice(&o.stdout).unwrap();
    let (window_bytes, alone_bytes) = (
        summary["bytes_read"].as_u64().unwrap(),
        alone["bytes_read"].as_u64().unwrap(),
    );
    assert!(
        window_bytes > 0 && window_bytes <= alone_bytes,
        "{summary} {alone}"
    );

    // A rerun writes nothing twice; another job of the same command gives
    // the same chip ids.
    let files = |out: &Path| std::fs::read_dir(out.join("chips")).unwrap().count();
    let before = files(&out);
    let o = windowed(&server.url(), &out, "median", "0:0.255");
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(files(&out), before);
    assert_eq!(rows(&out).as_array().unwrap(), got);
    let again = p.join("again");
    let o = windowed(&server.url(), &again, "median", "0:0.255");
    assert_eq!(o.status.code(), Some(0));
    let ids = |rows: &[Value]| -> Vec<(String, String)> {
        rows.iter()
            .map(|r| {
                (
                    r[2].as_str().unwrap().to_owned(),
                    r[12].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    assert_eq!(ids(rows(&again).as_array().unwrap()), ids(got));
}

#[test]
fn an_acquisition_that_fails_is_one_error_and_the_cells_keep_their_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path();
    let a = clear_copy(
        &make_scene(&p.join("a"), 128, ORIGIN, 7),
        &p.join("a_clear"),
    );
    let b = clear_copy(
        &make_scene(&p.join("b"), 128, ORIGIN, 8),
        &p.join("b_clear"),
    );
    // `b`'s red band loses its last bytes: its header opens, its pixels do not read.
    let red = b.path(BANDS[0]);
    let len = std::fs::metadata(&red).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&red)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    let mk = |id: &str, t: &str, s: &SceneFiles| {
        let dir = s.dir.clone();
        let href = move |n: &str| format!("file://{}", dir.join(n).display());
        item(s, id, "s2", t, json!(0), ItemStyle::V11Offset, &href)
    };
    let items = vec![
        mk("q1-a", "2024-02-01T10:00:00Z", &a),
        mk("q1-broken", "2024-03-01T10:00:00Z", &b),
    ];
    let coll = p.join("s2.json");
    std::fs::write(&coll, collection("s2").to_string()).unwrap();
    let items_file = p.join("items.json");
    stac::write_feature_collection(&items_file, &items);
    let server = StacServer::start(&[&coll, &items_file]);

    let out = p.join("out");
    let o = windowed(&server.url(), &out, "median", "0:0.255");
    assert_eq!(
        o.status.code(),
        Some(3),
        "an input failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let rows = duckdb(&format!(
        "SELECT cell, scenes FROM '{}/chips/*.parquet' ORDER BY 1",
        out.display()
    ));
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 4, "every cell keeps its row: {rows:?}");
    assert!(
        rows.iter().all(|r| r[1] == 1),
        "of the one acquisition read: {rows:?}"
    );
    let errors = duckdb(&format!(
        "SELECT source_uri, stage, error FROM '{}/errors/*.parquet'",
        out.display()
    ));
    let errors = errors.as_array().unwrap();
    assert_eq!(errors.len(), 1, "one error row an acquisition: {errors:?}");
    assert!(
        errors[0][0].as_str().unwrap().ends_with("q1-broken"),
        "{errors:?}"
    );
    // Its pixels, not its header: a read of the walk failed.
    assert_eq!(errors[0][1], "decode", "{errors:?}");
}

#[test]
fn a_window_reads_no_more_bytes_than_its_scenes_one_by_one() {
    // 512² scenes in 256² tiles, one cropped 64 pixels east and 32 south: its
    // tiles and cells fall differently, and cells of both share tiles.
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path();
    let full = clear_copy(&make_scene(&p.join("a"), 512, ORIGIN, 7), &p.join("full"));
    let cropped = SceneFiles {
        dir: p.join("cropped"),
        size: 448,
        origin: (ORIGIN.0 + 640.0, ORIGIN.1 - 320.0),
    };
    std::fs::create_dir_all(&cropped.dir).unwrap();
    let crop = |name: &str, win: [u32; 4]| {
        let w = win.map(|v| v.to_string());
        let mut args = vec![
            "-of",
            "COG",
            "-co",
            "BLOCKSIZE=256",
            "-co",
            "OVERVIEWS=NONE",
        ];
        args.extend(["-srcwin", &w[0], &w[1], &w[2], &w[3]]);
        gdal_translate(&args, &full.path(name), &cropped.path(name));
    };
    for b in BANDS {
        crop(b, [64, 32, 448, 448]);
    }
    crop("SCL.tif", [32, 16, 224, 224]);
    let mk = |id: &str, t: &str, s: &SceneFiles| {
        let dir = s.dir.clone();
        let href = move |n: &str| format!("file://{}", dir.join(n).display());
        item(s, id, "s2", t, json!(0), ItemStyle::V11Offset, &href)
    };
    let items = vec![
        mk("full", "2024-02-01T10:00:00Z", &full),
        mk("cropped", "2024-03-01T10:00:00Z", &cropped),
    ];
    let coll = p.join("s2.json");
    std::fs::write(&coll, collection("s2").to_string()).unwrap();
    let items_file = p.join("items.json");
    stac::write_feature_collection(&items_file, &items);
    let server = StacServer::start(&[&coll, &items_file]);

    let bytes = |o: std::process::Output| {
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let s: Value = serde_json::from_slice(&o.stdout).unwrap();
        s["bytes_read"].as_u64().unwrap()
    };
    let mut cmd = run_cmd(Path::new(&server.url()), &p.join("alone"), &tiny_model());
    cmd.args(["--json", "--chip-size", "64", "--scale", "0:0.255"])
        .args(["--cloud-mask", "SCL", "--align", "crs"])
        .args(["--datetime", "2024-01-01/2024-12-31"]);
    let alone = bytes(run_timeout(&mut cmd, LIMIT));
    for composite in ["median", "best"] {
        let window = bytes(windowed(
            &server.url(),
            &p.join(composite),
            composite,
            "0:0.255",
        ));
        assert!(
            window > 0 && window <= alone,
            "{composite}: {window} bytes, {alone} one by one"
        );
    }
}
