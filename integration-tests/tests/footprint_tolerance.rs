//! `--footprint-tolerance` through `rsembed run`: a part of the job's
//! identity (a rerun with another value is refused, naming the flag), checked
//! where it is read, and a job written before the flag existed (no tolerance
//! in its `job.json`) resumed with its own footprints, never a mix of two
//! precisions.

use std::path::{Path, PathBuf};
use std::process::Output;

use rsembed_integration_tests::cluster::make_images;
use rsembed_integration_tests::rasters::gdal_translate;
use rsembed_integration_tests::{duckdb, run, run_cmd, tiny_model};
use rsembed_schemas::job::JobSpec;
use serde_json::Value;

/// `n` 48×40 GeoTIFFs of 1 km pixels in UTM 18N, 300 km west of the central
/// meridian, where grid lines bend: a 16-pixel chip's edges need dozens of
/// vertices at 5e-8 degrees and none at a hundredth of a pixel.
fn make_scenes(dir: &Path, n: usize) {
    let pngs = dir.with_extension("png-src");
    std::fs::create_dir_all(dir).unwrap();
    for (i, png) in make_images(&pngs, n).into_iter().enumerate() {
        let x0 = 200_000 + 48_000 * i;
        gdal_translate(
            &[
                "-of".to_owned(),
                "GTiff".into(),
                "-a_srs".into(),
                "EPSG:32618".into(),
                "-a_ullr".into(),
                x0.to_string(),
                "4040000".into(),
                (x0 + 48_000).to_string(),
                "4000000".into(),
            ],
            &png,
            &dir.join(format!("scene_{i}.tif")),
        );
    }
    std::fs::remove_dir_all(pngs).unwrap();
}

fn run_job(input: &Path, output: &Path, extra: &[&str]) -> Output {
    run(run_cmd(input, output, &tiny_model())
        .args(["--chip-size", "16", "--task-files", "1", "--json"])
        .args(extra))
}

fn run_ok(input: &Path, output: &Path, extra: &[&str]) -> Value {
    let o = run_job(input, output, extra);
    assert!(
        o.status.success(),
        "run failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("run --json prints JSON")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn job(output: &Path) -> JobSpec {
    serde_json::from_slice(&std::fs::read(output.join("job.json")).unwrap()).unwrap()
}

/// Every chip file with its bytes, and `job.json`'s.
fn files(output: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(output.join("chips"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .chain([output.join("job.json")])
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect();
    v.sort();
    v
}

/// (source file, x, y, vertices of the footprint, footprint as hex) of every chip.
fn footprints(output: &Path) -> Vec<(String, i64, i64, i64, String)> {
    let rows = duckdb(&format!(
        "SELECT regexp_extract(source_uri, '[^/]+$'), x, y, \
         (octet_length(geometry::BLOB) - 13) // 16, hex(geometry::BLOB) \
         FROM read_parquet('{}/chips/*.parquet') ORDER BY 1, 3, 2",
        output.display()
    ));
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_str().unwrap().to_owned(),
                r[1].as_i64().unwrap(),
                r[2].as_i64().unwrap(),
                r[3].as_i64().unwrap(),
                r[4].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn assert_refused(o: &Output, before: &[(PathBuf, Vec<u8>)], output: &Path, says: &str) {
    assert_eq!(o.status.code(), Some(1), "refused: {}", stderr(o));
    let err = stderr(o);
    assert!(
        err.contains("--footprint-tolerance:"),
        "names the flag: {err}"
    );
    assert!(err.contains(says), "{err}");
    assert!(
        files(output) == before,
        "a refused command changed the output"
    );
}

#[test]
fn a_rerun_with_another_footprint_tolerance_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_scenes(&input, 2);
    let first = run_ok(&input, &output, &[]);
    assert_eq!(
        job(&output).tiling.footprint_tolerance,
        Some(0.01),
        "recorded"
    );
    let fps = footprints(&output);
    assert_eq!(fps.len(), 2 * 9);
    assert!(
        fps.iter().all(|f| f.3 == 5),
        "0.01 px: corners only {fps:?}"
    );
    let before = files(&output);

    let o = run_job(&input, &output, &["--footprint-tolerance", "0.1"]);
    assert_refused(
        &o,
        &before,
        &output,
        "0.1 pixel in this command, 0.01 pixel",
    );
    let o = run(run_cmd(&input, &output, &tiny_model())
        .args(["--chip-size", "16", "--task-files", "1"])
        .env("RSEMBED_FOOTPRINT_TOLERANCE", "0.001"));
    assert_refused(&o, &before, &output, "0.001 pixel in this command");

    // The default given explicitly is the same job: resumed, nothing redone.
    let s = run_ok(&input, &output, &["--footprint-tolerance", "0.01"]);
    assert_eq!(s["chips_embedded"], 0, "{s}");
    assert_eq!(s["job_id"], first["job_id"]);

    // Values that are not a tolerance are refused before anything is read.
    let fresh = dir.path().join("fresh");
    for bad in ["0", "-1", "1.5", "NaN", "inf"] {
        let o = run_job(&input, &fresh, &[&format!("--footprint-tolerance={bad}")]);
        assert!(!o.status.success(), "{bad} accepted");
        assert!(
            stderr(&o).contains("--footprint-tolerance is in source pixels"),
            "{bad}: {}",
            stderr(&o)
        );
        assert!(!fresh.exists(), "a refused command created the output");
    }
}

#[test]
fn an_old_job_resumes_with_its_own_footprints() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_scenes(&input, 3);
    run_ok(&input, &output, &[]);
    let new = footprints(&output);

    // The job as an rsembed before the flag wrote it: no tolerance, and the
    // id such a job had; none of its tasks done yet.
    let old = job(&output).with_footprint_tolerance(None);
    let text = serde_json::to_string_pretty(&old).unwrap();
    assert!(!text.contains("footprint_tolerance"), "{text}");
    std::fs::write(output.join("job.json"), text).unwrap();
    std::fs::remove_dir_all(output.join("chips")).unwrap();
    std::fs::remove_file(output.join("manifest.json")).unwrap();

    let s = run_ok(&input, &output, &[]);
    assert!(s["replaced_job"].is_null(), "resumed, not replaced: {s}");
    assert_eq!(s["job_id"], old.job_id.as_str());
    assert_eq!(s["chips_embedded"], 3 * 9);
    let after = job(&output);
    assert_eq!(after.tiling.footprint_tolerance, None, "still an old job");
    assert_eq!(after.job_id, old.job_id);
    let legacy = footprints(&output);
    assert_eq!(legacy.len(), new.len());
    for (l, n) in legacy.iter().zip(&new) {
        assert_eq!((&l.0, l.1, l.2), (&n.0, n.1, n.2), "the same chips");
        assert!(
            l.3 > 20 && n.3 == 5,
            "5e-8 degrees ({} vertices) where 0.01 px has {}",
            l.3,
            n.3
        );
    }

    // One task lost: redone alone, to the same precision as the others.
    let lost = std::fs::read_dir(output.join("chips"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::remove_file(&lost).unwrap();
    let s = run_ok(&input, &output, &[]);
    assert_eq!(s["chips_embedded"], 9, "{s}");
    assert_eq!(footprints(&output), legacy, "never two precisions");

    // Asking for a tolerance is asking for another job.
    let before = files(&output);
    let o = run_job(&input, &output, &["--footprint-tolerance", "0.01"]);
    assert_refused(&o, &before, &output, "older rsembed: 5e-8 degrees");

    // Starting over takes the default.
    let s = run_ok(&input, &output, &["--overwrite"]);
    assert!(s["replaced_job"].as_str().is_some(), "{s}");
    assert_eq!(job(&output).tiling.footprint_tolerance, Some(0.01));
    assert_eq!(footprints(&output), new);
}

/// `rsembed submit` records the tolerance and the workers densify to it:
/// they read it from the task message, not from a default of their own.
#[test]
fn distributed_workers_use_the_job_tolerance() {
    use rsembed_integration_tests::cluster::{finalize, submit_ok, wait_finished, Worker};
    use rsembed_integration_tests::nats::NatsServer;

    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_scenes(&input, 2);
    let s = submit_ok(
        &url,
        &input,
        &output,
        &["--chip-size", "16", "--footprint-tolerance", "0.0001"],
    );
    assert_eq!(job(&output).tiling.footprint_tolerance, Some(0.0001), "{s}");
    let worker = Worker::start(&url, "w", &[], &[]);
    let st = wait_finished(&url, &output, std::time::Duration::from_secs(120));
    assert_eq!(st["done"], st["tasks"], "{st}");
    let (code, report) = finalize(&url, &output);
    assert_eq!(code, Some(0), "{report}");
    drop(worker);
    let fps = footprints(&output);
    assert_eq!(fps.len(), 2 * 9);
    // Corners only at the default (see above); a ten-thousandth of a pixel
    // needs vertices along the edges.
    assert!(fps.iter().all(|f| f.3 > 5), "{fps:?}");
}
