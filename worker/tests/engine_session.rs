//! The ONNX Runtime session settings against the real library and the committed
//! tiny model: CUDA that cannot be registered is an error with ORT's reason (no
//! CPU fallback), arena shrinking is a run option that leaves embeddings
//! unchanged, and every session flag reaches a session that runs.

use std::path::{Path, PathBuf};
use std::process::Command;

use ort::ep::ExecutionProvider;
use rsembed_worker::engine::session::{ArenaShrink, Device, GraphOptLevel, SessionConfig};
use rsembed_worker::engine::vision::OrtVision;
use rsembed_worker::engine::{Backend, PixelBatch, RunHints};
use rsembed_worker::error::chain;
use rsembed_worker::model::ModelDir;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn ort_lib() -> PathBuf {
    let lib = std::env::var_os("ORT_DYLIB_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".cache/ort/libonnxruntime.so.1.31.1"));
    assert!(
        lib.is_file(),
        "ONNX Runtime library missing at {}: run scripts/setup-ort.sh",
        lib.display()
    );
    lib
}

fn cfg() -> SessionConfig {
    SessionConfig {
        ort_lib: Some(ort_lib()),
        intra_threads: Some(1),
        ..Default::default()
    }
}

fn model_dir() -> PathBuf {
    root().join("fixtures/models/tiny-siglip")
}

fn model() -> ModelDir {
    ModelDir::open(model_dir()).unwrap()
}

/// `n` images of deterministic pseudo-random pixels in [-1, 1], seeded by `seed`.
fn batch(n: usize, seed: u64) -> PixelBatch {
    let len = n * 3 * 256 * 256;
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data = (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    PixelBatch {
        n,
        channels: 3,
        height: 256,
        width: 256,
        data,
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Whether the loaded library was built with the CUDA execution provider.
fn cuda_in_library() -> bool {
    // The environment loads the library, which the query needs.
    rsembed_worker::engine::runtime::environment(Some(&ort_lib())).unwrap();
    ort::ep::CUDA::is_available().unwrap()
}

#[test]
fn cuda_that_cannot_register_fails_with_orts_reason() {
    let c = SessionConfig {
        device: Device::Cuda(0),
        ..cfg()
    };
    let r = OrtVision::open(&model(), false, &c);
    if cuda_in_library() {
        // A GPU build of ONNX Runtime: either CUDA works, or the reason names it.
        if let Err(e) = r {
            let msg = chain(&e);
            assert!(msg.contains("CUDAExecutionProvider"), "{msg}");
        }
        return;
    }
    let e = match r {
        Ok(_) => panic!("a CPU-only ONNX Runtime must not open a CUDA session"),
        Err(e) => e,
    };
    let msg = chain(&e);
    // ORT's own reason, then what we add: which provider, which device, no fallback.
    assert!(
        msg.contains("CUDA execution provider is not enabled in this build"),
        "{msg}"
    );
    assert!(msg.contains("CUDAExecutionProvider"), "{msg}");
    assert!(msg.contains("cuda:0"), "{msg}");
    assert!(msg.contains("--device cpu"), "{msg}");
}

#[test]
fn worker_binary_exits_1_when_cuda_cannot_register() {
    if cuda_in_library() {
        return; // covered by the device check in bench/gpu
    }
    // The worker connects to NATS first, so it needs a real server to get as
    // far as loading the model.
    let nats = rsembed_integration_tests::nats::NatsServer::start();
    let out = Command::new(env!("CARGO_BIN_EXE_rsembed-worker"))
        .arg("--nats")
        .arg(nats.url())
        .arg("--model")
        .arg(model_dir())
        .args(["--device", "cuda:0"])
        .env("ORT_DYLIB_PATH", ort_lib())
        .env("RSEMBED_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("CUDA execution provider is not enabled in this build"),
        "{stderr}"
    );
}

#[test]
fn arena_shrinking_leaves_embeddings_unchanged() {
    let m = model();
    let open = |shrink| {
        OrtVision::open(
            &m,
            false,
            &SessionConfig {
                arena_shrink: shrink,
                ..cfg()
            },
        )
        .unwrap()
    };
    let mut never = open(ArenaShrink::Never);
    let mut on_change = open(ArenaShrink::OnChange);
    let mut always = open(ArenaShrink::Always);
    let shrink = RunHints { shrink_arena: true };
    let keep = RunHints::default();
    assert!(!never.shrinks(shrink));
    assert!(on_change.shrinks(shrink) && !on_change.shrinks(keep));
    assert!(always.shrinks(keep));

    let big = batch(16, 1);
    let small = batch(3, 2);
    let want_big = never.run(&big, keep).unwrap();
    let want_small = never.run(&small, keep).unwrap();
    // A large batch, then small ones with and without shrinking, as the
    // adaptive layer does after its bucket shrinks.
    for v in [&mut on_change, &mut always] {
        assert_eq!(v.run(&big, keep).unwrap(), want_big);
        assert_eq!(v.run(&small, shrink).unwrap(), want_small);
        assert_eq!(v.run(&small, keep).unwrap(), want_small);
        assert_eq!(v.run(&big, shrink).unwrap(), want_big);
        assert_eq!(v.run(&big, keep).unwrap(), want_big);
    }
    assert_eq!(never.run(&small, shrink).unwrap(), want_small);
}

#[test]
fn every_session_setting_opens_a_session_that_runs() {
    let m = model();
    let b = batch(4, 3);
    let want = OrtVision::open(&m, false, &cfg())
        .unwrap()
        .embed(&b)
        .unwrap();
    let variants = [
        SessionConfig {
            graph_opt_level: GraphOptLevel::Disable,
            ..cfg()
        },
        SessionConfig {
            graph_opt_level: GraphOptLevel::Basic,
            ..cfg()
        },
        SessionConfig {
            graph_opt_level: GraphOptLevel::Extended,
            inter_threads: Some(2),
            ..cfg()
        },
        SessionConfig {
            intra_threads: Some(2),
            inter_threads: Some(1),
            // CUDA-only settings are accepted and ignored on the CPU.
            gpu_mem_limit: Some(1 << 30),
            tf32: true,
            ..cfg()
        },
    ];
    for c in variants {
        let got = OrtVision::open(&m, false, &c).unwrap().embed(&b).unwrap();
        for i in 0..b.n {
            let cos = cosine(got.row(i), want.row(i));
            assert!(cos > 0.99999, "{c:?}: row {i} cosine {cos}");
        }
    }
}

#[test]
fn ort_profile_is_written_to_the_named_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vision-profile.json");
    let c = SessionConfig {
        ort_profile: Some(file.clone()),
        ..cfg()
    };
    {
        let mut v = OrtVision::open(&model(), false, &c).unwrap();
        v.embed(&batch(2, 4)).unwrap();
    }
    let events: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let events = events.as_array().expect("a Chrome trace is a JSON array");
    assert!(
        events.iter().any(|e| e["cat"] == "Node"),
        "the profile records node runs"
    );
    // ORT's own timestamped name does not stay behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn cpu_reports_no_device_memory() {
    let v = OrtVision::open(&model(), false, &cfg()).unwrap();
    assert_eq!(v.device_memory(), None);
}

#[test]
fn the_shrink_entry_reaches_orts_run() {
    // ORT checks the shrink list at every run: an arena this session lacks is
    // an error, the CPU arena we name is accepted. So the entry is applied, not
    // silently dropped (as it would be as a session option).
    use ort::session::RunOptions;
    use ort::value::TensorRef;
    use rsembed_worker::engine::session::open_graph;
    use rsembed_worker::engine::vision::ARENA_SHRINK_KEY;

    let m = model();
    let g = m.vision_graph(false).unwrap();
    let mut s = open_graph(&cfg(), &m.path(&g.file), &g.input, &g.output).unwrap();
    let b = batch(1, 5);
    let mut run = |target: &str| {
        let mut o = RunOptions::new().unwrap();
        o.set(ARENA_SHRINK_KEY, target).unwrap();
        let x =
            TensorRef::from_array_view(([1i64, 3, 256, 256], b.data.as_f32().unwrap())).unwrap();
        s.run_with_options(ort::inputs![g.input.as_str() => x], &o)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    assert_eq!(run(&cfg().shrink_target()), Ok(()));
    let err = run("gpu:0").unwrap_err();
    assert!(err.contains("gpu:0"), "{err}");
}
