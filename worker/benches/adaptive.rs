//! Adaptive batch size against fixed batch sizes and the seed articles'
//! strategy, on the simulated device (`worker/src/engine/sim.rs`): issue 4,
//! benchmark 2.
//!
//! The device holds at most 48 images per run and its efficiency rises until
//! 32 images, then stays flat (1 ms per run plus 1 ms per image at full
//! efficiency, a quarter of that at one image). A stream of 20 000 chips
//! arrives in tasks of 1–300 chips (a fixed pseudo-random sequence); each
//! strategy cuts every task into batches of the size it wants at that moment,
//! as the worker's batcher does. Time is the device's virtual clock: every run,
//! failed runs (half their compute time) and the adaptive probe included, so
//! the benchmark is deterministic and takes well under a second.
//!
//! - **adaptive**: [`Adaptive`] after its warm-up probe; a request that fails
//!   (a one-image OOM, retryable) is sent again, as a redelivered task is.
//! - **fixed N**: every power of two up to 64; a batch that runs out of memory
//!   is lost (a fixed-size pipeline has no answer to it). The best fixed size is
//!   the fastest that never ran out of memory.
//! - **seed**: start at 32, halve on OOM and run the same chips again, double
//!   after 3 successes (up to 64), no memory of failed sizes.
//!
//! Two scenarios: the ceiling stays at 48 (`static`), and it drops to 24 for
//! chips 6 000–14 000 and comes back (`squeeze`, another tenant on the GPU).
//! Prints one `RESULT key=value …` line per strategy and scenario, then a table;
//! exits non-zero when adaptive loses a chip or falls under 95 % of the best
//! fixed size. Run with `cargo bench -p rsembed-worker --bench adaptive`.

use std::process::ExitCode;

use rsembed_worker::engine::adaptive::{Adaptive, AdaptiveConfig, ImageShape};
use rsembed_worker::engine::controller::ProbeOutcome;
use rsembed_worker::engine::sim::{SimConfig, SimHandle, SimulatedDevice};
use rsembed_worker::engine::{Backend, PixelBatch};
use rsembed_worker::retry::Retry;

const CHIPS: usize = 20_000;
const MAX_BATCH: usize = 64;
const SHAPE: ImageShape = ImageShape {
    channels: 1,
    height: 1,
    width: 1,
};

struct Scenario {
    name: &'static str,
    /// (from this chip on, images per run).
    ceilings: Vec<(usize, usize)>,
}

#[derive(Default, Clone)]
struct Outcome {
    strategy: String,
    chips_done: usize,
    lost: usize,
    retried: usize,
    ooms: usize,
    runs: usize,
    seconds: f64,
    order_ok: bool,
}

impl Outcome {
    fn images_per_s(&self) -> f64 {
        self.chips_done as f64 / self.seconds
    }
}

/// Task sizes, 1–300 chips, summing to `CHIPS`.
fn tasks() -> Vec<usize> {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut out = Vec::new();
    let mut left = CHIPS;
    while left > 0 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let n = (1 + (s % 300) as usize).min(left);
        out.push(n);
        left -= n;
    }
    out
}

fn batch(first_id: usize, n: usize) -> PixelBatch {
    PixelBatch {
        n,
        channels: SHAPE.channels,
        height: SHAPE.height,
        width: SHAPE.width,
        data: (first_id..first_id + n).map(|i| i as f32).collect(),
    }
}

fn device() -> (SimulatedDevice, SimHandle) {
    let d = SimulatedDevice::new(SimConfig {
        ceiling: 48,
        ..SimConfig::default()
    });
    let h = d.handle();
    (d, h)
}

/// Sets the device's ceiling for the chip about to run.
fn apply_ceiling(sim: &SimHandle, sc: &Scenario, chip: usize) {
    if let Some((_, c)) = sc.ceilings.iter().rev().find(|(from, _)| *from <= chip) {
        if sim.ceiling() != *c {
            sim.set_ceiling(*c);
        }
    }
}

/// Runs the stream with `next_size` choosing each batch and `run` running it.
/// `run` returns the embedded ids, or `None` when the chips must be run again
/// (retried), or `Some(empty)` when they are lost.
fn stream(
    sc: &Scenario,
    sim: &SimHandle,
    mut next_size: impl FnMut() -> usize,
    mut run: impl FnMut(&PixelBatch) -> Option<Vec<f32>>,
) -> Outcome {
    let mut o = Outcome {
        order_ok: true,
        ..Outcome::default()
    };
    let mut id = 0usize;
    let mut expected = 0usize;
    for task in tasks() {
        let end = id + task;
        while id < end {
            apply_ceiling(sim, sc, id);
            let n = next_size().max(1).min(end - id);
            let b = batch(id, n);
            match run(&b) {
                None => o.retried += n,
                Some(ids) if ids.is_empty() => {
                    o.lost += n;
                    expected += n;
                    id += n;
                }
                Some(ids) => {
                    for v in ids {
                        o.order_ok &= v as usize == expected;
                        expected += 1;
                    }
                    o.chips_done += n;
                    id += n;
                }
            }
        }
    }
    o.ooms = sim.ooms();
    o.runs = sim.run_count();
    o.seconds = sim.now().as_secs_f64();
    o
}

fn first_column(e: &rsembed_worker::engine::Embeddings) -> Vec<f32> {
    (0..e.n).map(|i| e.row(i)[0]).collect()
}

fn adaptive(sc: &Scenario, print_probe: bool) -> Outcome {
    let (dev, sim) = device();
    let clock = sim.clock();
    let a = std::cell::RefCell::new(Adaptive::with_clock(
        dev,
        AdaptiveConfig {
            max_batch: MAX_BATCH,
            ..AdaptiveConfig::default()
        },
        clock,
    ));
    apply_ceiling(&sim, sc, 0);
    let table = a.borrow_mut().probe(SHAPE).expect("probe");
    if print_probe {
        println!("probe table ({}):", sc.name);
        for r in table.iter() {
            println!(
                "  bucket {:>3}  {:>8.1} images/s  {}",
                r.bucket,
                r.images_per_s,
                match r.outcome {
                    ProbeOutcome::Measured => "",
                    other => other.as_str(),
                }
            );
        }
        println!("  chose {}", a.borrow().stats().bucket);
    }
    let mut o = stream(
        sc,
        &sim,
        || a.borrow().preferred_batch().unwrap_or(1),
        |b| match a.borrow_mut().embed(b) {
            Ok(e) => Some(first_column(&e)),
            Err(e) if e.retry_hint().is_retryable() => None,
            Err(e) => panic!("adaptive failed: {e}"),
        },
    );
    let s = a.borrow().stats();
    o.strategy = format!("adaptive (bucket {}, ceiling {})", s.bucket, s.ceiling);
    o
}

fn fixed(sc: &Scenario, size: usize) -> Outcome {
    let (dev, sim) = device();
    let dev = std::cell::RefCell::new(dev);
    let mut o = stream(
        sc,
        &sim,
        || size,
        |b| match dev.borrow_mut().embed(b) {
            Ok(e) => Some(first_column(&e)),
            Err(_) => Some(Vec::new()),
        },
    );
    o.strategy = format!("fixed {size}");
    o
}

fn seed(sc: &Scenario) -> Outcome {
    let (dev, sim) = device();
    let state = std::cell::RefCell::new((dev, 32usize, 0u32));
    let mut o = stream(
        sc,
        &sim,
        || state.borrow().1,
        |b| {
            let mut st = state.borrow_mut();
            let (dev, size, streak) = &mut *st;
            match dev.embed(b) {
                Ok(e) => {
                    *streak += 1;
                    if *streak >= 3 {
                        *size = (*size * 2).min(MAX_BATCH);
                        *streak = 0;
                    }
                    Some(first_column(&e))
                }
                Err(_) if b.n == 1 => Some(Vec::new()),
                Err(_) => {
                    *size = (*size / 2).max(1);
                    *streak = 0;
                    None
                }
            }
        },
    );
    o.strategy = "seed (32, halve, double after 3)".into();
    o
}

fn main() -> ExitCode {
    let scenarios = [
        Scenario {
            name: "static",
            ceilings: vec![(0, 48)],
        },
        Scenario {
            name: "squeeze",
            ceilings: vec![(0, 48), (6_000, 24), (14_000, 48)],
        },
    ];
    let mut ok = true;
    for sc in &scenarios {
        let a = adaptive(sc, true);
        let s = seed(sc);
        let fixed: Vec<Outcome> = (0..=MAX_BATCH.trailing_zeros())
            .map(|k| fixed(sc, 1 << k))
            .collect();
        let best = fixed
            .iter()
            .filter(|f| f.ooms == 0)
            .max_by(|x, y| x.images_per_s().total_cmp(&y.images_per_s()))
            .expect("fixed 1 never runs out of memory")
            .clone();
        let rows: Vec<&Outcome> = [&a, &s].into_iter().chain(fixed.iter()).collect();
        for r in &rows {
            println!(
                "RESULT scenario={} strategy={:?} images_per_s={:.1} ratio_to_best_fixed={:.3} \
                 ooms={} lost={} retried={} runs={} order_ok={} virtual_seconds={:.3}",
                sc.name,
                r.strategy,
                r.images_per_s(),
                r.images_per_s() / best.images_per_s(),
                r.ooms,
                r.lost,
                r.retried,
                r.runs,
                r.order_ok,
                r.seconds
            );
        }
        println!(
            "\n{} (ceiling {:?}), best fixed: {}\n",
            sc.name, sc.ceilings, best.strategy
        );
        println!(
            "| strategy | images/s | vs best fixed | OOMs | chips lost | chips retried | runs |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
        for r in &rows {
            println!(
                "| {} | {:.1} | {:.3} | {} | {} | {} | {} |",
                r.strategy,
                r.images_per_s(),
                r.images_per_s() / best.images_per_s(),
                r.ooms,
                r.lost,
                r.retried,
                r.runs
            );
        }
        println!();
        let ratio = a.images_per_s() / best.images_per_s();
        let met = a.lost == 0 && a.order_ok && a.chips_done == CHIPS && ratio >= 0.95;
        println!(
            "RESULT scenario={} target=adaptive_ge_0.95_best_fixed_and_0_lost ratio={ratio:.3} lost={} met={met}\n",
            sc.name, a.lost
        );
        ok &= met;
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
