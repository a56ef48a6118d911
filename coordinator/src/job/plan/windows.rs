//! The tasks of a windowed job (`--windows`): each STAC item goes to the
//! window holding its `datetime` (`start_datetime` for a range).
//!
//! A window is split into blocks of lattice cells, about `--task-chips`
//! cells a block on a grid anchored at the CRS origin, and a task is one
//! block's cells from every acquisition of the window that overlaps it. An
//! acquisition is placed from its item's `proj:code`, `proj:transform` and
//! `proj:shape` without a read; it is in the task of every block it
//! overlaps, and each task reads only its block's pixels of it, so no pixel
//! of an acquisition is read twice for one window. A window with an
//! acquisition the planner cannot place (no projection metadata, or a corner
//! off the lattice) stays one task of all its acquisitions: splitting it
//! would either lose that acquisition's cells outside the blocks or write two
//! rows for one (window, cell).
//!
//! A block keeps at most `--max-scenes` acquisitions (a whole window as
//! many): past the cap the cloudiest by `eo:cloud_cover` go first, then the
//! earliest. The planner holds every window's acquisitions until the listing
//! ends (a window is complete only then), at most `--max-scenes` a block:
//! its memory is bounded by windows × blocks × the cap, not by the search.

use std::cmp::Ordering as Order;
use std::collections::{BTreeMap, BinaryHeap, HashSet};
use std::sync::Arc;

use rsembed_raster::geo::{Crs, GeoTransform};
use rsembed_raster::lattice::Lattice;
use rsembed_schemas::align::Cell;
use rsembed_schemas::task::{CellBlock, Task, TaskInput, TaskWindow};
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
    /// Its tasks: one a block of cells, or one for the whole window.
    pub tasks: u64,
    /// Acquisitions in its tasks.
    pub acquisitions: u64,
    /// Acquisitions left out of a task by `--max-scenes`, once per block
    /// that left them out.
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
struct Ranked(Arc<TaskInput>);

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
    /// The worst on top, so a full bucket drops it first.
    held: BinaryHeap<Ranked>,
    dropped: u64,
}

impl Bucket {
    fn push(&mut self, input: Arc<TaskInput>, cap: usize) {
        self.held.push(Ranked(input));
        if self.held.len() > cap {
            self.held.pop();
            self.dropped += 1;
        }
    }
}

/// A block of the lattice's block grid: (lattice, block column, block row).
type BlockKey = (String, i64, i64);

/// One window, filling.
#[derive(Default)]
struct Window {
    /// Acquisitions by the blocks they overlap.
    blocks: BTreeMap<BlockKey, Bucket>,
    /// Acquisitions the planner cannot place: the window stays whole.
    unplaced: Bucket,
    /// Acquisitions pushed.
    seen: u64,
}

/// Blocks one acquisition may span before it is not split by them: far past a
/// real scene's (a Sentinel-2 tile is 1 block at the default size), it
/// bounds what a hostile `proj:shape` or a tiny `--task-chips` can make the
/// planner hold.
const MAX_BLOCKS_PER_SCENE: i64 = 4096;

/// The windows of a job, filling.
pub(super) struct WindowPlan {
    windows: Windows,
    max_scenes: usize,
    chip: u32,
    stride: u32,
    /// Cells per side of a block; `None`: whole windows (a job an older
    /// rsembed started).
    block: Option<i64>,
    buckets: BTreeMap<usize, Window>,
}

impl WindowPlan {
    /// The windows `spec` splits the search's `datetime` into, for chips of
    /// `chip` pixels every `stride`, in blocks of about `block_cells` cells
    /// when `spec` splits windows.
    pub(super) fn new(
        spec: &WindowSpec,
        datetime: Option<&str>,
        chip: u32,
        stride: u32,
        block_cells: usize,
    ) -> Result<WindowPlan> {
        let block = (block_cells.max(1) as f64).sqrt().floor().max(1.0) as i64;
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
            chip,
            stride,
            block: spec.cell_blocks.then_some(block),
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
        let blocks = self.blocks_of(&input);
        let (cap, input) = (self.max_scenes, Arc::new(input));
        let w = self.buckets.entry(k).or_default();
        w.seen += 1;
        match blocks {
            Some(keys) => {
                for key in keys {
                    w.blocks.entry(key).or_default().push(input.clone(), cap);
                }
            }
            None => w.unplaced.push(input, cap),
        }
        Placed::Held
    }

    /// The blocks an acquisition overlaps, from its item's projection
    /// metadata; `None` when it cannot be placed.
    fn blocks_of(&self, input: &TaskInput) -> Option<Vec<BlockKey>> {
        let b = self.block?;
        let item = input.item.as_deref()?;
        let (proj, [w, h]) = (item.proj?, item.grid?);
        let lattice = Lattice::of_scene(
            Some(&GeoTransform(proj.transform)),
            Some(&Crs::Epsg(proj.epsg)),
            self.chip,
            self.stride,
        )
        .ok()?;
        let [[c0, c1], [r0, r1]] = lattice.cell_span(w, h);
        let name = Cell {
            epsg: lattice.epsg,
            res: lattice.res,
            stride: lattice.stride,
            col: 0,
            row: 0,
        }
        .lattice();
        let (bc, br) = (
            c0.div_euclid(b)..=c1.div_euclid(b),
            r0.div_euclid(b)..=r1.div_euclid(b),
        );
        let n = (bc.end() - bc.start() + 1).saturating_mul(br.end() - br.start() + 1);
        if n > MAX_BLOCKS_PER_SCENE {
            return None;
        }
        Some(
            br.flat_map(|r| bc.clone().map(move |c| (c, r)))
                .map(|(c, r)| (name.clone(), c, r))
                .collect(),
        )
    }

    /// Every window's tasks (windows without an acquisition have none), in
    /// window order, then block order, and each window's counts.
    pub(super) fn finish(self, job_id: &str) -> Vec<(WindowCount, Vec<Task>)> {
        let (windows, cap, side) = (self.windows, self.max_scenes, self.block.unwrap_or(1));
        let block_side = u32::try_from(side).unwrap_or(u32::MAX);
        self.buckets
            .into_iter()
            .filter_map(|(k, w)| {
                let tw = windows.get(k)?;
                let window = TaskWindow {
                    index: u32::try_from(k).ok()?,
                    start: tw.start,
                    end: tw.end,
                };
                let mut count = WindowCount {
                    index: window.index,
                    start: tw.start,
                    end: tw.end,
                    tasks: 0,
                    acquisitions: 0,
                    dropped: 0,
                };
                let mut tasks = Vec::new();
                let mut kept = HashSet::new();
                if w.unplaced.held.is_empty() {
                    for ((lattice, c, r), b) in w.blocks {
                        count.dropped += b.dropped;
                        let inputs = in_order(b.held);
                        kept.extend(inputs.iter().map(|i| i.uri.clone()));
                        let cells = CellBlock {
                            lattice,
                            col: c * side,
                            row: r * side,
                            cols: block_side,
                            rows: block_side,
                        };
                        tasks.push(Task::in_window(job_id, window, Some(cells), inputs));
                    }
                } else {
                    // The whole window: every acquisition once, the cap over
                    // all of them. One a block left out was worse than `cap`
                    // others of that block, all of which are here: it is not
                    // among the window's best `cap` either.
                    let mut all = Bucket::default();
                    let mut uris = HashSet::new();
                    let placed = w.blocks.into_values().flat_map(|b| b.held.into_vec());
                    for r in w.unplaced.held.into_vec().into_iter().chain(placed) {
                        if uris.insert(r.0.uri.clone()) {
                            all.push(r.0, cap);
                        }
                    }
                    let inputs = in_order(all.held);
                    count.dropped = w.seen.saturating_sub(inputs.len() as u64);
                    kept.extend(inputs.iter().map(|i| i.uri.clone()));
                    tasks.push(Task::in_window(job_id, window, None, inputs));
                }
                count.tasks = tasks.len() as u64;
                count.acquisitions = kept.len() as u64;
                Some((count, tasks))
            })
            .collect()
    }
}

/// A task's acquisitions by time, then URL: the task id depends on the order.
fn in_order(held: BinaryHeap<Ranked>) -> Vec<TaskInput> {
    let mut inputs: Vec<TaskInput> = held
        .into_iter()
        .map(|r| Arc::try_unwrap(r.0).unwrap_or_else(|a| (*a).clone()))
        .collect();
    inputs.sort_by(|a, b| {
        let t = |i: &TaskInput| i.item.as_deref().and_then(|i| i.datetime);
        t(a).cmp(&t(b)).then_with(|| a.uri.cmp(&b.uri))
    });
    inputs
}

#[cfg(test)]
#[path = "windows_tests.rs"]
mod tests;
