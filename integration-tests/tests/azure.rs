//! `rsembed run` against a real Azure Blob Storage API (Azurite, npm
//! `azurite`), as `tests/s3.rs` runs it against moto: `az://` input and output
//! give the same chips as the same files on local disk, the dataset's objects
//! are where the contract puts them, and a rerun resumes.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use rsembed_integration_tests::azure::AzuriteServer;
use rsembed_integration_tests::*;
use serde_json::Value;

/// Bound on one `rsembed` run: generous for a loaded two-core machine.
const RUN_LIMIT: Duration = Duration::from_secs(180);

fn run_az(az: &AzuriteServer, input: &str, output: &str, extra: &[&str]) -> Output {
    let mut c = run_cmd(Path::new(input), Path::new(output), &tiny_model());
    c.args(extra);
    az.configure(&mut c);
    run_timeout(&mut c, RUN_LIMIT)
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

fn summary(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "--json prints the summary as JSON ({e}); stderr:\n{}",
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// The committed images and two committed georeferenced TIFFs (one with nodata).
fn fixture_set(dir: &Path) -> PathBuf {
    let set = dir.join("set");
    copy_dir(&fixture_images(), &set.join("images"));
    let geo = set.join("geo");
    std::fs::create_dir_all(&geo).unwrap();
    for f in ["u8_deflate_tp.tif", "u8_nodata_deflate_tb.tif"] {
        std::fs::copy(root().join("fixtures/tiff").join(f), geo.join(f)).unwrap();
    }
    set
}

/// Chip rows of a dataset, with `source_uri` relative to `input_root`, in a
/// stable order: every column but `chip_id` and `source_version`, which depend
/// on where the input lives.
fn chips(dataset: &Path, input_root: &str) -> Vec<Value> {
    let rows = duckdb(&format!(
        "SELECT replace(source_uri, '{input_root}', ''), x, y, width, height, valid_fraction, \
         crs, hex(geometry::BLOB), bbox.xmin, bbox.ymin, bbox.xmax, bbox.ymax, \
         centre_lon, centre_lat, embedding::FLOAT[] \
         FROM '{}/chips/*.parquet' ORDER BY 1, y, x",
        dataset.display()
    ));
    rows.as_array().unwrap().clone()
}

/// Same windows, footprints and metadata exactly; embeddings within 1e-6.
fn assert_same_chips(ours: &[Value], theirs: &[Value]) {
    assert_eq!(ours.len(), theirs.len(), "chip count");
    for (a, b) in ours.iter().zip(theirs) {
        let (a, b) = (a.as_array().unwrap(), b.as_array().unwrap());
        assert_eq!(a[..14], b[..14], "chip window, footprint and metadata");
        let (ea, eb) = (a[14].as_array().unwrap(), b[14].as_array().unwrap());
        assert_eq!(ea.len(), eb.len());
        let diff = ea
            .iter()
            .zip(eb)
            .map(|(x, y)| (x.as_f64().unwrap() - y.as_f64().unwrap()).abs())
            .fold(0.0, f64::max);
        assert!(diff <= 1e-6, "{}: embedding max abs diff {diff}", a[0]);
    }
}

#[test]
fn azure_input_and_output_equal_local_run_and_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let set = fixture_set(tmp.path());
    let az = AzuriteServer::start();
    az.create_container("input");
    az.create_container("output");
    az.upload(&set, "az://input/set");
    let flags = ["--task-size", "2", "--json"];

    let local = tmp.path().join("local");
    let o = run_timeout(run_cmd(&set, &local, &tiny_model()).args(flags), RUN_LIMIT);
    assert_eq!(o.status.code(), Some(0), "local run");
    let o = run_az(&az, "az://input/set", "az://output/job", &flags);
    assert_eq!(
        o.status.code(),
        Some(0),
        "run on Azure succeeds: {}\nAzurite log:\n{}",
        String::from_utf8_lossy(&o.stderr),
        az.log()
    );
    let first = summary(&o);
    let tasks = first["tasks"].as_u64().unwrap();
    assert!(tasks >= 3, "several tasks: {first}");

    // The dataset is in the container: job.json, manifest.json and the chip
    // files it lists, and nothing else (no write probe).
    let objects = az.list("az://output/job");
    let mut names: Vec<&str> = objects.iter().map(|(k, _)| k.as_str()).collect();
    names.sort_unstable();
    assert!(names.contains(&"job.json"), "{names:?}");
    assert!(names.contains(&"manifest.json"), "{names:?}");
    assert!(
        !names.iter().any(|n| n.contains("write-probe")),
        "the write probe is removed: {names:?}"
    );
    let dl = tmp.path().join("dl");
    az.download("az://output/job", &dl);
    let manifest = read_json(&dl.join("manifest.json"));
    let job = read_json(&dl.join("job.json"));
    assert_eq!(job["input"], "az://input/set");
    assert_eq!(job["output"], "az://output/job");
    assert_eq!(manifest["failed_inputs"], 0);
    let listed: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| n.starts_with("chips/"))
        .collect();
    let files = manifest_list(&dl, "files", "kind = 'chips'");
    let mut in_manifest: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
    in_manifest.sort_unstable();
    assert_eq!(listed, in_manifest, "the manifest lists the chip blobs");

    // Read back with DuckDB: the same rows as the run on local disk.
    let ours = chips(&dl, "az://input/set");
    let theirs = chips(&local, &format!("file://{}", set.display()));
    assert_eq!(manifest["rows"], ours.len() as u64);
    assert!(
        ours.iter()
            .filter(|r| r[0].as_str().unwrap().starts_with("/geo/") && !r[7].is_null())
            .count()
            >= 2,
        "the GeoTIFFs' chips have footprints"
    );
    assert_same_chips(&ours, &theirs);
    let uris = duckdb(&format!(
        "SELECT count(*) FILTER (WHERE starts_with(source_uri, 'az://input/set/')), \
         count(source_version), count(*) FROM '{}/chips/*.parquet'",
        dl.display()
    ));
    assert_eq!(uris[0][0], uris[0][2], "every source_uri is an az:// URL");
    assert_eq!(
        uris[0][1], uris[0][2],
        "every chip has a source_version (ETag)"
    );

    // A rerun finds every task done and writes nothing new.
    let o = run_az(&az, "az://input/set", "az://output/job", &flags);
    assert_eq!(o.status.code(), Some(0));
    let second = summary(&o);
    assert_eq!(second["tasks_resumed"], tasks, "{second}");
    assert_eq!(second["chips_embedded"], 0, "{second}");
    assert_eq!(second["chips"], first["chips"], "{second}");
    // Task files only: a run ends by writing job.json and manifest.json
    // again (its finalized_at changes).
    let tasks_only = |v: Vec<(String, u64)>| -> Vec<(String, u64)> {
        v.into_iter()
            .filter(|(name, _)| name.starts_with("chips/") || name.starts_with("errors/"))
            .collect()
    };
    let mut again = tasks_only(az.list("az://output/job"));
    let mut before = tasks_only(objects.clone());
    again.sort();
    before.sort();
    assert_eq!(again, before, "the rerun rewrote no blob");
}
