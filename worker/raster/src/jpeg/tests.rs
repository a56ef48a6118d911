//! Reference fixtures (expected output from Pillow / libjpeg-turbo, see
//! tools/gen_jpeg_fixtures.py), malformed-input cases and a mutation smoke test.

use super::*;
use std::path::PathBuf;

/// Relative to the crate root; regenerate with `tools/gen_jpeg_fixtures.py write`.
const FIXTURE: &str = "../../fixtures/jpeg/cases.bin";

struct Case {
    name: String,
    transform: ColorTransform,
    tables: Option<Vec<u8>>,
    jpeg: Vec<u8>,
    expected: Image,
}

fn take<'a>(d: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (a, b) = d.split_at(n);
    *d = b;
    a
}

fn take_u32(d: &mut &[u8]) -> usize {
    u32::from_le_bytes(take(d, 4).try_into().unwrap()) as usize
}

fn decode_png(bytes: &[u8]) -> Image {
    let dec = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = dec.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let components = match info.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::Rgb => 3,
        other => panic!("unexpected PNG colour type {other:?}"),
    };
    buf.truncate(info.buffer_size());
    Image {
        width: info.width,
        height: info.height,
        components,
        data: buf,
    }
}

fn load_cases() -> Vec<Case> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(FIXTURE);
    let all = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut d = &all[..];
    assert_eq!(take(&mut d, 8), b"LJPGFIX1");
    let mut cases = Vec::new();
    while !d.is_empty() {
        let n = u16::from_le_bytes(take(&mut d, 2).try_into().unwrap()) as usize;
        let name = String::from_utf8(take(&mut d, n).to_vec()).unwrap();
        let transform = match take(&mut d, 1)[0] {
            0 => ColorTransform::Auto,
            1 => ColorTransform::YCbCrToRgb,
            _ => ColorTransform::None,
        };
        let n = take_u32(&mut d);
        let tables = (n > 0).then(|| take(&mut d, n).to_vec());
        let n = take_u32(&mut d);
        let jpeg = take(&mut d, n).to_vec();
        let n = take_u32(&mut d);
        let expected = decode_png(take(&mut d, n));
        cases.push(Case {
            name,
            transform,
            tables,
            jpeg,
            expected,
        });
    }
    cases
}

fn case(name: &str) -> Case {
    load_cases()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no fixture {name}"))
}

fn dec(jpeg: &[u8]) -> Result<Image, Error> {
    decode(None, jpeg, ColorTransform::Auto, &Limits::default())
}

#[test]
fn fixtures_are_bit_exact() {
    let cases = load_cases();
    assert!(cases.len() > 150);
    let mut failures = Vec::new();
    for c in &cases {
        match decode(
            c.tables.as_deref(),
            &c.jpeg,
            c.transform,
            &Limits::default(),
        ) {
            Err(e) => failures.push(format!("{}: error {e}", c.name)),
            Ok(img) => {
                let exp = &c.expected;
                if (img.width, img.height, img.components)
                    != (exp.width, exp.height, exp.components)
                {
                    failures.push(format!(
                        "{}: got {}x{}x{}, expected {}x{}x{}",
                        c.name,
                        img.width,
                        img.height,
                        img.components,
                        exp.width,
                        exp.height,
                        exp.components
                    ));
                    continue;
                }
                let diffs: Vec<usize> = (0..img.data.len())
                    .filter(|&i| img.data[i] != exp.data[i])
                    .collect();
                if let Some(&first) = diffs.first() {
                    let maxd = diffs
                        .iter()
                        .map(|&i| img.data[i].abs_diff(exp.data[i]))
                        .max()
                        .unwrap_or(0);
                    let px = first / usize::from(img.components);
                    failures.push(format!(
                        "{}: {} samples differ (max {maxd}), first at x={} y={}",
                        c.name,
                        diffs.len(),
                        px % img.width as usize,
                        px / img.width as usize
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
}

#[test]
fn headers_match_fixtures() {
    for c in load_cases() {
        let h = read_header(c.tables.as_deref(), &c.jpeg).unwrap();
        assert_eq!(
            (h.width, h.height, h.components),
            (c.expected.width, c.expected.height, c.expected.components),
            "{}",
            c.name
        );
        assert_eq!(h.progressive, c.name.starts_with("prog"), "{}", c.name);
    }
}

/// Offset of the first entropy-coded byte (after the first SOS segment).
fn scan_start(jpeg: &[u8]) -> usize {
    let mut i = 2;
    loop {
        assert_eq!(jpeg[i], 0xFF);
        let m = jpeg[i + 1];
        let len = usize::from(u16::from_be_bytes([jpeg[i + 2], jpeg[i + 3]]));
        if m == 0xDA {
            return i + 2 + len;
        }
        i += 2 + len;
    }
}

fn sof_offset(jpeg: &[u8]) -> usize {
    let mut i = 2;
    loop {
        let m = jpeg[i + 1];
        if (0xC0..=0xCF).contains(&m) && m != 0xC4 && m != 0xCC {
            return i;
        }
        i += 2 + usize::from(u16::from_be_bytes([jpeg[i + 2], jpeg[i + 3]]));
    }
}

#[test]
fn truncated_scan_fails() {
    let c = case("420_33x65_q75");
    let start = scan_start(&c.jpeg);
    let end = c.jpeg.len() - 2;
    for cut in [start, start + 1, (start + end) / 2, end - 3] {
        let r = dec(&c.jpeg[..cut]);
        assert_eq!(r, Err(Error::Truncated), "cut at {cut}");
    }
    // Every prefix must fail cleanly.
    for cut in 0..end - 1 {
        assert!(dec(&c.jpeg[..cut]).is_err(), "prefix {cut} decoded");
    }
}

#[test]
fn marker_inside_scan_fails() {
    let c = case("420_33x65_q75");
    let start = scan_start(&c.jpeg);
    let mut j = c.jpeg[..start + 40].to_vec();
    j.extend_from_slice(&[0xFF, 0xD9]);
    assert_eq!(dec(&j), Err(Error::Truncated));
}

#[test]
fn missing_eoi_is_tolerated() {
    let c = case("420_33x65_q75");
    let full = dec(&c.jpeg).unwrap();
    let cut = dec(&c.jpeg[..c.jpeg.len() - 2]).unwrap();
    assert_eq!(full, cut);
}

#[test]
fn invalid_huffman_code_fails() {
    // 48 one-bits can never be consumed as codes: no Huffman code may be
    // all ones, so some code must start inside the run and fail.
    let c = case("444_33x65_q75");
    let start = scan_start(&c.jpeg);
    let mut j = c.jpeg.clone();
    let at = start + (j.len() - start) / 2;
    for k in 0..6 {
        j[at + 2 * k] = 0xFF;
        j[at + 2 * k + 1] = 0x00;
    }
    match dec(&j) {
        Err(Error::Corrupt(msg)) => assert!(msg.contains("Huffman"), "{msg}"),
        other => panic!("expected Huffman error, got {other:?}"),
    }
}

#[test]
fn extraneous_scan_bytes_fail() {
    let c = case("420_33x65_q75");
    let mut j = c.jpeg[..c.jpeg.len() - 2].to_vec();
    j.extend_from_slice(&[0x12, 0x34, 0xFF, 0xD9]);
    assert!(matches!(dec(&j), Err(Error::Corrupt(_))));
}

#[test]
fn bad_markers_fail() {
    let c = case("420_33x65_q75");
    let sof = sof_offset(&c.jpeg);
    for marker in [0x02u8, 0xC8, 0xF0, 0xD8] {
        let mut j = c.jpeg[..sof].to_vec();
        j.extend_from_slice(&[0xFF, marker, 0x00, 0x04, 0x00, 0x00]);
        j.extend_from_slice(&c.jpeg[sof..]);
        assert!(
            matches!(dec(&j), Err(Error::Corrupt(_))),
            "marker {marker:02X}"
        );
    }
    // Garbage between segments.
    let mut j = c.jpeg[..sof].to_vec();
    j.push(0x00);
    j.extend_from_slice(&c.jpeg[sof..]);
    assert!(matches!(dec(&j), Err(Error::Corrupt(_))));
    // No SOI.
    assert!(matches!(dec(&c.jpeg[2..]), Err(Error::Corrupt(_))));
}

#[test]
fn wrong_restart_marker_fails() {
    let c = case("420_restart_blocks1");
    let start = scan_start(&c.jpeg);
    let mut j = c.jpeg.clone();
    let rst = (start..j.len() - 1)
        .find(|&i| j[i] == 0xFF && j[i + 1] == 0xD1)
        .unwrap();
    j[rst + 1] = 0xD3;
    assert!(matches!(dec(&j), Err(Error::Corrupt(_))));
    j.drain(rst..rst + 2);
    assert!(dec(&j).is_err());
}

fn with_sof(jpeg: &[u8], f: impl Fn(&mut [u8])) -> Vec<u8> {
    let mut j = jpeg.to_vec();
    let sof = sof_offset(&j);
    f(&mut j[sof..]);
    j
}

#[test]
fn zero_size_frame_fails() {
    let c = case("420_33x65_q75");
    for at in [5usize, 7] {
        let j = with_sof(&c.jpeg, |s| {
            s[at] = 0;
            s[at + 1] = 0;
        });
        assert!(matches!(dec(&j), Err(Error::Corrupt(_))));
        assert!(read_header(None, &j).is_ok());
    }
}

#[test]
fn huge_frame_respects_limits() {
    let c = case("420_33x65_q75");
    let j = with_sof(&c.jpeg, |s| {
        s[5..9].copy_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF])
    });
    let tiny = Limits {
        max_width: 4096,
        max_height: 4096,
        max_alloc: 1 << 20,
    };
    let r = decode(None, &j, ColorTransform::Auto, &tiny);
    assert!(
        matches!(r, Err(Error::TooLarge { what: "width", .. })),
        "{r:?}"
    );
    assert!(matches!(dec(&j), Err(Error::TooLarge { .. })));
    let j = with_sof(&c.jpeg, |s| {
        s[5..9].copy_from_slice(&[0x0F, 0xFF, 0x0F, 0xFF])
    });
    let r = decode(None, &j, ColorTransform::Auto, &tiny);
    assert!(
        matches!(
            r,
            Err(Error::TooLarge {
                what: "allocation in bytes",
                ..
            })
        ),
        "{r:?}"
    );
    let h = read_header(None, &j).unwrap();
    assert_eq!((h.width, h.height), (4095, 4095));
}

#[test]
fn unsupported_encodings_are_reported() {
    let c = case("420_33x65_q75");
    for (m, what) in [
        (0xC3u8, "lossless"),
        (0xC9, "arithmetic"),
        (0xC5, "hierarchical"),
    ] {
        let j = with_sof(&c.jpeg, |s| s[1] = m);
        match dec(&j) {
            Err(Error::Unsupported(msg)) => assert!(msg.contains(what), "{msg}"),
            other => panic!("{m:02X}: {other:?}"),
        }
        assert!(matches!(read_header(None, &j), Err(Error::Unsupported(_))));
    }
    let j = with_sof(&c.jpeg, |s| s[4] = 12);
    assert!(matches!(dec(&j), Err(Error::Unsupported(_))));
}

#[test]
fn abbreviated_stream_needs_its_tables() {
    let c = case("420_abbreviated");
    assert!(c.tables.is_some());
    assert!(matches!(dec(&c.jpeg), Err(Error::Corrupt(_))));
    let ok = decode(
        c.tables.as_deref(),
        &c.jpeg,
        ColorTransform::Auto,
        &Limits::default(),
    );
    assert_eq!(ok.unwrap(), c.expected);
}

#[test]
fn colour_transform_overrides() {
    // A YCbCr file decoded with `None` must not equal the RGB conversion,
    // and `YCbCrToRgb` on a JFIF file is the same as `Auto`.
    let c = case("420_33x65_q75");
    let auto = dec(&c.jpeg).unwrap();
    let forced = decode(
        None,
        &c.jpeg,
        ColorTransform::YCbCrToRgb,
        &Limits::default(),
    )
    .unwrap();
    let raw = decode(None, &c.jpeg, ColorTransform::None, &Limits::default()).unwrap();
    assert_eq!(auto, forced);
    assert_ne!(auto, raw);
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn mutated_inputs_never_panic() {
    let names = [
        "420_17x9_q75",
        "mixed_17x9_q75",
        "420_restart_blocks1",
        "420_noninterleaved",
        "420_abbreviated",
        "gray_21x13_cjpeg_restart",
        "444_16bit_qt",
        "prog_420_pil",
        "prog_mixed_restart",
    ];
    let cases: Vec<Case> = load_cases()
        .into_iter()
        .filter(|c| names.contains(&c.name.as_str()))
        .collect();
    assert_eq!(cases.len(), names.len());
    let limits = Limits {
        max_width: 2048,
        max_height: 2048,
        max_alloc: 32 << 20,
    };
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut ok = 0;
    // LJPEG_FUZZ_ITERS allows longer runs (e.g. in release mode).
    let iters: usize = std::env::var("LJPEG_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    for i in 0..iters {
        let c = &cases[i % cases.len()];
        let mut j = c.jpeg.clone();
        let mut t = c.tables.clone();
        match rng.below(6) {
            0 => j.truncate(rng.below(j.len() + 1)),
            1 => {
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(j.len());
                    j[at] ^= 1 << rng.below(8);
                }
            }
            2 => {
                let at = rng.below(j.len());
                j[at] = rng.next() as u8;
            }
            3 => {
                let at = rng.below(j.len());
                j.insert(
                    at,
                    if rng.below(2) == 0 {
                        0xFF
                    } else {
                        rng.next() as u8
                    },
                );
            }
            4 => {
                // Header fields are where size and table logic lives.
                let at = rng.below(scan_start(&c.jpeg).min(j.len()));
                j[at] = rng.next() as u8;
            }
            _ => {
                if let Some(tb) = t.as_mut() {
                    let at = rng.below(tb.len());
                    tb[at] = rng.next() as u8;
                } else {
                    let at = rng.below(j.len());
                    j.remove(at);
                }
            }
        }
        let r = decode(t.as_deref(), &j, ColorTransform::Auto, &limits);
        if let Ok(img) = r {
            assert_eq!(
                img.data.len(),
                img.width as usize * img.height as usize * usize::from(img.components)
            );
            ok += 1;
        }
        let _ = read_header(t.as_deref(), &j);
    }
    // Most mutations must be caught; a few (e.g. in APPn payloads) are benign.
    assert!(ok < iters / 2, "{ok} mutated inputs decoded");
}

#[test]
fn progressive_needs_complete_refinement_and_eoi() {
    let c = case("prog_420_pil");
    assert_eq!(dec(&c.jpeg).unwrap(), c.expected);
    // Keep only the first scan, then EOI: libjpeg would smooth blocks here.
    let first = scan_start(&c.jpeg);
    let second_sos = (first..c.jpeg.len() - 1)
        .find(|&i| c.jpeg[i] == 0xFF && c.jpeg[i + 1] == 0xDA)
        .unwrap();
    let mut j = c.jpeg[..second_sos].to_vec();
    j.extend_from_slice(&[0xFF, 0xD9]);
    assert!(matches!(dec(&j), Err(Error::Unsupported(_))));
    // Without EOI the file may be missing scans.
    assert_eq!(dec(&c.jpeg[..second_sos]), Err(Error::Truncated));
    assert_eq!(dec(&c.jpeg[..c.jpeg.len() - 2]), Err(Error::Truncated));
}
