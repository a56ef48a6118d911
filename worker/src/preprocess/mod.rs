//! Pixels to model input, exactly as the model's `preprocessor_config.json` says.

pub mod resize;

use std::borrow::Cow;

use rsembed_raster::image::Rgb8;
use rsembed_schemas::model::PreprocessorConfig;

use resize::Filter;

/// Why an image could not be turned into model input.
#[derive(Debug, thiserror::Error)]
pub enum PreprocessError {
    /// `do_resize` is off and the image is not the model's size.
    #[error(
        "image is {got_w}x{got_h} but the model takes {want_w}x{want_h} and do_resize is false"
    )]
    WrongSize {
        /// Image width.
        got_w: u32,
        /// Image height.
        got_h: u32,
        /// Model width.
        want_w: u32,
        /// Model height.
        want_h: u32,
    },
    /// An image with no pixels.
    #[error("image has no pixels")]
    Empty,
}

/// Resize, rescale and normalize into NCHW float32, following a Hugging Face
/// `SiglipImageProcessor` config.
///
/// Resizing is Pillow's, byte for byte, on 8-bit pixels: that is what the
/// reference processor does, so the rounding of the intermediate 8-bit image is
/// part of the contract. Rescale and normalize fold into one lookup table per
/// channel, since an 8-bit input has only 256 values.
#[derive(Debug, Clone)]
pub struct Preprocessor {
    do_resize: bool,
    filter: Filter,
    width: u32,
    height: u32,
    lut: [[f32; 256]; 3],
}

impl Preprocessor {
    /// Builds the preprocessor; the config was checked when the model directory opened.
    pub fn new(cfg: &PreprocessorConfig) -> Preprocessor {
        let filter = Filter::from_pil_code(cfg.resample).unwrap_or(Filter::Bicubic);
        let mut lut = [[0f32; 256]; 3];
        for (c, table) in lut.iter_mut().enumerate() {
            for (v, out) in table.iter_mut().enumerate() {
                let mut x = v as f64;
                if cfg.do_rescale {
                    // HF rescales in float64 and then casts to float32.
                    x = (x * cfg.rescale_factor) as f32 as f64;
                }
                let mut y = x as f32;
                if cfg.do_normalize {
                    y = (y - cfg.image_mean[c] as f32) / cfg.image_std[c] as f32;
                }
                *out = y;
            }
        }
        Preprocessor {
            do_resize: cfg.do_resize,
            filter,
            width: cfg.size.width,
            height: cfg.size.height,
            lut,
        }
    }

    /// Model input width.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Model input height.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// Values per image: 3 × height × width.
    pub fn len(&self) -> usize {
        3 * self.width as usize * self.height as usize
    }

    /// Always false: a model input has pixels.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes one image as CHW float32 into `out` (length [`Self::len`]).
    pub fn run_into(&self, img: &Rgb8, out: &mut [f32]) -> Result<(), PreprocessError> {
        let sized = self.resized(img)?;
        self.normalize_into(&sized.data, out);
        Ok(())
    }

    /// Rescales and normalizes one resized 8-bit image (HWC, what
    /// [`Self::run`] returns) into CHW float32 `out` (length [`Self::len`]).
    /// A uint8 vision entry does the same inside its graph, with this table.
    pub fn normalize_into(&self, hwc: &[u8], out: &mut [f32]) {
        assert!(
            out.len() == self.len() && hwc.len() == self.len(),
            "pixel slices have the wrong length: this is a bug"
        );
        let plane = self.width as usize * self.height as usize;
        let (r, rest) = out.split_at_mut(plane);
        let (g, b) = rest.split_at_mut(plane);
        for (i, px) in hwc.chunks_exact(3).enumerate() {
            r[i] = self.lut[0][px[0] as usize];
            g[i] = self.lut[1][px[1] as usize];
            b[i] = self.lut[2][px[2] as usize];
        }
    }

    /// The 8-bit image that rescaling and normalization see: `img` resized
    /// to the model's input size as the config says (borrowed when it is
    /// that size already). Pictures of chips (`search --html`) are this
    /// image, so they show exactly the pixels the model was given.
    pub fn resized<'a>(&self, img: &'a Rgb8) -> Result<Cow<'a, Rgb8>, PreprocessError> {
        if img.width == 0 || img.height == 0 {
            return Err(PreprocessError::Empty);
        }
        if img.width == self.width && img.height == self.height {
            return Ok(Cow::Borrowed(img));
        }
        if !self.do_resize {
            return Err(PreprocessError::WrongSize {
                got_w: img.width,
                got_h: img.height,
                want_w: self.width,
                want_h: self.height,
            });
        }
        Ok(Cow::Owned(Rgb8 {
            width: self.width,
            height: self.height,
            data: resize::resize_u8(
                &img.data,
                img.width as usize,
                img.height as usize,
                3,
                self.width as usize,
                self.height as usize,
                self.filter,
            ),
        }))
    }

    /// One image as the batcher takes it: resized to the model's input,
    /// 8-bit, HWC ([`Self::len`] bytes). The batcher hands it to a uint8
    /// vision entry as it is, or through [`Self::normalize_into`] to a float
    /// one; a queued chip holds a quarter of the bytes of its float pixels.
    pub fn run(&self, img: &Rgb8) -> Result<Vec<u8>, PreprocessError> {
        Ok(self.resized(img)?.into_owned().data)
    }

    /// One image as a fresh CHW float32 vector.
    pub fn run_f32(&self, img: &Rgb8) -> Result<Vec<f32>, PreprocessError> {
        let mut out = vec![0f32; self.len()];
        self.run_into(img, &mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsembed_schemas::model::Size;

    fn cfg() -> PreprocessorConfig {
        serde_json::from_value(serde_json::json!({
            "size": {"height": 2, "width": 2}, "resample": 3,
            "rescale_factor": 1.0 / 255.0, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]
        }))
        .unwrap()
    }

    #[test]
    fn normalizes_to_minus_one_one_in_chw() {
        let p = Preprocessor::new(&cfg());
        let img = Rgb8 {
            width: 2,
            height: 2,
            data: vec![0, 255, 0, 0, 255, 0, 0, 255, 0, 255, 0, 255],
        };
        let out = p.run_f32(&img).unwrap();
        assert_eq!(out.len(), 12);
        // R plane, then G, then B.
        assert_eq!(&out[0..4], &[-1.0, -1.0, -1.0, 1.0]);
        assert_eq!(&out[4..8], &[1.0, 1.0, 1.0, -1.0]);
        assert_eq!(&out[8..12], &[-1.0, -1.0, -1.0, 1.0]);
    }

    #[test]
    fn honours_config_mean_and_std() {
        let mut c = cfg();
        c.image_mean = vec![0.0, 0.25, 0.5];
        c.image_std = vec![1.0, 0.5, 0.25];
        c.size = Size {
            height: 1,
            width: 1,
        };
        let p = Preprocessor::new(&c);
        let out = p
            .run_f32(&Rgb8 {
                width: 1,
                height: 1,
                data: vec![255, 255, 255],
            })
            .unwrap();
        assert!((out[0] - 1.0).abs() < 1e-6);
        assert!((out[1] - 1.5).abs() < 1e-6);
        assert!((out[2] - 2.0).abs() < 1e-6);
    }

    #[test]
    fn refuses_wrong_size_without_resize() {
        let mut c = cfg();
        c.do_resize = false;
        let p = Preprocessor::new(&c);
        let img = Rgb8 {
            width: 3,
            height: 2,
            data: vec![0; 18],
        };
        assert!(matches!(
            p.run(&img),
            Err(PreprocessError::WrongSize { .. })
        ));
    }
}
