//! Reading a chip's window of a scene: every band file onto the scene grid,
//! then through the stretch to 8-bit RGB.

use rsembed_schemas::ids::Window;

use super::{Scene, SceneError};
use crate::image::Rgb8;
use crate::tiff::{Samples, WindowData};

impl Scene {
    /// Reads a window of every source onto the scene grid: 3 channels, valid
    /// where any source has a real pixel (a pixel is nodata only when every band is).
    pub(super) async fn read(&self, win: Window) -> Result<WindowData, SceneError> {
        let (w, h) = (win.width as u32, win.height as u32);
        if let [only] = self.sources.as_slice() {
            return Ok(only
                .tiff
                .read_window(0, win.x.into(), win.y.into(), w, h, &only.bands)
                .await?);
        }
        let n = (w * h) as usize;
        let mut values = Vec::with_capacity(3 * n);
        let mut valid = vec![false; n];
        for src in &self.sources {
            let f = i64::from(src.factor);
            let (x0, y0) = (
                i64::from(win.x).div_euclid(f),
                i64::from(win.y).div_euclid(f),
            );
            let x1 = (i64::from(win.x) + i64::from(w) + f - 1).div_euclid(f);
            let y1 = (i64::from(win.y) + i64::from(h) + f - 1).div_euclid(f);
            let (cw, ch) = ((x1 - x0) as u32, (y1 - y0) as u32);
            let c = src.tiff.read_window(0, x0, y0, cw, ch, &src.bands).await?;
            let cn = (cw * ch) as usize;
            for b in 0..src.bands.len() {
                for j in 0..h as i64 {
                    let cy = (i64::from(win.y) + j).div_euclid(f) - y0;
                    for i in 0..w as i64 {
                        let cx = (i64::from(win.x) + i).div_euclid(f) - x0;
                        let k = (cy * i64::from(cw) + cx) as usize;
                        values.push(c.values.get(b * cn + k));
                        if c.valid[k] {
                            valid[(j * i64::from(w) + i) as usize] = true;
                        }
                    }
                }
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
