//! `--embedding-type f32|f16|int8`: what `run` stores, what DuckDB reads (with
//! the dequantisation macro of docs/querying.md, taken from the page itself),
//! the job identity, `search` and `classify` over every type, and `compact`
//! converting between them. Runs on the committed fixtures and tiny model.

use std::path::{Path, PathBuf};

use rsembed_integration_tests::*;
use serde_json::Value;

/// `rsembed run` of the fixture images, embeddings stored as `ty`.
fn run_typed(out: &Path, ty: &str) {
    let o = run(run_cmd(&fixture_images(), out, &tiny_model()).args(["--embedding-type", ty]));
    assert_eq!(o.status.code(), Some(0), "run --embedding-type {ty}");
}

fn chips(out: &Path) -> String {
    format!("{}/chips/*.parquet", out.display())
}

/// The `CREATE MACRO` block of docs/querying.md's int8 section, as a user copies it.
fn documented_macro() -> String {
    let doc = std::fs::read_to_string(root().join("docs/querying.md")).unwrap();
    let start = doc
        .find("CREATE OR REPLACE MACRO rsembed_dequantize")
        .expect("docs/querying.md has the dequantisation macro");
    let end = start + doc[start..].find(';').expect("the macro ends with ;");
    doc[start..=end].to_owned()
}

/// Runs SQL through DuckDB after the documented macro.
fn duckdb_with_macro(sql: &str) -> Value {
    duckdb(&format!("{} {sql}", documented_macro()))
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// chip_id → the float32 values DuckDB gives for each chip of `out`.
fn vectors(out: &Path, expr: &str) -> std::collections::BTreeMap<String, Vec<f64>> {
    duckdb_with_macro(&format!(
        "SELECT chip_id, {expr} FROM '{}' ORDER BY chip_id",
        chips(out)
    ))
    .as_array()
    .unwrap()
    .iter()
    .map(|r| (r[0].as_str().unwrap().to_owned(), f64s(&r[1])))
    .collect()
}

fn rsembed_meta(out: &Path) -> Value {
    let kv = duckdb(&format!(
        "SELECT decode(value) FROM parquet_kv_metadata('{}') WHERE decode(key) = 'rsembed'",
        chips(out)
    ));
    serde_json::from_str(kv[0][0].as_str().unwrap()).unwrap()
}

/// Compressed bytes of the `embedding` column per row.
fn embedding_bytes_per_row(out: &Path) -> f64 {
    let r = duckdb(&format!(
        "SELECT sum(total_compressed_size) / (SELECT count(*) FROM '{0}') \
         FROM parquet_metadata('{0}') WHERE path_in_schema LIKE 'embedding%'",
        chips(out)
    ));
    r[0][0].as_f64().unwrap()
}

struct Runs {
    _tmp: tempfile::TempDir,
    f32: PathBuf,
    f16: PathBuf,
    int8: PathBuf,
}

fn three_runs() -> Runs {
    let tmp = tempfile::tempdir().unwrap();
    let [f32, f16, int8] = ["f32", "f16", "int8"].map(|t| tmp.path().join(t));
    run_typed(&f32, "f32");
    run_typed(&f16, "f16");
    run_typed(&int8, "int8");
    Runs {
        _tmp: tmp,
        f32,
        f16,
        int8,
    }
}

#[test]
fn run_stores_each_type_and_duckdb_reads_it_back() {
    let r = three_runs();
    let types = |out: &Path| {
        duckdb(&format!(
            "SELECT DISTINCT typeof(embedding) FROM '{}'",
            chips(out)
        ))[0][0]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(types(&r.f32), "FLOAT[]");
    assert_eq!(types(&r.f16), "FLOAT[]");
    assert_eq!(types(&r.int8), "TINYINT[]");

    let exact = vectors(&r.f32, "embedding");
    let half = vectors(&r.f16, "embedding");
    let dequantised = vectors(&r.int8, "rsembed_dequantize(embedding, embedding_scale)");
    let scales: std::collections::BTreeMap<String, f64> = duckdb(&format!(
        "SELECT chip_id, embedding_scale, list_max(list_transform(embedding, lambda v: abs(v))) \
         FROM '{}'",
        chips(&r.int8)
    ))
    .as_array()
    .unwrap()
    .iter()
    .map(|row| {
        // Every vector uses the full range: its largest value is ±127.
        assert_eq!(row[2].as_i64(), Some(127), "{row:?}");
        (
            row[0].as_str().unwrap().to_owned(),
            row[1].as_f64().unwrap(),
        )
    })
    .collect();
    assert_eq!(exact.len(), 7, "one chip per fixture image");
    assert_eq!(
        exact.keys().collect::<Vec<_>>(),
        half.keys().collect::<Vec<_>>()
    );
    assert_eq!(
        exact.keys().collect::<Vec<_>>(),
        dequantised.keys().collect::<Vec<_>>()
    );
    for (id, x) in &exact {
        let max = x.iter().fold(0f64, |m, v| m.max(v.abs()));
        let s = scales[id];
        assert!(
            (s - max / 127.0).abs() < 1e-6 * max,
            "{id}: scale {s} for max {max}"
        );
        for (i, (a, b)) in x.iter().zip(&half[id]).enumerate() {
            assert!((a - b).abs() <= 1e-3, "{id}[{i}]: f32 {a}, f16 {b}");
        }
        // The documented formula lands within half a step of the model's value.
        for (i, (a, b)) in x.iter().zip(&dequantised[id]).enumerate() {
            assert!(
                (a - b).abs() <= s / 2.0 + 1e-6,
                "{id}[{i}]: f32 {a}, int8 dequantised {b} (scale {s})"
            );
        }
        assert!(cosine(x, &dequantised[id]) > 0.999);
    }

    // The dequantisation is recorded in the files and in the STAC collection.
    assert!(rsembed_meta(&r.f32).get("quantization").is_none());
    let q = &rsembed_meta(&r.int8)["quantization"];
    assert_eq!(q["data_type"], "int8");
    assert_eq!(q["scale_column"], "embedding_scale");
    assert_eq!(q["dequantize"], "embedding[i] * embedding_scale");
    assert_eq!(rsembed_meta(&r.f16)["quantization"]["data_type"], "float16");
    let stac: Value = serde_json::from_slice(
        &std::fs::read(r.int8.join("stac/collection.json")).expect("run writes the collection"),
    )
    .unwrap();
    assert_eq!(stac["data_type"], "int8");
    assert_eq!(stac["emb:quantization"], *q);
    let stac32: Value =
        serde_json::from_slice(&std::fs::read(r.f32.join("stac/collection.json")).unwrap())
            .unwrap();
    assert!(stac32.get("emb:quantization").is_none());

    // Half the float32 bytes for f16. int8's values are dictionary
    // indices, one byte each: its data pages hold about D bytes a row, apart
    // from the one dictionary page per chunk (up to 255 4-byte values, which
    // dominates at 7 rows; docs/benchmarks.md measures D = 768).
    let (b32, b16) = (
        embedding_bytes_per_row(&r.f32),
        embedding_bytes_per_row(&r.f16),
    );
    assert!(b16 < 0.6 * b32, "f16 {b16} vs f32 {b32}");
    let int8 = duckdb(&format!(
        "SELECT encodings, sum(total_compressed_size - (data_page_offset - dictionary_page_offset)) \
                / (SELECT count(*) FROM '{0}') \
         FROM parquet_metadata('{0}') WHERE path_in_schema LIKE 'embedding,%' GROUP BY 1",
        chips(&r.int8)
    ));
    assert!(
        int8[0][0].as_str().unwrap().contains("RLE_DICTIONARY"),
        "{int8}"
    );
    let per_row = int8[0][1].as_f64().unwrap();
    eprintln!("embedding bytes per row: f32 {b32:.0}, f16 {b16:.0}, int8 data pages {per_row:.0}");
    assert!(
        per_row <= 64.0 + 16.0,
        "int8 data pages: {per_row} B a row at D = 64"
    );

    // The job's identity: another type at the same output is another job,
    // refused naming the flag; the same type resumes and does nothing again.
    let o =
        run(run_cmd(&fixture_images(), &r.int8, &tiny_model()).args(["--embedding-type", "f32"]));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--embedding-type"), "{err}");
    let before = std::fs::read_dir(r.int8.join("chips")).unwrap().count();
    run_typed(&r.int8, "int8");
    assert_eq!(
        std::fs::read_dir(r.int8.join("chips")).unwrap().count(),
        before
    );
}

/// `rsembed search --json` results as (chip_id, cosine), best first.
fn search_json(index: &Path, args: &[&str]) -> Vec<(String, f64)> {
    let o = run(rsembed()
        .arg("search")
        .arg("--index")
        .arg(index)
        .args(["--json", "--top-k", "7"])
        .args(args));
    assert!(o.status.success());
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["chip_id"].as_str().unwrap().to_owned(),
                v["cosine"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn search_and_classify_read_every_type() {
    let r = three_runs();
    let model = tiny_model();
    let model = model.to_str().unwrap();
    let text = ["--model", model, "a river next to farmland"];
    let exact = search_json(&r.f32, &text);
    assert_eq!(exact.len(), 7);
    for (out, tol) in [(&r.f16, 1e-3), (&r.int8, 1e-2)] {
        let got = search_json(out, &text);
        assert_eq!(got.len(), 7);
        let by_id: std::collections::HashMap<_, _> = got.iter().cloned().collect();
        for (id, c) in &exact {
            assert!(
                (by_id[id] - c).abs() <= tol,
                "{}: {id} cosine {} vs f32 {c}",
                out.display(),
                by_id[id]
            );
        }
        // Same order wherever the float32 cosines are further apart than the error.
        for w in exact.windows(2) {
            if w[0].1 - w[1].1 > 2.0 * tol {
                assert!(by_id[&w[0].0] > by_id[&w[1].0], "order of {w:?}");
            }
        }
        // --like reads the example chip's stored vector, whatever its type.
        let like = search_json(out, &["--like", &exact[0].0]);
        assert!(like.iter().all(|(id, _)| *id != exact[0].0));
    }

    let tmp = tempfile::tempdir().unwrap();
    let labels = tmp.path().join("labels.txt");
    std::fs::write(&labels, "forest\nriver\nclouds\nbuildings\n").unwrap();
    let label_of = |index: &Path, name: &str| -> Vec<Value> {
        let out = tmp.path().join(name);
        let o = run(rsembed()
            .args(["classify", "--model", model, "--template", "{}", "--labels"])
            .arg(&labels)
            .arg("--index")
            .arg(index)
            .arg("--output")
            .arg(&out));
        assert!(o.status.success());
        duckdb(&format!(
            "SELECT chip_id, label FROM '{}' ORDER BY chip_id",
            out.display()
        ))
        .as_array()
        .unwrap()
        .clone()
    };
    let exact = label_of(&r.f32, "f32.parquet");
    assert_eq!(exact.len(), 7);
    assert_eq!(label_of(&r.f16, "f16.parquet"), exact);
    assert_eq!(label_of(&r.int8, "int8.parquet"), exact);
}

fn compact(index: &Path, out: &Path, ty: Option<&str>) {
    let mut c = rsembed();
    c.args(["compact", "--index"])
        .arg(index)
        .arg("--output")
        .arg(out);
    if let Some(t) = ty {
        c.args(["--embedding-type", t]);
    }
    let o = run(&mut c);
    assert!(o.status.success(), "compact --embedding-type {ty:?}");
}

#[test]
fn compact_converts_between_types() {
    let r = three_runs();
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();

    // f32 -> int8 quantises exactly as run does: the same integers and scales.
    compact(&r.f32, &d.join("to-int8"), Some("int8"));
    let diff = duckdb(&format!(
        "SELECT count(*), count(*) FILTER (WHERE a.embedding <> b.embedding \
                OR a.embedding_scale <> b.embedding_scale) \
         FROM '{}' a JOIN '{}' b USING (chip_id)",
        chips(&r.int8),
        chips(&d.join("to-int8"))
    ));
    assert_eq!(diff[0][0].as_u64(), Some(7));
    assert_eq!(diff[0][1].as_u64(), Some(0), "same int8 values as run's");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(d.join("to-int8/manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["embedding_type"], "int8");
    assert_eq!(manifest["rows"], 7);
    assert_eq!(
        rsembed_meta(&d.join("to-int8"))["quantization"]["data_type"],
        "int8"
    );

    // Without the flag the type is kept, and int8 is not quantised twice.
    compact(&r.int8, &d.join("kept"), None);
    let diff = duckdb(&format!(
        "SELECT count(*) FILTER (WHERE a.embedding <> b.embedding \
                OR a.embedding_scale <> b.embedding_scale) \
         FROM '{}' a JOIN '{}' b USING (chip_id)",
        chips(&r.int8),
        chips(&d.join("kept"))
    ));
    assert_eq!(diff[0][0].as_u64(), Some(0));

    // int8 -> f32 gives unit vectors back, close to the model's; f32 -> f16
    // equals run's f16.
    compact(&r.int8, &d.join("to-f32"), Some("f32"));
    let exact = vectors(&r.f32, "embedding");
    let back = vectors(&d.join("to-f32"), "embedding");
    for (id, x) in &exact {
        let norm: f64 = back[id].iter().map(|v| v * v).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{id}: norm {norm}");
        assert!(cosine(x, &back[id]) > 0.999);
    }
    compact(&r.f32, &d.join("to-f16"), Some("f16"));
    assert_eq!(
        vectors(&d.join("to-f16"), "embedding"),
        vectors(&r.f16, "embedding")
    );

    // Search reads the converted datasets like the others.
    let model = tiny_model();
    let text = ["--model", model.to_str().unwrap(), "farmland"];
    let a = search_json(&r.int8, &text);
    let b = search_json(&d.join("to-int8"), &text);
    assert_eq!(a, b);
}
