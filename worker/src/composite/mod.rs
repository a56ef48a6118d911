//! A window's task (`--windows`): of the window's acquisitions, one row per
//! cell of the CRS lattice, from the clearest acquisition (`--composite
//! best`, [`best`]) or the per-pixel median of them all (`median`,
//! [`median`]).
//!
//! The task is read **cell by cell**: every acquisition is opened once (its
//! headers), the cells they cover are walked in row-major order (north to
//! south, west to east), and for each cell its window of every acquisition
//! that covers it is read, combined, and only the result is sent on to the
//! batcher. One cell is read at a time, its acquisitions
//! `decode_concurrency` at once, so every file is read chip after chip in
//! its own row-major order: the order a job of that scene alone reads it,
//! so its block cache serves the same blocks and no block is fetched more
//! often. The composites (a median's arithmetic, the preprocessing) run
//! `decode_concurrency` at once behind the reads.
//!
//! Memory: best holds the 8-bit chip of every acquisition that covers a
//! cell, median its samples (f32 per band and pixel), for the cell being
//! read and the `decode_concurrency` being composed; the open scenes keep
//! their headers and block caches, which forget the blocks above each new
//! row of cells (about a row of blocks a file). Nothing grows with the
//! number of cells.

mod best;
mod median;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::StreamExt;
use rsembed_raster::lattice::Lattice;
use rsembed_raster::scene::Scene;
use rsembed_schemas::align::Cell;
use rsembed_schemas::chip::ErrorStage;
use rsembed_schemas::ids::Window;
use rsembed_schemas::task::{Task, TaskInput, TaskWindow};
use rsembed_schemas::window::Composite;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::context::JobContext;
use crate::input::scene::{open_input, SceneContext};
use crate::input::{input_error, item_kind, InputKind, Item, Readers, NOT_ON_A_LATTICE};
use crate::sink::rows::ErrorRow;

/// What the window's walk saw, for the rows and the summary.
#[derive(Debug, Default)]
pub(crate) struct Chosen {
    /// Per cell: the acquisitions it counts (`best`: those with valid pixels
    /// in it that passed `--min-valid` and `--max-cloud`; `median`: those
    /// with a clear valid pixel in it).
    pub(crate) scenes: HashMap<String, i32>,
    /// The inputs that gave a chip in some cell, chosen or not.
    pub(crate) inputs_with_chips: HashSet<String>,
    /// Cells without a clear pixel in the window: no row.
    pub(crate) unclear_cells: u64,
    /// Chips left out because their cloud fraction exceeds `--max-cloud`.
    pub(crate) cloudy_chips_dropped: u64,
}

/// One opened acquisition of the window.
pub(crate) struct Acquisition {
    pub(crate) input: TaskInput,
    pub(crate) scene: Scene,
}

/// A cell of the walk and its window in each acquisition that covers it.
pub(crate) struct CellJob {
    pub(crate) cell: Cell,
    pub(crate) name: String,
    /// (acquisition index, its window of the cell), in acquisition order.
    pub(crate) members: Vec<(usize, Window)>,
}

/// What one cell gave.
#[derive(Default)]
pub(crate) struct CellOutcome {
    /// The row's chip, when the cell has one.
    pub(crate) row: Option<crate::input::Prepared>,
    /// The cell had chips but no clear pixel.
    pub(crate) unclear: bool,
    /// The acquisitions `scenes` counts.
    pub(crate) scenes: i32,
    /// Acquisitions that gave a chip in the cell.
    pub(crate) with_chips: Vec<usize>,
    /// Acquisitions whose read of the cell failed, with their error rows.
    pub(crate) errors: Vec<(usize, ErrorRow)>,
    /// Chips over `--max-cloud`.
    pub(crate) cloudy: u64,
}

/// A chip of one acquisition as a composite reads it.
pub(crate) trait CellChip: Send + 'static {
    /// What `--max-cloud` checks.
    fn cloud_fraction(&self) -> Option<f32>;
}

impl CellChip for rsembed_raster::scene::SceneChip {
    fn cloud_fraction(&self) -> Option<f32> {
        self.cloud_fraction
    }
}

impl CellChip for rsembed_raster::scene::SampleChip {
    fn cloud_fraction(&self) -> Option<f32> {
        self.cloud_fraction
    }
}

/// How a composite reads one acquisition's chip of a cell: `Scene::chip` or
/// `Scene::sample_chip`, given the window and `--min-valid`.
pub(crate) type ChipRead<T> = for<'a> fn(
    &'a Scene,
    Window,
    Option<f32>,
) -> futures::future::BoxFuture<
    'a,
    Result<Option<T>, rsembed_raster::scene::SceneError>,
>;

/// Reads a cell's chip of each acquisition in `members` (`walk.conc` at
/// once), in acquisition order. A chip below `--min-valid` is none, one over
/// `--max-cloud` is counted and left out, and a failed read is its
/// acquisition's error row: the cell is composed of the others (see
/// docs/time.md).
pub(crate) async fn read_chips<T: CellChip>(
    walk: &Arc<Walk>,
    members: Vec<(usize, Window)>,
    out: &mut CellOutcome,
    read: ChipRead<T>,
) -> Vec<(usize, T)> {
    let mut reads = futures::stream::iter(members)
        .map(|(k, w)| {
            let walk = walk.clone();
            async move {
                let Some(a) = &walk.acquisitions[k] else {
                    return (k, Ok(None));
                };
                (k, read(&a.scene, w, walk.ctx.tiling.min_valid).await)
            }
        })
        .buffered(walk.conc);
    let mut chips = Vec::new();
    while let Some((k, chip)) = reads.next().await {
        let Some(a) = &walk.acquisitions[k] else {
            continue;
        };
        let chip = match chip {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                out.errors
                    .push((k, input_error(&a.input, ErrorStage::Decode, e)));
                continue;
            }
        };
        let max = walk.ctx.tiling.max_cloud;
        if let (Some(max), Some(cloud)) = (max, chip.cloud_fraction()) {
            if cloud > max {
                out.cloudy += 1;
                crate::metrics::global().cloudy_chips_dropped.inc_by(1);
                continue;
            }
        }
        out.with_chips.push(k);
        chips.push((k, chip));
    }
    chips
}

/// What a cell's composite needs besides its cell.
pub(crate) struct Walk {
    pub(crate) ctx: Arc<SceneContext>,
    pub(crate) acquisitions: Vec<Option<Acquisition>>,
    pub(crate) tiling_fp: String,
    pub(crate) window: TaskWindow,
    /// Acquisitions of a cell read at once, and composites made at once.
    pub(crate) conc: usize,
}

/// A cell read, its composite still to make.
enum Pending {
    Best(best::Read),
    Median(median::Read),
}

/// Starts the window task's walk into `tx`; the handle gives what it saw
/// once every cell is sent and `tx` is closed.
pub(crate) fn spawn_window(
    runner: &Readers<'_>,
    job: &JobContext,
    task: &Task,
    window: TaskWindow,
    tx: mpsc::Sender<Item>,
) -> tokio::task::JoinHandle<Chosen> {
    let ctx = Arc::new(SceneContext {
        stores: runner.stores.clone(),
        pre: runner.pre.clone(),
        counters: runner.counters.clone(),
        tiling: job.file_meta.tiling.clone(),
        scale: job.scale,
        limits: runner.tiff_limits.clone(),
        cloudy_dropped: Default::default(),
    });
    let conc = runner.decode_concurrency.max(1);
    let composite = job
        .file_meta
        .tiling
        .windows
        .as_ref()
        .map_or(Composite::Best, |w| w.composite);
    let task = task.clone();
    let tiling_fp = job.file_meta.tiling.fingerprint();
    tokio::spawn(
        async move {
            let mut chosen = Chosen::default();
            let mut failed: HashSet<usize> = HashSet::new();
            let (acquisitions, errors) =
                open_all(&ctx, &task.inputs, conc, task.cells.is_some()).await;
            for (k, e) in errors {
                failed.insert(k);
                if tx.send(Err(e)).await.is_err() {
                    return chosen;
                }
            }
            let cells = cells_of(&acquisitions, task.cells.as_ref());
            let walk = Arc::new(Walk {
                ctx: ctx.clone(),
                acquisitions,
                tiling_fp,
                window,
                conc,
            });
            // One cell is read at a time (its acquisitions `conc` at once),
            // so each file is read by one reader, chip after chip, in its
            // own row-major order: its block cache serves every block a
            // second chip needs, as when the scene is read alone. Reading
            // two cells at once would fetch a block two cells share twice,
            // before either had cached it. The composites (a median's
            // arithmetic, the preprocessing) run `conc` at once behind it.
            let reader = walk.clone();
            let mut row = None;
            let reads = futures::stream::iter(cells).then(move |job| {
                let walk = reader.clone();
                // A new row of cells: the blocks above it are done with.
                let c = &job.cell;
                if row != Some((c.epsg, c.res.to_bits(), c.row)) {
                    row = Some((c.epsg, c.res.to_bits(), c.row));
                    forget_rows_above(&walk, c);
                }
                async move {
                    match composite {
                        Composite::Best => Pending::Best(best::read(walk, job).await),
                        Composite::Median => Pending::Median(median::read(walk, job).await),
                    }
                }
            });
            let outcomes = reads
                .map(|pending| {
                    let walk = walk.clone();
                    async move {
                        match pending {
                            Pending::Best(r) => best::finish(&walk, r).await,
                            Pending::Median(r) => median::finish(&walk, r).await,
                        }
                    }
                })
                .buffered(conc);
            let mut outcomes = std::pin::pin!(outcomes);
            while let Some((name, o)) = outcomes.next().await {
                chosen.cloudy_chips_dropped += o.cloudy;
                for k in o.with_chips {
                    if let Some(a) = &walk.acquisitions[k] {
                        chosen.inputs_with_chips.insert(a.input.uri.clone());
                    }
                }
                // One error row an acquisition: its first failure.
                for (k, e) in o.errors {
                    if failed.insert(k) && tx.send(Err(e)).await.is_err() {
                        return chosen;
                    }
                }
                if o.scenes > 0 {
                    chosen.scenes.insert(name, o.scenes);
                }
                if o.unclear {
                    chosen.unclear_cells += 1;
                }
                if let Some(p) = o.row {
                    if tx.send(Ok(p)).await.is_err() {
                        return chosen;
                    }
                }
            }
            ctx.counters
                .inputs
                .fetch_add(task.inputs.len() as u64, Ordering::Relaxed);
            chosen
        }
        .in_current_span(),
    )
}

/// Lets each acquisition on `cell`'s lattice forget the blocks above the
/// cell's row, which the walk (row by row, north to south) has passed: its
/// block caches then hold about a row of blocks each, not 64 MiB a file.
fn forget_rows_above(walk: &Walk, cell: &Cell) {
    for a in walk.acquisitions.iter().flatten() {
        let Some(l) = &a.scene.lattice else { continue };
        if l.epsg == cell.epsg && l.res.to_bits() == cell.res.to_bits() {
            let top = cell.row.saturating_mul(i64::from(l.stride)) - l.row0;
            a.scene.forget_rows_above(top);
        }
    }
}

/// Opens every acquisition, `conc` at once: the opened ones by input index,
/// and the error rows of those that could not be. In a task of one block of
/// cells (`block`), an acquisition must lie where its item says.
async fn open_all(
    ctx: &Arc<SceneContext>,
    inputs: &[TaskInput],
    conc: usize,
    block: bool,
) -> (Vec<Option<Acquisition>>, Vec<(usize, ErrorRow)>) {
    let opened: Vec<Result<Acquisition, ErrorRow>> = futures::stream::iter(inputs.to_vec())
        .map(|input| {
            let ctx = ctx.clone();
            async move {
                let a = open_one(&ctx, input).await?;
                match block.then(|| misplaced(&a)).flatten() {
                    Some(why) => {
                        let e = std::io::Error::other(why);
                        Err(input_error(&a.input, ErrorStage::Decode, e))
                    }
                    None => Ok(a),
                }
            }
        })
        .buffered(conc)
        .collect()
        .await;
    let mut errors = Vec::new();
    let acquisitions = opened
        .into_iter()
        .enumerate()
        .map(|(k, o)| match o {
            Ok(a) => Some(a),
            Err(e) => {
                errors.push((k, e));
                None
            }
        })
        .collect();
    (acquisitions, errors)
}

/// Opens one acquisition on the job's lattice.
async fn open_one(ctx: &SceneContext, input: TaskInput) -> Result<Acquisition, ErrorRow> {
    // A window's inputs are STAC items; one whose asset is a whole
    // image has no place on a lattice.
    if input.item.is_some() && item_kind(&ctx.stores, &input).await == InputKind::Image {
        let e = std::io::Error::other(NOT_ON_A_LATTICE);
        return Err(input_error(&input, ErrorStage::Decode, e));
    }
    match open_input(&ctx.opener(), &input).await {
        Ok(scene) if scene.lattice.is_some() => Ok(Acquisition { input, scene }),
        Ok(_) => {
            let e = std::io::Error::other(NOT_ON_A_LATTICE);
            Err(input_error(&input, ErrorStage::Decode, e))
        }
        Err((stage, e)) => Err(input_error(&input, stage, e)),
    }
}

/// Why an acquisition is not where its item's `proj:transform` and
/// `proj:code` put it, when it is not. The planner gave it to the tasks of
/// the blocks its item overlaps: cut from elsewhere, its cells in other
/// blocks would be lost and those it does cut here would be another place's.
fn misplaced(a: &Acquisition) -> Option<String> {
    let proj = a.input.item.as_deref()?.proj?;
    let file = a.scene.lattice.as_ref()?;
    let said = Lattice::of_scene(
        Some(&rsembed_raster::geo::GeoTransform(proj.transform)),
        Some(&rsembed_raster::geo::Crs::Epsg(proj.epsg)),
        file.chip,
        file.stride,
    );
    let same = said.as_ref().is_ok_and(|l| {
        l.epsg == file.epsg
            && (l.res - file.res).abs() <= file.res * 1e-9
            && (l.col0, l.row0) == (file.col0, file.row0)
    });
    (!same).then(|| {
        format!(
            "--windows: the item places the scene at EPSG:{} {:?} (proj:code, proj:transform), \
             but its file is at EPSG:{}, lattice pixel ({}, {}) of {} units: the planner split \
             the window by the item's place, so the scene is left out rather than cut into \
             another block's cells",
            proj.epsg, proj.transform, file.epsg, file.col0, file.row0, file.res
        )
    })
}

/// The cells the acquisitions cover (those of `block` when the task is one
/// block of cells), in row-major order of each lattice, each with its window
/// of every acquisition that covers it.
fn cells_of(
    acquisitions: &[Option<Acquisition>],
    block: Option<&rsembed_schemas::task::CellBlock>,
) -> Vec<CellJob> {
    let placed = acquisitions.iter().enumerate().filter_map(|(k, a)| {
        let a = a.as_ref()?;
        let lattice = a.scene.lattice.as_ref()?;
        Some((k, lattice, a.scene.windows(a.input.chips)))
    });
    walk_order(placed, block)
}

/// [`cells_of`] from each acquisition's (index, lattice, chip windows).
fn walk_order<'a>(
    placed: impl Iterator<Item = (usize, &'a Lattice, Vec<Window>)>,
    block: Option<&rsembed_schemas::task::CellBlock>,
) -> Vec<CellJob> {
    // (EPSG, pixel size, row, column): rows count south, so this is each
    // lattice's north-to-south, west-to-east order.
    let mut cells: BTreeMap<(u32, u64, i64, i64), CellJob> = BTreeMap::new();
    for (k, lattice, windows) in placed {
        for w in windows {
            let cell = lattice.cell(w);
            let key = (cell.epsg, cell.res.to_bits(), cell.row, cell.col);
            if let Some(job) = cells.get_mut(&key) {
                job.members.push((k, w));
                continue;
            }
            let name = cell.to_string();
            if block.is_some_and(|b| !b.holds(&name)) {
                continue;
            }
            cells.insert(
                key,
                CellJob {
                    cell,
                    name,
                    members: vec![(k, w)],
                },
            );
        }
    }
    cells.into_values().collect()
}

#[cfg(test)]
mod tests {
    use rsembed_raster::lattice::Lattice;
    use rsembed_schemas::task::CellBlock;

    use super::walk_order;

    /// A scene whose corner is lattice pixel (`col0`, `row0`).
    fn placed(col0: i64, row0: i64) -> Lattice {
        Lattice {
            epsg: 32633,
            res: 10.0,
            chip: 64,
            stride: 64,
            col0,
            row0,
        }
    }

    #[test]
    fn cells_are_walked_row_major_each_with_every_acquisition_covering_it() {
        // Two scenes of 128², the second cropped 64 pixels east and south.
        let (a, b) = (placed(640, -7808), placed(704, -7744));
        let windows = |l: &Lattice| {
            let g = l.grid(128, 128);
            g.windows(0..g.rows()).collect::<Vec<_>>()
        };
        let jobs = walk_order(
            [(0, &a, windows(&a)), (1, &b, windows(&b))].into_iter(),
            None,
        );
        let names: Vec<String> = jobs
            .iter()
            .map(|j| format!("{}/{}", j.cell.col, j.cell.row))
            .collect();
        // North to south, west to east; the shared cell once, with both.
        assert_eq!(
            names,
            ["10/-122", "11/-122", "10/-121", "11/-121", "12/-121", "11/-120", "12/-120"]
        );
        let shared = &jobs[3];
        assert_eq!(shared.members.len(), 2, "{}", shared.name);
        assert_eq!(
            (shared.members[0].1.x, shared.members[1].1.x),
            (64, 0),
            "one cell, a window of each scene"
        );
    }

    #[test]
    fn a_block_task_walks_only_its_cells() {
        let a = placed(640, -7808);
        let g = a.grid(128, 128);
        let windows: Vec<_> = g.windows(0..g.rows()).collect();
        let block = CellBlock {
            lattice: "EPSG:32633/10/64".into(),
            col: 11,
            row: -122,
            cols: 1,
            rows: 2,
        };
        let jobs = walk_order([(0, &a, windows)].into_iter(), Some(&block));
        let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
        assert_eq!(
            names,
            ["EPSG:32633/10/64/11/-122", "EPSG:32633/10/64/11/-121"]
        );
        let other = CellBlock {
            lattice: "EPSG:32634/10/64".into(),
            ..block
        };
        let g = a.grid(128, 128);
        let jobs = walk_order(
            [(0, &a, g.windows(0..g.rows()).collect())].into_iter(),
            Some(&other),
        );
        assert!(
            jobs.is_empty(),
            "another lattice's block holds none of them"
        );
    }
}
