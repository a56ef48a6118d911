//! `rsembed-worker check`, the container self-check: loads the model, runs a
//! batch through both graphs, prints the execution provider; a device that
//! cannot run is a clear failure, never a silent CPU fallback.

use rsembed_integration_tests::*;
use serde_json::Value;

fn check(args: &[&str]) -> std::process::Output {
    let mut c = std::process::Command::new(binary("rsembed-worker"));
    c.arg("check")
        .args(args)
        .env("ORT_DYLIB_PATH", ort_lib())
        .env("RSEMBED_LOG", "warn");
    run(&mut c)
}

#[test]
fn check_runs_both_graphs_and_names_the_provider() {
    let model = tiny_model();
    let o = check(&["--model", model.to_str().unwrap(), "--json", "--batch", "3"]);
    assert_eq!(o.status.code(), Some(0));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["model"], "tiny-siglip");
    assert_eq!(r["embed_dim"], 64);
    assert_eq!(r["execution_provider"], "CPUExecutionProvider");
    // The graph the worker feeds: the model's uint8 entry, unless told otherwise.
    assert_eq!(r["vision_graph"], "vision_model_u8.onnx");
    assert_eq!(r["batch"], 3);
    let o = check(&[
        "--model",
        model.to_str().unwrap(),
        "--json",
        "--input-dtype",
        "float",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["vision_graph"], "vision_model.onnx");

    let o = check(&["--model", model.to_str().unwrap(), "--fp16"]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.starts_with("rsembed-worker check: ok"), "{text}");
    assert!(text.contains("vision_model_fp16_u8.onnx"), "{text}");
}

#[test]
fn check_fails_clearly_without_the_device_or_the_model() {
    let model = tiny_model();
    // The tests load the CPU build of ONNX Runtime: CUDA cannot register, and
    // the check says so instead of passing on the CPU. (With the GPU build on
    // a GPU machine it passes and names CUDA.)
    let o = check(&[
        "--model",
        model.to_str().unwrap(),
        "--device",
        "cuda",
        "--json",
    ]);
    if o.status.success() {
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["execution_provider"], "CUDAExecutionProvider");
    } else {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("rsembed-worker check: FAILED"), "{err}");
        assert!(err.contains("never falls back to the CPU"), "{err}");
    }
    let o = check(&["--model", "/nonexistent/model"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/model"));
    let o = check(&["--model", model.to_str().unwrap(), "--batch", "0"]);
    assert_eq!(o.status.code(), Some(1));
}
