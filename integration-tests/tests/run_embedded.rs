//! `rsembed run` end to end: real images, real ONNX Runtime, Parquet read back by DuckDB.

use std::path::Path;

use rsembed_integration_tests::*;
use serde_json::Value;

fn run_job(input: &Path, output: &Path) -> std::process::Output {
    run(&mut run_cmd(input, output, &tiny_model()))
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

fn image_count(dir: &Path) -> usize {
    let exts = ["png", "jpg", "jpeg", "tif", "tiff"];
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            n += image_count(&p);
        } else if p
            .extension()
            .map(|x| exts.contains(&x.to_string_lossy().to_lowercase().as_str()))
            .unwrap_or(false)
        {
            n += 1;
        }
    }
    n
}

#[test]
fn fixtures_run_writes_dataset_duckdb_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = run_job(&fixture_images(), &out);
    assert_eq!(o.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("chips/*.parquet"),
        "summary names the GeoParquet"
    );
    assert!(stdout.contains("duckdb -c"), "summary gives a DuckDB query");

    let n = image_count(&fixture_images());
    let manifest = read_json(&out.join("manifest.json"));
    assert_eq!(manifest["rows"], n as u64);
    assert_eq!(manifest["failed_inputs"], 0);
    let job = read_json(&out.join("job.json"));
    assert_eq!(job["job_id"], manifest["job_id"]);
    assert_eq!(job["model"]["name"], "tiny-siglip");
    assert_eq!(job["model"]["sha256"].as_str().unwrap().len(), 64);

    let glob = format!("{}/chips/*.parquet", out.display());
    let dim = read_json(&tiny_model().join("rsembed-model.json"))["embed_dim"]
        .as_u64()
        .unwrap();
    let rows = duckdb(&format!(
        "SELECT count(*), len(any_value(embedding)), count(DISTINCT chip_id), \
         min(list_dot_product(embedding, embedding)), \
         max(list_dot_product(embedding, embedding)), \
         count(geometry), min(valid_fraction) FROM '{glob}'"
    ));
    let r = &rows[0];
    assert_eq!(r[0], n as u64, "one row per image");
    assert_eq!(r[1], dim);
    assert_eq!(r[2], n as u64, "chip ids are unique");
    assert!((r[3].as_f64().unwrap() - 1.0).abs() < 1e-4, "L2-normalized");
    assert!((r[4].as_f64().unwrap() - 1.0).abs() < 1e-4, "L2-normalized");
    assert_eq!(r[5], 0, "plain images have no footprint");
    assert_eq!(r[6], 1.0);

    // Whole images are one chip at 0,0 with their own size.
    let sizes = duckdb(&format!(
        "SELECT x, y, width, height, source_uri FROM '{glob}' ORDER BY source_uri"
    ));
    for s in sizes.as_array().unwrap() {
        assert_eq!((s[0].as_i64(), s[1].as_i64()), (Some(0), Some(0)));
        let uri = s[4].as_str().unwrap();
        assert!(uri.starts_with("file:///"), "{uri}");
        let path = uri.trim_start_matches("file://");
        let (w, h) = image::image_dimensions(path).unwrap();
        assert_eq!(
            (s[2].as_u64(), s[3].as_u64()),
            (Some(w as u64), Some(h as u64))
        );
    }

    // Parquet has no fixed-size list, so DuckDB reads `embedding` as FLOAT[];
    // list functions score it as it is, array functions after a cast to FLOAT[D].
    let sim = duckdb(&format!(
        "SELECT list_cosine_similarity(embedding, embedding), \
         array_cosine_similarity(embedding::FLOAT[{dim}], embedding::FLOAT[{dim}]) \
         FROM '{glob}' LIMIT 1"
    ));
    assert!((sim[0][0].as_f64().unwrap() - 1.0).abs() < 1e-5);
    assert!((sim[0][1].as_f64().unwrap() - 1.0).abs() < 1e-5);

    // File metadata: GeoParquet and rsembed provenance.
    // One row per key and file: the task grouping hashes the input URIs, so
    // the number of files depends on where the fixtures are checked out.
    let kv = duckdb(&format!(
        "SELECT key, arg_min(value, file_name) FROM \
         (SELECT file_name, decode(key) AS key, decode(value) AS value \
          FROM parquet_kv_metadata('{glob}') WHERE decode(key) IN ('geo', 'rsembed')) \
         GROUP BY key ORDER BY key"
    ));
    assert_eq!(kv.as_array().map(Vec::len), Some(2), "{kv}");
    let geo: Value = serde_json::from_str(kv[0][1].as_str().unwrap()).unwrap();
    assert_eq!(geo["version"], "1.1.0");
    assert_eq!(geo["primary_column"], "geometry");
    let meta: Value = serde_json::from_str(kv[1][1].as_str().unwrap()).unwrap();
    assert_eq!(meta["schema_version"], rsembed_schemas::SCHEMA_VERSION);
    assert_eq!(meta["job_id"], manifest["job_id"]);
    assert_eq!(meta["model_sha256"], job["model"]["sha256"]);
}

#[test]
fn embeddings_match_hugging_face_end_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    assert_eq!(run_job(&fixture_images(), &out).status.code(), Some(0));
    let reference = read_json(&tiny_model().join("reference.json"));
    let glob = format!("{}/chips/*.parquet", out.display());
    let mut checked = 0;
    for img in reference["images"].as_array().unwrap() {
        let file = root().join("fixtures").join(img["file"].as_str().unwrap());
        let uri = format!("file://{}", file.display());
        let rows = duckdb(&format!(
            "SELECT embedding::FLOAT[] FROM '{glob}' WHERE source_uri = '{}'",
            uri.replace('\'', "''")
        ));
        let ours: Vec<f64> = rows[0][0]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let theirs: Vec<f64> = img["image_embeds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let cos = cosine(&ours, &theirs);
        let min = if img["resized"].as_bool().unwrap() {
            0.999
        } else {
            0.9999
        };
        assert!(cos >= min, "{}: cosine {cos} < {min}", file.display());
        checked += 1;
    }
    assert!(checked >= 4);
}

#[test]
#[allow(clippy::print_stderr)]
fn shared_chips_one_row_per_image() {
    let Some(data) = shared_data() else {
        skipped("../shared/data is not in this checkout");
        return;
    };
    let chips = data.join("chips");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = run_job(&chips, &out);
    assert_eq!(o.status.code(), Some(0), "every shared chip decodes");
    let n = image_count(&chips);
    assert!(n >= 10);
    let rows = duckdb(&format!(
        "SELECT count(*), len(any_value(embedding)) FROM '{}/chips/*.parquet'",
        out.display()
    ));
    assert_eq!(rows[0][0], n as u64);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("skipped"),
        "labels.csv is reported as skipped"
    );
}

#[test]
fn rerun_resumes_without_duplicates() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    assert_eq!(run_job(&fixture_images(), &out).status.code(), Some(0));
    let first = read_json(&out.join("manifest.json"));
    let all = "true ORDER BY kind, path";
    let (first_files, first_failures) = (
        manifest_list(&out, "files", all),
        manifest_list(&out, "failures", "true ORDER BY ALL"),
    );
    let o = run(run_cmd(&fixture_images(), &out, &tiny_model()).arg("--json"));
    assert_eq!(o.status.code(), Some(0));
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["tasks_resumed"], summary["tasks"]);
    assert_eq!(summary["chips_embedded"], 0);
    let second = read_json(&out.join("manifest.json"));
    assert_eq!(second["format"], 2);
    // The lists are written in the order tasks finish: the same rows.
    assert_eq!(first["rows"], second["rows"]);
    assert_eq!(first_files, manifest_list(&out, "files", all));
    assert_eq!(
        first_failures,
        manifest_list(&out, "failures", "true ORDER BY ALL")
    );
    let files = manifest_list(&out, "files", "kind = 'chips'");
    assert_eq!(files.len() as u64, summary["tasks"].as_u64().unwrap());
    let rows = duckdb(&format!(
        "SELECT count(*) - count(DISTINCT chip_id) FROM '{}/chips/*.parquet'",
        out.display()
    ));
    assert_eq!(rows[0][0], 0);
}

#[test]
fn output_of_another_job_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    assert_eq!(run_job(&fixture_images(), &out).status.code(), Some(0));
    let o = run(run_cmd(&fixture_images(), &out, &tiny_model()).args(["--stride", "128"]));
    assert_ne!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stderr).contains("must not mix"));
}

/// Issue 28.5: a mistyped `--input` into a used output was reported as
/// another job ("holds job …, differs in --input"); it is a missing input,
/// and the output is left as it was.
#[test]
fn a_mistyped_input_into_a_used_output_is_a_missing_input() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    assert_eq!(run_job(&fixture_images(), &out).status.code(), Some(0));
    let job = std::fs::read(out.join("job.json")).unwrap();
    let manifest = std::fs::read(out.join("manifest.json")).unwrap();
    let typo = tmp.path().join("imagse");
    let o = run_job(&typo, &out);
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("does not exist"), "{err}");
    assert!(err.contains("imagse"), "the error names the input: {err}");
    assert!(!err.contains("another job"), "{err}");
    assert_eq!(std::fs::read(out.join("job.json")).unwrap(), job);
    assert_eq!(std::fs::read(out.join("manifest.json")).unwrap(), manifest);
}

#[test]
fn auto_batch_size_probes_and_matches_fixed_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let (auto, fixed) = (tmp.path().join("auto"), tmp.path().join("fixed"));
    let o = run(run_cmd(&fixture_images(), &auto, &tiny_model())
        .args(["--batch-size", "auto", "--max-batch", "8"])
        .env("RSEMBED_LOG", "rsembed_worker::engine::adaptive=info"));
    assert_eq!(o.status.code(), Some(0));
    let log = String::from_utf8_lossy(&o.stderr);
    // The probe's table and choice are logged, one line per bucket.
    assert!(log.contains("batch probe chose a bucket"), "{log}");
    assert!(log.matches("batch probe").count() >= 2, "{log}");
    let o = run(&mut run_cmd(&fixture_images(), &fixed, &tiny_model()));
    assert_eq!(o.status.code(), Some(0));
    let q = |d: &std::path::Path| {
        duckdb(&format!(
            "SELECT chip_id, embedding::FLOAT[] FROM '{}/chips/*.parquet' ORDER BY chip_id",
            d.display()
        ))
    };
    let (a, f) = (q(&auto), q(&fixed));
    let (a, f) = (a.as_array().unwrap(), f.as_array().unwrap());
    assert_eq!(a.len(), f.len());
    for (x, y) in a.iter().zip(f) {
        assert_eq!(x[0], y[0], "same chips");
        let v = |e: &serde_json::Value| -> Vec<f64> {
            e.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect()
        };
        assert!(cosine(&v(&x[1]), &v(&y[1])) > 0.99999);
    }
}
