//! What arena shrinking costs and what it returns, on the CPU execution provider.
//!
//! ```sh
//! ORT_DYLIB_PATH=$PWD/.cache/ort/libonnxruntime.so.1.31.1 \
//!   cargo run --release -p rsembed-worker --example arena_shrink -- \
//!   [--model fixtures/models/tiny-siglip] [--big 64] [--small 4] [--runs 20] \
//!   [--rounds 3] [--threads 2]
//! ```
//!
//! For each `--arena-shrink` mode (`never`, `on-change`, `always`) it starts a
//! fresh process (so one mode's heap cannot flatter another's) that opens the
//! vision graph, runs `--big`-image batches, then `--runs` batches of `--small`
//! images — the first of them with the shrink hint, as the adaptive layer sends
//! it after its bucket shrinks — and reports the resident set size after each
//! phase and the median time per run. Modes are interleaved over `--rounds`
//! and each mode's fastest round is reported. It prints a Markdown table for
//! `docs/gpu-memory.md`. Not a test: timings depend on the machine.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use rsembed_worker::engine::session::{ArenaShrink, SessionConfig};
use rsembed_worker::engine::vision::OrtVision;
use rsembed_worker::engine::{Backend, PixelBatch, RunHints};
use rsembed_worker::model::ModelDir;

struct Opts {
    model: PathBuf,
    big: usize,
    small: usize,
    runs: usize,
    rounds: usize,
    threads: usize,
    child: Option<ArenaShrink>,
}

fn opts() -> Opts {
    let mut o = Opts {
        model: PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/models/tiny-siglip"
        )),
        big: 64,
        small: 4,
        runs: 20,
        rounds: 3,
        threads: 2,
        child: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut v = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--model" => o.model = v().into(),
            "--big" => o.big = v().parse().expect("--big N"),
            "--small" => o.small = v().parse().expect("--small N"),
            "--runs" => o.runs = v().parse().expect("--runs N"),
            "--rounds" => o.rounds = v().parse().expect("--rounds N"),
            "--threads" => o.threads = v().parse().expect("--threads N"),
            "--child" => o.child = Some(v().parse().expect("--child MODE")),
            _ => panic!("unknown argument {a}"),
        }
    }
    o
}

/// Resident and peak resident set size in bytes, from /proc/self/status.
fn rss() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

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

fn median_ms(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2] * 1e3
}

fn child(o: &Opts, mode: ArenaShrink) {
    assert!(o.runs >= 2, "--runs must be at least 2");
    let model = ModelDir::open(&o.model).expect("model directory");
    let (h, w) = (
        model.preprocessor.size.height as usize,
        model.preprocessor.size.width as usize,
    );
    let cfg = SessionConfig {
        arena_shrink: mode,
        intra_threads: Some(o.threads),
        ..SessionConfig::default()
    };
    let mut v = OrtVision::open(&model, false, &cfg).expect("open vision graph");
    let (loaded, _) = rss();
    let big = batch(o.big, h, w);
    let small = batch(o.small, h, w);
    let keep = RunHints::default();
    let mut big_t = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        v.run(&big, keep).expect("big batch");
        big_t.push(t.elapsed().as_secs_f64());
    }
    let (after_big, _) = rss();
    let mut small_t = Vec::new();
    for i in 0..o.runs {
        // The bucket just shrank: the adaptive layer asks for one shrink.
        let hints = RunHints {
            shrink_arena: i == 0,
        };
        let t = Instant::now();
        v.run(&small, hints).expect("small batch");
        small_t.push(t.elapsed().as_secs_f64());
    }
    let (after_small, peak) = rss();
    let (first, second) = (small_t[0] * 1e3, small_t[1] * 1e3);
    println!(
        "{}",
        serde_json::json!({
            "mode": mode.to_string(),
            "rss_loaded": loaded,
            "rss_after_big": after_big,
            "rss_after_small": after_small,
            "rss_peak": peak,
            "big_ms": median_ms(big_t),
            "small_first_ms": first,
            "small_second_ms": second,
            "small_ms": median_ms(small_t),
        })
    );
}

fn main() {
    let o = opts();
    if let Some(mode) = o.child {
        child(&o, mode);
        return;
    }
    let exe = std::env::current_exe().expect("own path");
    let mib = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0) / (1u64 << 20) as f64;
    println!(
        "model {}, big batch {}, small batch {}, {} small runs, {} intra-op threads, best of {} rounds\n",
        o.model.display(),
        o.big,
        o.small,
        o.runs,
        o.threads,
        o.rounds
    );
    println!(
        "| --arena-shrink | RSS loaded | after big batches | after small batches | peak \
         | ms/run big | ms small #1 (shrink hint) | ms small #2 | ms/run small (median) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    // Rounds interleave the modes; the fastest round of each is reported, the
    // one least disturbed by whatever else the machine runs.
    let modes = ["never", "on-change", "always"];
    let mut best: Vec<Option<serde_json::Value>> = vec![None; modes.len()];
    for _ in 0..o.rounds.max(1) {
        for (k, mode) in modes.iter().enumerate() {
            let out = Command::new(&exe)
                .args(["--child", mode, "--model"])
                .arg(&o.model)
                .args(["--big", &o.big.to_string()])
                .args(["--small", &o.small.to_string()])
                .args(["--runs", &o.runs.to_string()])
                .args(["--threads", &o.threads.to_string()])
                .output()
                .expect("child starts");
            assert!(
                out.status.success(),
                "{mode}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let r: serde_json::Value =
                serde_json::from_slice(&out.stdout).expect("child prints one JSON line");
            best[k] = Some(match best[k].take() {
                None => r,
                Some(mut b) => {
                    for key in ["big_ms", "small_first_ms", "small_second_ms", "small_ms"] {
                        let (x, y) = (b[key].as_f64().unwrap(), r[key].as_f64().unwrap());
                        b[key] = x.min(y).into();
                    }
                    b
                }
            });
        }
    }
    let ms = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    for (mode, r) in modes.iter().zip(best) {
        let r = r.expect("at least one round");
        println!(
            "| {mode} | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.1} | {:.2} | {:.2} | {:.2} |",
            mib(&r["rss_loaded"]),
            mib(&r["rss_after_big"]),
            mib(&r["rss_after_small"]),
            mib(&r["rss_peak"]),
            ms(&r["big_ms"]),
            ms(&r["small_first_ms"]),
            ms(&r["small_second_ms"]),
            ms(&r["small_ms"]),
        );
    }
}
