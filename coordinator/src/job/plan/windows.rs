//! The tasks of a windowed job (`--windows`): each STAC item goes to the
//! window holding its `datetime` (`start_datetime` for a range), and each
//! window's acquisitions are one task, so no acquisition is read twice for
//! one window. A window keeps at most `--max-scenes` of them: past the cap
//! the cloudiest by `eo:cloud_cover` go first, then the earliest.
//!
//! The planner holds every window's acquisitions until the listing ends (a
//! window is complete only then), at most `--max-scenes` a window: its memory
//! is bounded by windows × the cap, not by the search.

use std::cmp::Ordering as Order;
use std::collections::{BTreeMap, BinaryHeap};

use rsembed_schemas::task::{Task, TaskInput, TaskWindow};
use rsembed_schemas::window::{WindowSpec, Windows};

use crate::error::{Error, Result};

/// One window's planned task, for `plan` and the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct WindowCount {
    /// Its index, from 0.
    pub index: u32,
    /// Its first microsecond, UTC.
    pub start: i64,
    /// The first microsecond after it.
    pub end: i64,
    /// Acquisitions in its task.
    pub acquisitions: u64,
    /// Acquisitions past `--max-scenes`, dropped.
    pub dropped: u64,
}

/// What became of one input.
#[derive(Debug)]
pub(super) enum Placed {
    /// Held for its window's task.
    Held,
    /// No window holds its time (or it has none): dropped.
    Outside,
    /// An item that cannot be read: not an acquisition of any window, it goes
    /// to a task of its own so that its error is recorded.
    Error(TaskInput),
}

/// A window's acquisition, ranked for the cap: greater is worse (cloudier,
/// then earlier, then by URL so the choice does not depend on the order).
struct Ranked(TaskInput);

impl Ranked {
    fn key(&self) -> (f64, i64) {
        let item = self.0.item.as_deref();
        // An item that does not say is taken as clear, as a null
        // cloud_fraction is: it is kept rather than one known to be cloudy.
        let cloud = item.and_then(|i| i.cloud_cover).unwrap_or(0.0);
        (cloud, item.and_then(|i| i.datetime).unwrap_or(i64::MIN))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Ranked) -> Order {
        let ((ca, ta), (cb, tb)) = (self.key(), other.key());
        ca.total_cmp(&cb)
            .then(tb.cmp(&ta))
            .then_with(|| self.0.uri.cmp(&other.0.uri))
    }
}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Ranked) -> Option<Order> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Ranked) -> bool {
        self.cmp(other) == Order::Equal
    }
}

impl Eq for Ranked {}

#[derive(Default)]
struct Bucket {
    /// The worst on top, so a full window drops it first.
    held: BinaryHeap<Ranked>,
    dropped: u64,
}

/// The windows of a job, filling.
pub(super) struct WindowPlan {
    windows: Windows,
    max_scenes: usize,
    buckets: BTreeMap<usize, Bucket>,
}

impl WindowPlan {
    /// The windows `spec` splits the search's `datetime` into.
    pub(super) fn new(spec: &WindowSpec, datetime: Option<&str>) -> Result<WindowPlan> {
        let usage = |e: rsembed_schemas::window::WindowError| Error::Usage(e.to_string());
        let duration = spec.calendar().map_err(usage)?;
        let datetime = datetime.ok_or_else(|| {
            Error::Usage("--windows needs --datetime A/B: the interval it splits".into())
        })?;
        Ok(WindowPlan {
            windows: Windows::of_interval(datetime, duration).map_err(usage)?,
            max_scenes: usize::try_from(spec.max_scenes)
                .unwrap_or(usize::MAX)
                .max(1),
            buckets: BTreeMap::new(),
        })
    }

    /// Places one input in its window.
    pub(super) fn push(&mut self, input: TaskInput) -> Placed {
        let Some(item) = input.item.as_deref() else {
            return Placed::Outside;
        };
        if item.error.is_some() {
            return Placed::Error(input);
        }
        let Some(k) = item.datetime.and_then(|t| self.windows.index_of(t)) else {
            return Placed::Outside;
        };
        let bucket = self.buckets.entry(k).or_default();
        bucket.held.push(Ranked(input));
        if bucket.held.len() > self.max_scenes {
            bucket.held.pop();
            bucket.dropped += 1;
        }
        Placed::Held
    }

    /// Every window's task (windows without an acquisition have none), in
    /// window order, and its counts.
    pub(super) fn finish(self, job_id: &str) -> Vec<(Task, WindowCount)> {
        let windows = self.windows;
        self.buckets
            .into_iter()
            .filter_map(|(k, b)| {
                let w = windows.get(k)?;
                let mut inputs: Vec<TaskInput> = b.held.into_iter().map(|r| r.0).collect();
                // By time, then URL: the task id depends on the order.
                inputs.sort_by(|a, b| {
                    let t = |i: &TaskInput| i.item.as_deref().and_then(|i| i.datetime);
                    t(a).cmp(&t(b)).then_with(|| a.uri.cmp(&b.uri))
                });
                let window = TaskWindow {
                    index: u32::try_from(k).ok()?,
                    start: w.start,
                    end: w.end,
                };
                let count = WindowCount {
                    index: window.index,
                    start: w.start,
                    end: w.end,
                    acquisitions: inputs.len() as u64,
                    dropped: b.dropped,
                };
                Some((Task::in_window(job_id, window, None, inputs), count))
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "windows_tests.rs"]
mod tests;
