//! Tests of `extent.rs`: the outline covers every chip within the vertex
//! bound, places apart stay apart, and the record is what the rows say.

use super::*;
use crate::sink::hull::{area2, contains};

/// A chip bbox of `w`×`h` degrees at (`x`, `y`).
fn chip(x: f64, y: f64, w: f64, h: f64) -> [f64; 4] {
    [x, y, x + w, y + h]
}

/// A scene of `n`×`n` chips of `d` degrees, tilted like a UTM grid far
/// from its central meridian (each row shifted by `shear`·`d`).
fn scene(x0: f64, y0: f64, n: usize, d: f64, shear: f64) -> Vec<[f64; 4]> {
    let mut v = Vec::new();
    for r in 0..n {
        for c in 0..n {
            let x = x0 + c as f64 * d + r as f64 * shear * d;
            let y = y0 - r as f64 * d + c as f64 * shear * d;
            v.push(chip(x, y, d * (1.0 + shear), d * (1.0 + shear)));
        }
    }
    v
}

fn build(chips: &[(String, [f64; 4])]) -> FileExtent {
    let mut b = ExtentBuilder::default();
    for (s, bb) in chips {
        b.add(s, Some(*bb), None, None, None);
    }
    b.finish()
}

fn vertices(e: &FileExtent) -> usize {
    e.footprint.iter().map(Vec::len).sum()
}

/// Every chip's bbox lies in one polygon; the bound holds; polygons are
/// counter-clockwise and their bboxes do not meet.
fn assert_covers(e: &FileExtent, chips: &[(String, [f64; 4])]) {
    assert!(vertices(e) <= MAX_VERTICES, "{} vertices", vertices(e));
    e.check().unwrap();
    for ring in &e.footprint {
        assert!(area2(ring) > 0.0, "counter-clockwise: {ring:?}");
    }
    for (s, b) in chips {
        let held = e
            .footprint
            .iter()
            .any(|ring| corners(*b).iter().all(|&p| contains(ring, p, 1e-12)));
        assert!(
            held,
            "the chip {b:?} of {s} is not covered by {:?}",
            e.footprint
        );
    }
    let boxes: Vec<[f64; 4]> = e
        .footprint
        .iter()
        .map(|r| {
            FileExtent {
                footprint: vec![r.clone()],
                ..FileExtent::default()
            }
            .bbox()
            .unwrap()
        })
        .collect();
    for i in 0..boxes.len() {
        for j in i + 1..boxes.len() {
            assert!(!meet(boxes[i], boxes[j]), "polygons {i} and {j} meet");
        }
    }
}

fn in_any(e: &FileExtent, p: Pt) -> bool {
    e.footprint.iter().any(|r| contains(r, p, 0.0))
}

fn named(source: &str, chips: Vec<[f64; 4]>) -> Vec<(String, [f64; 4])> {
    chips.into_iter().map(|b| (source.to_owned(), b)).collect()
}

#[test]
fn a_tilted_scene_is_one_small_polygon_that_holds_every_chip() {
    let chips = named("s", scene(-100.0, 47.0, 8, 0.03, 0.05));
    let e = build(&chips);
    assert_covers(&e, &chips);
    assert_eq!(e.footprint.len(), 1);
    // The hull of a tilted grid's corners is a quadrilateral with notches;
    // a percent of slack leaves about four vertices, not one per chip.
    assert!(vertices(&e) <= 8, "{:?}", e.footprint);
    // The chips' bbox, grown by at most a few centimetres (the grid).
    let all = chips.iter().map(|c| c.1).reduce(union).unwrap();
    let b = e.bbox().unwrap();
    for k in 0..2 {
        assert!(b[k] <= all[k] && all[k] - b[k] < 5e-6, "{b:?} {all:?}");
        assert!(
            b[k + 2] >= all[k + 2] && b[k + 2] - all[k + 2] < 5e-6,
            "{b:?} {all:?}"
        );
    }
}

#[test]
fn two_places_far_apart_stay_two_polygons_and_between_is_nothing() {
    // North Dakota and Japan, one task.
    let mut chips = named("nd", scene(-100.0, 47.0, 4, 0.03, 0.02));
    chips.extend(named("jp", scene(139.0, 36.0, 4, 0.03, -0.02)));
    let e = build(&chips);
    assert_covers(&e, &chips);
    assert_eq!(e.footprint.len(), 2);
    for p in [[0.0, 40.0], [-99.0, 36.0], [139.05, 47.0], [20.0, 0.0]] {
        assert!(!in_any(&e, p), "{p:?} is between the places");
    }
    assert!(in_any(&e, [-99.95, 46.95]) && in_any(&e, [139.05, 35.95]));
}

#[test]
fn touching_scenes_are_one_polygon() {
    // Two scenes side by side (their edge chips share a border) and a
    // third overlapping the second: one polygon, nothing overlaps.
    let mut chips = named("a", scene(10.0, 50.0, 4, 0.1, 0.0));
    chips.extend(named("b", scene(10.4, 50.0, 4, 0.1, 0.0)));
    chips.extend(named("c", scene(10.6, 49.8, 4, 0.1, 0.0)));
    let e = build(&chips);
    assert_covers(&e, &chips);
    assert_eq!(e.footprint.len(), 1, "{:?}", e.footprint);
}

#[test]
fn over_the_bound_near_places_merge_and_far_ones_stay_apart() {
    // 40 small images along a coast, 0.05° apart, and 40 more in another
    // country: more polygons than the bound allows, so neighbours merge,
    // but the two countries do not.
    let mut chips = Vec::new();
    for i in 0..40 {
        let x = 5.0 + i as f64 * 0.05;
        chips.push((
            format!("fr{i}"),
            chip(x, 43.0 + (i % 3) as f64 * 0.01, 0.01, 0.01),
        ));
        let x = -75.0 + i as f64 * 0.05;
        chips.push((format!("us{i}"), chip(x, 40.0, 0.01, 0.01)));
    }
    let e = build(&chips);
    assert_covers(&e, &chips);
    assert!(e.footprint.len() <= MAX_VERTICES / 4);
    assert!(e.footprint.len() >= 2);
    assert!(
        !in_any(&e, [-30.0, 41.0]),
        "the ocean between is not covered"
    );
}

#[test]
fn a_scene_cut_by_the_antimeridian_is_two_narrow_polygons() {
    // Fiji: one scene's chips on both sides of ±180°.
    let mut chips = named("fiji", scene(179.7, -17.0, 3, 0.1, 0.0));
    chips.extend(named("fiji", scene(-180.0, -17.0, 3, 0.1, 0.0)));
    let e = build(&chips);
    assert_covers(&e, &chips);
    assert_eq!(e.footprint.len(), 2);
    let b = e.bbox().unwrap();
    assert!(b[2] - b[0] > 359.0, "the two sides of the map");
    assert!(!in_any(&e, [0.0, -17.1]), "not around the globe");
    // Even when the bound forces merges of near places, the two sides
    // stay apart.
    let mut many = chips.clone();
    for i in 0..30 {
        many.push((
            format!("w{i}"),
            chip(-179.0 + i as f64 * 0.02, -16.0, 0.01, 0.01),
        ));
        many.push((
            format!("e{i}"),
            chip(178.0 + i as f64 * 0.02, -16.0, 0.01, 0.01),
        ));
    }
    let e = build(&many);
    assert_covers(&e, &many);
    for r in &e.footprint {
        let fb = FileExtent {
            footprint: vec![r.clone()],
            ..FileExtent::default()
        }
        .bbox()
        .unwrap();
        assert!(fb[2] - fb[0] < 180.0, "{fb:?}");
    }
}

#[test]
fn chips_all_around_the_globe_still_get_a_bounded_cover() {
    let mut chips = Vec::new();
    for i in 0..200 {
        let x = -179.0 + (i * 37 % 358) as f64;
        let y = -80.0 + (i * 53 % 160) as f64;
        chips.push((format!("p{i}"), chip(x, y, 0.01, 0.01)));
    }
    let e = build(&chips);
    assert_covers(&e, &chips);
}

#[test]
fn very_many_inputs_are_keyed_by_cell_and_still_covered() {
    let mut chips = Vec::new();
    for i in 0..3000 {
        let x = -10.0 + (i % 60) as f64 * 0.3;
        let y = 30.0 + (i / 60) as f64 * 0.3;
        chips.push((format!("img{i}"), chip(x, y, 0.001, 0.001)));
    }
    let mut b = ExtentBuilder::default();
    for (s, bb) in &chips {
        b.add(s, Some(*bb), None, None, None);
        assert!(b.parts.len() <= MAX_PARTS);
    }
    assert!(b.key_cell.is_some());
    let e = b.finish();
    assert_covers(&e, &chips);
}

#[test]
fn the_record_does_not_depend_on_the_row_order() {
    let mut chips = named("a", scene(1.0, 1.0, 5, 0.01, 0.03));
    for i in 0..30 {
        chips.push((format!("x{i}"), chip(i as f64 * 0.3, -5.0, 0.01, 0.01)));
    }
    let e = build(&chips);
    chips.reverse();
    assert_eq!(build(&chips), e);
    assert_covers(&e, &chips);
}

#[test]
fn times_sources_and_undated_chips_are_counted() {
    let mut b = ExtentBuilder::default();
    b.add("https://x/items/b", None, Some(10), None, Some("b"));
    b.add("https://x/items/a", None, Some(5), Some(20), Some("a"));
    b.add("https://x/items/a", None, Some(7), None, Some("a"));
    b.add("file:///plain.png", None, None, None, None);
    let e = b.finish();
    assert_eq!((e.start, e.end, e.undated), (Some(5), Some(20), 1));
    assert_eq!(e.sources.len(), 2);
    assert!(e.footprint.is_empty() && !e.more_sources);

    let (mut fwd, mut rev) = (ExtentBuilder::default(), ExtentBuilder::default());
    let n = MAX_SOURCES + 20;
    let uri = |i: usize| format!("https://x/items/{i:04}");
    for i in 0..n {
        fwd.add(&uri(i), None, Some(1), None, Some("id"));
        rev.add(&uri(n - 1 - i), None, Some(1), None, Some("id"));
    }
    let (fwd, rev) = (fwd.finish(), rev.finish());
    assert_eq!(fwd, rev);
    assert_eq!(fwd.sources.len(), MAX_SOURCES);
    assert!(fwd.more_sources);
    assert_eq!(fwd.sources.keys().last(), Some(&uri(MAX_SOURCES - 1)));
}

#[test]
fn the_footer_entry_round_trips_and_a_bad_one_is_none() {
    let chips = named("s", scene(-100.0, 47.0, 3, 0.03, 0.05));
    let e = build(&chips);
    let kv = vec![entry(&e).unwrap()];
    assert_eq!(from_footer(Some(&kv)), Some(e.clone()));
    assert_eq!(from_footer(None), None);
    for bad in [
        "{",
        r#"{"footprint": [[[0, 0], [1, 0]]]}"#,
        r#"{"start": "x"}"#,
    ] {
        let kv = vec![KeyValue::new(EXTENT_KEY.to_owned(), bad.to_owned())];
        assert_eq!(from_footer(Some(&kv)), None, "{bad}");
    }
    // A typical scene block's record, as JSON: the cost a done record pays.
    let json = serde_json::to_string(&e).unwrap();
    assert!(json.len() < 400, "{} bytes: {json}", json.len());
}

#[test]
fn a_composite_row_is_dated_by_its_window() {
    // A scene's chip: its acquisition, whatever its window.
    assert_eq!(row_time(Some(5), None, Some((0, 10))), (Some(5), None));
    assert_eq!(row_time(Some(5), Some(7), None), (Some(5), Some(7)));
    // A median row: its window, the end exclusive.
    assert_eq!(row_time(None, None, Some((0, 10))), (Some(0), Some(9)));
    assert_eq!(row_time(None, None, None), (None, None));
}
