//! Whole images (PNG, JPEG, TIFF without georeferencing): one chip each.

use std::io::Cursor;

use image::{ImageFormat, ImageReader, Limits};

/// Bounds on what one image may make us allocate. Inputs are hostile: a 60-byte
/// PNG can claim to be 100 000 × 100 000 pixels.
#[derive(Debug, Clone, Copy)]
pub struct DecodeLimits {
    /// Largest width or height accepted.
    pub max_dimension: u32,
    /// Largest decoder allocation in bytes.
    pub max_alloc: u64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_dimension: 32_768,
            max_alloc: 1 << 30,
        }
    }
}

/// A decoded 8-bit RGB image, row-major, interleaved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb8 {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// `width * height * 3` bytes.
    pub data: Vec<u8>,
}

/// Why an image could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Zero bytes.
    #[error("empty file (0 bytes)")]
    Empty,
    /// Not a format we read.
    #[error("not a PNG, JPEG or TIFF image (unrecognized content)")]
    UnknownFormat,
    /// A format we recognize but do not read as a whole image.
    #[error("unsupported image format {0:?}")]
    Unsupported(ImageFormat),
    /// The decoder refused the file.
    #[error("{format:?} decode failed: {source}")]
    Decoder {
        /// The recognized format.
        format: ImageFormat,
        /// The decoder's reason.
        #[source]
        source: image::ImageError,
    },
    /// The JPEG decoder refused the file.
    #[error("JPEG decode failed: {0}")]
    Jpeg(String),
    /// The image would need more memory than the limit allows.
    #[error("{width}x{height} pixels is over the decode limit ({limit} bytes)")]
    TooLarge {
        /// Width from the header.
        width: usize,
        /// Height from the header.
        height: usize,
        /// The byte limit.
        limit: u64,
    },
}

/// Decodes a whole PNG, JPEG or TIFF into 8-bit RGB, dropping alpha and replicating
/// grey, as PIL's `convert("RGB")` does.
pub fn decode_rgb8(bytes: &[u8], limits: DecodeLimits) -> Result<Rgb8, DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::Empty);
    }
    let format = match image::guess_format(bytes) {
        Ok(f @ (ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::Tiff)) => f,
        Ok(other) => return Err(DecodeError::Unsupported(other)),
        Err(_) => return Err(DecodeError::UnknownFormat),
    };
    if format == ImageFormat::Jpeg {
        return decode_jpeg(bytes, limits);
    }
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut l = Limits::default();
    l.max_image_width = Some(limits.max_dimension);
    l.max_image_height = Some(limits.max_dimension);
    l.max_alloc = Some(limits.max_alloc);
    reader.limits(l);
    let img = reader
        .decode()
        .map_err(|source| DecodeError::Decoder { format, source })?;
    let rgb = img.into_rgb8();
    Ok(Rgb8 {
        width: rgb.width(),
        height: rgb.height(),
        data: rgb.into_raw(),
    })
}

/// Decodes a JPEG exactly as libjpeg-turbo (Pillow, the reference) does,
/// through our own decoder; the few encodings it does not implement (CMYK,
/// arithmetic coding, 12-bit) go to zune-jpeg, close to but not bit-exact
/// with Pillow.
///
/// Both are strict: decoders usually paint a corrupt or cut-short scan grey
/// and report success, as browsers want; an embedding of half an image is
/// worse than an error record, so any entropy-coding error fails the input.
fn decode_jpeg(bytes: &[u8], limits: DecodeLimits) -> Result<Rgb8, DecodeError> {
    use crate::raster::jpeg::{self, ColorTransform, Error as JpegError};
    let jl = jpeg::Limits {
        max_width: limits.max_dimension,
        max_height: limits.max_dimension,
        max_alloc: limits.max_alloc,
    };
    let img = match jpeg::decode(None, bytes, ColorTransform::Auto, &jl) {
        Ok(img) => img,
        Err(JpegError::Unsupported(_)) => return decode_jpeg_zune(bytes, limits),
        Err(e @ JpegError::TooLarge { .. }) => {
            return Err(match jpeg::read_header(None, bytes) {
                Ok(h) => DecodeError::TooLarge {
                    width: h.width as usize,
                    height: h.height as usize,
                    limit: limits.max_alloc,
                },
                Err(_) => DecodeError::Jpeg(e.to_string()),
            })
        }
        Err(e) => return Err(DecodeError::Jpeg(e.to_string())),
    };
    let data = match img.components {
        3 => img.data,
        // Grey is replicated, as PIL's convert("RGB") does.
        _ => img.data.iter().flat_map(|&v| [v, v, v]).collect(),
    };
    Ok(Rgb8 {
        width: img.width,
        height: img.height,
        data,
    })
}

/// zune-jpeg in strict mode, for the encodings our decoder leaves out.
fn decode_jpeg_zune(bytes: &[u8], limits: DecodeLimits) -> Result<Rgb8, DecodeError> {
    use zune_core::bytestream::ZCursor;
    use zune_core::colorspace::ColorSpace;
    use zune_core::options::DecoderOptions;

    let max = limits.max_dimension as usize;
    let opts = DecoderOptions::default()
        .set_strict_mode(true)
        .set_max_width(max)
        .set_max_height(max)
        .jpeg_set_out_colorspace(ColorSpace::RGB);
    let mut d = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), opts);
    d.decode_headers()
        .map_err(|e| DecodeError::Jpeg(e.to_string()))?;
    let info = d
        .info()
        .ok_or_else(|| DecodeError::Jpeg("no frame header".into()))?;
    let (width, height) = (info.width as usize, info.height as usize);
    if (width * height * 3) as u64 > limits.max_alloc {
        return Err(DecodeError::TooLarge {
            width,
            height,
            limit: limits.max_alloc,
        });
    }
    let data = d.decode().map_err(|e| DecodeError::Jpeg(e.to_string()))?;
    if data.len() != width * height * 3 {
        return Err(DecodeError::Jpeg(format!(
            "decoder returned {} bytes for {width}x{height} RGB",
            data.len()
        )));
    }
    Ok(Rgb8 {
        width: width as u32,
        height: height as u32,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 7]));
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, ImageFormat::Png).unwrap();
        out.into_inner()
    }

    fn jpeg(w: u32, h: u32) -> Vec<u8> {
        let img =
            image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 4) as u8, (y * 4) as u8, 99]));
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, ImageFormat::Jpeg).unwrap();
        out.into_inner()
    }

    #[test]
    fn decodes_png_to_rgb() {
        let img = decode_rgb8(&png(5, 3), DecodeLimits::default()).unwrap();
        assert_eq!((img.width, img.height), (5, 3));
        assert_eq!(&img.data[..3], &[0, 0, 7]);
        assert_eq!(&img.data[3 * 6..3 * 6 + 3], &[1, 1, 7]);
    }

    #[test]
    fn grey_and_alpha_convert_like_pil() {
        let grey = image::GrayImage::from_pixel(2, 2, image::Luma([9]));
        let mut out = Cursor::new(Vec::new());
        grey.write_to(&mut out, ImageFormat::Png).unwrap();
        let img = decode_rgb8(out.get_ref(), DecodeLimits::default()).unwrap();
        assert_eq!(&img.data[..3], &[9, 9, 9]);

        let rgba = image::RgbaImage::from_pixel(2, 2, image::Rgba([1, 2, 3, 0]));
        let mut out = Cursor::new(Vec::new());
        rgba.write_to(&mut out, ImageFormat::Png).unwrap();
        let img = decode_rgb8(out.get_ref(), DecodeLimits::default()).unwrap();
        assert_eq!(&img.data[..3], &[1, 2, 3]);
    }

    #[test]
    fn hostile_inputs_are_errors() {
        assert!(matches!(
            decode_rgb8(&[], DecodeLimits::default()),
            Err(DecodeError::Empty)
        ));
        assert!(matches!(
            decode_rgb8(b"hello, I am text", DecodeLimits::default()),
            Err(DecodeError::UnknownFormat)
        ));
        let p = png(64, 64);
        assert!(decode_rgb8(&p[..p.len() / 2], DecodeLimits::default()).is_err());
        let j = jpeg(64, 64);
        assert!(decode_rgb8(&j, DecodeLimits::default()).is_ok());
        assert!(decode_rgb8(&j[..j.len() * 2 / 3], DecodeLimits::default()).is_err());
        let mut bad = j.clone();
        let sos = bad.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
        let end = bad.len() - 2;
        for (i, b) in bad[sos + 20..end].iter_mut().enumerate() {
            *b = (i * 37 % 256) as u8 | 0x80;
        }
        assert!(decode_rgb8(&bad, DecodeLimits::default()).is_err());
        let small = DecodeLimits {
            max_dimension: 32,
            ..Default::default()
        };
        assert!(decode_rgb8(&p, small).is_err());
    }
}
