//! The adaptive batch size (`worker/src/engine/adaptive.rs`): no chip lost or
//! duplicated and the order kept while the device's memory ceiling drops and
//! rises, the failed-twice rule, the one-image failure, the probe, and one real
//! ONNX Runtime CPU allocation failure recovered.

use std::path::{Path, PathBuf};

use rsembed_worker::engine::adaptive::{Adaptive, AdaptiveConfig, ImageShape};
use rsembed_worker::engine::controller::{bucket_for, ProbeOutcome};
use rsembed_worker::engine::handle::EngineHandle;
use rsembed_worker::engine::session::SessionConfig;
use rsembed_worker::engine::sim::{SimConfig, SimHandle, SimRun, SimulatedDevice};
use rsembed_worker::engine::vision::OrtVision;
use rsembed_worker::engine::{Backend, PixelBatch, RunHints};
use rsembed_worker::error::{chain, is_out_of_memory, Error};
use rsembed_worker::model::ModelDir;
use rsembed_worker::retry::Retry;

/// splitmix64: a few lines of deterministic randomness, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Images whose pixels all equal their id (ids from `first`), 2×2 RGB.
fn images(first: usize, n: usize) -> PixelBatch {
    let il = 3 * 2 * 2;
    PixelBatch {
        n,
        channels: 3,
        height: 2,
        width: 2,
        data: (0..n * il).map(|i| (first + i / il) as f32).collect(),
    }
}

fn device(ceiling: usize) -> (SimulatedDevice, SimHandle) {
    let d = SimulatedDevice::new(SimConfig {
        ceiling,
        ..SimConfig::default()
    });
    let h = d.handle();
    (d, h)
}

fn adaptive(
    dev: SimulatedDevice,
    max_batch: usize,
    recover_after: u32,
) -> Adaptive<SimulatedDevice> {
    let clock = dev.handle().clock();
    Adaptive::with_clock(
        dev,
        AdaptiveConfig {
            max_batch,
            recover_after,
            ..AdaptiveConfig::default()
        },
        clock,
    )
}

/// Checks that the rows are the ids `first..first+n`, in order.
fn assert_identity(e: &rsembed_worker::engine::Embeddings, first: usize, n: usize) {
    assert_eq!(e.n, n);
    assert_eq!(e.data.len(), n * e.dim);
    for i in 0..n {
        assert_eq!(e.row(i)[0], (first + i) as f32, "row {i} of {n}");
    }
}

/// The failed-twice rule, checked on the device's own run log: a failure at
/// size `s` is confirmed when a smaller run succeeds next; once a size `s ≥ 2`
/// has two confirmed failures, no later run reaches `s`.
fn assert_failed_twice_never_again(runs: &[SimRun]) {
    let mut confirmed = std::collections::BTreeMap::<usize, u32>::new();
    let mut unconfirmed: Option<usize> = None;
    let mut limit = usize::MAX;
    for (i, r) in runs.iter().enumerate() {
        assert!(
            r.n < limit,
            "run {i} of {} images after a cap below {limit}",
            r.n
        );
        if r.ok {
            if let Some(u) = unconfirmed.take() {
                if r.n < u && u >= 2 {
                    let c = confirmed.entry(u).or_default();
                    *c += 1;
                    if *c >= 2 {
                        limit = limit.min(u);
                    }
                }
            }
        } else if r.oom {
            unconfirmed = Some(unconfirmed.map_or(r.n, |u| u.min(r.n)));
        }
    }
}

#[test]
fn every_chip_comes_back_once_in_order_while_the_ceiling_moves() {
    let mut total_ooms = 0;
    let mut total_one_image_failures = 0;
    for seed in 0..300u64 {
        let mut rng = Rng(seed);
        let max_batch = [1, 2, 4, 8, 16, 32, 48, 64, 100][rng.below(9)];
        let (dev, sim) = device(1 + rng.below(80));
        // Ceiling changes at random run numbers, in the middle of requests;
        // now and then the device is full (0), but it always recovers.
        let mut at = 0;
        for _ in 0..1 + rng.below(6) {
            at += 1 + rng.below(40);
            let c = if rng.below(8) == 0 {
                0
            } else {
                1 + rng.below(80)
            };
            sim.schedule(at, c);
        }
        sim.schedule(at + 1 + rng.below(40), 1 + rng.below(80));
        let mut a = adaptive(dev, max_batch, 1 + rng.below(8) as u32);
        let top = bucket_for(max_batch + 1) / 2;
        let mut next_id = 1;
        for _ in 0..25 {
            let n = rng.below(150);
            let batch = images(next_id, n);
            let mut tries = 0;
            let e = loop {
                tries += 1;
                match a.embed(&batch) {
                    Ok(e) => break e,
                    Err(err) => {
                        // Only the one-image failure may come back, and it says retry.
                        assert!(
                            err.retry_hint().is_retryable(),
                            "seed {seed}: {}",
                            chain(&err)
                        );
                        assert!(matches!(err, Error::OutOfMemory { .. }));
                        total_one_image_failures += 1;
                        assert!(tries < 200, "seed {seed}: never recovered");
                    }
                }
            };
            assert_identity(&e, next_id, n);
            next_id += n;
        }
        let runs = sim.runs();
        for (i, r) in runs.iter().enumerate() {
            assert!(
                r.n.is_power_of_two() && r.n <= top,
                "seed {seed}: run of {}",
                r.n
            );
            if !r.ok {
                // Multiplicative decrease, and the retry shrinks the arena.
                if let Some(next) = runs.get(i + 1) {
                    assert!(
                        next.n <= (r.n / 2).max(1),
                        "seed {seed}: {r:?} then {next:?}"
                    );
                }
            }
        }
        assert_failed_twice_never_again(&runs);
        let stats = a.stats();
        assert_eq!(stats.ooms as usize, sim.ooms(), "seed {seed}");
        assert_eq!(stats.runs as usize, runs.len());
        total_ooms += sim.ooms();
    }
    // The property must have been exercised, not passed vacuously.
    assert!(total_ooms > 300, "only {total_ooms} OOMs");
    assert!(total_one_image_failures > 0);
}

#[test]
fn a_size_that_failed_twice_is_never_run_again() {
    let (dev, sim) = device(20);
    let mut a = adaptive(dev, 32, 4);
    let mut id = 1;
    for _ in 0..40 {
        let e = a.embed(&images(id, 32)).unwrap();
        assert_identity(&e, id, 32);
        id += 32;
    }
    // 32 failed, 16 succeeded, 4 successes later 32 failed again: capped.
    let s = a.stats();
    assert_eq!(s.hard_limit, Some(16));
    assert_eq!(s.ooms, 2);
    sim.set_ceiling(1000);
    let before = sim.run_count();
    for _ in 0..40 {
        a.embed(&images(id, 32)).unwrap();
        id += 32;
    }
    assert!(sim.runs()[before..].iter().all(|r| r.n <= 16));
    assert_eq!((a.stats().bucket, a.stats().ceiling), (16, 16));
    assert_failed_twice_never_again(&sim.runs());
}

#[test]
fn the_bucket_climbs_back_one_step_after_k_successes() {
    let (dev, sim) = device(64);
    sim.schedule(0, 20); // squeezed for the first run only
    sim.schedule(1, 64);
    let mut a = adaptive(dev, 32, 3);
    a.embed(&images(1, 32)).unwrap(); // 32 fails, 16 + 16 succeed
    assert_eq!(a.stats().bucket, 16);
    assert_eq!(a.stats().ceiling, 16);
    a.embed(&images(33, 16)).unwrap(); // the third success at 16
    assert_eq!(a.stats().bucket, 32, "additive increase: one step");
    let e = a.embed(&images(49, 32)).unwrap();
    assert_identity(&e, 49, 32);
    let runs: Vec<(usize, bool)> = sim.runs().iter().map(|r| (r.n, r.ok)).collect();
    assert_eq!(
        runs,
        vec![(32, false), (16, true), (16, true), (16, true), (32, true)]
    );
}

#[test]
fn one_image_that_does_not_fit_fails_retryably_and_the_next_request_works() {
    let (dev, sim) = device(0);
    let mut a = adaptive(dev, 8, 4);
    let err = a.embed(&images(1, 5)).unwrap_err();
    assert!(err.retry_hint().is_retryable());
    assert!(is_out_of_memory(&err));
    let text = chain(&err);
    assert!(text.contains("batch of 1 image (retryable)"), "{text}");
    assert!(text.contains("run of 1 images"), "{text}");
    // 8 → 4, 2, 1, then the one image once more after a shrink.
    let runs: Vec<(usize, bool)> = sim.runs().iter().map(|r| (r.n, r.shrink)).collect();
    assert_eq!(runs, vec![(8, false), (4, true), (2, true), (1, true)]);
    assert_eq!(a.stats().failed_requests, 1);

    // A lone image that fails is retried once, as a shrink run.
    let (dev1, sim1) = device(0);
    let mut one = adaptive(dev1, 1, 4);
    assert!(one
        .embed(&images(1, 1))
        .unwrap_err()
        .retry_hint()
        .is_retryable());
    let runs: Vec<bool> = sim1.runs().iter().map(|r| r.shrink).collect();
    assert_eq!(runs, vec![false, true]);

    // The engine stays usable: memory comes back, the next request works.
    sim.set_ceiling(8);
    let e = a.embed(&images(100, 7)).unwrap();
    assert_identity(&e, 100, 7);
    // From bucket 1, one step after 4 successes.
    assert_eq!(a.stats().bucket, 2);
}

#[test]
fn other_errors_pass_through_unchanged_and_are_not_retried_here() {
    let (dev, sim) = device(64);
    let mut a = adaptive(dev, 32, 4);
    sim.fail_next("Got invalid dimensions for input: pixel_values for the following indices");
    let err = a.embed(&images(1, 32)).unwrap_err();
    match &err {
        Error::Device { message, .. } => assert!(message.starts_with("Got invalid dimensions")),
        other => panic!("changed: {other:?}"),
    }
    // Not retried by the engine at a smaller size; the task itself may be
    // tried later (possibly by a healthy worker), as any ORT run failure.
    assert!(err.retry_hint().is_retryable());
    assert_eq!(sim.run_count(), 1, "not retried");
    assert_eq!(a.stats().bucket, 32, "not an OOM: the bucket stays");
    a.embed(&images(1, 32)).unwrap();
}

#[test]
fn partial_pieces_run_at_the_smallest_bucket_and_padding_is_dropped() {
    let (dev, sim) = device(64);
    let mut a = adaptive(dev, 32, 4);
    let e = a.embed(&images(1, 32 + 32 + 5)).unwrap();
    assert_identity(&e, 1, 69);
    let sizes: Vec<usize> = sim.runs().iter().map(|r| r.n).collect();
    assert_eq!(sizes, vec![32, 32, 8]);
    // Row fields: [id, run size, index in run, shrink].
    assert_eq!(e.row(68)[1], 8.0);
    assert_eq!(e.row(68)[2], 4.0);
    assert_eq!(a.stats().padded_images, 3);
    let empty = a.embed(&images(1, 0)).unwrap();
    assert_eq!((empty.n, empty.data.len()), (0, 0));
    assert_eq!(sim.run_count(), 3, "an empty request runs nothing");
}

#[test]
fn retries_and_the_run_after_the_bucket_shrinks_ask_for_an_arena_shrink() {
    let (dev, sim) = device(64);
    sim.schedule(1, 10); // the second run and on: at most 10 images
    let mut a = adaptive(dev, 32, 100);
    a.embed(&images(1, 64)).unwrap();
    let runs: Vec<(usize, bool, bool)> = sim.runs().iter().map(|r| (r.n, r.ok, r.shrink)).collect();
    assert_eq!(
        runs,
        vec![
            (32, true, false),
            (32, false, false),
            (16, false, true), // retries after an OOM are shrink runs
            (8, true, true),
            (8, true, true),
            // The other half, already cut to the lowered bucket.
            (8, true, true),
            (8, true, true),
        ]
    );
    // Steady state: no shrink.
    a.embed(&images(65, 16)).unwrap();
    assert!(sim.runs()[7..].iter().all(|r| !r.shrink && r.n == 8));
    // The caller's own hint reaches the first run.
    a.run(&images(81, 16), RunHints { shrink_arena: true })
        .unwrap();
    let last: Vec<bool> = sim.runs()[9..].iter().map(|r| r.shrink).collect();
    assert_eq!(last, vec![true, false]);
    assert!(a.stats().shrink_runs >= 6);
}

fn saturating_device(ceiling: usize, total_memory: Option<u64>) -> (SimulatedDevice, SimHandle) {
    let d = SimulatedDevice::new(SimConfig {
        ceiling,
        total_memory,
        ..SimConfig::default()
    });
    let h = d.handle();
    (d, h)
}

const SHAPE: ImageShape = ImageShape {
    channels: 3,
    height: 2,
    width: 2,
};

#[test]
fn probe_picks_the_smallest_bucket_within_3_percent_of_the_best() {
    // Efficiency saturates at 32: 64 is under 3 % faster, so the probe stops
    // there and picks 32.
    let (dev, sim) = saturating_device(1000, None);
    let mut a = adaptive(dev, 128, 16);
    let table = a.probe(SHAPE).unwrap();
    let buckets: Vec<usize> = table.iter().map(|r| r.bucket).collect();
    assert_eq!(buckets, vec![1, 2, 4, 8, 16, 32, 64]);
    assert!(table.iter().all(|r| r.outcome == ProbeOutcome::Measured));
    let t32 = table[5].images_per_s;
    let t64 = table[6].images_per_s;
    assert!(t64 < t32 * 1.03 && t64 > t32, "{t32} {t64}");
    // Virtual time: 32 images at efficiency 1 take 1 ms + 32 ms.
    assert!((t32 - 32.0 / 0.033).abs() < 1e-6, "{t32}");
    let s = a.stats();
    assert_eq!(s.bucket, 32);
    assert_eq!(s.target, 32);
    assert_eq!(s.probe.as_deref(), Some(&table[..]));
    assert_eq!(a.probe_table().as_deref(), Some(&table[..]));
    assert_eq!(a.preferred_batch(), Some(32));
    // One warm and two timed runs per bucket; the next run shrinks the arena,
    // which the 64-image runs grew.
    assert_eq!(sim.run_count(), 7 * 3);
    a.embed(&images(1, 32)).unwrap();
    assert!(sim.runs().last().unwrap().shrink);
}

#[test]
fn probe_stops_at_out_of_memory() {
    let (dev, sim) = saturating_device(20, None);
    let mut a = adaptive(dev, 64, 16);
    let table = a.probe(SHAPE).unwrap();
    let last = table.last().unwrap();
    assert_eq!((last.bucket, last.outcome), (32, ProbeOutcome::OutOfMemory));
    let s = a.stats();
    assert_eq!((s.bucket, s.ceiling, s.ooms), (16, 16, 1));
    assert!(s.last_oom.unwrap().contains("Failed to allocate memory"));
    assert_eq!(sim.ooms(), 1);
}

#[test]
fn probe_stops_at_the_memory_budget() {
    // A device of 64 images' worth whose other tenants use 24 of them: after
    // the 32-image runs the arena holds 32, so 56 of 64 (87.5 %) are in use,
    // over a budget of 80 % (the 16 bucket used 40 of 64, 62.5 %).
    let (dev, _sim) = saturating_device(40, Some(64 * (64 << 20)));
    let clock = dev.handle().clock();
    let mut a = Adaptive::with_clock(
        dev,
        AdaptiveConfig {
            max_batch: 64,
            memory_budget: 0.8,
            ..AdaptiveConfig::default()
        },
        clock,
    );
    let table = a.probe(SHAPE).unwrap();
    let last = table.last().unwrap();
    assert_eq!((last.bucket, last.outcome), (32, ProbeOutcome::OverBudget));
    assert!(last.memory_used.is_some());
    assert_eq!(a.stats().bucket, 16);
    assert_eq!(a.stats().ooms, 0);
}

#[test]
fn probe_failing_at_one_image_is_retryable() {
    let (dev, _sim) = saturating_device(0, None);
    let mut a = adaptive(dev, 64, 16);
    let err = a.probe(SHAPE).unwrap_err();
    assert!(err.retry_hint().is_retryable(), "{}", chain(&err));
    assert_eq!(a.probe_table().unwrap().len(), 1);
}

#[tokio::test]
async fn the_engine_handle_publishes_the_current_bucket() {
    let (dev, sim) = device(64);
    let mut a = adaptive(dev, 32, 16);
    a.probe(SHAPE).unwrap();
    let h = EngineHandle::spawn("test-adaptive", 2, move || Ok(a)).unwrap();
    assert_eq!(h.preferred_batch(), Some(32));
    assert_eq!(h.max_batch(), None, "adaptive takes batches of any size");
    sim.set_ceiling(10);
    let e = h.embed(images(1, 40)).await.unwrap();
    assert_identity(&e, 1, 40);
    assert_eq!(h.preferred_batch(), Some(8));
}

// ---------------------------------------------------------------------------
// Real ONNX Runtime.

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn session_cfg(intra_threads: Option<usize>) -> SessionConfig {
    let lib = std::env::var_os("ORT_DYLIB_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".cache/ort/libonnxruntime.so.1.31.1"));
    assert!(
        lib.is_file(),
        "ONNX Runtime library missing at {}: run scripts/setup-ort.sh",
        lib.display()
    );
    SessionConfig {
        ort_lib: Some(lib),
        intra_threads,
        ..Default::default()
    }
}

fn tiny() -> ModelDir {
    ModelDir::open(root().join("fixtures/models/tiny-siglip")).unwrap()
}

/// `n` distinct 256×256 images in [-1, 1], deterministic.
fn ort_images(n: usize) -> PixelBatch {
    let il = 3 * 256 * 256;
    let mut rng = Rng(7);
    PixelBatch {
        n,
        channels: 3,
        height: 256,
        width: 256,
        data: (0..n * il)
            .map(|_| (rng.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect(),
    }
}

fn one(batch: &PixelBatch, i: usize) -> PixelBatch {
    let il = batch.image_len();
    PixelBatch {
        n: 1,
        data: batch.data.padded(i * il..(i + 1) * il, il),
        ..batch.clone()
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Checks every row against its own one-image reference, and that the
/// references are far enough apart for that to prove the order.
fn assert_rows_match(out: &rsembed_worker::engine::Embeddings, refs: &[Vec<f32>]) {
    assert_eq!(out.n, refs.len());
    for (i, r) in refs.iter().enumerate() {
        let c = cosine(out.row(i), r);
        assert!(c > 0.99999, "row {i}: cosine {c} with its own image");
        for (j, other) in refs.iter().enumerate().filter(|(j, _)| *j != i) {
            assert!(cosine(r, other) < 0.9999, "images {i} and {j} embed alike");
        }
    }
}

#[test]
fn probe_and_padding_over_the_real_cpu_session() {
    let vision = OrtVision::open(&tiny(), false, &session_cfg(None)).unwrap();
    let mut a = Adaptive::new(
        vision,
        AdaptiveConfig {
            max_batch: 8,
            ..AdaptiveConfig::default()
        },
    );
    let table = a.probe(ImageShape::of_model(&tiny())).unwrap();
    assert!(!table.is_empty() && table.iter().all(|r| r.images_per_s > 0.0));
    let bucket = a.stats().bucket;
    assert!(table.iter().any(|r| r.bucket == bucket));
    // 11 images: full buckets plus a padded tail; rows as run one at a time.
    let batch = ort_images(11);
    let refs: Vec<Vec<f32>> = (0..11)
        .map(|i| a.inner_mut().embed(&one(&batch, i)).unwrap().data)
        .collect();
    let out = a.embed(&batch).unwrap();
    assert_rows_match(&out, &refs);
}

#[repr(C)]
struct Rlimit {
    cur: u64,
    max: u64,
}

extern "C" {
    fn setrlimit(resource: i32, rlim: *const Rlimit) -> i32;
}

/// `RLIMIT_AS` on Linux (x86_64 and aarch64).
const RLIMIT_AS: i32 = 9;

fn vm_size() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmSize in /proc/self/status");
    kib * 1024
}

const CHILD: &str = "RSEMBED_ORT_OOM_CHILD";

/// One real ONNX Runtime CPU allocation failure, recovered.
///
/// The CPU session's BFC arena gets its memory from `posix_memalign`; with the
/// process's address space capped (`RLIMIT_AS`) 40 MiB above what it maps
/// once the session and the input are ready, a 64-image run of the tiny model
/// (its unfused graph, see [`unfused_tiny`]) needs a 64 MiB attention buffer and ORT itself fails with "Failed to
/// allocate memory for requested buffer of size 67108864". The cap is set in a
/// child process (this test re-run with `RSEMBED_ORT_OOM_CHILD=1`), so no other
/// test shares it.
#[test]
fn real_ort_cpu_allocation_failure_is_recovered() {
    if std::env::var_os(CHILD).is_some() {
        return ort_oom_child();
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "real_ort_cpu_allocation_failure_is_recovered",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed: {text}");
    assert!(text.contains("1 passed"), "{text}");
}

/// The tiny model with its vision graph as exported before attention was
/// fused (`fixtures/models/unfused/`, exporter version 1): its eager attention
/// materialises a 64 MiB buffer for 64 images, the one allocation large enough
/// for an address-space cap to meet inside ONNX Runtime rather than in Rust's
/// own (25 MiB) copies of the split halves. The fused graph needs no buffer
/// that large, so a cap that fails it fails Rust first, which aborts.
fn unfused_tiny(dir: &std::path::Path) -> ModelDir {
    let src = root().join("fixtures/models/tiny-siglip");
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    std::fs::copy(
        root().join("fixtures/models/unfused/vision_model.onnx"),
        dir.join("vision_model.onnx"),
    )
    .unwrap();
    ModelDir::open(dir).unwrap()
}

fn ort_oom_child() {
    let dir = tempfile::tempdir().unwrap();
    let model = unfused_tiny(dir.path());
    // One intra-op thread: the run stays on this thread, so the cap meets
    // ORT's allocations and nothing else.
    let mut vision = OrtVision::open(&model, false, &session_cfg(Some(1))).unwrap();
    let n = 64;
    let batch = ort_images(n);
    let refs: Vec<Vec<f32>> = (0..n)
        .map(|i| vision.embed(&one(&batch, i)).unwrap().data)
        .collect();
    let mut a = Adaptive::new(
        vision,
        AdaptiveConfig {
            max_batch: 64,
            ..AdaptiveConfig::default()
        },
    );
    let limit = vm_size() + (40 << 20);
    // SAFETY: setrlimit reads a valid struct; it only lowers this process's cap.
    let rc = unsafe {
        setrlimit(
            RLIMIT_AS,
            &Rlimit {
                cur: limit,
                max: u64::MAX,
            },
        )
    };
    assert_eq!(rc, 0, "setrlimit failed");
    let out = a.embed(&batch).unwrap();
    let s = a.stats();
    eprintln!(
        "capped at {} MiB, now {} MiB; stats: {s:?}",
        limit >> 20,
        vm_size() >> 20
    );
    assert!(s.ooms >= 1, "no OOM happened; the cap is too loose");
    let msg = s.last_oom.clone().unwrap();
    assert!(
        msg.contains("Failed to allocate memory for requested buffer of size"),
        "{msg}"
    );
    assert!(s.bucket < 64 && s.ceiling < 64);
    assert_rows_match(&out, &refs);
}
