//! Whole images (PNG, JPEG): one chip each. TIFFs, whole or not, are read by
//! the project's own reader as scenes ([`crate::scene`]), wherever they come from.

pub use crate::pixels::{DecodeError, DecodeLimits, Rgb8};

/// Whether `bytes` start like a TIFF or BigTIFF file.
pub fn is_tiff_content(bytes: &[u8]) -> bool {
    matches!(
        bytes.get(..4),
        Some(b"II*\0" | b"MM\0*" | b"II+\0" | b"MM\0+")
    )
}

/// Decodes a whole PNG or JPEG into 8-bit RGB, dropping alpha and replicating
/// grey, as PIL's `convert("RGB")` does.
pub fn decode_rgb8(bytes: &[u8], limits: DecodeLimits) -> Result<Rgb8, DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::Empty);
    }
    if crate::png::is_png(bytes) {
        return crate::png::decode(bytes, limits);
    }
    if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        return decode_jpeg(bytes, limits);
    }
    if is_tiff_content(bytes) {
        return Err(DecodeError::Unsupported(
            "TIFF content under another name (TIFFs are read as scenes: name the file .tif or .tiff)",
        ));
    }
    let other = [
        (&b"GIF8"[..], "GIF"),
        (b"RIFF", "WebP (or another RIFF format)"),
        (b"BM", "BMP"),
    ];
    match other.iter().find(|(magic, _)| bytes.starts_with(magic)) {
        Some((_, name)) => Err(DecodeError::Unsupported(name)),
        None => Err(DecodeError::UnknownFormat),
    }
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
    use crate::jpeg::{self, ColorTransform, Error as JpegError};
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
        let data: Vec<u8> = (0..h)
            .flat_map(|y| (0..w).flat_map(move |x| [x as u8, y as u8, 7]))
            .collect();
        let mut out = Vec::new();
        let mut e = ::png::Encoder::new(&mut out, w, h);
        e.set_color(::png::ColorType::Rgb);
        e.write_header().unwrap().write_image_data(&data).unwrap();
        out
    }

    fn fixture(name: &str) -> Vec<u8> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/images")
            .join(name);
        std::fs::read(p).unwrap()
    }

    #[test]
    fn decodes_png_to_rgb() {
        let img = decode_rgb8(&png(5, 3), DecodeLimits::default()).unwrap();
        assert_eq!((img.width, img.height), (5, 3));
        assert_eq!(&img.data[..3], &[0, 0, 7]);
        assert_eq!(&img.data[3 * 6..3 * 6 + 3], &[1, 1, 7]);
    }

    #[test]
    fn tiff_and_other_formats_are_named() {
        let tif = fixture("aerial_256_lzw.tif");
        let e = decode_rgb8(&tif, DecodeLimits::default()).unwrap_err();
        assert!(e.to_string().contains("TIFF"), "{e}");
        let e = decode_rgb8(b"GIF89a....", DecodeLimits::default()).unwrap_err();
        assert!(e.to_string().contains("GIF"), "{e}");
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
        let j = fixture("small_64.jpg");
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
        assert!(decode_rgb8(&j, small).is_err());
    }
}
