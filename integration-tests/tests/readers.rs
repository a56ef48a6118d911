//! The output dataset read by the tools it is documented for, as users read it:
//! GeoPandas, DuckDB, Polars and PyArrow (`python/test_readers.py`), and every
//! query of `docs/querying.md` run against a real dataset (`python/test_docs.py`).
//!
//! The datasets are `rsembed run` outputs of `../shared/data/geotiff`; each test
//! says SKIPPED when it is absent. For the documented queries on the STAC
//! columns (schema version 2), three of its chip files get STAC values first
//! (`python/stamp_stac.py`); `test_readers.py` reads a mix of schema versions 1
//! and 2 as the page says. The Python packages come from
//! `integration-tests/requirements.txt` (`scripts/setup-test-env.sh`).

use std::path::{Path, PathBuf};
use std::process::Command;

use rsembed_integration_tests::*;

/// The query text whose embedding the similarity checks and documented queries use.
const QUERY: &str = "a river next to farmland";

fn script(name: &str) -> PathBuf {
    root().join("integration-tests/python").join(name)
}

/// `rsembed text` for [`QUERY`], written where the scripts read it.
fn query_vector(dir: &Path) -> PathBuf {
    let o = run(rsembed()
        .args(["text", "--model"])
        .arg(tiny_model())
        .arg(QUERY));
    assert!(o.status.success(), "rsembed text succeeds");
    let text = String::from_utf8(o.stdout).expect("rsembed text prints UTF-8");
    assert_eq!(text.lines().count(), 1, "one line for one text");
    let v: Vec<f64> = serde_json::from_str(text.trim()).expect("a JSON array");
    assert!(!v.is_empty());
    let p = dir.join("q.json");
    std::fs::write(&p, text).unwrap();
    p
}

/// The dataset of `../shared/data/geotiff` as it is: one task, one file.
fn whole_dataset(geotiff: &Path, out: &Path) {
    let o = run(&mut run_cmd(geotiff, out, &tiny_model()));
    assert_eq!(
        o.status.code(),
        Some(0),
        "every shared GeoTIFF is processed"
    );
}

/// The same scenes plus one broken input, one task per input (`--task-files 1`):
/// several files, so that a bbox filter has row groups to skip, and an
/// `errors/` file for the documented error query. Exit 3: an input failed.
fn split_dataset(geotiff: &Path, tmp: &Path) -> PathBuf {
    let input = tmp.join("in");
    copy_dir(geotiff, &input.join("geotiff"));
    std::fs::write(input.join("truncated.tif"), b"II*\0").unwrap();
    let out = tmp.join("split");
    let o = run(run_cmd(&input, &out, &tiny_model()).args(["--task-files", "1"]));
    assert_eq!(
        o.status.code(),
        Some(3),
        "done, with the broken input in errors/"
    );
    assert!(out.join("errors").is_dir());
    out
}

/// Runs a Python test script and fails with its output when it fails.
fn python_script(cmd: &mut Command) {
    let o = run(cmd);
    assert!(
        o.status.success(),
        "{:?} failed ({:?})\nstdout:\n{}\nstderr:\n{}",
        cmd.get_args().next(),
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
#[allow(clippy::print_stderr)]
fn python_readers_read_the_dataset() {
    let Some(data) = shared_data() else {
        skipped("../shared/data is not in this checkout");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    whole_dataset(&data.join("geotiff"), &whole);
    let split = split_dataset(&data.join("geotiff"), tmp.path());
    let q = query_vector(tmp.path());
    python_script(
        Command::new(python())
            .arg(script("test_readers.py"))
            .arg("--dataset")
            .arg(&whole)
            .arg("--split-dataset")
            .arg(&split)
            .arg("--model")
            .arg(tiny_model())
            .arg("--query")
            .arg(&q)
            .arg("--manifest")
            .arg(data.join("MANIFEST.txt")),
    );
}

#[test]
#[allow(clippy::print_stderr)]
fn documented_queries_run() {
    let Some(data) = shared_data() else {
        skipped("../shared/data is not in this checkout");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let split = split_dataset(&data.join("geotiff"), tmp.path());
    // The int8 section's `out-int8/`: the same rows, converted by compact
    // (before the STAC stamp, which rewrites files behind the manifest).
    let int8 = tmp.path().join("split-int8");
    let o = run(rsembed()
        .args(["compact", "--index"])
        .arg(&split)
        .arg("--output")
        .arg(&int8)
        .args(["--embedding-type", "int8"]));
    assert!(o.status.success(), "compact --embedding-type int8 succeeds");
    python_script(
        Command::new(python())
            .arg(script("stamp_stac.py"))
            .arg(&split),
    );
    let q = query_vector(tmp.path());
    // The documented resident search starts `rsembed` from PATH.
    let bin = binary("rsembed");
    let path = std::env::join_paths(std::iter::once(bin.parent().unwrap().to_owned()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    python_script(
        Command::new(python())
            .env("PATH", path)
            .arg(script("test_docs.py"))
            .arg("--docs")
            .arg(root().join("docs/querying.md"))
            .arg("--dataset")
            .arg(&split)
            .arg("--dataset-int8")
            .arg(&int8)
            .arg("--query")
            .arg(&q),
    );
}
