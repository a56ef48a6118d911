//! `rsembed compact` on real job outputs: every row exactly once and byte for
//! byte the same, files and rows in Hilbert order, a manifest that lists
//! exactly the new files, the same answers from `rsembed search`, and the
//! refusals (no manifest, compacting onto the source, a non-empty output).
//!
//! The GeoTIFF test reads `../shared/data/geotiff` and says SKIPPED when it is
//! absent; the fixture-image tests always run.

use std::path::{Path, PathBuf};
use std::process::Output;

use rsembed_integration_tests::*;
use rsembed_query::compact::{hilbert_key, parse_chip_id, Key};
use serde_json::Value;
use stac_chips::{FileSpec, Kind, MAY_2023, MAY_2024};

mod stac_chips;

/// `rsembed run --task-files 1` (one chip file per input), which must exit with `code`.
fn embed(input: &Path, out: &Path, code: i32) {
    let o = run(run_cmd(input, out, &tiny_model()).args(["--task-files", "1"]));
    assert_eq!(o.status.code(), Some(code), "run exits with {code}");
}

fn compact(index: &Path, out: &Path, extra: &[&str]) -> Output {
    run(rsembed()
        .arg("compact")
        .arg("--index")
        .arg(index)
        .arg("--output")
        .arg(out)
        .args(extra))
}

/// `rsembed compact --json` that must succeed; its summary.
fn compact_ok(index: &Path, out: &Path, extra: &[&str]) -> Value {
    let o = compact(index, out, &[&["--json"], extra].concat());
    assert_eq!(o.status.code(), Some(0), "compact succeeds");
    serde_json::from_slice(&o.stdout).expect("the summary is JSON")
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// The chip files of `d`, by column name: a dataset may hold files of chip
/// schema versions 1 and 2.
fn glob(d: &Path) -> String {
    format!(
        "read_parquet('{}/chips/*.parquet', union_by_name=true)",
        d.display()
    )
}

fn count(sql: &str) -> u64 {
    duckdb(sql)[0][0].as_u64().expect("a count")
}

/// The checks every compaction must pass; returns the manifest.
fn check_compaction(src: &Path, out: &Path, summary: &Value) -> Value {
    let src_manifest = read_json(&src.join("manifest.json"));
    let manifest = read_json(&out.join("manifest.json"));
    let rows = src_manifest["rows"].as_u64().unwrap();
    assert!(rows > 0);
    assert_eq!(manifest["rows"], rows);
    assert_eq!(summary["rows"], rows);
    for k in [
        "job_id",
        "fingerprint",
        "tasks",
        "failed_inputs",
        "error_file_count",
        "failed_task_count",
        "inputs_without_chips",
    ] {
        assert_eq!(manifest[k], src_manifest[k], "{k} is the source's");
    }
    assert_eq!(manifest["format"], 2);
    // The error files and failures are the source's, as its list (format 2)
    // or its manifest.json (format 1) has them.
    let format_2 = |d: &Path| d.join("manifest/files.parquet").is_file();
    let errors = |d: &Path, m: &Value| -> Vec<Value> {
        let rows = if format_2(d) {
            manifest_list(d, "files", "kind = 'errors'")
        } else {
            m["error_files"].as_array().cloned().unwrap_or_default()
        };
        rows.iter()
            .map(|f| serde_json::json!([f["path"], f["sha256"], f["bytes"], f["rows"]]))
            .collect()
    };
    assert_eq!(
        errors(out, &manifest),
        errors(src, &src_manifest),
        "the error files are the source's"
    );
    if format_2(src) {
        let failures = |d: &Path| {
            let mut v: Vec<String> = manifest_list(d, "failures", "true")
                .iter()
                .map(Value::to_string)
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            failures(out),
            failures(src),
            "the failures are the source's"
        );
    }
    assert_eq!(
        manifest["compacted_from"]["url"].as_str().unwrap(),
        format!("file://{}", src.display())
    );

    // The manifest lists exactly the files in chips/, with their digests and rows.
    let files = manifest_list(out, "files", "kind = 'chips'");
    assert_eq!(summary["files"].as_u64().unwrap() as usize, files.len());
    assert_eq!(manifest["chip_file_count"], files.len());
    let mut on_disk: Vec<String> = std::fs::read_dir(out.join("chips"))
        .unwrap()
        .map(|e| format!("chips/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    on_disk.sort();
    let listed: Vec<String> = files
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_owned())
        .collect();
    let want: Vec<String> = (0..files.len())
        .map(|i| format!("chips/part-{i:05}.parquet"))
        .collect();
    assert_eq!(listed, want);
    assert_eq!(on_disk, want, "no other file in chips/");
    let blobs = duckdb(&format!(
        "SELECT filename, sha256(content), size FROM read_blob('{}/chips/*.parquet') ORDER BY 1",
        out.display()
    ));
    let counts = duckdb(&format!(
        "SELECT filename, count(*) FROM read_parquet('{}/chips/*.parquet', filename=true) \
         GROUP BY 1 ORDER BY 1",
        out.display()
    ));
    let (blobs, counts) = (blobs.as_array().unwrap(), counts.as_array().unwrap());
    assert_eq!(blobs.len(), files.len());
    for ((f, b), c) in files.iter().zip(blobs).zip(counts) {
        assert!(b[0]
            .as_str()
            .unwrap()
            .ends_with(f["path"].as_str().unwrap()));
        assert_eq!(c[0], b[0]);
        assert_eq!(f["sha256"], b[1], "{}: sha256", f["path"]);
        assert_eq!(f["bytes"], b[2], "{}: bytes", f["path"]);
        assert_eq!(f["rows"], c[1], "{}: rows", f["path"]);
    }
    assert_eq!(
        std::fs::read(src.join("job.json")).unwrap(),
        std::fs::read(out.join("job.json")).unwrap(),
        "job.json is the source's"
    );
    for e in &errors(out, &manifest) {
        let rel = e[0].as_str().unwrap();
        assert_eq!(
            std::fs::read(src.join(rel)).unwrap(),
            std::fs::read(out.join(rel)).unwrap(),
            "{rel} is copied"
        );
    }

    // Every row exactly once, every column the same.
    let (a, b) = (glob(src), glob(out));
    assert_eq!(count(&format!("SELECT count(*) FROM {b}")), rows);
    assert_eq!(
        count(&format!("SELECT count(DISTINCT chip_id) FROM {b}")),
        rows
    );
    for (x, y) in [(&a, &b), (&b, &a)] {
        assert_eq!(
            count(&format!(
                "SELECT count(*) FROM (SELECT * FROM {x} EXCEPT ALL SELECT * FROM {y})"
            )),
            0,
            "the same rows, byte for byte"
        );
    }

    // Hilbert order, within each file and across them: recomputed here.
    let seq = duckdb(&format!(
        "SELECT filename, chip_id, centre_lon, centre_lat FROM \
         read_parquet('{}/chips/*.parquet', filename=true, file_row_number=true) \
         ORDER BY filename, file_row_number",
        out.display()
    ));
    let keys: Vec<(String, Key)> = seq
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let id = parse_chip_id(r[1].as_str().unwrap()).unwrap();
            (
                r[0].as_str().unwrap().to_owned(),
                (hilbert_key(r[2].as_f64(), r[3].as_f64()), id),
            )
        })
        .collect();
    for w in keys.windows(2) {
        assert!(
            w[0].1 < w[1].1,
            "rows out of Hilbert order: {:?} then {:?}",
            w[0],
            w[1]
        );
    }

    // Each file carries the job's metadata, with its own name as the task.
    for (i, f) in files.iter().enumerate() {
        let kv = duckdb(&format!(
            "SELECT decode(key), decode(value) FROM parquet_kv_metadata('{}/{}')",
            out.display(),
            f["path"].as_str().unwrap()
        ));
        let get = |k: &str| -> Value {
            let v = kv
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r[0] == k)
                .unwrap_or_else(|| panic!("no `{k}` metadata"));
            serde_json::from_str(v[1].as_str().unwrap()).unwrap()
        };
        let meta = get("rsembed");
        assert_eq!(meta["task_id"], format!("part-{i:05}"));
        assert_eq!(meta["job_id"], src_manifest["job_id"]);
        assert_eq!(get("geo")["primary_column"], "geometry");
    }
    manifest
}

/// `rsembed search --json` results as (chip_id, cosine) pairs, sorted.
fn search(index: &Path, extra: &[&str]) -> Vec<(String, String)> {
    let o = run(rsembed()
        .args(["search", "--json", "--top-k", "100000", "--index"])
        .arg(index)
        .args(extra));
    assert_eq!(o.status.code(), Some(0), "search succeeds");
    let mut v: Vec<(String, String)> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            (
                r["chip_id"].as_str().unwrap().to_owned(),
                format!("{:.6}", r["cosine"].as_f64().unwrap()),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn shared_geotiffs_compact_into_hilbert_sorted_files() {
    let Some(data) = shared_data() else {
        skipped("../shared/data is not in this checkout");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (src, out) = (tmp.path().join("job"), tmp.path().join("compacted"));
    embed(&data.join("geotiff"), &src, 0);
    let src_files = read_json(&src.join("manifest.json"))["chip_file_count"]
        .as_u64()
        .unwrap() as usize;
    assert!(src_files > 5, "one file per input: {src_files}");
    let spill = tmp.path().join("spill");
    let summary = compact_ok(
        &src,
        &out,
        &[
            // About a quarter of the source (173 KB since footprints are
            // sized to the pixel; 100 KB made 2 files of it).
            "--target-size",
            "40KB",
            "--spill-dir",
            spill.to_str().unwrap(),
        ],
    );
    let manifest = check_compaction(&src, &out, &summary);
    let files = manifest["chip_file_count"].as_u64().unwrap() as usize;
    assert!(
        (3..src_files).contains(&files),
        "{files} files of about 40 KB"
    );
    assert_eq!(
        std::fs::read_dir(&spill).unwrap().count(),
        0,
        "the spill is removed"
    );
    assert!(
        count(&format!("SELECT count(centre_lon) FROM {}", glob(&out))) > 0,
        "the scenes are georeferenced"
    );

    // Search reads the compaction as it reads the job: same chips, same cosines.
    let like = duckdb(&format!(
        "SELECT chip_id FROM {} WHERE centre_lon IS NOT NULL ORDER BY chip_id LIMIT 1",
        glob(&src)
    ))[0][0]
        .as_str()
        .unwrap()
        .to_owned();
    let all = search(&src, &["--like", &like]);
    assert_eq!(all.len() as u64 + 1, manifest["rows"].as_u64().unwrap());
    assert_eq!(search(&out, &["--like", &like]), all);
    let ext = duckdb(&format!(
        "SELECT centre_lon, centre_lat FROM {} WHERE chip_id = '{like}'",
        glob(&src)
    ));
    let (lon, lat) = (ext[0][0].as_f64().unwrap(), ext[0][1].as_f64().unwrap());
    // A box around that chip's scene, which other scenes are far from.
    let bbox = format!("{},{},{},{}", lon - 0.5, lat - 0.5, lon + 0.5, lat + 0.5);
    let near = search(&src, &["--like", &like, "--bbox", &bbox]);
    assert!(!near.is_empty() && near.len() < all.len());
    assert_eq!(search(&out, &["--like", &like, "--bbox", &bbox]), near);
}

/// A job over the fixture images (not georeferenced: no centres), one file
/// per image, and one input that fails (so the job has an error file).
fn fixture_job(tmp: &Path) -> PathBuf {
    let input = tmp.join("images");
    copy_dir(&fixture_images(), &input);
    std::fs::write(input.join("broken.png"), b"\x89PNG\r\n\x1a\nnot really").unwrap();
    let src = tmp.join("job");
    embed(&input, &src, 3);
    assert_eq!(
        read_json(&src.join("manifest.json"))["failed_inputs"],
        1,
        "broken.png failed"
    );
    src
}

#[test]
fn plain_images_without_centres_compact_once_each_by_chip_id() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture_job(tmp.path());
    let out = tmp.path().join("compacted");
    let summary = compact_ok(&src, &out, &["--target-size", "20KB"]);
    let manifest = check_compaction(&src, &out, &summary);
    assert!(
        manifest["chip_file_count"].as_u64().unwrap() >= 2,
        "several files"
    );
    assert_eq!(
        count(&format!("SELECT count(centre_lon) FROM {}", glob(&out))),
        0,
        "no centres: every key is the last one, and the order is by chip_id"
    );

    // One big file when the target is large; a rerun onto it needs --overwrite.
    let one = tmp.path().join("one");
    let s = compact_ok(&src, &one, &[]);
    assert_eq!(s["files"], 1);
    check_compaction(&src, &one, &s);
    let o = compact(&src, &one, &[]);
    assert_ne!(
        o.status.code(),
        Some(0),
        "an output holding a dataset is refused"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--overwrite"), "{err}");
    let s = compact_ok(&src, &one, &["--overwrite", "--target-size", "20KB"]);
    check_compaction(&src, &one, &s);
}

#[test]
fn unfinished_jobs_and_the_source_itself_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture_job(tmp.path());

    let o = compact(&src, &src, &[]);
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("is the dataset being compacted"), "{err}");
    assert!(
        src.join("manifest.json").is_file(),
        "the source is untouched"
    );

    let unfinished = tmp.path().join("unfinished");
    copy_dir(&src, &unfinished);
    std::fs::remove_file(unfinished.join("manifest.json")).unwrap();
    let out = tmp.path().join("out");
    let o = compact(&unfinished, &out, &[]);
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no manifest.json") && err.contains("rsembed finalize"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");
}

#[test]
fn unwritable_outputs_fail_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture_job(tmp.path());
    let file = tmp.path().join("afile");
    std::fs::write(&file, b"a file, not a folder").unwrap();
    for (out, cause) in [
        (
            Path::new("/proc/rsembed-test-compact").to_path_buf(),
            "/proc",
        ),
        (Path::new("/proc").to_path_buf(), "/proc"),
        (file.join("out"), "afile"),
    ] {
        let o = run_timeout(
            rsembed()
                .arg("compact")
                .arg("--index")
                .arg(&src)
                .arg("--output")
                .arg(&out),
            std::time::Duration::from_secs(120),
        );
        assert_eq!(o.status.code(), Some(1), "{}", out.display());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&*out.to_string_lossy()),
            "names the output: {err}"
        );
        assert!(err.contains(cause), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"a file, not a folder",
        "untouched"
    );
}

#[test]
fn files_rewritten_by_pyarrow_compact() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture_job(tmp.path());
    // PyArrow names the embedding list's items `element` where arrow-rs says `item`.
    let o = run(std::process::Command::new(python()).args([
        "-c",
        "import glob, sys, pyarrow.parquet as pq\n\
         for f in sorted(glob.glob(sys.argv[1] + '/chips/*.parquet')):\n\
         \x20   pq.write_table(pq.read_table(f), f)\n\
         print(pq.read_schema(f).field('embedding').type)",
        src.to_str().unwrap(),
    ]));
    assert!(o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("element"),
        "the rewrite renamed the list items"
    );
    let out = tmp.path().join("compacted");
    let summary = compact_ok(&src, &out, &["--target-size", "20KB"]);
    check_compaction(&src, &out, &summary);
}

/// Columns, `rsembed` schema_version and rows of each file of a dataset.
fn file_versions(d: &Path) -> Vec<(usize, u64, u64)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(d.join("chips"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| {
            let cols = duckdb(&format!(
                "SELECT count(*) FROM (DESCRIBE SELECT * FROM '{}')",
                f.display()
            ))[0][0]
                .as_u64()
                .unwrap() as usize;
            let kv = duckdb(&format!(
                "SELECT decode(value) FROM parquet_kv_metadata('{}') WHERE decode(key) = 'rsembed'",
                f.display()
            ));
            let meta: Value = serde_json::from_str(kv[0][0].as_str().unwrap()).unwrap();
            let rows = count(&format!("SELECT count(*) FROM '{}'", f.display()));
            (cols, meta["schema_version"].as_u64().unwrap(), rows)
        })
        .collect()
}

fn spec(name: &'static str, kind: Kind, rows: usize, lon: f64) -> FileSpec {
    FileSpec {
        name,
        kind,
        rows,
        lon,
    }
}

#[test]
fn schema_versions_1_2_and_mixed_compact_with_their_columns() {
    let tmp = tempfile::tempdir().unwrap();
    let v1 = [
        spec("a-v1", Kind::V1, 50, -100.0),
        spec("b-v1", Kind::V1, 30, -99.0),
    ];
    let v2 = [
        spec("c-stac", Kind::Stac { base: MAY_2024 }, 60, -98.0),
        spec("d-plain", Kind::Plain, 40, -97.0),
    ];
    let mixed = [
        v1[0],
        v2[0],
        spec("e-stac", Kind::Stac { base: MAY_2023 }, 30, -96.0),
    ];
    for (name, files, version) in [
        ("v1", &v1[..], 1u64),
        ("v2", &v2[..], 2),
        ("mixed", &mixed[..], 2),
    ] {
        let src = tmp.path().join(name);
        stac_chips::write_job(&src, files);
        let out = tmp.path().join(format!("{name}-compacted"));
        let summary = compact_ok(&src, &out, &["--target-size", "20KB"]);
        // Every row once, every column equal (the v1 rows of a mixed source
        // null in the new columns, as DuckDB's union_by_name reads them).
        let manifest = check_compaction(&src, &out, &summary);
        assert_eq!(manifest["schema_version"], version, "{name}");
        let parts = file_versions(&out);
        assert!(parts.len() >= 2, "{name}: several parts");
        let want_cols = if version == 1 { 14 } else { 19 };
        for (cols, v, _) in &parts {
            assert_eq!((*cols, *v), (want_cols, version), "{name}: {parts:?}");
        }
        let rows: usize = files.iter().map(|f| f.rows).sum();
        assert_eq!(
            parts.iter().map(|p| p.2).sum::<u64>(),
            rows as u64,
            "{name}"
        );
        if version == 2 {
            // The STAC values survive, the rows without them stay null.
            let q = |d: &Path| {
                duckdb(&format!(
                    "SELECT count(item_id), count(collection), count(datetime), \
                     count(end_datetime), count(cloud_fraction), \
                     sum(epoch_us(datetime)), sum(cloud_fraction) FROM {}",
                    glob(d)
                ))
            };
            let (a, b) = (q(&src), q(&out));
            assert_eq!(a, b, "{name}");
            assert!(a[0][2].as_u64().unwrap() > 0, "{name}: {a}");
        }
        // And search reads it as it reads the source.
        let q = src.join("q.json");
        let args = [
            "--vector",
            q.to_str().unwrap(),
            "--datetime",
            "2023-01-01T00:00:00Z/..",
        ];
        assert_eq!(search(&out, &args), search(&src, &args), "{name}");
    }
}
