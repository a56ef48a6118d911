//! Raw inference throughput: `OrtVision` (ONNX Runtime `session.run` plus the
//! L2 normalisation every run does) on one model directory, with nothing else
//! in the process — no decoding, no preprocessing, no Parquet.
//!
//! ```sh
//! ORT_DYLIB_PATH=$PWD/.cache/ort/libonnxruntime.so.1.31.1 \
//!   cargo run --release -p rsembed-worker --example session_throughput -- \
//!   [--model fixtures/models/tiny-siglip] [--batch 16] [--threads 2] \
//!   [--chips 160] [--warmup 2] [--fp16]
//! ```
//!
//! It opens the vision graph as `rsembed run` does (same `SessionConfig`
//! defaults, `--threads` intra-op threads), runs `--warmup` untimed batches,
//! then whole batches of `--batch` fixed pseudo-random images until at least
//! `--chips` images are embedded, and prints one line
//! `RESULT chips=N seconds=S chips_per_s=R ms_per_batch=M open_s=O`.
//! `bench/pipeline.py` divides `rsembed run`'s chips/s by this figure.

use std::path::PathBuf;
use std::time::Instant;

use rsembed_worker::engine::session::SessionConfig;
use rsembed_worker::engine::vision::OrtVision;
use rsembed_worker::engine::{Backend, PixelBatch};
use rsembed_worker::model::ModelDir;

struct Opts {
    model: PathBuf,
    batch: usize,
    threads: usize,
    chips: usize,
    warmup: usize,
    fp16: bool,
}

fn opts() -> Opts {
    let mut o = Opts {
        model: PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/models/tiny-siglip"
        )),
        batch: 16,
        threads: 2,
        chips: 160,
        warmup: 2,
        fp16: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut v = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--model" => o.model = v().into(),
            "--batch" => o.batch = v().parse().expect("--batch N"),
            "--threads" => o.threads = v().parse().expect("--threads N"),
            "--chips" => o.chips = v().parse().expect("--chips N"),
            "--warmup" => o.warmup = v().parse().expect("--warmup N"),
            "--fp16" => o.fp16 = true,
            _ => panic!("unknown argument {a}"),
        }
    }
    assert!(o.batch > 0, "--batch must be positive");
    o
}

/// Values in [-1, 1), as the preprocessor produces; fixed so runs compare.
fn batch(n: usize, h: usize, w: usize) -> PixelBatch {
    let data = (0..n * 3 * h * w)
        .map(|i| ((i * 7919) % 255) as f32 / 127.5 - 1.0)
        .collect();
    PixelBatch {
        n,
        channels: 3,
        height: h,
        width: w,
        data,
    }
}

fn main() {
    let o = opts();
    let model = ModelDir::open(&o.model).expect("model directory");
    let (h, w) = (
        model.preprocessor.size.height as usize,
        model.preprocessor.size.width as usize,
    );
    let cfg = SessionConfig {
        intra_threads: Some(o.threads),
        ..SessionConfig::default()
    };
    let t = Instant::now();
    let mut v = OrtVision::open(&model, o.fp16, &cfg).expect("open vision graph");
    let open_s = t.elapsed().as_secs_f64();
    let b = batch(o.batch, h, w);
    for _ in 0..o.warmup {
        v.embed(&b).expect("warm-up batch");
    }
    let runs = o.chips.div_ceil(o.batch).max(1);
    let t = Instant::now();
    for _ in 0..runs {
        let e = v.embed(&b).expect("batch");
        assert_eq!(e.n, o.batch);
    }
    let secs = t.elapsed().as_secs_f64();
    let chips = runs * o.batch;
    println!(
        "RESULT chips={chips} seconds={secs:.4} chips_per_s={:.3} ms_per_batch={:.3} open_s={open_s:.3}",
        chips as f64 / secs,
        secs * 1e3 / runs as f64,
    );
}
