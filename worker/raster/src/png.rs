//! PNG to 8-bit RGB, sample for sample as Pillow's `Image.open(f).convert("RGB")`.
//!
//! The reference pipeline (Hugging Face's image processor) receives what
//! Pillow makes of a file, so the conversion follows Pillow, checked against
//! Pillow itself in the tests, including where it surprises:
//!
//! - 16-bit RGB, RGBA and grey+alpha keep the high byte of each sample
//!   (`v >> 8`), as Pillow's `RGB;16B`/`LA;16B` unpackers do;
//! - 16-bit grey opens as mode `I;16`, whose conversion to RGB clamps:
//!   `min(v, 255)`, so anything above 255 is white;
//! - grey of 1, 2 or 4 bits is scaled to 0–255 (`v · 255 / (2^d − 1)`);
//! - palette indexes past the end of `PLTE` are black;
//! - alpha and `tRNS` are dropped, never composited.

use std::io::Cursor;

use ::png::{BitDepth, ColorType, Decoder, Transformations};

use crate::pixels::{DecodeError, DecodeLimits, Rgb8};

/// Whether `bytes` start with the PNG signature.
pub(crate) fn is_png(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x89PNG\r\n\x1a\n")
}

fn err(e: ::png::DecodingError) -> DecodeError {
    DecodeError::Png(e)
}

/// Decodes a whole PNG (the first frame of an APNG) into 8-bit RGB.
///
/// The header is checked against `limits` before anything is allocated for
/// pixels: the raw frame and the RGB output must each fit in `max_alloc`.
pub fn decode(bytes: &[u8], limits: DecodeLimits) -> Result<Rgb8, DecodeError> {
    let budget = usize::try_from(limits.max_alloc).unwrap_or(usize::MAX);
    let mut decoder = Decoder::new_with_limits(
        Cursor::new(bytes),
        ::png::Limits {
            // Bounds what the decoder itself allocates for chunks (text, ICC).
            bytes: budget,
        },
    );
    decoder.set_transformations(Transformations::IDENTITY);
    let (w, h) = decoder.read_header_info().map_err(err)?.size();
    let (width, height) = (w as usize, h as usize);
    if w > limits.max_dimension || h > limits.max_dimension {
        return Err(DecodeError::DimensionTooLarge {
            width,
            height,
            max: limits.max_dimension,
        });
    }
    let too_large = || DecodeError::TooLarge {
        width,
        height,
        limit: limits.max_alloc,
    };
    if (width as u64) * (height as u64) * 3 > limits.max_alloc {
        return Err(too_large());
    }
    let mut reader = decoder.read_info().map_err(err)?;
    let raw_len = reader.output_buffer_size().ok_or_else(too_large)?;
    if raw_len as u64 > limits.max_alloc {
        return Err(too_large());
    }
    let palette = reader.info().palette.as_ref().map(|p| p.to_vec());
    let mut raw = vec![0u8; raw_len];
    let frame = reader.next_frame(&mut raw).map_err(err)?;
    let (fw, fh) = (frame.width as usize, frame.height as usize);
    let mut data = Vec::with_capacity(fw * fh * 3);
    for row in raw.chunks_exact(frame.line_size).take(fh) {
        convert_row(
            row,
            fw,
            frame.color_type,
            frame.bit_depth,
            palette.as_deref(),
            &mut data,
        )?;
    }
    Ok(Rgb8 {
        width: frame.width,
        height: frame.height,
        data,
    })
}

/// Appends one raw row (`width` pixels) as RGB.
fn convert_row(
    row: &[u8],
    width: usize,
    color: ColorType,
    depth: BitDepth,
    palette: Option<&[u8]>,
    out: &mut Vec<u8>,
) -> Result<(), DecodeError> {
    let be16 = |s: &[u8]| u16::from_be_bytes([s[0], s[1]]);
    match (color, depth) {
        (ColorType::Rgb, BitDepth::Eight) => out.extend_from_slice(&row[..width * 3]),
        (ColorType::Rgba, BitDepth::Eight) => {
            for px in row.chunks_exact(4).take(width) {
                out.extend_from_slice(&px[..3]);
            }
        }
        // The high byte of each big-endian sample is the first one.
        (ColorType::Rgb, BitDepth::Sixteen) => {
            for px in row.chunks_exact(6).take(width) {
                out.extend_from_slice(&[px[0], px[2], px[4]]);
            }
        }
        (ColorType::Rgba, BitDepth::Sixteen) => {
            for px in row.chunks_exact(8).take(width) {
                out.extend_from_slice(&[px[0], px[2], px[4]]);
            }
        }
        (ColorType::GrayscaleAlpha, BitDepth::Eight) => {
            for px in row.chunks_exact(2).take(width) {
                out.extend_from_slice(&[px[0]; 3]);
            }
        }
        (ColorType::GrayscaleAlpha, BitDepth::Sixteen) => {
            for px in row.chunks_exact(4).take(width) {
                out.extend_from_slice(&[px[0]; 3]);
            }
        }
        (ColorType::Grayscale, BitDepth::Sixteen) => {
            for px in row.chunks_exact(2).take(width) {
                let v = be16(px).min(255) as u8;
                out.extend_from_slice(&[v; 3]);
            }
        }
        (ColorType::Grayscale, d) => {
            let bits = d as u8;
            let max = (1u16 << bits) - 1;
            for i in 0..width {
                let v = u16::from(sample(row, i, bits));
                let v = (v * 255 / max) as u8;
                out.extend_from_slice(&[v; 3]);
            }
        }
        (ColorType::Indexed, d) => {
            let palette = palette.ok_or(DecodeError::PngPalette)?;
            for i in 0..width {
                let at = usize::from(sample(row, i, d as u8)) * 3;
                match palette.get(at..at + 3) {
                    Some(rgb) => out.extend_from_slice(rgb),
                    None => out.extend_from_slice(&[0, 0, 0]),
                }
            }
        }
        // The PNG header check admits no other combination.
        (c, d) => return Err(DecodeError::PngLayout(format!("{c:?} at {d:?}"))),
    }
    Ok(())
}

/// Sample `i` of a row packed at `bits` (1, 2, 4 or 8) per sample, most significant first.
fn sample(row: &[u8], i: usize, bits: u8) -> u8 {
    if bits == 8 {
        return row[i];
    }
    let per_byte = 8 / usize::from(bits);
    let byte = row[i / per_byte];
    let shift = 8 - bits as usize * (i % per_byte + 1);
    (byte >> shift) & ((1u8 << bits) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// A PNG of `w × h` written by the `png` crate from raw samples.
    fn encode(
        w: u32,
        h: u32,
        color: ColorType,
        depth: BitDepth,
        data: &[u8],
        plte: Option<&[u8]>,
        trns: Option<&[u8]>,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        {
            let mut e = ::png::Encoder::new(&mut out, w, h);
            e.set_color(color);
            e.set_depth(depth);
            if let Some(p) = plte {
                e.set_palette(p.to_vec());
            }
            if let Some(t) = trns {
                e.set_trns(t.to_vec());
            }
            let mut wr = e.write_header().unwrap();
            wr.write_image_data(data).unwrap();
        }
        out
    }

    fn be16(v: &[u16]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_be_bytes()).collect()
    }

    /// Every layout Pillow distinguishes, with values that tell the rules
    /// apart (16-bit samples whose high and low bytes differ, and above 255).
    fn cases() -> Vec<(&'static str, Vec<u8>)> {
        let v16: Vec<u16> = vec![0, 255, 256, 0x1234, 0xabcd, 0xffff, 0x00ff, 0x8001];
        let w = v16.len() as u32;
        let ramp = |k: u16| -> Vec<u16> { v16.iter().map(|v| v.wrapping_mul(k) ^ k).collect() };
        let interleave = |planes: &[Vec<u16>]| -> Vec<u16> {
            (0..v16.len())
                .flat_map(|i| planes.iter().map(move |p| p[i]))
                .collect()
        };
        let plte: Vec<u8> = (0..5u8)
            .flat_map(|i| [i * 40, 255 - i * 30, i ^ 0x5a])
            .collect();
        vec![
            (
                "gray16",
                encode(
                    w,
                    1,
                    ColorType::Grayscale,
                    BitDepth::Sixteen,
                    &be16(&v16),
                    None,
                    None,
                ),
            ),
            (
                "gray16_trns",
                encode(
                    w,
                    1,
                    ColorType::Grayscale,
                    BitDepth::Sixteen,
                    &be16(&v16),
                    None,
                    Some(&[0x12, 0x34]),
                ),
            ),
            (
                "gray_alpha16",
                encode(
                    w,
                    1,
                    ColorType::GrayscaleAlpha,
                    BitDepth::Sixteen,
                    &be16(&interleave(&[v16.clone(), ramp(3)])),
                    None,
                    None,
                ),
            ),
            (
                "rgb16",
                encode(
                    w,
                    1,
                    ColorType::Rgb,
                    BitDepth::Sixteen,
                    &be16(&interleave(&[v16.clone(), ramp(7), ramp(13)])),
                    None,
                    None,
                ),
            ),
            (
                "rgba16",
                encode(
                    w,
                    1,
                    ColorType::Rgba,
                    BitDepth::Sixteen,
                    &be16(&interleave(&[v16.clone(), ramp(7), ramp(13), ramp(5)])),
                    None,
                    None,
                ),
            ),
            (
                "gray8_trns",
                encode(
                    4,
                    1,
                    ColorType::Grayscale,
                    BitDepth::Eight,
                    &[0, 5, 200, 255],
                    None,
                    Some(&[0, 5]),
                ),
            ),
            (
                "gray_alpha8",
                encode(
                    2,
                    1,
                    ColorType::GrayscaleAlpha,
                    BitDepth::Eight,
                    &[9, 0, 200, 255],
                    None,
                    None,
                ),
            ),
            (
                "rgba8",
                encode(
                    2,
                    1,
                    ColorType::Rgba,
                    BitDepth::Eight,
                    &[1, 2, 3, 0, 4, 5, 6, 255],
                    None,
                    None,
                ),
            ),
            (
                "gray1",
                encode(
                    11,
                    2,
                    ColorType::Grayscale,
                    BitDepth::One,
                    &[0b1011_0001, 0b1010_0000, 0b0101_1110, 0b0100_0000],
                    None,
                    None,
                ),
            ),
            (
                "gray2",
                encode(
                    5,
                    1,
                    ColorType::Grayscale,
                    BitDepth::Two,
                    &[0b0001_1011, 0b1000_0000],
                    None,
                    None,
                ),
            ),
            (
                "gray4",
                encode(
                    3,
                    1,
                    ColorType::Grayscale,
                    BitDepth::Four,
                    &[0x3c, 0xf0],
                    None,
                    None,
                ),
            ),
            (
                "palette8_trns_out_of_range",
                encode(
                    6,
                    1,
                    ColorType::Indexed,
                    BitDepth::Eight,
                    &[0, 1, 2, 3, 4, 9],
                    Some(&plte),
                    Some(&[0, 128, 255]),
                ),
            ),
            (
                "palette2",
                encode(
                    5,
                    1,
                    ColorType::Indexed,
                    BitDepth::Two,
                    &[0b0001_1011, 0b0100_0000],
                    Some(&plte),
                    None,
                ),
            ),
            (
                "palette4",
                encode(
                    3,
                    1,
                    ColorType::Indexed,
                    BitDepth::Four,
                    &[0x04, 0x30],
                    Some(&plte),
                    None,
                ),
            ),
        ]
    }

    /// What Pillow makes of each file: `Image.open(f).convert("RGB")`.
    fn pillow_rgb(files: &[std::path::PathBuf]) -> Vec<Vec<u8>> {
        let script = "import sys\nfrom PIL import Image\nfor f in sys.argv[1:]:\n    print(Image.open(f).convert('RGB').tobytes().hex())\n";
        let out = Command::new(rsembed_integration_tests::python())
            .arg("-c")
            .arg(script)
            .args(files)
            .output()
            .expect("the test Python starts");
        assert!(
            out.status.success(),
            "Pillow failed (pillow is pinned in integration-tests/requirements.txt): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| hex::decode(l).unwrap())
            .collect()
    }

    #[test]
    fn every_layout_converts_as_pillow_does() {
        let tmp = tempfile::tempdir().unwrap();
        let cases = cases();
        let files: Vec<_> = cases
            .iter()
            .map(|(name, bytes)| {
                let p = tmp.path().join(format!("{name}.png"));
                std::fs::write(&p, bytes).unwrap();
                p
            })
            .collect();
        let pillow = pillow_rgb(&files);
        assert_eq!(pillow.len(), cases.len());
        for ((name, bytes), want) in cases.iter().zip(pillow) {
            let got = decode(bytes, DecodeLimits::default()).unwrap();
            assert_eq!(
                got.data.len(),
                (got.width * got.height * 3) as usize,
                "{name}"
            );
            assert_eq!(got.data, want, "{name}: ours vs Pillow");
        }
    }

    #[test]
    fn sixteen_bit_rules_are_the_high_byte_and_the_clamp() {
        // Independent of Pillow being installed: the rules themselves.
        let rgb = encode(
            2,
            1,
            ColorType::Rgb,
            BitDepth::Sixteen,
            &be16(&[0x1234, 0xabcd, 0x00ff, 0xffff, 0x0100, 0x80ff]),
            None,
            None,
        );
        assert_eq!(
            decode(&rgb, DecodeLimits::default()).unwrap().data,
            [0x12, 0xab, 0x00, 0xff, 0x01, 0x80]
        );
        let grey = encode(
            3,
            1,
            ColorType::Grayscale,
            BitDepth::Sixteen,
            &be16(&[7, 255, 0x1234]),
            None,
            None,
        );
        assert_eq!(
            decode(&grey, DecodeLimits::default()).unwrap().data,
            [7, 7, 7, 255, 255, 255, 255, 255, 255]
        );
    }

    #[test]
    fn header_is_checked_before_pixels_are_allocated() {
        // A valid header claiming 100 000 × 100 000 pixels, and nothing else.
        let mut b = encode(
            1,
            1,
            ColorType::Rgb,
            BitDepth::Eight,
            &[0, 0, 0],
            None,
            None,
        );
        b[16..20].copy_from_slice(&100_000u32.to_be_bytes());
        b[20..24].copy_from_slice(&100_000u32.to_be_bytes());
        let crc = crc32(&b[12..29]);
        b[29..33].copy_from_slice(&crc.to_be_bytes());
        let big = DecodeLimits {
            max_dimension: 200_000,
            max_alloc: 1 << 30,
        };
        assert!(matches!(decode(&b, big), Err(DecodeError::TooLarge { .. })));
        assert!(matches!(
            decode(&b, DecodeLimits::default()),
            Err(DecodeError::DimensionTooLarge { .. })
        ));
        // Cut short in the signature, the header or the image data (the
        // last 12 bytes are IEND, which a decoder need not reach): errors, not panics.
        let p = encode(4, 4, ColorType::Rgb, BitDepth::Eight, &[9; 48], None, None);
        for cut in [0, 8, 20, 33, p.len() - 16] {
            assert!(
                decode(&p[..cut], DecodeLimits::default()).is_err(),
                "cut at {cut}"
            );
        }
    }

    fn crc32(b: &[u8]) -> u32 {
        let mut c = !0u32;
        for &x in b {
            c ^= u32::from(x);
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
        }
        !c
    }
}
