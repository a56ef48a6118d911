//! Scaling source samples to the 8 bits the model's preprocessor expects.
//!
//! `--scale auto` keeps 8-bit data as it is and stretches anything else by the
//! scene's own 2nd–98th percentiles per band, computed once per scene (from an
//! overview or a decimated read), never per chip: chips of one scene must stay
//! comparable, and a per-chip stretch would turn a uniform field into noise.

/// The `--scale` flag.
///
/// A scene whose item gives physical units (STAC `raster:scale` and
/// `raster:offset`: physical = DN·scale + offset) changes only `Range`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScaleSpec {
    /// None for 8-bit data, scene percentiles otherwise. Physical units change
    /// nothing: percentiles are taken per band, and a linear map commutes
    /// with them, so the stored numbers give the same 8 bits.
    Auto,
    /// Values are clamped to 0–255 as they are stored, physical units or not.
    None,
    /// Linear from `min..max` to 0–255, the same for every band. With
    /// physical units, `min` and `max` are physical values, so each channel
    /// has its own range of stored numbers (a Sentinel-2 L2A band after
    /// baseline 04.00, DN + 1000 with offset −0.1, gives the same bytes as one
    /// before it).
    Range(f64, f64),
}

impl std::str::FromStr for ScaleSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<ScaleSpec, String> {
        match s {
            "auto" => Ok(ScaleSpec::Auto),
            "none" => Ok(ScaleSpec::None),
            _ => {
                let (a, b) = s
                    .split_once(':')
                    .ok_or_else(|| format!("`{s}` is not auto, none or MIN:MAX"))?;
                let lo: f64 = a.trim().parse().map_err(|_| format!("bad MIN in `{s}`"))?;
                let hi: f64 = b.trim().parse().map_err(|_| format!("bad MAX in `{s}`"))?;
                if !(lo.is_finite() && hi.is_finite() && hi > lo) {
                    return Err(format!("`{s}`: MIN:MAX needs finite MIN < MAX"));
                }
                Ok(ScaleSpec::Range(lo, hi))
            }
        }
    }
}

/// A per-band linear map to 0–255.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Stretch {
    /// (min, max) per band; `None` means clamp as is.
    pub bands: Vec<Option<(f64, f64)>>,
}

impl Stretch {
    /// The identity (clamp to 0–255) for `n` bands.
    pub fn identity(n: usize) -> Stretch {
        Stretch {
            bands: vec![None; n],
        }
    }

    /// The same range for every band.
    pub fn uniform(n: usize, lo: f64, hi: f64) -> Stretch {
        Stretch {
            bands: vec![Some((lo, hi)); n],
        }
    }

    /// Maps one sample of band `b` to 8 bits, rounding to nearest.
    pub fn apply(&self, b: usize, v: f64) -> u8 {
        let v = match self.bands[b] {
            None => v,
            Some((lo, hi)) => (v - lo) * 255.0 / (hi - lo),
        };
        if v.is_nan() {
            0
        } else {
            v.round().clamp(0.0, 255.0) as u8
        }
    }
}

/// The `q`-quantile (0–1) of `values`, by nearest rank.
///
/// Selection, not a sort: a 16-bit scene's sample is a million values per
/// band. `values` is reordered; NaNs must already be filtered out.
pub(crate) fn quantile(values: &mut [f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let idx = ((values.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
    let (_, v, _) = values.select_nth_unstable_by(idx, |a, b| a.total_cmp(b));
    Some(*v)
}

/// Scene-level 2nd–98th percentile stretch from per-band samples of valid pixels.
///
/// A band whose percentiles coincide (a constant band) keeps a one-unit range,
/// so it maps to a flat value instead of dividing by zero.
pub(crate) fn percentile_stretch(mut samples: Vec<Vec<f64>>) -> Stretch {
    let bands = samples
        .iter_mut()
        .map(|s| {
            let lo = quantile(s, 0.02)?;
            let hi = quantile(s, 0.98)?;
            Some(if hi > lo { (lo, hi) } else { (lo, lo + 1.0) })
        })
        .collect();
    Stretch { bands }
}

/// Scenes whose `--scale auto` stretch a process remembers.
const STRETCH_CACHE_ENTRIES: usize = 4096;

/// `--scale auto` stretches already computed in this process, by scene.
///
/// The stretch is a pure function of the scene's bytes and bands, so a task
/// of a scene that another task of this process already opened takes it from
/// here instead of reading the sample again: the answer is the same either
/// way, which keeps every task of a scene on one stretch whichever worker runs
/// it. Concurrent tasks of one scene wait for the first to finish instead of
/// reading the sample side by side. Failures are not remembered.
pub struct StretchCache {
    /// Oldest first; a few thousand entries of a few dozen bytes.
    entries: std::sync::Mutex<std::collections::VecDeque<(String, Slot)>>,
}

type Slot = std::sync::Arc<futures::lock::Mutex<Option<Stretch>>>;

impl Default for StretchCache {
    fn default() -> Self {
        StretchCache {
            entries: std::sync::Mutex::new(std::collections::VecDeque::new()),
        }
    }
}

impl StretchCache {
    /// The stretch remembered under `key`, or `compute`'s, remembered when it succeeds.
    pub(crate) async fn get_or_compute<E>(
        &self,
        key: &str,
        compute: impl std::future::Future<Output = Result<Stretch, E>>,
    ) -> Result<Stretch, E> {
        let slot = {
            let mut entries = self
                .entries
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match entries.iter().find(|(k, _)| k == key) {
                Some((_, slot)) => slot.clone(),
                None => {
                    if entries.len() >= STRETCH_CACHE_ENTRIES {
                        entries.pop_front();
                    }
                    let slot = Slot::default();
                    entries.push_back((key.to_owned(), slot.clone()));
                    slot
                }
            }
        };
        let mut held = slot.lock().await;
        if let Some(s) = held.as_ref() {
            return Ok(s.clone());
        }
        let s = compute.await?;
        *held = Some(s.clone());
        Ok(s)
    }

    /// Scenes remembered.
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Whether nothing is remembered yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_flag() {
        assert_eq!("auto".parse::<ScaleSpec>(), Ok(ScaleSpec::Auto));
        assert_eq!("none".parse::<ScaleSpec>(), Ok(ScaleSpec::None));
        assert_eq!(
            "0:3000".parse::<ScaleSpec>(),
            Ok(ScaleSpec::Range(0.0, 3000.0))
        );
        assert!("5:5".parse::<ScaleSpec>().is_err());
        assert!("x".parse::<ScaleSpec>().is_err());
    }

    #[test]
    fn linear_map_rounds_and_clamps() {
        let s = Stretch::uniform(1, 0.0, 1000.0);
        assert_eq!(s.apply(0, 0.0), 0);
        assert_eq!(s.apply(0, 500.0), 128);
        assert_eq!(s.apply(0, 1000.0), 255);
        assert_eq!(s.apply(0, 5000.0), 255);
        assert_eq!(s.apply(0, -5.0), 0);
        assert_eq!(Stretch::identity(1).apply(0, 300.0), 255);
        assert_eq!(Stretch::identity(1).apply(0, f64::NAN), 0);
    }

    #[test]
    fn percentiles_ignore_outliers() {
        let mut v: Vec<f64> = (0..1000).map(f64::from).collect();
        v.push(1e9);
        let s = percentile_stretch(vec![v, vec![7.0; 10]]);
        let (lo, hi) = s.bands[0].unwrap();
        assert!(
            (lo - 20.0).abs() <= 1.0 && (hi - 980.0).abs() <= 1.0,
            "{lo} {hi}"
        );
        assert_eq!(s.bands[1], Some((7.0, 8.0)));
        assert_eq!(percentile_stretch(vec![vec![]]).bands[0], None);
    }

    #[test]
    fn cache_computes_once_per_key_and_forgets_failures() {
        let cache = StretchCache::default();
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let compute = |lo: f64| {
            let runs = &runs;
            async move {
                runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok::<_, String>(Stretch::uniform(3, lo, lo + 10.0))
            }
        };
        futures::executor::block_on(async {
            let a = cache.get_or_compute("a", compute(1.0)).await.unwrap();
            let again = cache.get_or_compute("a", compute(99.0)).await.unwrap();
            assert_eq!(a, again, "the first stretch of a scene is kept");
            let b = cache.get_or_compute("b", compute(5.0)).await.unwrap();
            assert_ne!(a, b);
            let failed = cache
                .get_or_compute("c", async { Err::<Stretch, _>("io".to_owned()) })
                .await;
            assert!(failed.is_err());
            let c = cache.get_or_compute("c", compute(7.0)).await.unwrap();
            assert_eq!(c, Stretch::uniform(3, 7.0, 17.0), "a failure is retried");
        });
        assert_eq!(
            runs.into_inner(),
            3,
            "one computation per key that succeeded"
        );
        assert_eq!(cache.len(), 3);
    }
}
