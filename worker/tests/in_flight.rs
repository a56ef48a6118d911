//! Two batches in flight (issue 32, item 3), on the simulated device: while
//! batch n computes, batch n+1 is copied to the device (`Backend::stage`),
//! and out-of-memory splitting keeps its guarantees: every image comes back
//! once, in order, with its own row.

use std::time::Duration;

use rsembed_worker::engine::adaptive::{Adaptive, AdaptiveConfig};
use rsembed_worker::engine::sim::{SimConfig, SimulatedDevice};
use rsembed_worker::engine::{Backend, PixelBatch};

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

fn assert_identity(e: &rsembed_worker::engine::Embeddings, first: usize, n: usize) {
    assert_eq!(e.n, n);
    for i in 0..n {
        assert_eq!(e.row(i)[0], (first + i) as f32, "row {i} of {n}");
    }
}

const COPY: Duration = Duration::from_micros(250);

fn copying(ceiling: usize, staged_share: f64) -> SimConfig {
    SimConfig {
        ceiling,
        copy_per_image: COPY,
        staged_share,
        ..SimConfig::default()
    }
}

#[test]
fn a_staged_batch_is_copied_while_the_one_before_it_runs() {
    let cfg = copying(64, 0.0);
    // One after the other: copy, run, copy, run, copy, run.
    let mut serial = SimulatedDevice::new(cfg.clone());
    for k in 0..3 {
        assert_identity(&serial.embed(&images(8 * k, 8)).unwrap(), 8 * k, 8);
    }
    let serial_time = serial.handle().now();

    // Each batch staged while the one before it runs: only the first copy shows.
    let mut d = SimulatedDevice::new(cfg);
    let h = d.handle();
    let batches: Vec<PixelBatch> = (0..3).map(|k| images(8 * k, 8)).collect();
    for (k, b) in batches.iter().enumerate() {
        if let Some(next) = batches.get(k + 1) {
            d.stage(next);
        }
        assert_identity(&d.embed(b).unwrap(), 8 * k, 8);
    }
    assert_eq!(serial_time - h.now(), COPY * 16, "two copies of 8 hidden");
    let staged: Vec<bool> = h.runs().iter().map(|r| r.staged).collect();
    assert_eq!(staged, [false, true, true]);

    // A run of another batch than the staged one copies its own input and
    // leaves the staged one for its own run.
    d.stage(&images(100, 8));
    assert_identity(&d.embed(&images(200, 8)).unwrap(), 200, 8);
    assert_identity(&d.embed(&images(100, 8)).unwrap(), 100, 8);
    let last: Vec<bool> = h.runs().iter().rev().take(2).map(|r| r.staged).collect();
    assert_eq!(last, [true, false]);
}

/// The engine thread's order (stage the batch queued next, run this one),
/// through the adaptive layer, while the ceiling drops below the bucket and a
/// staged batch's own memory pushes runs over it.
#[test]
fn staging_under_out_of_memory_loses_and_misplaces_nothing() {
    let dev = SimulatedDevice::new(copying(40, 0.25));
    let h = dev.handle();
    h.schedule(6, 20);
    h.schedule(14, 40);
    let clock = h.clock();
    let mut a = Adaptive::with_clock(
        dev,
        AdaptiveConfig {
            max_batch: 32,
            recover_after: 2,
            ..AdaptiveConfig::default()
        },
        clock,
    );
    let batches: Vec<PixelBatch> = (0..12).map(|k| images(32 * k, 32)).collect();
    for (k, b) in batches.iter().enumerate() {
        if let Some(next) = batches.get(k + 1) {
            a.stage(next);
        }
        let out = a.embed(b).unwrap();
        assert_identity(&out, 32 * k, 32);
    }
    let runs = h.runs();
    assert!(h.ooms() >= 2, "out of memory met: {runs:?}");
    assert!(
        runs.iter().any(|r| r.staged && r.ok),
        "some copies overlapped: {runs:?}"
    );
    // A staged batch is dropped on out of memory: no run after an OOM uses
    // a copy staged before it unless it was staged again.
    for w in runs.windows(2) {
        if w[0].oom {
            assert!(!w[1].staged, "a retry used a dropped staged copy: {runs:?}");
        }
    }
}
