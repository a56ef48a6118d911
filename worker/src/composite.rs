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

/// What ranks a chip among a cell's candidates.
#[derive(Debug, Clone, Copy)]
struct Rank<'a> {
    cloud: Option<f32>,
    valid: f32,
    time: Option<i64>,
    uri: &'a str,
}

impl<'a> Rank<'a> {
    fn of(p: &'a Prepared) -> Rank<'a> {
        Rank {
            cloud: p.cloud_fraction,
            valid: p.valid_fraction,
            time: p.input.item.as_deref().and_then(|i| i.datetime),
            uri: &p.input.uri,
        }
    }

    /// Whether `self` is a clearer choice than `other`: lower
    /// `cloud_fraction` (none counts as 0: nothing says it is cloudy), then
    /// higher `valid_fraction`, then the later acquisition, then the URL, so
    /// the choice does not depend on the order the chips were read in.
    fn better(&self, other: &Rank<'_>) -> bool {
        let cloud = |r: &Rank<'_>| r.cloud.unwrap_or(0.0);
        let o = cloud(other)
            .total_cmp(&cloud(self))
            .then(self.valid.total_cmp(&other.valid))
            .then(self.time.cmp(&other.time))
            .then_with(|| other.uri.cmp(self.uri));
        o == Order::Greater
    }
}

fn better(a: &Prepared, b: &Prepared) -> bool {
    Rank::of(a).better(&Rank::of(b))
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

#[cfg(test)]
mod tests {
    use super::Rank;

    fn r(cloud: Option<f32>, valid: f32, time: i64, uri: &str) -> Rank<'_> {
        Rank {
            cloud,
            valid,
            time: Some(time),
            uri,
        }
    }

    #[test]
    fn clearest_then_fullest_then_latest() {
        let clear = r(Some(0.0), 0.5, 1, "a");
        let cloudy = r(Some(0.2), 1.0, 9, "b");
        assert!(clear.better(&cloudy) && !cloudy.better(&clear));
        // No cloud mask says nothing is cloudy: as clear as 0.
        let unknown = r(None, 0.9, 1, "c");
        assert!(unknown.better(&clear), "fuller at equal cloud");
        assert!(unknown.better(&cloudy));
        let later = r(Some(0.0), 0.5, 2, "d");
        assert!(later.better(&clear), "later at equal cloud and valid");
        // Ties end on the URL, either way round the same.
        let twin = r(Some(0.0), 0.5, 1, "b");
        assert!(clear.better(&twin) != twin.better(&clear));
        assert!(!clear.better(&clear));
    }
}
