//! `--composite best`: of a window's acquisitions, each cell's chip comes
//! from the clearest one. A cell's chips are read (`decode_concurrency` at
//! once) as 8-bit chips, 192 KiB each at 256 pixels, and only the chosen one
//! is preprocessed and embedded.

use std::cmp::Ordering as Order;
use std::sync::Arc;

use rsembed_raster::scene::SceneChip;
use rsembed_schemas::chip::ErrorStage;
use rsembed_schemas::task::TaskInput;

use super::{read_chips, CellJob, CellOutcome, Walk};
use crate::input::input_error;
use crate::input::scene::prepared;

/// What ranks a chip among a cell's candidates.
#[derive(Debug, Clone, Copy)]
struct Rank<'a> {
    cloud: Option<f32>,
    valid: f32,
    time: Option<i64>,
    uri: &'a str,
}

impl<'a> Rank<'a> {
    fn of(chip: &SceneChip, input: &'a TaskInput) -> Rank<'a> {
        Rank {
            cloud: chip.cloud_fraction,
            valid: chip.valid_fraction,
            time: input.item.as_deref().and_then(|i| i.datetime),
            uri: &input.uri,
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

/// A cell read: its clearest chip so far.
pub(super) struct Read {
    name: String,
    out: CellOutcome,
    best: Option<(usize, SceneChip)>,
}

/// Reads the cell's chip of each acquisition that covers it and keeps the
/// clearest.
pub(super) async fn read(walk: Arc<Walk>, job: CellJob) -> Read {
    let mut out = CellOutcome::default();
    let chips = read_chips(&walk, job.members, &mut out, |s, w, m| {
        Box::pin(s.chip(w, m))
    })
    .await;
    out.scenes = chips.len() as i32;
    let input = |k: usize| &walk.acquisitions[k].as_ref().expect("read").input;
    let mut best: Option<(usize, SceneChip)> = None;
    for (k, chip) in chips {
        let replace = best
            .as_ref()
            .is_none_or(|(h, held)| Rank::of(&chip, input(k)).better(&Rank::of(held, input(*h))));
        if replace {
            best = Some((k, chip));
        }
    }
    Read {
        name: job.name,
        out,
        best,
    }
}

/// The cell's clearest chip, preprocessed as that acquisition's chip (its
/// `chip_id`, `source_uri` and window); none when it is all cloud (the cell
/// is unclear).
pub(super) async fn finish(walk: &Walk, read: Read) -> (String, CellOutcome) {
    let Read {
        name,
        mut out,
        best,
    } = read;
    let Some((k, chip)) = best else {
        return (name, out);
    };
    if chip.cloud_fraction.is_some_and(|c| c >= 1.0) {
        out.unclear = true;
        return (name, out);
    }
    let input = &walk.acquisitions[k].as_ref().expect("chosen").input;
    match prepared(&walk.ctx.pre, input, chip).await {
        Ok(p) => out.row = Some(p),
        Err(e) => out
            .errors
            .push((k, input_error(input, ErrorStage::Preprocess, e))),
    }
    (name, out)
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
