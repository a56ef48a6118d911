//! Scenes stored one file per band (`--band-files`), checked against a
//! composite GDAL builds from the same files.

use std::path::{Path, PathBuf};
use std::process::Command;

use rsembed_integration_tests::*;
use serde_json::Value;

fn landsat_dir() -> Option<PathBuf> {
    let d = shared_data()?.join("geotiff/rio-pansharpen/LC81070352015122LGN00");
    d.is_dir().then_some(d)
}

fn gdal(args: &[&str]) {
    let st = Command::new(args[0])
        .args(&args[1..])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| {
            panic!(
                "{} runs (GDAL is installed by scripts/setup-test-env.sh): {e}",
                args[0]
            )
        });
    assert!(st.success(), "{args:?}");
}

fn rows(out: &Path) -> Vec<Value> {
    duckdb(&format!(
        "SELECT x, y, valid_fraction, crs, hex(geometry::BLOB), embedding::FLOAT[] \
         FROM '{}/chips/*.parquet' ORDER BY y, x",
        out.display()
    ))
    .as_array()
    .unwrap()
    .clone()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Same chips, footprints and (to float rounding) embeddings.
fn assert_same(a: &[Value], b: &[Value], min_cos: f64) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.as_array().unwrap()[..5], y.as_array().unwrap()[..5]);
        let c = cosine(&floats(&x[5]), &floats(&y[5]));
        assert!(c >= min_cos, "cosine {c}");
    }
}

/// Rows rsembed writes for GDAL's composite of the B4, B3, B2 files in `dir`
/// (`vrt_opts` go to gdalbuildvrt, e.g. the resampling).
fn composite_rows(tmp: &Path, dir: &Path, vrt_opts: &[&str]) -> Vec<Value> {
    let comp = tmp.join("comp");
    std::fs::create_dir_all(&comp).unwrap();
    let vrt = tmp.join("rgb.vrt").display().to_string();
    let tif = comp.join("rgb.tif").display().to_string();
    let (b4, b3, b2) = (band(dir, "B4"), band(dir, "B3"), band(dir, "B2"));
    let mut args = vec!["gdalbuildvrt", "-q", "-separate"];
    args.extend_from_slice(vrt_opts);
    args.extend_from_slice(&[&vrt, &b4, &b3, &b2]);
    gdal(&args);
    gdal(&["gdal_translate", "-q", "-co", "TILED=YES", &vrt, &tif]);
    let out = tmp.join("comp-out");
    let o = run(&mut run_cmd(Path::new(&tif), &out, &tiny_model()));
    assert_eq!(o.status.code(), Some(0));
    rows(&out)
}

/// A scene folder with B4, B3, B2: two copied from `dir`, and `made` written by
/// `gdal_translate <args> <dir's file> <scene's file>`.
fn scene_with(tmp: &Path, dir: &Path, made: &str, args: &[&str]) -> PathBuf {
    let scene = tmp.join("scene");
    std::fs::create_dir_all(&scene).unwrap();
    for b in ["B4", "B3", "B2"].into_iter().filter(|b| *b != made) {
        std::fs::copy(band(dir, b), band(&scene, b)).unwrap();
    }
    let (src, dst) = (band(dir, made), band(&scene, made));
    let mut cmd = vec!["gdal_translate", "-q"];
    cmd.extend_from_slice(args);
    cmd.extend_from_slice(&[&src, &dst]);
    gdal(&cmd);
    scene
}

fn band(dir: &Path, b: &str) -> String {
    dir.join(format!("LC81070352015122LGN00_{b}.tif"))
        .display()
        .to_string()
}

#[test]
fn band_files_equal_a_gdal_composite() {
    let Some(dir) = landsat_dir() else {
        skipped("../shared/data is not in this checkout");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bands");
    let o = run(run_cmd(&dir, &out, &tiny_model()).args(["--band-files", "B4,B3,B2"]));
    assert_eq!(o.status.code(), Some(0));
    let ours = rows(&out);
    assert!(!ours.is_empty());
    let uri = duckdb(&format!(
        "SELECT DISTINCT source_uri FROM '{}/chips/*.parquet'",
        out.display()
    ));
    assert_eq!(uri.as_array().unwrap().len(), 1, "three files, one scene");
    assert!(uri[0][0]
        .as_str()
        .unwrap()
        .ends_with("LC81070352015122LGN00_{B4,B3,B2}.tif"));

    assert_same(&ours, &composite_rows(tmp.path(), &dir, &[]), 0.99999);
}

#[test]
fn a_coarser_band_is_upsampled_onto_the_finest_grid() {
    let Some(dir) = landsat_dir() else {
        skipped("../shared/data is not in this checkout");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    // B3 at twice the pixel size over the same extent: the grids line up.
    let scene = scene_with(
        tmp.path(),
        &dir,
        "B3",
        &["-r", "average", "-outsize", "775", "789"],
    );
    let out = tmp.path().join("out");
    let o = run(run_cmd(&scene, &out, &tiny_model()).args(["--band-files", "B4,B3,B2"]));
    assert_eq!(
        o.status.code(),
        Some(0),
        "a coarser band that lines up is resampled"
    );
    let ours = rows(&out);

    // GDAL's nearest-neighbour composite at the finest resolution is the reference.
    let reference = composite_rows(
        tmp.path(),
        &scene,
        &["-resolution", "highest", "-r", "nearest"],
    );
    assert_same(&ours, &reference, 0.9999);
}

#[test]
fn misaligned_band_files_are_an_error_for_the_scene() {
    let Some(dir) = landsat_dir() else {
        skipped("../shared/data is not in this checkout");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    // Shift B2 by a third of a pixel.
    let scene = scene_with(
        tmp.path(),
        &dir,
        "B2",
        &["-a_ullr", "300935", "4106965", "533465", "3870235"],
    );
    let out = tmp.path().join("out");
    let o = run(run_cmd(&scene, &out, &tiny_model()).args(["--band-files", "B4,B3,B2"]));
    assert_eq!(o.status.code(), Some(3));
    let errors = duckdb(&format!(
        "SELECT source_uri, error FROM '{}/errors/*.parquet'",
        out.display()
    ));
    let e = errors[0][1].as_str().unwrap();
    assert!(e.contains("does not line up"), "{e}");
    assert!(e.contains("_B2.tif"), "names the file: {e}");
}

#[test]
fn a_band_file_scene_is_split_into_chip_block_tasks() {
    let Some(dir) = landsat_dir() else {
        skipped("../shared/data is not in this checkout");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    let o = run(run_cmd(&dir, &whole, &tiny_model()).args(["--band-files", "B4,B3,B2"]));
    assert_eq!(o.status.code(), Some(0));
    let split = tmp.path().join("split");
    let o = run(run_cmd(&dir, &split, &tiny_model()).args([
        "--band-files",
        "B4,B3,B2",
        "--shard-bytes",
        "1",
        "--task-size",
        "9",
        "--json",
    ]));
    assert_eq!(o.status.code(), Some(0));
    let s: Value = serde_json::from_slice(&o.stdout).unwrap();
    // 49 chips in blocks of about 9: several tasks, each reading its own window.
    assert!(s["tasks"].as_u64().unwrap() >= 4, "{s}");
    assert_same(&rows(&split), &rows(&whole), 0.999999);
}
