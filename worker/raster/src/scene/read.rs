//! Reading a chip's window of a scene: every band file onto the scene grid,
//! then through the stretch to 8-bit RGB.

use rsembed_schemas::ids::Window;

use super::{MaskSource, Scene, SceneError};
use crate::cloud::{is_cloud, CloudCount};
use crate::pixels::Rgb8;
use crate::tiff::{Samples, TiffError, TiffFile, WindowData};

impl Scene {
    /// Reads a window of every source onto the scene grid: 3 channels, valid
    /// where any source has a real pixel (a pixel is nodata only when every band is).
    pub(super) async fn read(&self, win: Window) -> Result<WindowData, SceneError> {
        let (w, h) = (win.width as u32, win.height as u32);
        if let [only] = self.sources.as_slice() {
            if only.factor == 1 {
                return Ok(only
                    .tiff
                    .read_window(0, win.x.into(), win.y.into(), w, h, &only.bands)
                    .await?);
            }
        }
        let n = (w * h) as usize;
        let mut values = Vec::with_capacity(3 * n);
        let mut valid = vec![false; n];
        for src in &self.sources {
            let (c, map) = read_coarse(&src.tiff, &src.bands, src.factor, win).await?;
            let cn = (c.width * c.height) as usize;
            for b in 0..src.bands.len() {
                map.for_each(|i, k| {
                    values.push(c.values.get(b * cn + k));
                    if c.valid[k] {
                        valid[i] = true;
                    }
                });
            }
        }
        Ok(WindowData {
            width: w,
            height: h,
            bands: 3,
            values: Samples::F64(values),
            valid,
        })
    }

    /// The chip's valid pixels (`valid`, of window `win`) and how many of
    /// them `mask` marks as cloud. A mask pixel it cannot give (outside the
    /// mask, or its nodata) is not cloud.
    pub(super) async fn cloud_count(
        &self,
        mask: &MaskSource,
        win: Window,
        valid: &[bool],
    ) -> Result<CloudCount, SceneError> {
        let (c, map) = read_coarse(&mask.tiff, &[0], mask.factor, win).await?;
        let mut count = CloudCount::default();
        map.for_each(|i, k| {
            let cloud = c.valid[k] && is_cloud(mask.kind, c.values.get(k));
            count.add(valid[i], cloud);
        });
        Ok(count)
    }

    pub(super) fn to_rgb8(&self, w: &WindowData) -> Rgb8 {
        let n = (w.width * w.height) as usize;
        let mut data = vec![0u8; n * 3];
        match &w.values {
            // Integer sources map through one table per band, built from
            // `Stretch::apply` itself so both paths give the same bytes.
            Samples::U8(v) => {
                let luts: [[u8; 256]; 3] = std::array::from_fn(|c| {
                    std::array::from_fn(|x| self.stretch.apply(c, x as f64))
                });
                fill_rgb(&mut data, &w.valid, planes(v, n), |c, x| {
                    luts[c][usize::from(x)]
                });
            }
            Samples::U16(v) => {
                let luts = self.u16_luts();
                fill_rgb(&mut data, &w.valid, planes(v, n), |c, x| {
                    luts[c][usize::from(x)]
                });
            }
            Samples::F64(v) => {
                fill_rgb(&mut data, &w.valid, planes(v, n), |c, x| {
                    self.stretch.apply(c, x)
                });
            }
        }
        Rgb8 {
            width: w.width,
            height: w.height,
            data,
        }
    }

    /// 16-bit lookup tables, built on first use and kept for the scene.
    fn u16_luts(&self) -> &[Box<[u8; 65536]>; 3] {
        self.u16_luts.get_or_init(|| {
            std::array::from_fn(|c| {
                let mut t = Box::new([0u8; 65536]);
                for (x, o) in t.iter_mut().enumerate() {
                    *o = self.stretch.apply(c, x as f64);
                }
                t
            })
        })
    }
}

/// The three band planes of a band-sequential window of `n` pixels.
fn planes<T>(v: &[T], n: usize) -> [&[T]; 3] {
    [&v[..n], &v[n..2 * n], &v[2 * n..3 * n]]
}

/// Interleaves three band planes into RGB through `map(channel, sample)`,
/// leaving invalid pixels 0.
fn fill_rgb<T: Copy>(
    data: &mut [u8],
    valid: &[bool],
    [r, g, b]: [&[T]; 3],
    map: impl Fn(usize, T) -> u8,
) {
    let src = r.iter().zip(g).zip(b);
    for ((px, ok), ((r, g), b)) in data.chunks_exact_mut(3).zip(valid).zip(src) {
        if *ok {
            px[0] = map(0, *r);
            px[1] = map(1, *g);
            px[2] = map(2, *b);
        }
    }
}

/// Where each pixel of a scene window falls in a window of a grid `factor`
/// times coarser (nearest neighbour: the coarse pixel that contains it).
pub(super) struct CoarseMap {
    win: Window,
    factor: i64,
    /// The coarse window's origin and width.
    x0: i64,
    y0: i64,
    cw: i64,
}

impl CoarseMap {
    /// Calls `f(i, k)` for every pixel of the scene window, row-major: `i`
    /// its index in the window, `k` the index of its coarse pixel.
    pub(super) fn for_each(&self, mut f: impl FnMut(usize, usize)) {
        let (w, h) = (i64::from(self.win.width), i64::from(self.win.height));
        let mut i = 0;
        for j in 0..h {
            let cy = (i64::from(self.win.y) + j).div_euclid(self.factor) - self.y0;
            for x in 0..w {
                let cx = (i64::from(self.win.x) + x).div_euclid(self.factor) - self.x0;
                f(i, (cy * self.cw + cx) as usize);
                i += 1;
            }
        }
    }
}

/// Reads the part of `tiff` (`bands`, on a grid `factor` times coarser than
/// the scene's) under the scene window `win`, with the map from the scene
/// window's pixels to it.
pub(super) async fn read_coarse(
    tiff: &TiffFile,
    bands: &[usize],
    factor: u32,
    win: Window,
) -> Result<(WindowData, CoarseMap), TiffError> {
    let f = i64::from(factor);
    let (x0, y0) = (
        i64::from(win.x).div_euclid(f),
        i64::from(win.y).div_euclid(f),
    );
    let x1 = (i64::from(win.x) + i64::from(win.width) + f - 1).div_euclid(f);
    let y1 = (i64::from(win.y) + i64::from(win.height) + f - 1).div_euclid(f);
    let (cw, ch) = ((x1 - x0) as u32, (y1 - y0) as u32);
    let c = tiff.read_window(0, x0, y0, cw, ch, bands).await?;
    let map = CoarseMap {
        win,
        factor: f,
        x0,
        y0,
        cw: i64::from(cw),
    };
    Ok((c, map))
}
