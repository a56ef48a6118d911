//! Chip footprints in lon/lat (OGC:CRS84) through proj4rs.
//!
//! A straight pixel edge is a curve in lon/lat (UTM grid lines bend, the
//! geostationary view bends a lot), so each edge is bisected until the chord
//! stays within [`TOLERANCE_DEG`] of the reprojected edge; Mercator edges stay
//! straight and cost no extra vertex.

use proj4rs::transform::transform;
use proj4rs::Proj;

use super::{polygon_wkb, Crs, GeoError, GeoTransform};

/// Half of the contract's 1e-7 degrees, leaving room for the error of the
/// three-point flatness test itself.
const TOLERANCE_DEG: f64 = 5e-8;
/// 2^10 segments per edge at most, which bounds the WKB of one chip (~64 KiB).
/// Chips of satellite-scale size (a 128-pixel GOES full-disk chip spans
/// ~2500 km) hit it and stay within ~2e-6 degrees instead of 1e-7.
const MAX_DEPTH: u32 = 10;
/// OGC:CRS84: WGS 84 geographic, lon/lat.
const CRS84: &str = "+proj=longlat +datum=WGS84 +no_defs";

/// Where a chip lies on Earth: a chip's footprint, as its row stores it.
///
/// Absent (`None` where it is held) for images without georeferencing and
/// for chips outside the projection's domain.
#[derive(Debug, Clone, PartialEq)]
pub struct Footprint {
    /// WKB Polygon (little-endian, 2D), closed counter-clockwise ring, lon/lat.
    pub wkb: Vec<u8>,
    /// Bounding box of the ring: xmin, ymin, xmax, ymax (lon/lat).
    pub bbox: [f64; 4],
    /// Reprojected window centre: lon, lat.
    pub centre: [f64; 2],
}

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
        })
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
    /// the reprojected outline within 1e-7 degrees; closed, counter-clockwise.
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
        let centre = self.pixel(gt, (x + w / 2.0, y + h / 2.0))?;
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
            centre: [centre.0, centre.1],
        })
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
        let dev = |p: (f64, f64), c: (f64, f64)| (p.0 - c.0).abs().max((p.1 - c.1).abs());
        // Three probes: a mid-point alone misses S-shaped edges.
        let mut probes = [(0.0, 0.0); 3];
        let mut worst = 0.0f64;
        for (k, t) in [0.25, 0.5, 0.75].into_iter().enumerate() {
            probes[k] = self.edge_pixel(gt, at(t))?;
            worst = worst.max(dev(probes[k], chord(t)));
        }
        if worst <= TOLERANCE_DEG {
            return Some(());
        }
        let depth = ((worst / TOLERANCE_DEG).log(4.0).ceil() as u32).clamp(1, MAX_DEPTH);
        let n = 1usize << depth;
        let mut pts = Vec::with_capacity(n + 1);
        pts.push((a, pa));
        for i in 1..n {
            let t = i as f64 / n as f64;
            // n >= 2, so the probes sit at multiples of n/4 (n/2 when n = 2).
            let p = if (4 * i) % n == 0 {
                probes[4 * i / n - 1]
            } else {
                self.edge_pixel(gt, at(t))?
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
        let mid = self.edge_pixel(gt, m)?;
        let c = ((pa.0 + pb.0) / 2.0, (pa.1 + pb.1) / 2.0);
        if (mid.0 - c.0).abs().max((mid.1 - c.1).abs()) <= TOLERANCE_DEG || depth >= MAX_DEPTH {
            return Some(());
        }
        self.refine(gt, (a, pa), (m, mid), depth + 1, out)?;
        out.push(mid);
        self.refine(gt, (m, mid), (b, pb), depth + 1, out)
    }
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
        assert!(f.bbox[0] < f.centre[0] && f.centre[0] < f.bbox[2]);
        assert!(f.bbox[1] < f.centre[1] && f.centre[1] < f.bbox[3]);
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

    /// Between vertices too, not only at the dyadic points GDAL was probed at.
    #[test]
    fn densified_ring_within_tolerance_everywhere() {
        let geos = "+proj=geos +lon_0=-75 +h=35786023 +x_0=0 +y_0=0 +ellps=GRS80 +units=m +no_defs +sweep=x";
        // A 128-pixel GOES chip spans ~2500 km near the limb: the depth cap
        // (1024 segments per edge) binds before 1e-7 degrees is reached.
        let cases = [
            (
                Crs::Epsg(32618),
                [101985.0, 300.0379, 0.0, 2826915.0, 0.0, -300.0418],
                256.0,
                256.0,
                1e-7,
            ),
            (
                Crs::UserDefined { proj4: geos.into() },
                [-5434895.08, 20054.96, 0.0, 5434895.08, 0.0, -20054.96],
                128.0,
                128.0,
                5e-6,
            ),
            (
                Crs::UserDefined { proj4: geos.into() },
                [-5434895.08, 20054.96, 0.0, 5434895.08, 0.0, -20054.96],
                256.0,
                16.0,
                1e-7,
            ),
        ];
        for (crs, gt, o, size, tol) in cases {
            let (p, gt) = (Projector::new(&crs).unwrap(), GeoTransform(gt));
            let ring = decode_polygon(&p.footprint(&gt, o, o, size, size).unwrap().wkb);
            let corners = [(o, o), (o, o + size), (o + size, o + size), (o + size, o)];
            let mut worst = 0.0f64;
            for i in 0..4 {
                let (a, b) = (corners[i], corners[(i + 1) % 4]);
                for k in 0..500 {
                    let t = (k as f64 + 0.377) / 500.0;
                    let q = p
                        .pixel(&gt, (a.0 + (b.0 - a.0) * t, a.1 + (b.1 - a.1) * t))
                        .unwrap();
                    let d = ring
                        .windows(2)
                        .map(|s| dist_to_segment(q, s[0], s[1]))
                        .fold(f64::INFINITY, f64::min);
                    worst = worst.max(d);
                }
            }
            assert!(worst <= tol, "{}: {worst:e} deg", crs.label());
        }
    }
}
