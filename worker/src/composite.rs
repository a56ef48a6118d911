//! `--composite best`: of a window's acquisitions, each cell's chip comes
//! from the clearest one. The stage sits between the readers and the
//! batcher: it holds the best chip of each cell so far (a worse one is
//! dropped as soon as it is seen), and sends the winners on once every
//! acquisition is read, so only the chosen chips are embedded. Its memory
//! is one prepared chip per cell of the task.

use std::cmp::Ordering as Order;
use std::collections::{BTreeMap, HashMap, HashSet};

use tokio::sync::mpsc;

use crate::input::{Item, Prepared};

/// What the stage saw, for the rows and the summary.
#[derive(Debug, Default)]
pub(crate) struct Chosen {
    /// Per cell: the acquisitions with valid pixels in it.
    pub(crate) scenes: HashMap<String, i32>,
    /// The inputs that gave a chip, chosen or not.
    pub(crate) inputs_with_chips: HashSet<String>,
    /// Cells whose every acquisition was all cloud: no row.
    pub(crate) unclear_cells: u64,
}

/// Whether `a` is a clearer choice than `b`: lower `cloud_fraction` (none
/// counts as 0: nothing says it is cloudy), then higher `valid_fraction`,
/// then the later acquisition, then the URL, so the choice does not depend
/// on the order the chips were read in.
fn better(a: &Prepared, b: &Prepared) -> bool {
    let cloud = |p: &Prepared| p.cloud_fraction.unwrap_or(0.0);
    let time = |p: &Prepared| p.input.item.as_deref().and_then(|i| i.datetime);
    let o = cloud(b)
        .total_cmp(&cloud(a))
        .then(a.valid_fraction.total_cmp(&b.valid_fraction))
        .then(time(a).cmp(&time(b)))
        .then_with(|| b.input.uri.cmp(&a.input.uri));
    o == Order::Greater
}

/// Reads every item of `rx`, sends error rows on at once and each cell's
/// clearest chip once `rx` ends. A chip without a cell (not on a lattice)
/// is sent on as it is.
pub(crate) async fn best_per_cell(mut rx: mpsc::Receiver<Item>, tx: mpsc::Sender<Item>) -> Chosen {
    let mut chosen = Chosen::default();
    // Ordered by cell, so the winners go to the batcher in one order.
    let mut best: BTreeMap<String, Prepared> = BTreeMap::new();
    while let Some(item) = rx.recv().await {
        let p = match item {
            Ok(p) => p,
            Err(e) => {
                if tx.send(Err(e)).await.is_err() {
                    return chosen;
                }
                continue;
            }
        };
        chosen.inputs_with_chips.insert(p.input.uri.clone());
        let Some(cell) = p.cell.clone() else {
            if tx.send(Ok(p)).await.is_err() {
                return chosen;
            }
            continue;
        };
        *chosen.scenes.entry(cell.clone()).or_default() += 1;
        match best.get(&cell) {
            Some(held) if !better(&p, held) => {}
            _ => {
                best.insert(cell, p);
            }
        }
    }
    for (_, p) in best {
        if p.cloud_fraction.is_some_and(|c| c >= 1.0) {
            chosen.unclear_cells += 1;
            continue;
        }
        if tx.send(Ok(p)).await.is_err() {
            break;
        }
    }
    chosen
}
