//! Outlines on a grid of [`GRID`] degrees: a recorded outline's coordinates
//! are multiples of 10⁻⁷° (about 1 cm), so they print short (`-99.9970001`,
//! not `-99.99700000000001`) and JSON reads them back exactly (serde_json's
//! default parser is exact for numbers of at most 15 digits, not for every
//! shortest 17-digit form). An outline is grown a hair before it is rounded,
//! so it still holds every point it held.

use super::hull::{area2, Pt};

/// Coordinates of a recorded outline are multiples of this many degrees.
pub(crate) const GRID: f64 = 1e-7;
const PER_DEGREE: f64 = 1e7;
/// The offsets tried, in grid steps: none first (a ring on the grid stays
/// as it is, and rounding alone may hold the ring); then, as a rounded
/// vertex moves at most 0.71 steps, 1.5 holds the ring unless an edge is a
/// few steps long.
const OFFSETS: [f64; 6] = [0.0, 1.5, 3.0, 6.0, 12.0, 24.0];

/// `v` rounded to the grid.
fn round(v: f64) -> f64 {
    (v * PER_DEGREE).round() / PER_DEGREE
}

/// The largest grid value at most `v`.
fn floor(v: f64) -> f64 {
    let mut k = (v * PER_DEGREE).floor();
    if k / PER_DEGREE > v {
        k -= 1.0;
    }
    k / PER_DEGREE
}

/// The smallest grid value at least `v`.
fn ceil(v: f64) -> f64 {
    let mut k = (v * PER_DEGREE).ceil();
    if k / PER_DEGREE < v {
        k += 1.0;
    }
    k / PER_DEGREE
}

/// The rectangle of `b` rounded outward to the grid, in lon/lat range, at
/// least a step wide and high.
pub(crate) fn rectangle(b: [f64; 4]) -> Vec<Pt> {
    let (mut x0, mut y0) = (floor(b[0]).max(-180.0), floor(b[1]).max(-90.0));
    let (mut x1, mut y1) = (ceil(b[2]).min(180.0), ceil(b[3]).min(90.0));
    if x1 <= x0 {
        (x0, x1) = if x1 < 180.0 {
            (x0, round(x0 + GRID))
        } else {
            (round(x1 - GRID), x1)
        };
    }
    if y1 <= y0 {
        (y0, y1) = if y1 < 90.0 {
            (y0, round(y0 + GRID))
        } else {
            (round(y1 - GRID), y1)
        };
    }
    vec![[x0, y0], [x1, y0], [x1, y1], [x0, y1]]
}

/// `ring` (convex, counter-clockwise) on the grid, holding `ring`, with its
/// vertices within `reach` degrees of `bounds` (which hold `ring`): its
/// edges moved out by an offset, the new vertices rounded; the first offset
/// whose ring is convex and holds every vertex of `ring`. Else the
/// rectangle of `bounds`, rounded outward.
pub(crate) fn outward(ring: &[Pt], bounds: [f64; 4], reach: f64) -> Vec<Pt> {
    let lo = [
        (bounds[0] - reach).max(-180.0),
        (bounds[1] - reach).max(-90.0),
    ];
    let hi = [
        (bounds[2] + reach).min(180.0),
        (bounds[3] + reach).min(90.0),
    ];
    for steps in OFFSETS {
        let Some(grown) = offset(ring, steps * GRID) else {
            break;
        };
        let mut q: Vec<Pt> = grown
            .iter()
            .map(|p| {
                [
                    round(p[0].clamp(lo[0], hi[0])),
                    round(p[1].clamp(lo[1], hi[1])),
                ]
            })
            .collect();
        q.dedup();
        while q.len() > 1 && q.first() == q.last() {
            q.pop();
        }
        if q.len() >= 3 && convex(&q) && ring.iter().all(|&v| holds(&q, v)) {
            return q;
        }
    }
    rectangle(bounds)
}

/// The vertices of `ring` with every edge moved out by `d`: each where its
/// two edges' moved lines meet. `None` for a spike (two edges almost
/// reversed), whose vertex would go far.
fn offset(ring: &[Pt], d: f64) -> Option<Vec<Pt>> {
    let n = ring.len();
    let normal = |a: Pt, b: Pt| -> Option<Pt> {
        let (dx, dy) = (b[0] - a[0], b[1] - a[1]);
        let len = (dx * dx + dy * dy).sqrt();
        // Outward is to the right of a counter-clockwise ring's edges.
        (len > 0.0).then(|| [dy / len, -dx / len])
    };
    (0..n)
        .map(|i| {
            let (prev, v, next) = (ring[(i + n - 1) % n], ring[i], ring[(i + 1) % n]);
            let (n1, n2) = (normal(prev, v)?, normal(v, next)?);
            // The miter: m·n1 = m·n2 = 1.
            let k = 1.0 + n1[0] * n2[0] + n1[1] * n2[1];
            if k < 1e-3 {
                return None;
            }
            Some([
                v[0] + d * (n1[0] + n2[0]) / k,
                v[1] + d * (n1[1] + n2[1]) / k,
            ])
        })
        .collect()
}

/// Whether `q` turns left (or goes straight) at every vertex and has area.
fn convex(q: &[Pt]) -> bool {
    let n = q.len();
    area2(q) > 0.0
        && (0..n).all(|i| {
            let (a, b, c) = (q[i], q[(i + 1) % n], q[(i + 2) % n]);
            (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0]) >= 0.0
        })
}

/// Whether the convex ring `q` holds `p` (its boundary included).
fn holds(q: &[Pt], p: Pt) -> bool {
    let n = q.len();
    (0..n).all(|i| {
        let (a, b) = (q[i], q[(i + 1) % n]);
        (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0]) >= 0.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(v: f64) -> bool {
        let s = serde_json::to_string(&v).unwrap();
        s.len() <= 13 && serde_json::from_str::<f64>(&s).unwrap() == v
    }

    #[test]
    fn grid_values_print_short_and_read_back_exactly() {
        for v in [
            -99.99700000000001,
            179.99999999,
            -0.00000004,
            47.0345,
            -180.0,
            12.345678912,
        ] {
            for g in [round(v), floor(v), ceil(v)] {
                assert!(exact(g), "{v} -> {g}");
            }
            assert!(floor(v) <= v && v <= ceil(v));
            assert!(ceil(v) - floor(v) <= GRID * 1.000001);
        }
    }

    #[test]
    fn a_ring_on_the_grid_still_holds_the_ring() {
        // A skinny, tilted quadrilateral with awkward coordinates.
        let ring = vec![
            [-99.99700000000001, 46.94],
            [-99.90550000000002, 46.943000000000005],
            [-99.9085, 47.03450000000001],
            [-100.00000000000001, 47.0315],
        ];
        let b = [
            -100.00000000000001,
            46.94,
            -99.90550000000002,
            47.03450000000001,
        ];
        let q = outward(&ring, b, 4e-6);
        assert_eq!(q.len(), 4);
        for p in &q {
            assert!(exact(p[0]) && exact(p[1]), "{p:?}");
            assert!(p[0] >= b[0] - 4e-6 && p[1] <= b[3] + 4e-6);
        }
        assert!(ring.iter().all(|&v| holds(&q, v)));
        // A needle of a few grid steps cannot be grown that way: the
        // rectangle, which holds it too.
        let needle = vec![[0.0, 0.0], [1.0, 1e-8], [0.5, 3e-8]];
        let nb = [0.0, 0.0, 1.0, 3e-8];
        let q = outward(&needle, nb, 4e-6);
        assert!(needle.iter().all(|&v| holds(&q, v)), "{q:?}");
        assert_eq!(
            rectangle([1.0, 2.0, 1.0, 2.0]),
            vec![
                [1.0, 2.0],
                [1.0000001, 2.0],
                [1.0000001, 2.0000001],
                [1.0, 2.0000001]
            ]
        );
        let edge = rectangle([180.0, 90.0, 180.0, 90.0]);
        assert!(edge.iter().all(|p| p[0] <= 180.0 && p[1] <= 90.0) && area2(&edge) > 0.0);
    }
}
