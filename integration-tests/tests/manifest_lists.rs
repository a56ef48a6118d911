//! The manifest's Parquet lists (`manifest/files.parquet`,
//! `manifest/failures.parquet`) as `rsembed run` writes them and DuckDB
//! reads them; an output of an older rsembed (a format 1 `manifest.json`,
//! its lists in it) still searched, and rewritten by `finalize` without
//! `--nats`.

use std::io::Cursor;
use std::path::Path;

use futures::TryStreamExt;
use rsembed_integration_tests::*;
use rsembed_schemas::manifest::{
    failures, files, parse_manifest, FailureKind, FailureRow, FileKind, ListedFile,
};
use serde_json::{json, Value};

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// A job over the fixture images and one broken image (so it has an error
/// file and a failed input), one task per image.
fn job(tmp: &Path) -> std::path::PathBuf {
    let input = tmp.join("images");
    copy_dir(&fixture_images(), &input);
    std::fs::write(input.join("broken.png"), b"\x89PNG\r\n\x1a\nnot really").unwrap();
    let out = tmp.join("job");
    let o = run(run_cmd(&input, &out, &tiny_model()).args(["--task-files", "1"]));
    assert_eq!(o.status.code(), Some(3), "a failed input: exit 3");
    out
}

/// `sha256(content), size` of a file, by DuckDB.
fn digest(p: &Path) -> Value {
    let v = duckdb(&format!(
        "SELECT sha256(content), size FROM read_blob('{}')",
        p.display()
    ));
    v[0].clone()
}

/// Each row as a sorted list of JSON strings, to compare lists whose rows
/// may come in another order.
fn sorted(rows: Vec<Value>) -> Vec<String> {
    let mut v: Vec<String> = rows.iter().map(Value::to_string).collect();
    v.sort();
    v
}

fn search_like(index: &Path, chip: &str) -> Vec<String> {
    let o = run(rsembed()
        .args([
            "search", "--json", "--top-k", "1000", "--like", chip, "--index",
        ])
        .arg(index));
    assert_eq!(o.status.code(), Some(0), "search succeeds");
    let mut v: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            format!("{} {:.6}", r["chip_id"], r["cosine"].as_f64().unwrap())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn run_writes_small_manifest_and_parquet_lists_that_duckdb_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let out = job(tmp.path());
    let m = read_json(&out.join("manifest.json"));
    assert_eq!(m["format"], 2, "{m}");
    assert!(m.get("files").is_none(), "no JSON list: {m}");
    assert!(
        std::fs::metadata(out.join("manifest.json")).unwrap().len() < 4096,
        "a few KiB whatever the job's size"
    );
    assert_eq!(m["error_file_count"], 1);
    assert_eq!(m["failed_inputs"], 1);
    for list in ["files", "failures"] {
        let entry = &m["lists"][list];
        assert_eq!(entry["path"], format!("manifest/{list}.parquet"));
        let d = digest(&out.join(entry["path"].as_str().unwrap()));
        assert_eq!(
            (&entry["sha256"], &entry["bytes"]),
            (&d[0], &d[1]),
            "{list}"
        );
    }

    // One row per chip file, as the files on disk are.
    let chips = manifest_list(&out, "files", "kind = 'chips'");
    assert_eq!(m["chip_file_count"], chips.len());
    assert_eq!(m["lists"]["files"]["rows"], chips.len() + 1);
    let on_disk = duckdb(&format!(
        "SELECT 'chips/' || parse_filename(b.filename), sha256(b.content), b.size, \
         coalesce(c.n, 0) FROM read_blob('{0}/chips/*.parquet') b LEFT JOIN \
         (SELECT filename, count(*) AS n FROM read_parquet('{0}/chips/*.parquet', filename=true) \
          GROUP BY 1) c USING (filename) ORDER BY 1",
        out.display()
    ));
    let mut listed: Vec<Value> = chips
        .iter()
        .map(|f| json!([f["path"], f["sha256"], f["bytes"], f["rows"]]))
        .collect();
    listed.sort_by_key(|v| v[0].as_str().unwrap().to_owned());
    assert_eq!(Value::from(listed), on_disk);
    let total: u64 = chips.iter().map(|f| f["rows"].as_u64().unwrap()).sum();
    assert_eq!(m["rows"], total);
    for f in &chips {
        let task = f["task_id"].as_str().unwrap();
        assert_eq!(f["path"], format!("chips/{task}.parquet"));
        // Plain images: an extent is recorded, with nothing dated or placed.
        assert_eq!(f["undated"], f["rows"], "{f}");
        assert!(f["footprint"].is_null() && f["bbox"].is_null(), "{f}");
        assert!(f["datetime_start"].is_null(), "{f}");
    }

    // The error file, and its failed input under its task.
    let errors = manifest_list(&out, "files", "kind = 'errors'");
    assert_eq!(errors.len(), 1);
    let task = errors[0]["task_id"].as_str().unwrap();
    assert_eq!(errors[0]["path"], format!("errors/{task}.parquet"));
    assert!(errors[0]["undated"].is_null(), "no extent: {}", errors[0]);
    let failed = manifest_list(&out, "failures", "kind = 'failed_input'");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["task_id"], task);
    assert!(failed[0]["source_uri"]
        .as_str()
        .unwrap()
        .ends_with("broken.png"));
    assert!(!failed[0]["stage"].as_str().unwrap().is_empty());
    assert!(failed[0]["deliveries"].is_null());
    let kinds = duckdb(&format!(
        "SELECT DISTINCT kind FROM '{}/manifest/failures.parquet'",
        out.display()
    ));
    assert_eq!(kinds, json!([["failed_input"]]));
}

/// Rewrites the output's manifest as rsembed wrote it before the Parquet
/// lists: format 1, every list in `manifest.json`, no `manifest/`.
fn to_format_1(out: &Path) {
    let bytes = std::fs::read(out.join("manifest.json")).unwrap();
    let m = parse_manifest(&bytes).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let open = |e: &rsembed_schemas::job::ManifestFile| {
        Cursor::new(std::fs::read(out.join(&e.path)).unwrap())
    };
    let listed: Vec<ListedFile> = rt.block_on(files(&m, open).try_collect()).unwrap();
    let rows: Vec<FailureRow> = rt.block_on(failures(&m, open).try_collect()).unwrap();
    let of = |k: FileKind| {
        listed
            .iter()
            .filter(|f| f.kind == k)
            .map(|f| serde_json::to_value(&f.file).unwrap())
            .collect::<Vec<_>>()
    };
    let failed: Vec<Value> = rows
        .iter()
        .filter(|r| r.kind == FailureKind::FailedInput)
        .map(|r| json!({"source_uri": r.source_uri, "stage": r.stage, "error": r.error}))
        .collect();
    let old = json!({
        "format": 1,
        "job_id": m.job_id,
        "fingerprint": m.fingerprint,
        "tasks": m.tasks,
        "rows": m.rows,
        "failed_inputs": m.failed_inputs,
        "files": of(FileKind::Chips),
        "error_files": of(FileKind::Errors),
        "failures": failed,
        "inputs_without_chips": 0,
        "finalized_at": m.finalized_at,
        "software_version": "rsembed 0.1.0",
        // What a compaction added beside the manifest's own keys.
        "compacted_from": {"url": "file:///elsewhere", "files": 3},
    });
    std::fs::write(
        out.join("manifest.json"),
        serde_json::to_vec_pretty(&old).unwrap(),
    )
    .unwrap();
    std::fs::remove_dir_all(out.join("manifest")).unwrap();
}

fn finalize_without_nats(out: &Path) -> (Option<i32>, Value) {
    let o = run(rsembed()
        .args(["finalize", "--json", "--output"])
        .arg(out)
        .env_remove("RSEMBED_NATS"));
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o.status.code(), v)
}

#[test]
fn an_older_output_is_searched_and_finalize_without_nats_rewrites_its_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let out = job(tmp.path());
    let like = duckdb(&format!(
        "SELECT chip_id FROM '{}/chips/*.parquet' ORDER BY chip_id LIMIT 1",
        out.display()
    ))[0][0]
        .as_str()
        .unwrap()
        .to_owned();
    let found = search_like(&out, &like);
    assert!(found.len() > 3, "{found:?}");
    let lists = |d: &Path| {
        (
            sorted(manifest_list(d, "files", "true")),
            sorted(manifest_list(d, "failures", "true")),
        )
    };
    let before = lists(&out);
    let new = read_json(&out.join("manifest.json"));

    to_format_1(&out);
    assert!(!out.join("manifest/files.parquet").exists());
    assert_eq!(
        search_like(&out, &like),
        found,
        "a format 1 output is searched as before"
    );

    let (code, report) = finalize_without_nats(&out);
    assert_eq!(code, Some(0), "{report}");
    assert!(
        report["converted"]
            .as_str()
            .unwrap()
            .starts_with("from format 1"),
        "{report}"
    );
    let m = read_json(&out.join("manifest.json"));
    assert_eq!(m["format"], 2, "{m}");
    assert!(m.get("files").is_none(), "{m}");
    for k in [
        "job_id",
        "rows",
        "tasks",
        "failed_inputs",
        "chip_file_count",
        "error_file_count",
    ] {
        assert_eq!(m[k], new[k], "{k}");
    }
    assert_eq!(lists(&out), before, "the same rows as the run wrote");
    assert_eq!(m["compacted_from"]["files"], 3, "other keys are kept: {m}");
    assert_eq!(search_like(&out, &like), found);

    // A second time: nothing to do, and it says so.
    let (code, report) = finalize_without_nats(&out);
    assert_eq!(code, Some(0), "{report}");
    assert!(
        report["converted"]
            .as_str()
            .unwrap()
            .contains("already format 2"),
        "{report}"
    );
    assert_eq!(read_json(&out.join("manifest.json")), m, "left as it is");
}

#[test]
fn finalize_without_nats_needs_a_finished_output() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, _) = finalize_without_nats(tmp.path());
    assert_eq!(code, Some(1));
    let o = run(rsembed()
        .args(["finalize", "--output"])
        .arg(tmp.path())
        .env_remove("RSEMBED_NATS"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("manifest.json does not exist") && err.contains("--nats"),
        "{err}"
    );
}
