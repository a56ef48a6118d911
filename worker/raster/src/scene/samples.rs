//! A chip's samples for a composite (`--composite median`): its stored
//! numbers as they are, before any stretch, with which pixels are valid and
//! which are clear of cloud; and the maps between stored numbers, physical
//! units and the scene's fixed 8 bits.
//!
//! The samples stay stored numbers (f32) rather than physical values: a
//! physical value `DN·scale + offset` turned back into a stored number is not
//! always the same double, and a stored number that lands on a rounding edge
//! of the stretch (8.5, say) would then give another byte. Kept as stored,
//! a sample goes through exactly what the scene's own chip goes through.

use rsembed_schemas::ids::Window;

use super::{MaskSource, Scene, SceneError};
use crate::cloud::{is_cloud, CloudCount};

/// One chip of a scene as samples.
#[derive(Debug, Clone)]
pub struct SampleChip {
    /// The chip's window of the scene.
    pub window: Window,
    /// Share of real, non-nodata pixels, as [`super::SceneChip`] counts it.
    pub valid_fraction: f32,
    /// Share of the valid pixels the cloud mask marks as cloud; `None`
    /// without a mask.
    pub cloud_fraction: Option<f32>,
    /// Stored numbers, band-sequential: `values[c·n + i]`, `n` = width × height.
    pub values: Vec<f32>,
    /// Per pixel: a real, non-nodata sample.
    pub valid: Vec<bool>,
    /// Per pixel: valid and not cloud (every valid pixel without a mask).
    pub clear: Vec<bool>,
    /// Source CRS label.
    pub crs: Option<String>,
    /// Lon/lat footprint, as the scene's chip of this window has it.
    pub footprint: Option<crate::geo::Footprint>,
    /// Lon/lat of the window's centre.
    pub centre: Option<[f64; 2]>,
    /// The chip's cell of the CRS lattice.
    pub cell: Option<String>,
}

impl Scene {
    /// Reads one chip as samples; `None` exactly when [`Scene::chip`] of
    /// the same window gives `None` (below `min_valid`, or no valid pixel).
    pub async fn sample_chip(
        &self,
        window: Window,
        min_valid: Option<f32>,
    ) -> Result<Option<SampleChip>, SceneError> {
        let w = self.read(window).await?;
        let Some(valid_fraction) = super::kept(&w.valid, min_valid) else {
            return Ok(None);
        };
        let (clear, cloud_fraction) = match &self.mask {
            Some(m) => {
                let (clear, count) = self.clear_pixels(m, window, &w.valid).await?;
                (clear, count.fraction())
            }
            None => (w.valid.clone(), None),
        };
        let n = w.valid.len();
        let values = (0..3 * n).map(|i| w.values.get(i) as f32).collect();
        let place = self.place(window);
        Ok(Some(SampleChip {
            window,
            valid_fraction,
            cloud_fraction,
            values,
            valid: w.valid,
            clear,
            crs: self.crs_label.clone(),
            footprint: place.footprint,
            centre: place.centre,
            cell: place.cell,
        }))
    }

    /// Per pixel of `win`: valid and not cloud; and the count that gives
    /// the chip's `cloud_fraction` ([`Scene::cloud_count`]'s, pixel for pixel).
    async fn clear_pixels(
        &self,
        mask: &MaskSource,
        win: Window,
        valid: &[bool],
    ) -> Result<(Vec<bool>, CloudCount), SceneError> {
        let (c, map) = super::read::read_coarse(&mask.tiff, &[0], mask.factor, win).await?;
        let mut count = CloudCount::default();
        let mut clear = vec![false; valid.len()];
        map.for_each(|i, k| {
            let cloud = c.valid[k] && is_cloud(mask.kind, c.values.get(k));
            count.add(valid[i], cloud);
            clear[i] = valid[i] && !cloud;
        });
        Ok((clear, count))
    }

    /// The physical value of a stored number of channel `c`: `DN·scale +
    /// offset` where the scene's item gives units, else the number itself.
    pub fn physical(&self, c: usize, stored: f64) -> f64 {
        match self.units.get(c).copied().flatten() {
            Some(u) => stored * u.scale + u.offset,
            None => stored,
        }
    }

    /// The stored number of channel `c` whose physical value is `physical`
    /// (the inverse of [`Scene::physical`]).
    pub fn stored(&self, c: usize, physical: f64) -> f64 {
        match self.units.get(c).copied().flatten() {
            Some(u) => (physical - u.offset) / u.scale,
            None => physical,
        }
    }

    /// A stored number of channel `c` in the scene's 8 bits: the byte the
    /// scene's own chip gives a pixel of that number (the same
    /// `Stretch::apply`; a `--scale auto` stretch is the scene's own).
    pub fn to_u8(&self, c: usize, stored: f64) -> u8 {
        self.stretch.apply(c, stored)
    }
}
