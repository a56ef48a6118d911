//! `rsembed text`: one JSON array per line, matching the reference text embeddings.

use rsembed_integration_tests::*;
use serde_json::Value;

#[test]
fn prints_one_normalized_array_per_text() {
    let reference: Value =
        serde_json::from_slice(&std::fs::read(tiny_model().join("reference.json")).unwrap())
            .unwrap();
    let texts: Vec<String> = reference["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["text"].as_str().unwrap().to_owned())
        .collect();
    let mut cmd = rsembed();
    cmd.args(["text", "--model", tiny_model().to_str().unwrap(), "--"]);
    cmd.args(&texts);
    let o = run(&mut cmd);
    assert!(o.status.success());
    let stdout = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), texts.len());
    for (line, t) in lines.iter().zip(reference["texts"].as_array().unwrap()) {
        let v: Vec<f64> = serde_json::from_str(line).unwrap();
        let norm: f64 = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4);
        let want: Vec<f64> = t["text_embeds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert!(cosine(&v, &want) >= 0.9999);
    }
}

/// A model directory copied with only what an fp32 image run uses: `run`
/// works and names the same job as the complete model, and `text` fails
/// naming the graph it lacks.
#[test]
fn image_run_needs_only_its_vision_graph() {
    let tmp = tempfile::tempdir().unwrap();
    let partial = tmp.path().join("vision-only");
    copy_dir(&tiny_model(), &partial);
    for f in ["text_model.onnx", "vision_model_fp16.onnx"] {
        std::fs::remove_file(partial.join(f)).unwrap();
    }
    let input = fixture_images();
    let json = |out: &std::path::Path, model: &std::path::Path| -> Value {
        let o = run(run_cmd(&input, out, model).arg("--json"));
        assert_eq!(o.status.code(), Some(0), "run with {}", model.display());
        serde_json::from_slice(&std::fs::read(out.join("job.json")).unwrap()).unwrap()
    };
    let full = json(&tmp.path().join("full"), &tiny_model());
    let part = json(&tmp.path().join("part"), &partial);
    assert_eq!(
        part["fingerprint"], full["fingerprint"],
        "same model, same job"
    );
    // The job ids differ only because the outputs do (the output is part
    // of a job's identity).
    assert_eq!(
        part["model"], full["model"],
        "job.json records the graph it ran"
    );
    let files = full["model"]["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(files[0]["path"], "vision_model.onnx");

    // --fp16 needs the fp16 graph, and says so.
    let o = run(run_cmd(&input, &tmp.path().join("fp16"), &partial).arg("--fp16"));
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    let missing = partial.join("vision_model_fp16.onnx");
    assert!(
        stderr.contains(&missing.display().to_string()) && stderr.contains("missing"),
        "{stderr}"
    );

    let o = run(rsembed().args([
        "text",
        "--model",
        partial.to_str().unwrap(),
        "--",
        "a field",
    ]));
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    let missing = partial.join("text_model.onnx");
    assert!(
        stderr.contains(&missing.display().to_string()) && stderr.contains("missing"),
        "{stderr}"
    );
}
