//! `rsembed run --input-dtype`: the tiny model's uint8 entry (`vision_u8`)
//! against its float graph, end to end through the batcher. The same chips
//! come out, with embeddings within float32 rounding (max |Δ| ≤ 1e-6 per
//! component of the L2-normalized rows), and the job records the same model
//! identity, which a copy of the model without the entry shares.

use std::path::Path;

use rsembed_integration_tests::*;
use serde_json::Value;

fn job_model(out: &Path) -> Value {
    let job: Value = serde_json::from_slice(&std::fs::read(out.join("job.json")).unwrap()).unwrap();
    job["model"].clone()
}

/// `(chip_id, embedding)` of every row, by chip id.
fn rows(out: &Path) -> Vec<(String, Vec<f64>)> {
    let glob = format!("{}/chips/*.parquet", out.display());
    duckdb(&format!(
        "SELECT chip_id, embedding FROM '{glob}' ORDER BY chip_id"
    ))
    .as_array()
    .unwrap()
    .iter()
    .map(|r| {
        let e = r[1].as_array().unwrap().iter().map(|v| v.as_f64().unwrap());
        (r[0].as_str().unwrap().to_owned(), e.collect())
    })
    .collect()
}

#[test]
fn the_uint8_entry_gives_the_float_graphs_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let mut outs = Vec::new();
    for dtype in ["float", "uint8", "auto"] {
        let out = tmp.path().join(dtype);
        let o = run(run_cmd(&fixture_images(), &out, &tiny_model())
            .args(["--input-dtype", dtype])
            .env("RSEMBED_LOG", "rsembed_worker::engine::vision=info"));
        assert_eq!(o.status.code(), Some(0));
        let log = String::from_utf8_lossy(&o.stderr);
        let want = if dtype == "float" {
            "F32Nchw"
        } else {
            "U8Nhwc"
        };
        assert!(log.contains(want), "{dtype}: {log}");
        outs.push(out);
    }
    let float = rows(&outs[0]);
    assert!(!float.is_empty());
    for out in &outs[1..] {
        let got = rows(out);
        assert_eq!(got.len(), float.len());
        for ((id, e), (fid, fe)) in got.iter().zip(&float) {
            assert_eq!(id, fid, "the same chips");
            let max = e
                .iter()
                .zip(fe)
                .map(|(a, b)| (a - b).abs())
                .fold(0f64, f64::max);
            assert!(max <= 1e-6, "{id}: max |Δ| {max}");
        }
        assert_eq!(job_model(out), job_model(&outs[0]), "model identity");
    }

    // A copy of the model made before the entry existed: same identity.
    let old = tmp.path().join("old-model");
    copy_dir(&tiny_model(), &old);
    for f in ["vision_model_u8.onnx", "vision_model_fp16_u8.onnx"] {
        std::fs::remove_file(old.join(f)).unwrap();
    }
    let mpath = old.join("rsembed-model.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
    let o = m.as_object_mut().unwrap();
    o.remove("vision_u8");
    o.remove("vision_fp16_u8");
    o["files"]
        .as_object_mut()
        .unwrap()
        .retain(|k, _| !k.ends_with("_u8.onnx"));
    std::fs::write(&mpath, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let out = tmp.path().join("old");
    let o = run(&mut run_cmd(&fixture_images(), &out, &old));
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(job_model(&out), job_model(&outs[0]));
    assert_eq!(rows(&out).len(), float.len());
}
