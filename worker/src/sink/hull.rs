//! Planar geometry for chip-file footprints ([`super::extent`]): convex hulls
//! of lon/lat points, and fewer-vertex polygons that still contain them.
//!
//! Lon/lat is treated as a plane, as GeoJSON and STAC API searches do.

/// A point: lon, lat.
pub(crate) type Pt = [f64; 2];

fn cross(o: Pt, a: Pt, b: Pt) -> f64 {
    (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])
}

/// Twice the signed area of a ring (positive when counter-clockwise), from
/// its first vertex: products of absolute lon/lat (16 200 at a corner of the
/// world) would drown a small ring's area in rounding.
pub(crate) fn area2(ring: &[Pt]) -> f64 {
    let Some(&o) = ring.first() else {
        return 0.0;
    };
    ring.windows(2).map(|w| cross(o, w[0], w[1])).sum()
}

/// The convex hull of `points` (Andrew's monotone chain): counter-clockwise,
/// open, without collinear vertices; its vertices are input points, so it
/// holds every input point exactly. Fewer than 3 vertices when the points
/// are all on one line.
pub(crate) fn convex_hull(mut points: Vec<Pt>) -> Vec<Pt> {
    points.sort_by(|a, b| a[0].total_cmp(&b[0]).then(a[1].total_cmp(&b[1])));
    points.dedup();
    if points.len() < 3 {
        return points;
    }
    let mut hull: Vec<Pt> = Vec::with_capacity(points.len() + 1);
    let chain = |hull: &mut Vec<Pt>, p: Pt, floor: usize| {
        while hull.len() >= floor + 2 && cross(hull[hull.len() - 2], hull[hull.len() - 1], p) <= 0.0
        {
            hull.pop();
        }
        hull.push(p);
    };
    // The lower chain left to right, then the upper one back.
    for &p in &points {
        chain(&mut hull, p, 0);
    }
    let lower = hull.len() - 1;
    for &p in points.iter().rev().skip(1) {
        chain(&mut hull, p, lower);
    }
    // The upper chain ends where the lower one began.
    hull.pop();
    hull
}

/// The rectangle of `b` = xmin, ymin, xmax, ymax, counter-clockwise; a
/// degenerate one (a line or a point) grows by a hair so it is a polygon.
pub(crate) fn rectangle(b: [f64; 4]) -> Vec<Pt> {
    const HAIR: f64 = 1e-9;
    let (mut x0, mut y0, mut x1, mut y1) = (b[0], b[1], b[2], b[3]);
    if x1 - x0 <= 0.0 {
        (x0, x1) = ((x0 - HAIR).max(-180.0), (x1 + HAIR).min(180.0));
    }
    if y1 - y0 <= 0.0 {
        (y0, y1) = ((y0 - HAIR).max(-90.0), (y1 + HAIR).min(90.0));
    }
    vec![[x0, y0], [x1, y0], [x1, y1], [x0, y1]]
}

/// Where the neighbours of edge `i` (from `v[i]` to `v[i+1]`) meet when the
/// edge is dropped and they are extended, and the area that adds; `None`
/// when they do not meet ahead of both ends (their turns add up to 180° or
/// more) or meet outside `bounds`.
fn drop_edge(v: &[Pt], i: usize, bounds: [f64; 4]) -> Option<(Pt, f64)> {
    let n = v.len();
    let (prev, a, b, next) = (v[(i + n - 1) % n], v[i], v[(i + 1) % n], v[(i + 2) % n]);
    let d1 = [a[0] - prev[0], a[1] - prev[1]];
    let d2 = [next[0] - b[0], next[1] - b[1]];
    let den = d1[0] * d2[1] - d1[1] * d2[0];
    if den <= 0.0 {
        return None;
    }
    let ab = [b[0] - a[0], b[1] - a[1]];
    // a + t·d1 = b − s·d2
    let t = (ab[0] * d2[1] - ab[1] * d2[0]) / den;
    let s = (d1[0] * ab[1] - d1[1] * ab[0]) / den;
    if !(t >= 0.0 && s >= 0.0 && t.is_finite() && s.is_finite()) {
        return None;
    }
    let p = [a[0] + t * d1[0], a[1] + t * d1[1]];
    let inside = bounds[0] <= p[0] && p[0] <= bounds[2] && bounds[1] <= p[1] && p[1] <= bounds[3];
    inside.then(|| (p, cross(a, p, b).abs() / 2.0))
}

/// A convex polygon of at most `budget` (≥ 4) vertices that contains the
/// convex polygon `hull` (counter-clockwise) and lies within `bounds` (which
/// holds `hull`). Edges are dropped, cheapest added area first: while the
/// polygon has more than `budget` vertices, and after that while the area
/// added in all stays within `slack` of the hull's own area (an outline
/// needs few vertices where the hull has many almost in line). When no edge
/// can be dropped inside `bounds`, the rectangle of `bounds`.
pub(crate) fn enclose(hull: &[Pt], budget: usize, bounds: [f64; 4], slack: f64) -> Vec<Pt> {
    debug_assert!(budget >= 4);
    let area = area2(hull) / 2.0;
    if hull.len() < 3 || area <= 0.0 || !area.is_finite() {
        return rectangle(bounds);
    }
    let mut v = hull.to_vec();
    let mut added = 0.0;
    while v.len() > 3 {
        let best = (0..v.len())
            .filter_map(|i| drop_edge(&v, i, bounds).map(|(p, a)| (i, p, a)))
            .min_by(|x, y| x.2.total_cmp(&y.2));
        let must = v.len() > budget;
        match best {
            Some((i, p, a)) if must || added + a <= slack * area => {
                added += a;
                let j = (i + 1) % v.len();
                v[i] = p;
                v.remove(j);
            }
            None if must => return rectangle(bounds),
            _ => break,
        }
    }
    // The first vertex is the lowest-leftmost, so the ring does not depend
    // on which edges went.
    let first = (0..v.len())
        .min_by(|&a, &b| {
            v[a][0]
                .total_cmp(&v[b][0])
                .then(v[a][1].total_cmp(&v[b][1]))
        })
        .unwrap_or(0);
    v.rotate_left(first);
    v
}

/// Whether `p` is in the convex polygon `ring` (counter-clockwise), its
/// boundary included, within `eps`.
#[cfg(test)]
pub(crate) fn contains(ring: &[Pt], p: Pt, eps: f64) -> bool {
    let n = ring.len();
    (0..n).all(|i| {
        let (a, b) = (ring[i], ring[(i + 1) % n]);
        let len = ((b[0] - a[0]).powi(2) + (b[1] - a[1]).powi(2)).sqrt();
        cross(a, b, p) >= -eps * len
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hulls_hold_every_point_and_drop_the_inner_and_collinear_ones() {
        let pts = vec![
            [0.0, 0.0],
            [2.0, 0.0],
            [1.0, 0.0],
            [2.0, 2.0],
            [0.0, 2.0],
            [1.0, 1.0],
            [0.0, 2.0],
        ];
        let h = convex_hull(pts.clone());
        assert_eq!(h, vec![[0.0, 0.0], [2.0, 0.0], [2.0, 2.0], [0.0, 2.0]]);
        assert!(area2(&h) > 0.0, "counter-clockwise");
        assert!(pts.iter().all(|&p| contains(&h, p, 0.0)));
        assert_eq!(
            convex_hull(vec![[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]).len(),
            2
        );
        assert_eq!(convex_hull(vec![[1.0, 1.0]; 3]), vec![[1.0, 1.0]]);
    }

    /// A regular polygon of `n` vertices around (10, 20).
    fn round(n: usize) -> Vec<Pt> {
        (0..n)
            .map(|k| {
                let a = k as f64 / n as f64 * std::f64::consts::TAU;
                [10.0 + a.cos(), 20.0 + a.sin()]
            })
            .collect()
    }

    #[test]
    fn enclosing_keeps_every_vertex_inside_and_the_budget() {
        let hull = convex_hull(round(40));
        assert_eq!(hull.len(), 40);
        // Room around the circle for the vertices an enclosing polygon of
        // few vertices needs (a square's are √2 out).
        let bounds = [8.0, 18.0, 12.0, 22.0];
        for budget in [4, 5, 8, 16, 39] {
            let e = enclose(&hull, budget, bounds, 0.0);
            assert_eq!(e.len(), budget, "{budget}");
            assert!(area2(&e) > 0.0);
            for &p in &hull {
                assert!(contains(&e, p, 1e-12), "{budget}: {p:?} outside {e:?}");
            }
            for p in &e {
                assert!(
                    bounds[0] <= p[0]
                        && p[0] <= bounds[2]
                        && bounds[1] <= p[1]
                        && p[1] <= bounds[3]
                );
            }
        }
        // Within the budget already: kept as it is unless slack allows.
        assert_eq!(enclose(&hull, 64, bounds, 0.0).len(), 40);
        assert!(enclose(&hull, 64, bounds, 0.05).len() < 40);
    }

    #[test]
    fn nearly_straight_runs_go_for_free_and_a_square_stays() {
        // A square whose bottom edge bends by a hair: its extra vertices add
        // almost no area, so a small slack drops them.
        let mut pts: Vec<Pt> = (0..=20)
            .map(|i| [i as f64 / 20.0, -1e-7 * (i * (20 - i)) as f64])
            .collect();
        pts.extend([[1.0, 1.0], [0.0, 1.0]]);
        let hull = convex_hull(pts);
        assert!(hull.len() > 10);
        let e = enclose(&hull, 64, [0.0, -1e-4, 1.0, 1.0], 0.01);
        assert!(e.len() <= 5, "{e:?}");
        let sq = vec![[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]];
        assert_eq!(enclose(&sq, 4, [0.0, 0.0, 1.0, 1.0], 0.5), sq);
    }

    #[test]
    fn no_room_in_the_bounds_gives_the_rectangle_and_lines_grow_a_hair() {
        // A regular pentagon in its own bbox: every dropped edge's
        // neighbours meet outside it, so four vertices means the rectangle.
        let pent: Vec<Pt> = (0..5)
            .map(|k| {
                let a = std::f64::consts::FRAC_PI_2 + k as f64 * std::f64::consts::TAU / 5.0;
                [a.cos(), a.sin()]
            })
            .collect();
        let hull = convex_hull(pent.clone());
        assert_eq!(hull.len(), 5);
        let b = [-0.951_056_6, -0.809_017, 0.951_056_6, 1.0];
        assert_eq!(enclose(&hull, 4, b, 0.0), rectangle(b));
        assert_eq!(enclose(&hull, 5, b, 0.0).len(), 5);
        let line = enclose(&[[0.0, 0.0], [1.0, 0.0]], 4, [0.0, 0.0, 1.0, 0.0], 0.0);
        assert_eq!(line.len(), 4);
        assert!(area2(&line) > 0.0);
    }
}
