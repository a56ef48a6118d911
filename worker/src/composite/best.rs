//! `--composite best`: of a window's acquisitions, each cell's chip comes
//! from the clearest one. A cell's chips are read one acquisition after
//! another (`decode_concurrency` at once), and a worse one is dropped as
//! soon as it is read, so a cell holds a few 8-bit chips at most and only
//! its chosen chip is preprocessed and embedded.

use std::cmp::Ordering as Order;
use std::sync::Arc;

use futures::StreamExt;

use rsembed_raster::scene::SceneChip;
use rsembed_schemas::chip::ErrorStage;
use rsembed_schemas::task::TaskInput;

use super::{CellJob, CellOutcome, Walk};
use crate::input::scene::preprocess;
use crate::input::{input_error, Prepared};

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

/// Reads the cell's chip of each acquisition that covers it (`walk.conc`
/// at once) and keeps the clearest.
pub(super) async fn read(walk: Arc<Walk>, job: CellJob) -> Read {
    let mut out = CellOutcome::default();
    let mut best: Option<(usize, SceneChip)> = None;
    let mut chips = futures::stream::iter(job.members)
        .map(|(k, w)| {
            let walk = walk.clone();
            async move {
                let Some(a) = &walk.acquisitions[k] else {
                    return (k, Ok(None));
                };
                (k, a.scene.chip(w, walk.ctx.tiling.min_valid).await)
            }
        })
        .buffered(walk.conc);
    while let Some((k, chip)) = chips.next().await {
        let Some(a) = &walk.acquisitions[k] else {
            continue;
        };
        let chip = match chip {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                // The cell is chosen among the others (see docs/time.md).
                out.errors
                    .push((k, input_error(&a.input, ErrorStage::Decode, e)));
                continue;
            }
        };
        if let (Some(max), Some(cloud)) = (walk.ctx.tiling.max_cloud, chip.cloud_fraction) {
            if cloud > max {
                out.cloudy += 1;
                crate::metrics::global().cloudy_chips_dropped.inc_by(1);
                continue;
            }
        }
        out.scenes += 1;
        out.with_chips.push(k);
        let replace = match &best {
            None => true,
            Some((h, held)) => {
                let held_input = &walk.acquisitions[*h].as_ref().expect("held").input;
                Rank::of(&chip, &a.input).better(&Rank::of(held, held_input))
            }
        };
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
    match preprocess(&walk.ctx.pre, chip.rgb).await {
        Ok(pixels) => {
            out.row = Some(Prepared {
                input: input.clone(),
                window: chip.window,
                valid_fraction: chip.valid_fraction,
                crs: chip.crs,
                footprint: chip.footprint,
                centre: chip.centre,
                cloud_fraction: chip.cloud_fraction,
                cell: chip.cell,
                pixels,
                identity: None,
                queued: crate::metrics::global().queue_chips.hold(1),
            })
        }
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
