//! `rsembed run` with the ONNX Runtime session flags: CUDA that cannot be
//! registered exits 1 with ORT's reason before anything is written, and the
//! other session flags reach a run that succeeds.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn ort_lib() -> PathBuf {
    std::env::var_os("ORT_DYLIB_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".cache/ort/libonnxruntime.so.1.31.1"))
}

fn run(out: &Path, extra: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_rsembed"))
        .arg("run")
        .arg("--input")
        .arg(root().join("fixtures/images/aerial_256.png"))
        .arg("--output")
        .arg(out)
        .arg("--model")
        .arg(root().join("fixtures/models/tiny-siglip"))
        .args(extra)
        .env("ORT_DYLIB_PATH", ort_lib())
        .env("RSEMBED_LOG", "warn")
        .output()
        .unwrap();
    eprintln!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

#[test]
fn cuda_without_a_cuda_library_exits_1_with_orts_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = run(&out, &["--device", "cuda:0"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    if stderr.contains("CUDA execution provider is not enabled in this build") {
        // The CPU-only library of the test setup.
        assert_eq!(o.status.code(), Some(1));
        assert!(stderr.contains("CUDAExecutionProvider"), "{stderr}");
        assert!(
            !out.join("job.json").exists(),
            "a model that cannot load leaves no job behind"
        );
    } else {
        // A GPU library: the run either works on CUDA or says why not.
        assert!(
            o.status.success() || stderr.contains("CUDAExecutionProvider"),
            "{stderr}"
        );
    }
}

#[test]
fn session_flags_reach_a_run_that_succeeds() {
    let tmp = tempfile::tempdir().unwrap();
    let profile = tmp.path().join("profile.json");
    let o = run(
        &tmp.path().join("out"),
        &[
            "--arena-shrink",
            "always",
            "--gpu-mem-limit",
            "512MiB",
            "--arena-extend-strategy",
            "next-power-of-two",
            "--cudnn-conv-algo-search",
            "exhaustive",
            "--graph-opt-level",
            "extended",
            "--intra-threads",
            "1",
            "--inter-threads",
            "1",
            "--ort-profile",
            profile.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(0));
    assert!(profile.is_file(), "--ort-profile writes its file");
}

#[test]
fn bad_session_flag_values_are_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    for (flag, value, says) in [
        ("--gpu-mem-limit", "8parsecs", "unknown unit"),
        ("--arena-shrink", "sometimes", "never, on-change, always"),
        ("--graph-opt-level", "max", "disable, basic, extended, all"),
        ("--device", "gpu", "cpu, cuda or cuda:N"),
    ] {
        let o = run(&tmp.path().join("out"), &[flag, value]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {stderr}");
        assert!(stderr.contains(says), "{flag} {value}: {stderr}");
    }
}
