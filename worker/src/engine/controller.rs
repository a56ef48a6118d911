//! The adaptive batch-size controller: pure decisions, no I/O and no clock.
//!
//! [`crate::engine::adaptive::Adaptive`] asks it which bucket to run, tells it
//! how each run went, and reads from it whether the next run should shrink the
//! memory arena. Everything here is deterministic so it can be unit-tested
//! exhaustively.
//!
//! The rules (AIMD over power-of-two buckets):
//! - **Buckets** are 1, 2, 4, … up to `max_batch` (rounded down to a power of
//!   two), so the arena and ORT's cached execution plans see at most
//!   log2(max)+1 shapes.
//! - The **bucket** run now is `min(target, ceiling, hard_limit)`. `target` is
//!   the warm-up probe's choice (`max_batch` until a probe ran): larger is no
//!   faster, so the controller never climbs past it.
//! - **Multiplicative decrease**: an out-of-memory run at size `s` lowers the
//!   ceiling to `s / 2` at once.
//! - **Additive increase**: after [`DEFAULT_RECOVER_AFTER`] consecutive
//!   successful runs at the current bucket, the ceiling rises one bucket step.
//! - **Failed twice, never again**: a size `s ≥ 2` that failed twice sets a
//!   permanent `hard_limit` below it. A failure counts toward this only once a
//!   smaller size has then succeeded, i.e. when the size, not a full device,
//!   was at fault: when a neighbour fills the whole device, every size down to
//!   1 fails in one cascade, and counting all of them would pin the worker to
//!   bucket 1 for the rest of its life.
//! - **Shrink on change**: after the bucket shrinks, the next run returns the
//!   arena's free chunks to the device (so the smaller shape does not sit on
//!   the larger shape's memory); the retries after an OOM are shrink runs too
//!   (the caller asks for those itself).

/// Consecutive successes at the current bucket before trying one bucket up.
///
/// 16: a climb that fails wastes about one run (the failed run at twice the
/// size; its halves then do the work), about 6 % of the 17-run window, and a
/// size can fail a climb only once more before it is capped for good, so the
/// worst total cost is log2(max) such windows. On a GPU 16 runs are a second or
/// two, so recovery from a transient squeeze stays quick. The seed articles'
/// 3 retries a size that just failed after three runs, before a fragmented
/// arena has been shrunk and settled (and, without a memory of failures, for
/// ever: see the adaptive benchmark).
pub const DEFAULT_RECOVER_AFTER: u32 = 16;

/// The largest power of two not above `n` (`n ≥ 1`).
pub(crate) fn floor_pow2(n: usize) -> usize {
    assert!(n >= 1, "a batch limit of 0 is a bug");
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// The smallest bucket that holds `n` images (`n ≥ 1`): the next power of two.
pub fn bucket_for(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

/// The buckets up to `max_batch`: 1, 2, 4, … ≤ `max_batch`.
pub fn buckets(max_batch: usize) -> Vec<usize> {
    let top = floor_pow2(max_batch.max(1));
    std::iter::successors(Some(1usize), |b| Some(b * 2))
        .take_while(|b| *b <= top)
        .collect()
}

/// What a reported run did to the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Same bucket as before.
    None,
    /// The bucket grew (a climb).
    Raised,
    /// The bucket shrank (an OOM).
    Lowered,
}

/// The controller's state.
#[derive(Debug, Clone)]
pub(crate) struct Controller {
    max: usize,
    target: usize,
    ceiling: usize,
    hard_limit: usize,
    /// Confirmed failures per bucket, indexed by log2(size).
    failures: [u32; usize::BITS as usize],
    /// The smallest size that failed since the last success, not yet confirmed.
    unconfirmed: Option<usize>,
    streak: u32,
    recover_after: u32,
    pending_shrink: bool,
    ooms: u64,
    successes: u64,
}

impl Controller {
    /// A controller over buckets up to `max_batch`, starting at the largest,
    /// climbing after `recover_after` successes (at least 1).
    pub fn new(max_batch: usize, recover_after: u32) -> Controller {
        let max = floor_pow2(max_batch.max(1));
        Controller {
            max,
            target: max,
            ceiling: max,
            hard_limit: max,
            failures: [0; usize::BITS as usize],
            unconfirmed: None,
            streak: 0,
            recover_after: recover_after.max(1),
            pending_shrink: false,
            ooms: 0,
            successes: 0,
        }
    }

    /// The bucket to run full pieces at now.
    pub fn bucket(&self) -> usize {
        self.target.min(self.ceiling()).max(1)
    }

    /// The largest bucket believed to fit now (never above the hard limit).
    pub fn ceiling(&self) -> usize {
        self.ceiling.min(self.hard_limit).max(1)
    }

    /// The bucket the controller climbs back to (the probe's choice).
    pub fn target(&self) -> usize {
        self.target
    }

    /// The largest bucket.
    pub fn max_batch(&self) -> usize {
        self.max
    }

    /// Below the smallest size that failed twice, when one has.
    pub fn hard_limit(&self) -> Option<usize> {
        (self.hard_limit < self.max).then_some(self.hard_limit)
    }

    /// Out-of-memory runs seen.
    pub fn ooms(&self) -> u64 {
        self.ooms
    }

    /// Successful runs seen.
    pub fn successes(&self) -> u64 {
        self.successes
    }

    /// Consecutive successes at the current bucket.
    #[cfg(test)]
    pub fn streak(&self) -> u32 {
        self.streak
    }

    /// Confirmed failures of `size` (a bucket).
    #[cfg(test)]
    pub fn failures(&self, size: usize) -> u32 {
        self.failures[bucket_for(size).trailing_zeros() as usize]
    }

    /// Sets the bucket to climb back to (the probe's choice), within the buckets.
    pub(crate) fn set_target(&mut self, target: usize) {
        let before = self.bucket();
        self.target = floor_pow2(target.clamp(1, self.max));
        self.streak = 0;
        if self.bucket() < before {
            self.pending_shrink = true;
        }
    }

    /// Lowers the ceiling below `size` without counting a failure (the probe's
    /// memory budget was reached at `size`).
    pub(crate) fn limit_below(&mut self, size: usize) {
        let before = self.bucket();
        self.ceiling = self.ceiling.min((bucket_for(size) / 2).max(1));
        if self.bucket() < before {
            self.pending_shrink = true;
        }
    }

    /// Whether the next run should shrink the arena; reading it clears it.
    pub(crate) fn take_shrink(&mut self) -> bool {
        std::mem::take(&mut self.pending_shrink)
    }

    /// A run at `size` (a bucket) succeeded.
    pub(crate) fn on_success(&mut self, size: usize) -> Change {
        self.successes += 1;
        if let Some(failed) = self.unconfirmed.take() {
            if size < failed {
                self.confirm_failure(failed);
            }
        }
        let before = self.bucket();
        if size < before {
            // A partial piece says nothing about the current bucket.
            return Change::None;
        }
        self.streak += 1;
        if self.streak >= self.recover_after {
            self.streak = 0;
            let up = before * 2;
            if before < self.target && before == self.ceiling() && up <= self.hard_limit {
                self.ceiling = up;
            }
        }
        if self.bucket() > before {
            Change::Raised
        } else {
            Change::None
        }
    }

    /// A run at `size` (a bucket) ran out of memory.
    pub(crate) fn on_oom(&mut self, size: usize) -> Change {
        let size = bucket_for(size);
        self.ooms += 1;
        self.streak = 0;
        self.unconfirmed = Some(self.unconfirmed.map_or(size, |u| u.min(size)));
        let before = self.bucket();
        self.ceiling = self.ceiling.min((size / 2).max(1));
        if self.bucket() < before {
            self.pending_shrink = true;
            Change::Lowered
        } else {
            Change::None
        }
    }

    /// Counts a failure at `size` found during the warm-up probe, where the
    /// smaller buckets had already succeeded.
    pub(crate) fn on_probe_oom(&mut self, size: usize) {
        self.on_oom(size);
        if let Some(failed) = self.unconfirmed.take() {
            if failed > 1 {
                self.confirm_failure(failed);
            }
        }
    }

    fn confirm_failure(&mut self, size: usize) {
        if size < 2 {
            return;
        }
        let i = size.trailing_zeros() as usize;
        self.failures[i] += 1;
        if self.failures[i] >= 2 {
            self.hard_limit = self.hard_limit.min(size / 2);
        }
    }
}

/// How one probed bucket ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Measured.
    Measured,
    /// Ran out of memory; the probe stopped.
    OutOfMemory,
    /// Device memory in use passed the budget after this bucket; excluded, and
    /// the probe stopped.
    OverBudget,
}

impl ProbeOutcome {
    /// A short name for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeOutcome::Measured => "measured",
            ProbeOutcome::OutOfMemory => "out_of_memory",
            ProbeOutcome::OverBudget => "over_budget",
        }
    }
}

/// One row of the warm-up probe's table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeRow {
    /// The bucket.
    pub bucket: usize,
    /// Images per second of the fastest timed run (0 when not measured).
    pub images_per_s: f64,
    /// Device memory in use after the bucket's runs, when the backend reports it.
    pub memory_used: Option<u64>,
    /// How it ended.
    pub outcome: ProbeOutcome,
}

/// Whether the probe should go on past `rows` (the last row is the newest):
/// only while the newest bucket was measured and is more than `tolerance`
/// faster than every smaller one.
pub(crate) fn keep_probing(rows: &[ProbeRow], tolerance: f64) -> bool {
    let Some((last, before)) = rows.split_last() else {
        return true;
    };
    if last.outcome != ProbeOutcome::Measured {
        return false;
    }
    let best_before = before
        .iter()
        .filter(|r| r.outcome == ProbeOutcome::Measured)
        .map(|r| r.images_per_s)
        .fold(0.0, f64::max);
    last.images_per_s > best_before * (1.0 + tolerance)
}

/// The smallest measured bucket within `tolerance` of the best throughput;
/// `None` when nothing was measured.
pub(crate) fn choose(rows: &[ProbeRow], tolerance: f64) -> Option<usize> {
    let measured = || rows.iter().filter(|r| r.outcome == ProbeOutcome::Measured);
    let best = measured().map(|r| r.images_per_s).fold(0.0, f64::max);
    measured()
        .filter(|r| r.images_per_s >= best * (1.0 - tolerance))
        .map(|r| r.bucket)
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_up_to_max() {
        assert_eq!(buckets(64), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(buckets(48), vec![1, 2, 4, 8, 16, 32]);
        assert_eq!(buckets(1), vec![1]);
        assert_eq!(bucket_for(1), 1);
        assert_eq!(bucket_for(3), 4);
        assert_eq!(bucket_for(32), 32);
        assert_eq!(bucket_for(33), 64);
        assert_eq!(floor_pow2(48), 32);
    }

    #[test]
    fn oom_halves_below_the_failed_size_and_asks_for_a_shrink() {
        let mut c = Controller::new(64, 4);
        assert_eq!(c.bucket(), 64);
        assert!(!c.take_shrink());
        assert_eq!(c.on_oom(64), Change::Lowered);
        assert_eq!((c.bucket(), c.ceiling()), (32, 32));
        assert!(c.take_shrink());
        assert!(!c.take_shrink(), "the shrink is for the next run only");
        // A partial piece failing at 8 lowers the ceiling below 8.
        assert_eq!(c.on_oom(8), Change::Lowered);
        assert_eq!(c.bucket(), 4);
        assert_eq!(c.ooms(), 2);
    }

    #[test]
    fn climbs_one_step_after_k_full_successes_up_to_the_target() {
        let mut c = Controller::new(64, 4);
        c.set_target(32);
        c.on_oom(32);
        c.on_success(8); // partial: neither counts nor confirms a climb
        assert_eq!(c.streak(), 0);
        for _ in 0..3 {
            assert_eq!(c.on_success(16), Change::None);
        }
        assert_eq!(c.on_success(16), Change::Raised);
        assert_eq!(c.bucket(), 32);
        for _ in 0..20 {
            c.on_success(32);
        }
        assert_eq!(c.bucket(), 32, "never above the target");
    }

    #[test]
    fn a_size_failing_twice_is_never_reached_again() {
        let mut c = Controller::new(64, 2);
        c.set_target(32);
        c.on_oom(32);
        c.on_success(16); // confirms 32's failure
        assert_eq!(c.failures(32), 1);
        c.on_success(16);
        assert_eq!(c.bucket(), 32, "one failure: climb again");
        c.on_oom(32);
        c.on_success(16);
        assert_eq!(c.failures(32), 2);
        assert_eq!(c.hard_limit(), Some(16));
        for _ in 0..100 {
            c.on_success(16);
        }
        assert_eq!(c.bucket(), 16);
        assert_eq!(c.ceiling(), 16);
    }

    #[test]
    fn a_full_device_cascade_counts_only_against_the_smallest_failing_size() {
        let mut c = Controller::new(64, 2);
        for _ in 0..2 {
            for s in [64, 32, 16, 8, 4, 2, 1] {
                c.on_oom(s);
            }
            // The device frees up; one image runs.
            c.on_success(1);
        }
        assert_eq!(
            c.failures(2),
            0,
            "nothing smaller than 2 succeeded after it"
        );
        assert_eq!(
            c.hard_limit(),
            None,
            "a full device is not the size's fault"
        );
        // It climbs all the way back.
        for _ in 0..2 * 7 {
            let b = c.bucket();
            c.on_success(b);
        }
        assert_eq!(c.bucket(), 64);
    }

    #[test]
    fn probe_stops_when_throughput_stops_improving_and_picks_the_smallest_near_best() {
        let row = |bucket, images_per_s| ProbeRow {
            bucket,
            images_per_s,
            memory_used: None,
            outcome: ProbeOutcome::Measured,
        };
        let mut rows = vec![row(1, 10.0)];
        assert!(keep_probing(&rows, 0.03));
        rows.push(row(2, 19.0));
        assert!(keep_probing(&rows, 0.03));
        rows.push(row(4, 19.4)); // +2 %: stop
        assert!(!keep_probing(&rows, 0.03));
        assert_eq!(choose(&rows, 0.03), Some(2));
        rows.push(ProbeRow {
            outcome: ProbeOutcome::OutOfMemory,
            ..row(8, 0.0)
        });
        assert!(!keep_probing(&rows, 0.03));
        assert_eq!(choose(&rows, 0.03), Some(2));
        assert_eq!(choose(&[], 0.03), None);
    }

    #[test]
    fn probe_oom_counts_as_a_confirmed_failure() {
        let mut c = Controller::new(64, 2);
        c.on_probe_oom(64);
        assert_eq!(c.failures(64), 1);
        assert_eq!(c.ceiling(), 32);
        c.limit_below(32);
        assert_eq!(c.ceiling(), 16);
        assert_eq!(c.failures(32), 0);
    }
}
