//! Chip footprints in lon/lat (OGC:CRS84) through proj4rs.
//!
//! A straight pixel edge is a curve in lon/lat (UTM grid lines bend, the
//! geostationary view bends a lot), so each edge is bisected until every
//! chord stays within the [`Tolerance`] of the reprojected edge; Mercator
//! edges stay straight and cost no extra vertex.
//!
//! The tolerance is in source pixels (`--footprint-tolerance`, a hundredth of
//! a pixel by default): a chord's point is mapped back into the source grid
//! and its distance from the straight pixel edge is how far the polygon
//! strays there. That is exact, needs no local pixel size in degrees (which
//! varies across a GOES chip), and ignores the slide along the edge that a
//! coordinate-by-coordinate comparison in degrees counts as error.

use proj4rs::transform::transform;
use proj4rs::Proj;

use super::{polygon_wkb, Crs, GeoError, GeoTransform};

/// [`Tolerance::LegacyDegrees`]: half of the former contract's 1e-7 degrees,
/// leaving room for the error of the three-point flatness test itself.
const TOLERANCE_DEG: f64 = 5e-8;
/// 2^10 segments per edge at most, which bounds the WKB of one chip (~64 KiB)
/// whatever the tolerance. Chips of satellite-scale size (a 128-pixel GOES
/// full-disk chip spans ~2500 km) can hit it under the legacy tolerance and
/// stay within ~2e-6 degrees instead of 1e-7.
const MAX_DEPTH: u32 = 10;

/// How closely a footprint follows its chip's reprojected outline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tolerance {
    /// Every chord within this many source pixels of the pixel edge, measured
    /// in the source grid across the edge.
    Pixels(f64),
    /// Each coordinate of a chord's point within 5e-8 degrees of the edge's
    /// point at the same fraction of the edge: what jobs written before
    /// `--footprint-tolerance` existed got, kept so they resume unchanged.
    LegacyDegrees,
}

impl Tolerance {
    /// The tolerance a job records (`TilingSpec::footprint_tolerance`):
    /// pixels, or the legacy degrees where none is recorded.
    pub fn of_job(recorded: Option<f64>) -> Tolerance {
        recorded.map_or(Tolerance::LegacyDegrees, Tolerance::Pixels)
    }

    /// The bound a deviation ([`Projector::deviation`]'s unit) is held to.
    fn limit(self) -> f64 {
        match self {
            Tolerance::Pixels(px) => px,
            Tolerance::LegacyDegrees => TOLERANCE_DEG,
        }
    }
}

impl Default for Tolerance {
    fn default() -> Tolerance {
        Tolerance::Pixels(rsembed_schemas::job::DEFAULT_FOOTPRINT_TOLERANCE)
    }
}
/// OGC:CRS84: WGS 84 geographic, lon/lat.
const CRS84: &str = "+proj=longlat +datum=WGS84 +no_defs";

pub use rsembed_schemas::chip::Footprint;

/// Reprojection from a scene's CRS to lon/lat; build once per scene.
#[derive(Debug)]
pub struct Projector {
    src: Proj,
    dst: Proj,
    /// proj4rs wants radians for geographic input; geotransforms are in degrees.
    src_latlong: bool,
    /// Whether the projection covers only part of the Earth (the geostationary
    /// view, orthographic): then every densified point is checked for being on
    /// the visible side, not only the corners.
    bounded: bool,
    tolerance: Tolerance,
}

/// Projections whose domain is a disc: their inverses can return finite
/// nonsense off the disc instead of an error.
const BOUNDED: [&str; 4] = ["+proj=geos", "+proj=ortho", "+proj=nsper", "+proj=tpers"];

impl Projector {
    /// A projector for `crs`; fails when the CRS has no usable proj4 definition.
    pub fn new(crs: &Crs) -> Result<Projector, GeoError> {
        let def = crs
            .proj4()
            .ok_or_else(|| GeoError::UnsupportedCrs { crs: crs.label() })?;
        let proj = |s: &str| {
            Proj::from_proj_string(s).map_err(|source| GeoError::Projection {
                crs: crs.label(),
                source,
            })
        };
        let src = proj(&def)?;
        let dst = proj(CRS84)?;
        let src_latlong = src.is_latlong();
        let bounded = BOUNDED.iter().any(|p| def.contains(p));
        Ok(Projector {
            src,
            dst,
            src_latlong,
            bounded,
            tolerance: Tolerance::default(),
        })
    }

    /// The same projector, its footprints densified to `tolerance`.
    pub fn with_tolerance(mut self, tolerance: Tolerance) -> Projector {
        self.tolerance = tolerance;
        self
    }

    /// Lon/lat in degrees of a map coordinate; `None` outside the projection's domain.
    pub(crate) fn to_lonlat(&self, x: f64, y: f64) -> Option<(f64, f64)> {
        self.lonlat(x, y, true)
    }

    /// As [`Projector::to_lonlat`]; `check` false skips the forward round trip
    /// that catches points off a bounded projection's domain.
    fn lonlat(&self, x: f64, y: f64, check: bool) -> Option<(f64, f64)> {
        let mut p = if self.src_latlong {
            (x.to_radians(), y.to_radians(), 0.0)
        } else {
            (x, y, 0.0)
        };
        transform(&self.src, &self.dst, &mut p).ok()?;
        let (lon, lat) = (p.0.to_degrees(), p.1.to_degrees());
        if !lon.is_finite() || !lat.is_finite() || lat.abs() > 90.0 {
            return None;
        }
        if check && !self.src_latlong {
            // Some inverses return finite nonsense outside their domain
            // instead of an error; a forward round trip exposes it.
            let mut back = (p.0, p.1, 0.0);
            transform(&self.dst, &self.src, &mut back).ok()?;
            let tol = |v: f64| 1e-2 + 1e-9 * v.abs();
            if (back.0 - x).abs() > tol(x) || (back.1 - y).abs() > tol(y) {
                return None;
            }
        }
        Some((lon, lat))
    }

    /// Source pixel position of a lon/lat point; `None` where the forward
    /// projection has no answer (the far side of a geostationary disc).
    pub(crate) fn lonlat_to_pixel(
        &self,
        gt: &GeoTransform,
        (lon, lat): (f64, f64),
    ) -> Option<(f64, f64)> {
        let mut p = (lon.to_radians(), lat.to_radians(), 0.0);
        transform(&self.dst, &self.src, &mut p).ok()?;
        let (x, y) = if self.src_latlong {
            (p.0.to_degrees(), p.1.to_degrees())
        } else {
            (p.0, p.1)
        };
        let (col, row) = gt.invert(x, y);
        (col.is_finite() && row.is_finite()).then_some((col, row))
    }

    fn pixel(&self, gt: &GeoTransform, (col, row): (f64, f64)) -> Option<(f64, f64)> {
        let (x, y) = gt.apply(col, row);
        self.to_lonlat(x, y)
    }

    /// A point on an edge whose corners are in the domain: on an unbounded
    /// projection it is too, and the round trip would double the cost.
    fn edge_pixel(&self, gt: &GeoTransform, (col, row): (f64, f64)) -> Option<(f64, f64)> {
        let (x, y) = gt.apply(col, row);
        self.lonlat(x, y, self.bounded)
    }

    /// Footprint of the pixel window (x, y, w, h) in lon/lat (OGC:CRS84 axis order).
    ///
    /// The ring is the window's outline, each edge densified until it matches
    /// the reprojected outline within the projector's [`Tolerance`]; closed,
    /// counter-clockwise.
    /// `None` when any corner or densified point is outside the projection's
    /// domain (off-Earth GOES corners), or when the outline crosses the
    /// antimeridian (a single lon/lat polygon cannot describe it).
    pub fn footprint(
        &self,
        gt: &GeoTransform,
        x: f64,
        y: f64,
        w: f64,
        h: f64,
    ) -> Option<Footprint> {
        // Down the left edge first: counter-clockwise for a north-up raster.
        let corners = [(x, y), (x, y + h), (x + w, y + h), (x + w, y)];
        let projected: Vec<(f64, f64)> = corners
            .iter()
            .map(|c| self.pixel(gt, *c))
            .collect::<Option<_>>()?;
        let mut ring = Vec::with_capacity(64);
        for i in 0..4 {
            let j = (i + 1) % 4;
            ring.push(projected[i]);
            self.densify(
                gt,
                (corners[i], projected[i]),
                (corners[j], projected[j]),
                &mut ring,
            )?;
        }
        ring.push(projected[0]);
        if signed_area(&ring) < 0.0 {
            ring.reverse();
        }
        let mut bbox = [
            f64::INFINITY,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NEG_INFINITY,
        ];
        for (lon, lat) in &ring {
            bbox = [
                bbox[0].min(*lon),
                bbox[1].min(*lat),
                bbox[2].max(*lon),
                bbox[3].max(*lat),
            ];
        }
        Some(Footprint {
            wkb: polygon_wkb(&ring),
            bbox,
        })
    }

    /// The lon/lat of the pixel window (x, y, w, h)'s centre; `None` when it
    /// is outside the projection's domain (in space, on a GOES disk).
    pub fn centre(&self, gt: &GeoTransform, x: f64, y: f64, w: f64, h: f64) -> Option<[f64; 2]> {
        self.pixel(gt, (x + w / 2.0, y + h / 2.0))
            .map(|(lon, lat)| [lon, lat])
    }

    /// Appends the interior vertices of edge a→b (a and b excluded).
    ///
    /// A chord's error shrinks about fourfold per halving on a smooth edge, so
    /// the error at three probes predicts how many equal pieces the edge
    /// needs; every piece is then checked at its midpoint and bisected
    /// further where the prediction fell short. That costs about two
    /// projections per vertex, where plain bisection with three probes per
    /// piece cost six.
    fn densify(
        &self,
        gt: &GeoTransform,
        (a, pa): ((f64, f64), (f64, f64)),
        (b, pb): ((f64, f64), (f64, f64)),
        out: &mut Vec<(f64, f64)>,
    ) -> Option<()> {
        if (pa.0 - pb.0).abs() > 180.0 {
            return None;
        }
        let at = |t: f64| (a.0 + (b.0 - a.0) * t, a.1 + (b.1 - a.1) * t);
        let chord = |t: f64| (pa.0 + (pb.0 - pa.0) * t, pa.1 + (pb.1 - pa.1) * t);
        let limit = self.tolerance.limit();
        // Three probes: a mid-point alone misses S-shaped edges.
        let mut probes = [None; 3];
        let mut worst = 0.0f64;
        for (k, t) in [0.25, 0.5, 0.75].into_iter().enumerate() {
            let d = self.deviation(gt, (a, b), at(t), chord(t), &mut probes[k])?;
            worst = worst.max(d);
        }
        if worst <= limit {
            return Some(());
        }
        let (n, depth) = pieces(self.tolerance, worst / limit);
        let mut pts = Vec::with_capacity(n + 1);
        pts.push((a, pa));
        for i in 1..n {
            let t = i as f64 / n as f64;
            // Legacy n is a power of two >= 2, so the probes sit at multiples
            // of n/4 (n/2 when n = 2); pixel probes hold no edge points.
            let known = if (4 * i) % n == 0 {
                probes[4 * i / n - 1]
            } else {
                None
            };
            let p = match known {
                Some(p) => p,
                None => self.edge_pixel(gt, at(t))?,
            };
            pts.push((at(t), p));
        }
        pts.push((b, pb));
        for (i, piece) in pts.windows(2).enumerate() {
            if i > 0 {
                out.push(piece[0].1);
            }
            self.refine(gt, piece[0], piece[1], depth, out)?;
        }
        Some(())
    }

    /// Bisects piece a→b until its midpoint lies on the chord, appending the
    /// interior vertices.
    fn refine(
        &self,
        gt: &GeoTransform,
        (a, pa): ((f64, f64), (f64, f64)),
        (b, pb): ((f64, f64), (f64, f64)),
        depth: u32,
        out: &mut Vec<(f64, f64)>,
    ) -> Option<()> {
        if (pa.0 - pb.0).abs() > 180.0 {
            return None;
        }
        let m = ((a.0 + b.0) / 2.0, (a.1 + b.1) / 2.0);
        let c = ((pa.0 + pb.0) / 2.0, (pa.1 + pb.1) / 2.0);
        let mut mid = None;
        if self.deviation(gt, (a, b), m, c, &mut mid)? <= self.tolerance.limit()
            || depth >= MAX_DEPTH
        {
            return Some(());
        }
        let mid = match mid {
            Some(p) => p,
            None => self.edge_pixel(gt, m)?,
        };
        self.refine(gt, (a, pa), (m, mid), depth + 1, out)?;
        out.push(mid);
        self.refine(gt, (m, mid), (b, pb), depth + 1, out)
    }

    /// How far the chord's point `c` (lon/lat) strays from the edge a→b (in
    /// source pixels) at the edge's point `m`, in the tolerance's unit.
    ///
    /// The legacy measure needs the edge's true point and leaves it in
    /// `truth` for the caller; the pixel measure maps `c` back into the grid
    /// and needs it only where the edge must be split. `None` when the
    /// edge's point is outside the projection's domain.
    fn deviation(
        &self,
        gt: &GeoTransform,
        (a, b): ((f64, f64), (f64, f64)),
        m: (f64, f64),
        c: (f64, f64),
        truth: &mut Option<(f64, f64)>,
    ) -> Option<f64> {
        match self.tolerance {
            Tolerance::LegacyDegrees => {
                let p = self.edge_pixel(gt, m)?;
                *truth = Some(p);
                Some((p.0 - c.0).abs().max((p.1 - c.1).abs()))
            }
            // A chord point with no way back into the grid (past a bounded
            // projection's limb) is as far off as can be: split further.
            Tolerance::Pixels(_) => Some(
                self.lonlat_to_pixel(gt, c)
                    .map_or(f64::INFINITY, |q| distance_to_line(q, a, b)),
            ),
        }
    }
}

/// How many equal pieces an edge whose three probes strayed `excess` times
/// the tolerance is cut into first, and the bisection depth that stands for.
///
/// A chord's error grows with the square of its length, so `√excess`
/// pieces suffice on an edge of even curvature. The legacy tolerance rounds
/// that up to a power of two (what its footprints were); pixels take the
/// count as it is (3 pieces, not 4, for an excess of 5), because their
/// vertices are what a chip's bytes are spent on. Either way the depth
/// passed on keeps the pieces of an edge to at most 2^[`MAX_DEPTH`].
fn pieces(tolerance: Tolerance, excess: f64) -> (usize, u32) {
    let depth = (excess.log(4.0).ceil() as u32).clamp(1, MAX_DEPTH);
    match tolerance {
        Tolerance::LegacyDegrees => (1 << depth, depth),
        Tolerance::Pixels(_) => {
            let n = (excess.sqrt().ceil() as usize).clamp(2, 1 << MAX_DEPTH);
            (n, n.next_power_of_two().trailing_zeros())
        }
    }
}

/// Distance in the plane from `q` to the line through `a` and `b` (a ≠ b).
fn distance_to_line(q: (f64, f64), a: (f64, f64), b: (f64, f64)) -> f64 {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    ((q.0 - a.0) * dy - (q.1 - a.1) * dx).abs() / dx.hypot(dy)
}

/// Shoelace area; positive for a counter-clockwise ring in lon/lat.
fn signed_area(ring: &[(f64, f64)]) -> f64 {
    ring.windows(2)
        .map(|s| s[0].0 * s[1].1 - s[1].0 * s[0].1)
        .sum::<f64>()
        / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geo::parity_tests::dist_to_segment;
    use crate::geo::wkb::decode_polygon;

    #[test]
    fn mercator_edges_need_no_extra_vertices() {
        let p = Projector::new(&Crs::Epsg(3857)).unwrap();
        let gt = GeoTransform([
            14321853.115736904,
            0.597164,
            0.0,
            4533021.525424092,
            0.0,
            -0.597164,
        ]);
        let f = p.footprint(&gt, 0.0, 0.0, 256.0, 256.0).unwrap();
        let ring = decode_polygon(&f.wkb);
        assert_eq!(ring.len(), 5);
        assert!(signed_area(&ring) > 0.0);
        assert_eq!(ring.first(), ring.last());
    }

    #[test]
    fn south_up_still_counter_clockwise() {
        let p = Projector::new(&Crs::Epsg(32618)).unwrap();
        let gt = GeoTransform([101985.0, 300.0, 0.0, 2826915.0, 0.0, 300.0]);
        let f = p.footprint(&gt, 0.0, 0.0, 256.0, 256.0).unwrap();
        let ring = decode_polygon(&f.wkb);
        assert!(signed_area(&ring) > 0.0);
        assert!(ring.len() > 5, "UTM edges bend in lon/lat");
        let c = p.centre(&gt, 0.0, 0.0, 256.0, 256.0).unwrap();
        assert!(f.bbox[0] < c[0] && c[0] < f.bbox[2]);
        assert!(f.bbox[1] < c[1] && c[1] < f.bbox[3]);
    }

    #[test]
    fn unknown_epsg_is_an_error() {
        assert!(matches!(
            Projector::new(&Crs::Epsg(1)),
            Err(GeoError::UnsupportedCrs { .. })
        ));
        let bad = Crs::UserDefined {
            proj4: "+proj=nonsense".into(),
        };
        assert!(matches!(
            Projector::new(&bad),
            Err(GeoError::Projection { .. })
        ));
    }

    /// Distance in pixels from `q` to the outline of window (o, o, size, size).
    fn off_outline(q: (f64, f64), o: (f64, f64), size: (f64, f64)) -> f64 {
        let c = [
            o,
            (o.0, o.1 + size.1),
            (o.0 + size.0, o.1 + size.1),
            (o.0 + size.0, o.1),
        ];
        (0..4)
            .map(|i| dist_to_segment(q, c[i], c[(i + 1) % 4]))
            .fold(f64::INFINITY, f64::min)
    }

    /// The worst distance, in source pixels, of the ring's points (200 per
    /// segment, not only its vertices) from the window's outline: how far
    /// the footprint strays from the chip, mapped back into the grid.
    fn worst_off_outline(
        p: &Projector,
        gt: &GeoTransform,
        o: (f64, f64),
        size: (f64, f64),
    ) -> (f64, usize) {
        let f = p.footprint(gt, o.0, o.1, size.0, size.1).unwrap();
        let ring = decode_polygon(&f.wkb);
        let mut worst = 0.0f64;
        for s in ring.windows(2) {
            for k in 0..=200 {
                let t = k as f64 / 200.0;
                let c = (
                    s[0].0 + (s[1].0 - s[0].0) * t,
                    s[0].1 + (s[1].1 - s[0].1) * t,
                );
                let q = p.lonlat_to_pixel(gt, c).unwrap();
                worst = worst.max(off_outline(q, o, size));
            }
        }
        (worst, ring.len())
    }

    /// A window's origin or size, in pixels.
    type Xy = (f64, f64);

    const GEOS: &str =
        "+proj=geos +lon_0=-75 +h=35786023 +x_0=0 +y_0=0 +ellps=GRS80 +units=m +no_defs +sweep=x";

    /// Scenes that bend: Landsat's 30 m UTM far from the central meridian,
    /// rasterio's 300 m UTM, and GOES's 2 km geostationary view near the limb.
    fn bent_scenes() -> Vec<(Crs, [f64; 6], Xy, Xy)> {
        vec![
            (
                Crs::Epsg(32654),
                [300885.0, 30.0, 0.0, 4107015.0, 0.0, -30.0],
                (0.0, 0.0),
                (256.0, 256.0),
            ),
            (
                Crs::Epsg(32618),
                [101985.0, 300.0379, 0.0, 2826915.0, 0.0, -300.0418],
                (256.0, 256.0),
                (256.0, 256.0),
            ),
            (
                Crs::UserDefined { proj4: GEOS.into() },
                [-5434895.08, 20054.96, 0.0, 5434895.08, 0.0, -20054.96],
                (128.0, 128.0),
                (128.0, 128.0),
            ),
            (
                Crs::UserDefined { proj4: GEOS.into() },
                [-5434895.08, 20054.96, 0.0, 5434895.08, 0.0, -20054.96],
                (256.0, 256.0),
                (16.0, 16.0),
            ),
        ]
    }

    /// Between vertices too, not only at the points where the edges were
    /// probed; and at every tolerance, not only the default.
    #[test]
    fn densified_ring_within_tolerance_everywhere() {
        for tol in [0.001, 0.01, 0.1, 1.0] {
            for (crs, gt, o, size) in bent_scenes() {
                let p = Projector::new(&crs)
                    .unwrap()
                    .with_tolerance(Tolerance::Pixels(tol));
                let (worst, n) = worst_off_outline(&p, &GeoTransform(gt), o, size);
                println!("{} tol {tol}: {n} vertices, {worst:.2e} px", crs.label());
                assert!(worst <= tol, "{}: {worst:e} px > {tol}", crs.label());
            }
        }
    }

    /// 256-pixel UTM chips 200 km from the central meridian (the shared
    /// Landsat scene's grid, at 30 m and at its own 150 m): a few vertices at
    /// a hundredth of a pixel where 5e-8 degrees took 49 and 193, and more as
    /// the tolerance tightens.
    #[test]
    fn vertex_counts_follow_the_tolerance() {
        let crs = Crs::Epsg(32654);
        for (px, legacy_n, default_n) in [(30.0, 49, 7), (150.0, 193, 13)] {
            let gt = GeoTransform([300885.0, px, 0.0, 4107015.0, 0.0, -px]);
            let count = |t: Tolerance| {
                let p = Projector::new(&crs).unwrap().with_tolerance(t);
                decode_polygon(&p.footprint(&gt, 0.0, 0.0, 256.0, 256.0).unwrap().wkb).len()
            };
            let counts = [
                Tolerance::LegacyDegrees,
                Tolerance::Pixels(1e-4),
                Tolerance::default(),
                Tolerance::Pixels(1.0),
            ]
            .map(count);
            println!("{px} m: legacy, 1e-4, 0.01, 1 px: {counts:?}");
            assert_eq!(counts[0], legacy_n, "{px} m, legacy");
            assert!(counts[2] <= default_n, "{px} m: {counts:?}");
            assert!(
                counts[3] <= counts[2] && counts[2] < counts[1],
                "{counts:?}"
            );
        }
    }

    /// The legacy tolerance still gives what jobs written before
    /// `--footprint-tolerance` got, byte for byte (the digest of the former
    /// code's footprints of every GDAL fixture window), so resuming one never
    /// mixes footprints of two precisions.
    #[test]
    fn legacy_tolerance_gives_the_former_footprints() {
        let mut h: u64 = 0xcbf29ce484222325;
        let mut bytes = 0usize;
        for (crs, gt, windows) in crate::geo::parity_tests::fixture_windows() {
            let p = Projector::new(&crs)
                .unwrap()
                .with_tolerance(Tolerance::LegacyDegrees);
            for [x, y, w, hh] in windows {
                if let Some(fp) = p.footprint(&gt, x, y, w, hh) {
                    for b in &fp.wkb {
                        h = (h ^ u64::from(*b)).wrapping_mul(0x100000001b3);
                    }
                    bytes += fp.wkb.len();
                }
            }
        }
        assert_eq!(
            (format!("{h:016x}"), bytes),
            ("f0e459e916a1a310".into(), 327026)
        );
    }

    #[test]
    fn tolerance_of_a_job() {
        assert_eq!(Tolerance::of_job(None), Tolerance::LegacyDegrees);
        assert_eq!(Tolerance::of_job(Some(0.5)), Tolerance::Pixels(0.5));
    }
}
