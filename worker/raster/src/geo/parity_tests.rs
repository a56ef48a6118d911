//! GDAL parity on the committed fixtures (see tools/gen_geo_fixtures.py).
//!
//! Each fixture holds a file's raw GeoTIFF tags and GDAL 3.6's answers; these
//! tests rebuild everything from the tags alone and hold it to GDAL.

use serde_json::Value;

use rsembed_schemas::job::DEFAULT_FOOTPRINT_TOLERANCE;

use super::wkb::decode_polygon;
use super::*;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/geo");
/// Our points (corners, centres) within 1e-7 degrees of GDAL's.
const MAX_ERR_DEG: f64 = 1e-7;

pub(super) fn fixtures() -> Vec<(String, Value)> {
    let mut paths: Vec<_> = std::fs::read_dir(FIXTURES)
        .expect("fixtures/geo")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    assert!(
        paths.len() >= 10,
        "fixtures/geo looks incomplete: {paths:?}"
    );
    paths
        .into_iter()
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (
                name,
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap(),
            )
        })
        .collect()
}

fn f64s(v: &Value) -> Option<Vec<f64>> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_f64().unwrap()).collect())
}

pub(super) fn tags_of(fx: &Value) -> GeoTiffTags {
    let t = &fx["tags"];
    GeoTiffTags {
        model_pixel_scale: f64s(&t["model_pixel_scale"]),
        model_tiepoint: f64s(&t["model_tiepoint"]),
        model_transformation: f64s(&t["model_transformation"]),
        geo_key_directory: t["geo_key_directory"]
            .as_array()
            .map(|a| a.iter().map(|x| x.as_u64().unwrap() as u16).collect()),
        geo_double_params: f64s(&t["geo_double_params"]),
        geo_ascii_params: t["geo_ascii_params"].as_str().map(str::to_string),
    }
}

struct Scene {
    gt: GeoTransform,
    crs: Crs,
    projector: Projector,
}

fn scene(name: &str, fx: &Value) -> Scene {
    let tags = tags_of(fx);
    let keys = parse_geokeys(&tags).unwrap().expect("geokeys");
    let gt = geotransform(&tags, Some(&keys))
        .unwrap()
        .expect("geotransform");
    let crs = crs_from_geokeys(&keys)
        .unwrap()
        .unwrap_or_else(|| panic!("{name}: no CRS"));
    let projector =
        Projector::new(&crs).unwrap_or_else(|e| panic!("{name}: {e} ({})", crs.label()));
    Scene { gt, crs, projector }
}

/// Every fixture's CRS, affine and windows (x, y, w, h).
pub(super) fn fixture_windows() -> Vec<(Crs, GeoTransform, Vec<[f64; 4]>)> {
    fixtures()
        .into_iter()
        .map(|(name, fx)| {
            let s = scene(&name, &fx);
            let windows = fx["windows"].as_array().unwrap().iter().map(window);
            (s.crs, s.gt, windows.collect())
        })
        .collect()
}

/// (col, row, GDAL lon/lat or None if GDAL failed) of one probed point.
type Probe = (f64, f64, Option<(f64, f64)>);

/// The probed points of a window: its outline, then its centre.
fn points(win: &Value) -> Vec<Probe> {
    let pts = win["points"].as_array().unwrap().iter().map(|p| {
        let p = p.as_array().unwrap();
        let lonlat = p[2].as_f64().zip(p[3].as_f64());
        (p[0].as_f64().unwrap(), p[1].as_f64().unwrap(), lonlat)
    });
    pts.collect()
}

fn window(win: &Value) -> [f64; 4] {
    ["x", "y", "w", "h"].map(|k| win[k].as_f64().unwrap())
}

#[test]
fn geotransform_matches_gdal() {
    for (name, fx) in fixtures() {
        let ours = geotransform(
            &tags_of(&fx),
            parse_geokeys(&tags_of(&fx)).unwrap().as_ref(),
        )
        .unwrap()
        .unwrap();
        let gdal = f64s(&fx["gdal_geotransform"]).unwrap();
        for (a, b) in ours.0.iter().zip(&gdal) {
            assert!(
                (a - b).abs() <= 1e-9 * b.abs().max(1.0),
                "{name}: {:?} vs GDAL {gdal:?}",
                ours.0
            );
        }
    }
}

#[test]
fn crs_matches_gdal() {
    for (name, fx) in fixtures() {
        let s = scene(&name, &fx);
        match fx["gdal_epsg"].as_u64() {
            Some(code) => assert_eq!(s.crs, Crs::Epsg(code as u32), "{name}"),
            None => assert!(
                matches!(s.crs, Crs::UserDefined { .. }),
                "{name}: {:?}",
                s.crs
            ),
        }
        println!(
            "{name}: {} (GDAL: {})",
            s.crs.label(),
            fx["gdal_proj4"].as_str().unwrap()
        );
    }
}

#[test]
fn points_match_gdal() {
    let mut worst = 0.0f64;
    for (name, fx) in fixtures() {
        let s = scene(&name, &fx);
        let mut max_err = 0.0f64;
        for win in fx["windows"].as_array().unwrap() {
            for (c, r, gdal) in points(win) {
                let (x, y) = s.gt.apply(c, r);
                let ours = s.projector.to_lonlat(x, y);
                match (ours, gdal) {
                    (Some(o), Some(g)) => {
                        max_err = max_err.max((o.0 - g.0).abs()).max((o.1 - g.1).abs())
                    }
                    (None, None) => {}
                    _ => panic!("{name} ({c}, {r}): ours {ours:?}, GDAL {gdal:?}"),
                }
            }
        }
        println!("{name}: max |ours - GDAL| = {max_err:.3e} deg");
        assert!(max_err <= MAX_ERR_DEG, "{name}: {max_err:e} deg");
        worst = worst.max(max_err);
    }
    println!("all fixtures: max error {worst:.3e} deg");
}

/// Euclidean distance in lon/lat degrees from p to segment a-b.
pub(super) fn dist_to_segment(p: (f64, f64), a: (f64, f64), b: (f64, f64)) -> f64 {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let len2 = dx * dx + dy * dy;
    let t = if len2 == 0.0 {
        0.0
    } else {
        (((p.0 - a.0) * dx + (p.1 - a.1) * dy) / len2).clamp(0.0, 1.0)
    };
    ((p.0 - a.0 - t * dx).powi(2) + (p.1 - a.1 - t * dy).powi(2)).sqrt()
}

/// Distance in source pixels from GDAL's point `g` of a window's outline to
/// our footprint `ring`: `g` and the points of the ring's nearest segment (64
/// along it, the segment being straight in lon/lat, not in the grid) are
/// mapped into the grid by our projector, which `points_match_gdal` holds
/// to GDAL within 1e-8 degrees, far below a hundredth of any fixture's pixel.
fn pixels_off(s: &Scene, ring: &[(f64, f64)], g: (f64, f64)) -> f64 {
    let seg = ring
        .windows(2)
        .min_by(|a, b| {
            let d = |s: &[(f64, f64)]| dist_to_segment(g, s[0], s[1]);
            d(a).total_cmp(&d(b))
        })
        .unwrap();
    let to_px = |p| s.projector.lonlat_to_pixel(&s.gt, p).unwrap();
    let q = to_px(g);
    let chord: Vec<_> = (0..=64)
        .map(|k| {
            let t = k as f64 / 64.0;
            to_px((
                seg[0].0 + (seg[1].0 - seg[0].0) * t,
                seg[0].1 + (seg[1].1 - seg[0].1) * t,
            ))
        })
        .collect();
    chord
        .windows(2)
        .map(|c| dist_to_segment(q, c[0], c[1]))
        .fold(f64::INFINITY, f64::min)
}

/// Every fixture window's footprint at `tolerance` against GDAL's points of
/// its outline and centre; the worst outline point's distance in pixels.
fn footprints_against_gdal(name: &str, fx: &Value, tolerance: Tolerance) -> f64 {
    let s = scene(name, fx);
    let s = Scene {
        projector: s.projector.with_tolerance(tolerance),
        ..s
    };
    let mut max_px = 0.0f64;
    for win in fx["windows"].as_array().unwrap() {
        let [x, y, w, h] = window(win);
        let pts = points(win);
        let fp = s.projector.footprint(&s.gt, x, y, w, h);
        if pts.iter().any(|p| p.2.is_none()) {
            assert!(
                fp.is_none(),
                "{name} {x},{y}: GDAL fails on part of the outline, we gave a footprint"
            );
            // The centre stands alone: on the disk GDAL gives it, and so must we.
            let ours = s.projector.centre(&s.gt, x, y, w, h);
            match (pts[pts.len() - 1].2, ours) {
                (Some(c), Some(o)) => assert!(
                    (o[0] - c.0).abs() <= MAX_ERR_DEG && (o[1] - c.1).abs() <= MAX_ERR_DEG,
                    "{name} {x},{y}: centre {o:?}, GDAL {c:?}"
                ),
                (None, None) => {}
                (c, o) => panic!("{name} {x},{y}: centre {o:?}, GDAL {c:?}"),
            }
            continue;
        }
        let fp = fp.unwrap_or_else(|| panic!("{name} {x},{y}: no footprint"));
        let ring = decode_polygon(&fp.wkb);
        assert_eq!(ring.first(), ring.last(), "{name}: ring not closed");
        let area: f64 = ring
            .windows(2)
            .map(|s| s[0].0 * s[1].1 - s[1].0 * s[0].1)
            .sum();
        assert!(area > 0.0, "{name}: ring not counter-clockwise");
        let (outline, centre) = pts.split_at(pts.len() - 1);
        for (c, r, g) in outline {
            let g = g.unwrap();
            max_px = max_px.max(pixels_off(&s, &ring, g));
            // The bbox covers the ring, which may pass inside the outline by
            // the tolerance: a pixel's size in degrees there is the slack.
            let step = |dc: f64, dr: f64| {
                let (a, b) = (s.gt.apply(*c, *r), s.gt.apply(c + dc, r + dr));
                let (a, b) = (
                    s.projector.to_lonlat(a.0, a.1),
                    s.projector.to_lonlat(b.0, b.1),
                );
                a.zip(b)
                    .map_or(0.0, |(a, b)| (a.0 - b.0).abs().max((a.1 - b.1).abs()))
            };
            let slack = MAX_ERR_DEG + step(1.0, 0.0).max(step(0.0, 1.0));
            let b = fp.bbox;
            assert!(
                g.0 >= b[0] - slack
                    && g.0 <= b[2] + slack
                    && g.1 >= b[1] - slack
                    && g.1 <= b[3] + slack,
                "{name}: {g:?} outside {b:?}"
            );
        }
        let c = centre[0].2.unwrap();
        let ours = s.projector.centre(&s.gt, x, y, w, h).expect("a centre");
        assert!((ours[0] - c.0).abs() <= MAX_ERR_DEG && (ours[1] - c.1).abs() <= MAX_ERR_DEG);
    }
    max_px
}

/// GDAL's outline points are within the default hundredth of a pixel of our
/// footprints (in every fixture's own pixels), at the dyadic points GDAL was
/// probed at, which our vertices need not be.
#[test]
fn footprints_match_gdal() {
    for (name, fx) in fixtures() {
        let max_px = footprints_against_gdal(&name, &fx, Tolerance::default());
        println!("{name}: GDAL outline points to our polygon: max {max_px:.6e} px");
        assert!(
            max_px <= DEFAULT_FOOTPRINT_TOLERANCE,
            "{name}: outline off by {max_px:e} px"
        );
    }
}

/// The comparison above can fail: footprints to a whole pixel (corners
/// only, mostly) are more than a hundredth of a pixel off GDAL's outline in
/// the fixtures whose edges bend.
#[test]
fn coarse_footprints_fail_the_gdal_comparison() {
    let mut off = vec![];
    for (name, fx) in fixtures() {
        let max_px = footprints_against_gdal(&name, &fx, Tolerance::Pixels(1.0));
        assert!(max_px <= 1.0, "{name}: {max_px} px at a 1-pixel tolerance");
        if max_px > DEFAULT_FOOTPRINT_TOLERANCE {
            off.push(name);
        }
    }
    println!("off by more than 0.01 px at 1 px: {off:?}");
    assert!(off.len() >= 3, "{off:?}");
}

#[test]
fn goes_off_earth_corners_give_none() {
    let fx: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURES}/goes.json")).unwrap())
            .unwrap();
    let s = scene("goes", &fx);
    assert!(s.crs.label().starts_with("+proj=geos"), "{}", s.crs.label());
    let (mut none, mut some) = (0, 0);
    for win in fx["windows"].as_array().unwrap() {
        let [x, y, w, h] = window(win);
        match s.projector.footprint(&s.gt, x, y, w, h) {
            None => none += 1,
            Some(_) => some += 1,
        }
    }
    assert!(none >= 3 && some >= 2, "off-Earth {none}, on-Earth {some}");
    // A chip at the disk's edge: a corner in space, its centre on Earth (the
    // row's centre_lon/centre_lat; footprints_match_gdal checks the value).
    assert!(s
        .projector
        .footprint(&s.gt, 0.0, 0.0, 256.0, 256.0)
        .is_none());
    assert!(s.projector.centre(&s.gt, 0.0, 0.0, 256.0, 256.0).is_some());
    assert!(s
        .projector
        .centre(&s.gt, 512.0, 0.0, 256.0, 256.0)
        .is_none());
    // The full disk's corners are in space.
    assert!(s
        .projector
        .footprint(&s.gt, 0.0, 0.0, 542.0, 542.0)
        .is_none());
}
