//! Scenes of several files with band lists, physical units, a cloud mask and
//! a planned grid (a STAC item's assets), on GeoTIFFs written for each test.

use std::sync::Arc;

use bytes::Bytes;
use rsembed_schemas::job::TilingSpec;
use rsembed_schemas::task::{MaskKind, Units};

use super::test_tiff::{write, Place, Planes};
use super::*;
use crate::scale::ScaleSpec;
use crate::tiff::TiffLimits;

const W: u32 = 16;
const H: u32 = 16;
const UTM: Place = Place {
    x0: 400_000.0,
    y0: 5_000_000.0,
    pixel: 10.0,
    epsg: 32633,
};

fn tiling() -> TilingSpec {
    TilingSpec {
        chip_size: 8,
        stride: 8,
        bands: vec![1, 2, 3],
        scale: "none".into(),
        min_valid: None,
        band_files: None,
        assets: None,
        cloud_mask: None,
        max_cloud: None,
        footprint_tolerance: Some(rsembed_schemas::job::DEFAULT_FOOTPRINT_TOLERANCE),
        embedding_type: Default::default(),
        align: Default::default(),
        windows: None,
        schema_version: rsembed_schemas::SCHEMA_VERSION,
    }
}

fn part(name: &str, bytes: Vec<u8>, bands: &[u32]) -> ScenePart {
    ScenePart {
        uri: format!("mem://{name}"),
        reader: Arc::new(MemRange::new(Bytes::from(bytes))),
        bands: bands.to_vec(),
    }
}

fn parts(files: Vec<ScenePart>) -> SceneParts {
    SceneParts {
        files,
        mask: None,
        units: vec![],
        grid: None,
    }
}

fn open(p: SceneParts, scale: ScaleSpec) -> Result<Scene, SceneError> {
    futures::executor::block_on(Scene::open_parts(
        p,
        &tiling(),
        scale,
        TiffLimits::default(),
        "mem://scene",
        None,
    ))
}

/// Every chip of the scene, row by row.
fn chips(scene: &Scene) -> Vec<SceneChip> {
    scene
        .windows(None)
        .into_iter()
        .filter_map(|w| futures::executor::block_on(scene.chip(w, None)).unwrap())
        .collect()
}

/// The 8-bit original: every value 0..=255 occurs, and the bands differ.
fn v(b: u32, x: u32, y: u32) -> u32 {
    (x * 16 + y + b * 85) % 256
}

fn plane(b: u32, f: impl Fn(u32) -> u32) -> impl Iterator<Item = u32> {
    (0..H)
        .flat_map(move |y| (0..W).map(move |x| (x, y)))
        .map(move |(x, y)| f(v(b, x, y)))
}

fn u8_file(bands: &[u32]) -> Vec<u8> {
    let data = bands
        .iter()
        .flat_map(|&b| plane(b, |v| v))
        .map(|v| v as u8)
        .collect();
    write(W, H, bands.len() as u16, &Planes::U8(data), Some(UTM), None)
}

fn u16_file(bands: &[u32], dn: impl Fn(u32) -> u32 + Copy) -> Vec<u8> {
    let data = bands
        .iter()
        .flat_map(|&b| plane(b, dn))
        .map(|v| v as u16)
        .collect();
    write(
        W,
        H,
        bands.len() as u16,
        &Planes::U16(data),
        Some(UTM),
        None,
    )
}

fn units(scale: f64, offset: f64) -> Option<Units> {
    Some(Units { scale, offset })
}

#[test]
fn physical_units_give_the_bytes_of_the_8_bit_original() {
    let original = open(
        parts(vec![part("rgb8", u8_file(&[0, 1, 2]), &[1, 2, 3])]),
        ScaleSpec::None,
    )
    .unwrap();
    let want: Vec<Vec<u8>> = chips(&original).into_iter().map(|c| c.rgb.data).collect();
    assert_eq!(want.len(), 4);
    assert!(want.iter().flatten().any(|&x| x == 255) && want.iter().flatten().any(|&x| x == 0));
    let range = ScaleSpec::Range(0.0, 0.255);

    // Before Sentinel-2 baseline 04.00: DN = 10·v, scale 1e-4; one 3-band file.
    let mut before = parts(vec![part(
        "before",
        u16_file(&[0, 1, 2], |v| 10 * v),
        &[1, 2, 3],
    )]);
    before.units = vec![units(1e-4, 0.0); 3];
    // After: DN = 10·v + 1000, offset −0.1; three one-band files.
    let mut after = parts(
        (0..3)
            .map(|b| part(&format!("B{b}"), u16_file(&[b], |v| 10 * v + 1000), &[]))
            .collect(),
    );
    after.units = vec![units(1e-4, -0.1); 3];
    // A descending encoding (DN = 3000 − 10·v, scale −1e-4, offset 0.3), its
    // bands stored B, G, R and taken as [3, 2, 1].
    let mut negative = parts(vec![part(
        "bgr",
        u16_file(&[2, 1, 0], |v| 3000 - 10 * v),
        &[3, 2, 1],
    )]);
    negative.units = vec![units(-1e-4, 0.3); 3];

    for (name, p) in [("before", before), ("after", after), ("negative", negative)] {
        let got: Vec<Vec<u8>> = chips(&open(p, range).unwrap())
            .into_iter()
            .map(|c| c.rgb.data)
            .collect();
        assert!(
            got == want,
            "{name}: the chips differ from the 8-bit original"
        );
    }
}

#[test]
fn units_stretch_each_channel_by_its_own_range() {
    let file = || part("rgb16", u16_file(&[0, 1, 2], |v| v), &[1, 2, 3]);
    let mut p = parts(vec![file()]);
    p.units = vec![units(1e-4, -0.1), None, units(-1e-4, 0.3)];
    let s = open(p, ScaleSpec::Range(0.0, 0.255)).unwrap();
    let near = |a: (f64, f64), b: (f64, f64)| (a.0 - b.0).abs() < 1e-6 && (a.1 - b.1).abs() < 1e-6;
    let bands: Vec<(f64, f64)> = s.stretch.bands.iter().map(|b| b.unwrap()).collect();
    assert!(near(bands[0], (1000.0, 3550.0)), "{bands:?}");
    assert!(near(bands[1], (0.0, 0.255)), "no units: MIN:MAX as stored");
    assert!(
        near(bands[2], (3000.0, 450.0)),
        "negative scale: a descending range"
    );
    for (c, (lo, hi)) in bands.iter().enumerate() {
        assert_eq!(s.stretch.apply(c, *lo), 0, "MIN maps to 0");
        assert_eq!(s.stretch.apply(c, *hi), 255, "MAX maps to 255");
    }
    assert_eq!(s.stretch.apply(2, 3100.0), 0, "below MIN in physical units");

    // `none` and `auto` ignore the units.
    let mut p = parts(vec![file()]);
    p.units = vec![units(1e-4, -0.1); 3];
    assert_eq!(
        open(p, ScaleSpec::None).unwrap().stretch,
        Stretch::identity(3)
    );

    for bad in [
        units(0.0, 1.0),
        units(f64::NAN, 0.0),
        units(f64::INFINITY, 0.0),
        units(1.0, f64::NEG_INFINITY),
        units(1e-320, 0.0),
    ] {
        let mut p = parts(vec![file()]);
        p.units = vec![None, bad, None];
        let e = open(p, ScaleSpec::Range(0.0, 1.0)).err().unwrap();
        assert!(matches!(e, SceneError::Units { channel: 1, .. }), "{e}");
    }
    let mut p = parts(vec![file()]);
    p.units = vec![units(1.0, 0.0)];
    assert!(matches!(
        open(p, ScaleSpec::Range(0.0, 1.0)),
        Err(SceneError::Units { .. })
    ));
}

#[test]
fn a_scene_needs_exactly_three_channels() {
    let three = || u8_file(&[0, 1, 2]);
    let one = |b| u8_file(&[b]);
    let cases = [
        vec![part("a", three(), &[1, 2])],
        vec![part("a", one(0), &[]), part("b", one(1), &[])],
        vec![part("a", three(), &[1, 2, 3]), part("b", one(1), &[])],
        vec![part("a", three(), &[1, 1, 2, 3])],
    ];
    for files in cases {
        let e = open(parts(files), ScaleSpec::None).err().unwrap();
        assert!(matches!(e, SceneError::Channels { .. }), "{e}");
        assert!(e.to_string().contains("mem://a: bands"), "{e}");
    }
    let e = open(parts(vec![part("a", three(), &[4, 3, 2])]), ScaleSpec::None)
        .err()
        .unwrap();
    assert!(matches!(e, SceneError::NoSuchBand { bands: 3, .. }), "{e}");
    // One 3-band file, or one band of each of three files, or a mix.
    for files in [
        vec![part("a", three(), &[3, 2, 1])],
        vec![
            part("a", one(0), &[1]),
            part("b", one(1), &[]),
            part("c", one(2), &[]),
        ],
        vec![part("a", three(), &[1, 2]), part("b", one(2), &[])],
    ] {
        open(parts(files), ScaleSpec::None).unwrap();
    }
}

#[test]
fn band_lists_pick_channels_and_keep_the_planned_grid() {
    let scene = open(
        parts(vec![part("a", u8_file(&[0, 1, 2]), &[3, 1, 2])]),
        ScaleSpec::None,
    )
    .unwrap();
    let c = &chips(&scene)[0];
    assert_eq!(
        &c.rgb.data[..3],
        &[v(2, 0, 0) as u8, v(0, 0, 0) as u8, v(1, 0, 0) as u8]
    );
    assert_eq!(c.cloud_fraction, None, "no mask, no cloud fraction");

    // The planner's grid of the same files is the worker's.
    let planned = futures::executor::block_on(plan_band_grid(
        vec![Arc::new(MemRange::new(Bytes::from(u8_file(&[0, 1, 2]))))],
        &tiling(),
        TiffLimits::default(),
    ))
    .unwrap();
    assert_eq!(
        planned.map(|g| (g.width, g.height)),
        scene.grid.as_ref().map(|g| (g.width, g.height))
    );

    let mut p = parts(vec![part("a", u8_file(&[0, 1, 2]), &[1, 2, 3])]);
    p.grid = Some([W, H]);
    open(p, ScaleSpec::None).unwrap();
    let mut p = parts(vec![part("a", u8_file(&[0, 1, 2]), &[1, 2, 3])]);
    p.grid = Some([10980, 10980]);
    let e = open(p, ScaleSpec::None).err().unwrap();
    assert!(matches!(e, SceneError::GridMismatch { .. }), "{e}");
    assert!(
        e.to_string().contains("[16, 16]") && e.to_string().contains("[10980, 10980]"),
        "{e}"
    );
}

/// A one-band mask of `w`×`h` pixels at `place`.
fn mask_file(w: u32, h: u32, values: Vec<u16>, place: Option<Place>) -> Vec<u8> {
    if values.iter().all(|v| *v < 256) {
        let v = values.into_iter().map(|v| v as u8).collect();
        write(w, h, 1, &Planes::U8(v), place, None)
    } else {
        write(w, h, 1, &Planes::U16(values), place, None)
    }
}

fn with_mask(kind: MaskKind, bytes: Vec<u8>) -> SceneParts {
    // Scene nodata 0 in every band over its top-left 4×4 pixels.
    let data = (0..3)
        .flat_map(|b| {
            (0..H).flat_map(move |y| {
                (0..W).map(move |x| {
                    if x < 4 && y < 4 {
                        0
                    } else {
                        1 + v(b, x, y) as u16
                    }
                })
            })
        })
        .collect();
    let scene = write(W, H, 3, &Planes::U16(data), Some(UTM), Some("0"));
    let mut p = parts(vec![part("scene", scene, &[1, 2, 3])]);
    p.mask = Some(SceneMask {
        kind,
        uri: "mem://mask".into(),
        reader: Arc::new(MemRange::new(Bytes::from(bytes))),
    });
    p
}

#[test]
fn cloud_fraction_from_an_scl_on_a_2x_coarser_grid() {
    // SCL at 20 m beside 10 m bands: 8×8 pixels, each under 2×2 scene pixels;
    // one chip (8×8 scene pixels) sees 4×4 of them.
    let mut scl = vec![4u16; 64]; // vegetation
    let mut set = |x: usize, y: usize, c: u16| scl[y * 8 + x] = c;
    // Chip (0, 0): cloud (9) only under the scene's nodata corner, which must
    // not count; a cloud (8) and a shadow (3) pixel on valid pixels.
    for (x, y) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        set(x, y, 9);
    }
    set(2, 0, 8);
    set(3, 0, 3);
    // Chip (1, 0): all cirrus. Chip (0, 1): no data (0), never cloud.
    for y in 0..4 {
        for x in 4..8 {
            set(x, y, 10);
        }
        for x in 0..4 {
            set(x, y + 4, 0);
        }
        // Chip (1, 1): half shadow, half water (6).
        for x in 4..8 {
            set(x, y + 4, if x < 6 { 3 } else { 6 });
        }
    }
    let place = Place { pixel: 20.0, ..UTM };
    let scene = open(
        with_mask(MaskKind::Scl, mask_file(8, 8, scl, Some(place))),
        ScaleSpec::Auto,
    )
    .unwrap();
    let got: Vec<(i32, i32, Option<f32>, f32)> = chips(&scene)
        .iter()
        .map(|c| (c.window.x, c.window.y, c.cloud_fraction, c.valid_fraction))
        .collect();
    // Chip (0, 0): 48 valid pixels, 2 SCL pixels × 4 of them cloud.
    assert_eq!(
        got,
        [
            (0, 0, Some(8.0 / 48.0), 48.0 / 64.0),
            (8, 0, Some(1.0), 1.0),
            (0, 8, Some(0.0), 1.0),
            (8, 8, Some(0.5), 1.0),
        ]
    );
}

#[test]
fn cloud_fraction_from_a_qa_pixel_on_the_same_grid() {
    // Clear (21824) everywhere; cloud (22280) on one row of chip (0, 1), fill
    // with cloud bits (31) on another, cirrus (55052) over chip (1, 1).
    let mut qa = vec![21824u16; (W * H) as usize];
    for x in 0..8 {
        qa[(9 * W + x) as usize] = 22280;
        qa[(10 * W + x) as usize] = 31;
    }
    for y in 8..16 {
        for x in 8..16 {
            qa[(y * W + x) as usize] = 55052;
        }
    }
    let scene = open(
        with_mask(MaskKind::QaPixel, mask_file(W, H, qa, Some(UTM))),
        ScaleSpec::None,
    )
    .unwrap();
    let got: Vec<Option<f32>> = chips(&scene).iter().map(|c| c.cloud_fraction).collect();
    assert_eq!(got, [Some(0.0), Some(0.0), Some(8.0 / 64.0), Some(1.0)]);
}

#[test]
fn a_mask_off_the_scene_grid_is_an_error() {
    let cases = [
        (
            "half a pixel off",
            Some(Place {
                x0: UTM.x0 + 10.0,
                pixel: 20.0,
                ..UTM
            }),
            8,
        ),
        ("1.5 pixels wide", Some(Place { pixel: 15.0, ..UTM }), 11),
        ("another CRS", Some(Place { epsg: 32632, ..UTM }), 16),
        ("not georeferenced", None, 16),
    ];
    for (what, place, side) in cases {
        let m = mask_file(side, side, vec![4; (side * side) as usize], place);
        let e = open(with_mask(MaskKind::Scl, m), ScaleSpec::None).err();
        let e = e.unwrap_or_else(|| panic!("{what}: opened"));
        assert!(
            matches!(&e, SceneError::Misaligned { uri, .. } if uri == "mem://mask"),
            "{what}: {e}"
        );
    }
}

/// A chip's samples through the scene's own stretch, pixel by pixel.
fn samples_to_rgb(scene: &Scene, s: &SampleChip) -> Vec<u8> {
    let n = s.valid.len();
    (0..n)
        .flat_map(|i| {
            (0..3).map(move |c| {
                if s.valid[i] {
                    scene.to_u8(c, f64::from(s.values[c * n + i]))
                } else {
                    0
                }
            })
        })
        .collect()
}

#[test]
fn samples_are_stored_numbers_that_give_the_chips_bytes() {
    let mut after = parts(
        (0..3)
            .map(|b| part(&format!("B{b}"), u16_file(&[b], |v| 10 * v + 1000), &[]))
            .collect(),
    );
    after.units = vec![units(1e-4, -0.1); 3];
    let scene = open(after, ScaleSpec::Range(0.0, 0.255)).unwrap();
    for w in scene.windows(None) {
        let chip = futures::executor::block_on(scene.chip(w, None))
            .unwrap()
            .unwrap();
        let s = futures::executor::block_on(scene.sample_chip(w, None))
            .unwrap()
            .unwrap();
        assert_eq!(samples_to_rgb(&scene, &s), chip.rgb.data, "{w:?}");
        assert_eq!(
            (s.valid_fraction, s.cloud_fraction, &s.cell, &s.footprint),
            (
                chip.valid_fraction,
                chip.cloud_fraction,
                &chip.cell,
                &chip.footprint
            )
        );
        assert_eq!(s.clear, s.valid, "no mask: every valid pixel is clear");
        // Physical units: DN 10·v + 1000 is reflectance v/1000.
        let dn = f64::from(s.values[0]);
        let physical = scene.physical(0, dn);
        assert!((physical - (dn - 1000.0) / 10_000.0).abs() < 1e-12);
        assert!((scene.stored(0, physical) - dn).abs() < 1e-9);
    }
}

#[test]
fn samples_mark_clear_pixels_by_the_mask() {
    // QA_PIXEL on the scene grid: cloud (bit 3) on the left half of row 0.
    let mut qa = vec![0u16; (W * H) as usize];
    qa[..8].fill(1 << 3);
    let scene = open(
        with_mask(MaskKind::QaPixel, mask_file(W, H, qa, Some(UTM))),
        ScaleSpec::None,
    )
    .unwrap();
    let w = scene.windows(None)[0];
    let chip = futures::executor::block_on(scene.chip(w, None))
        .unwrap()
        .unwrap();
    let s = futures::executor::block_on(scene.sample_chip(w, None))
        .unwrap()
        .unwrap();
    assert_eq!(s.cloud_fraction, chip.cloud_fraction);
    // The chip's top-left 4×4 is nodata: of row 0's cloud, x 4..8 is valid.
    let cleared: Vec<usize> = (0..64).filter(|&i| s.valid[i] && !s.clear[i]).collect();
    assert_eq!(cleared, [4, 5, 6, 7]);
    assert!(s.clear.iter().zip(&s.valid).all(|(c, v)| !c || *v));
}
