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
