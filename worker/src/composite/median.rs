//! `--composite median`: per pixel and band, the median of the clear, valid
//! samples of the window's acquisitions that cover the cell, in physical
//! units (`DN·raster:scale + raster:offset` where the item gives units),
//! then the job's fixed `--scale` to 8 bits and the model's preprocessing.
//!
//! An odd count's median is one acquisition's sample, which goes through
//! that acquisition's own stretch as it is: a median of one acquisition is
//! that acquisition's chip, byte for byte. An even count's is the mean of
//! the two middle physical values (numpy's `median`), put in the stored
//! numbers of the lower one's acquisition and through its stretch. A pixel
//! without a clear valid sample is padding (0) in the result.

use std::sync::Arc;

use rsembed_raster::pixels::Rgb8;
use rsembed_raster::scene::SampleChip;
use rsembed_schemas::chip::ErrorStage;
use rsembed_schemas::chip_file::rows::StacColumns;
use rsembed_schemas::ids::{composite_chip_id, Window};
use rsembed_schemas::task::TaskInput;

use super::{read_chips, CellJob, CellOutcome, Walk};
use crate::input::scene::preprocess;
use crate::input::{input_error, Prepared, RowIdentity};

/// One clear sample of a pixel's band.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    /// Its physical value (what the median orders by).
    pub(crate) physical: f64,
    /// Its stored number.
    pub(crate) stored: f64,
    /// The acquisition it came from (its index in the cell's list).
    pub(crate) from: usize,
}

/// A pixel's median, as what maps it to 8 bits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Median {
    /// An odd count: the middle sample, a stored number of acquisition `from`.
    Sample { from: usize, stored: f64 },
    /// An even count: the mean of the two middle physical values; `from` is
    /// the lower one's acquisition, whose stretch maps it.
    Mean { from: usize, physical: f64 },
}

/// The median of `samples` (reordered: by physical value, ties by
/// acquisition, so the answer does not depend on the order they came in);
/// `None` for none.
pub(crate) fn median(samples: &mut [Sample]) -> Option<Median> {
    let n = samples.len();
    if n == 0 {
        return None;
    }
    samples.sort_unstable_by(|a, b| a.physical.total_cmp(&b.physical).then(a.from.cmp(&b.from)));
    let m = n / 2;
    Some(if n % 2 == 1 {
        Median::Sample {
            from: samples[m].from,
            stored: samples[m].stored,
        }
    } else {
        let (lo, hi) = (samples[m - 1], samples[m]);
        Median::Mean {
            from: lo.from,
            physical: (lo.physical + hi.physical) / 2.0,
        }
    })
}

/// The composite of a cell's chips (`chips[j]` from acquisition `scenes[j]`).
struct Composed {
    rgb: Rgb8,
    /// Share of pixels with at least one clear valid sample.
    valid_fraction: f32,
    /// Share of the valid pixels without a clear sample; `None` when no
    /// acquisition of the cell has a cloud mask.
    cloud_fraction: Option<f32>,
    /// Which chips gave a clear pixel.
    contributed: Vec<bool>,
    /// Pixels with a clear sample.
    clear: usize,
}

fn compose(scenes: &[&rsembed_raster::scene::Scene], chips: &[SampleChip]) -> Composed {
    let w = chips[0].window;
    let n = (w.width as usize) * (w.height as usize);
    let mut data = vec![0u8; n * 3];
    let mut contributed = vec![false; chips.len()];
    let (mut valid, mut clear) = (0usize, 0usize);
    let mut samples = Vec::with_capacity(chips.len());
    for i in 0..n {
        if chips.iter().any(|c| c.valid[i]) {
            valid += 1;
        }
        let mut any = false;
        for (j, c) in chips.iter().enumerate() {
            if c.clear[i] {
                any = true;
                contributed[j] = true;
            }
        }
        if !any {
            continue;
        }
        clear += 1;
        for band in 0..3 {
            samples.clear();
            for (j, c) in chips.iter().enumerate() {
                if !c.clear[i] {
                    continue;
                }
                let stored = f64::from(c.values[band * n + i]);
                let physical = scenes[j].physical(band, stored);
                if !physical.is_nan() {
                    samples.push(Sample {
                        physical,
                        stored,
                        from: j,
                    });
                }
            }
            data[i * 3 + band] = match median(&mut samples) {
                None => 0,
                Some(Median::Sample { from, stored }) => scenes[from].to_u8(band, stored),
                Some(Median::Mean { from, physical }) => {
                    let s = scenes[from];
                    s.to_u8(band, s.stored(band, physical))
                }
            };
        }
    }
    let masked = chips.iter().any(|c| c.cloud_fraction.is_some());
    Composed {
        rgb: Rgb8 {
            width: w.width as u32,
            height: w.height as u32,
            data,
        },
        valid_fraction: clear as f32 / n.max(1) as f32,
        cloud_fraction: masked.then(|| ((valid - clear) as f64 / valid.max(1) as f64) as f32),
        contributed,
        clear,
    }
}

/// The window's text in a median row's `source_uri`: its ISO 8601
/// interval, `start/end` in RFC 3339 UTC.
pub(crate) fn window_text(start: i64, end: i64) -> String {
    let f =
        |us: i64| rsembed_schemas::datetime::micros_rfc3339(us).unwrap_or_else(|| us.to_string());
    format!("{}/{}", f(start), f(end))
}

/// A cell read: the samples of every acquisition that gave a chip.
pub(super) struct Read {
    job: CellJob,
    out: CellOutcome,
    chips: Vec<(usize, SampleChip)>,
}

/// Reads the cell's samples of each acquisition that covers it, in
/// acquisition order.
pub(super) async fn read(walk: Arc<Walk>, job: CellJob) -> Read {
    let mut out = CellOutcome::default();
    let chips = read_chips(&walk, job.members.clone(), &mut out, |s, w, m| {
        Box::pin(s.sample_chip(w, m))
    })
    .await;
    Read { job, out, chips }
}

/// The cell's median row; none when no acquisition has a clear pixel in it
/// (the cell is unclear when some gave a chip).
pub(super) async fn finish(walk: &Arc<Walk>, read: Read) -> (String, CellOutcome) {
    let Read {
        job,
        mut out,
        chips,
    } = read;
    if chips.is_empty() {
        return (job.name, out);
    }
    let blocking = walk.clone();
    let ks: Vec<usize> = chips.iter().map(|c| c.0).collect();
    let (ks, chips, composed) = match tokio::task::spawn_blocking(move || {
        let (ks, chips): (Vec<usize>, Vec<SampleChip>) = chips.into_iter().unzip();
        let scenes: Vec<_> = ks
            .iter()
            .map(|k| &blocking.acquisitions[*k].as_ref().expect("read").scene)
            .collect();
        let c = compose(&scenes, &chips);
        (ks, chips, c)
    })
    .await
    {
        Ok(r) => r,
        Err(join) => {
            let e = std::io::Error::other(format!("median panicked: {join}"));
            let a = &walk.acquisitions[ks[0]].as_ref().expect("read").input;
            out.errors
                .push((ks[0], input_error(a, ErrorStage::Preprocess, e)));
            return (job.name, out);
        }
    };
    out.scenes = composed.contributed.iter().filter(|c| **c).count() as i32;
    if composed.clear == 0 {
        out.unclear = true;
        return (job.name, out);
    }
    let first = &chips[0];
    let s = i64::from(job.cell.stride);
    let corner = (
        i32::try_from(job.cell.col * s),
        i32::try_from(job.cell.row * s),
    );
    let (Ok(x), Ok(y)) = corner else {
        let e = std::io::Error::other(format!(
            "cell {}: its lattice position does not fit a row's x and y (32 bits)",
            job.name
        ));
        let a = &walk.acquisitions[ks[0]].as_ref().expect("read").input;
        out.errors
            .push((ks[0], input_error(a, ErrorStage::Decode, e)));
        return (job.name, out);
    };
    let window = Window {
        x,
        y,
        width: first.window.width,
        height: first.window.height,
    };
    let inputs: Vec<&TaskInput> = ks
        .iter()
        .map(|k| &walk.acquisitions[*k].as_ref().expect("read").input)
        .collect();
    let pixels = match preprocess(&walk.ctx.pre, composed.rgb).await {
        Ok(p) => p,
        Err(e) => {
            out.errors
                .push((ks[0], input_error(inputs[0], ErrorStage::Preprocess, e)));
            return (job.name, out);
        }
    };
    let (start, end) = (walk.window.start, walk.window.end);
    let uri = format!("rsembed:median/{}/{}", job.name, window_text(start, end));
    // The collection, when every acquisition of the cell is of one.
    let collection = inputs[0].item.as_ref().and_then(|i| i.collection.clone());
    let collection = collection.filter(|c| {
        inputs
            .iter()
            .all(|i| i.item.as_ref().and_then(|i| i.collection.as_ref()) == Some(c))
    });
    let identity = RowIdentity {
        chip_id: composite_chip_id(&job.name, start, end, "median", &walk.tiling_fp),
        stac: StacColumns {
            collection,
            cloud_fraction: composed.cloud_fraction,
            ..StacColumns::default()
        },
    };
    out.row = Some(Prepared {
        input: TaskInput {
            uri,
            size: 0,
            version: None,
            chips: None,
            parts: vec![],
            item: None,
        },
        window,
        valid_fraction: composed.valid_fraction,
        crs: first.crs.clone(),
        footprint: first.footprint.clone(),
        centre: first.centre,
        cloud_fraction: composed.cloud_fraction,
        cell: Some(job.name.clone()),
        pixels,
        identity: Some(Box::new(identity)),
        queued: crate::metrics::global().queue_chips.hold(1),
    });
    (job.name, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(physical: f64, from: usize) -> Sample {
        Sample {
            physical,
            stored: physical * 10.0,
            from,
        }
    }

    #[test]
    fn odd_counts_give_the_middle_sample_itself() {
        let mut v = [s(3.0, 0), s(1.0, 1), s(2.0, 2)];
        assert_eq!(
            median(&mut v),
            Some(Median::Sample {
                from: 2,
                stored: 20.0
            })
        );
        let mut one = [s(7.5, 4)];
        assert_eq!(
            median(&mut one),
            Some(Median::Sample {
                from: 4,
                stored: 75.0
            }),
            "one sample is its own median, as stored"
        );
    }

    #[test]
    fn even_counts_give_the_mean_of_the_two_middle_values() {
        let mut v = [s(4.0, 0), s(1.0, 1), s(2.0, 2), s(100.0, 3)];
        // numpy.median([4, 1, 2, 100]) == 3.0; mapped by the lower one's scene.
        assert_eq!(
            median(&mut v),
            Some(Median::Mean {
                from: 2,
                physical: 3.0
            })
        );
        // Equal values: ties are ordered by acquisition, whatever order they came in.
        let mut a = [s(2.0, 1), s(2.0, 0)];
        let mut b = [s(2.0, 0), s(2.0, 1)];
        assert_eq!(median(&mut a), median(&mut b));
        assert_eq!(
            median(&mut a),
            Some(Median::Mean {
                from: 0,
                physical: 2.0
            })
        );
    }

    #[test]
    fn no_clear_sample_has_no_median() {
        assert_eq!(median(&mut []), None);
    }

    #[test]
    fn the_window_is_its_iso_interval() {
        // 2024-01-01 and 2024-04-01, UTC.
        assert_eq!(
            window_text(1_704_067_200_000_000, 1_711_929_600_000_000),
            "2024-01-01T00:00:00Z/2024-04-01T00:00:00Z"
        );
    }
}
