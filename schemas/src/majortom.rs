//! The `grid_cell` column: the Major TOM 10 km cell (arXiv 2402.12095) that
//! holds a point, in Major TOM's notation (`434U_876L`).
//!
//! The reference is `MajorTOM/grid.py` of ESA-PhiLab/Major-TOM
//! (`Grid(10).latlon2rowcol`); `fixtures/majortom/grid_cell_vectors.json`
//! holds its answers, made by `tools/gen_majortom_vectors.py`, and the tests
//! hold this module to them. Its arithmetic is reproduced operation by
//! operation, floating point included, so that points on a cell's edge land
//! where the reference puts them:
//!
//! - row latitudes are `np.linspace(-90, 90, N + 1)[:-1]` (N = ⌈π·R/10⌉),
//!   wrapped by `np.mod(v, 180) - 90` and sorted; rows within −85..=85 are
//!   kept; labels count from the 0° row: `0U, 1U, …` north, `1D, 2D, …` south;
//! - a row's column longitudes are `np.linspace(-180, 180, M + 1)[:-1]`
//!   (M = ⌈2π·R·cos(lat)/10⌉ at the row's own latitude), wrapped by
//!   `np.mod(v, 360) - 180` and sorted; labels `0R, 1R, …` east from 0°,
//!   `1L, 2L, …` west;
//! - a point's row is the last whose latitude is below it (strictly: a point on
//!   a row's southern edge is in the row below), its column likewise; a
//!   longitude at or west of the first column wraps to the last (it is the
//!   same meridian as 180°).
//!
//! One deliberate difference: a latitude at or below the grid's southernmost
//! row has no row (the reference indexes its row list with −1 there and
//! answers the northernmost row, a cell nowhere near the point), so it gets
//! no cell. So does a coordinate that is not a number.
//!
//! Nothing here allocates but the answer: the grid's values are computed
//! where they are compared, by binary search over their closed forms.

/// The Earth's equatorial radius the reference grid uses, km.
const RADIUS_EQUATOR_KM: f64 = 6378.137;
/// The cell size, km.
const DIST_KM: f64 = 10.0;
/// The latitudes the grid keeps rows for.
const LATITUDE_RANGE: (f64, f64) = (-85.0, 85.0);

/// `np.sort(np.mod(np.linspace(-h, h, n + 1)[:-1], 2h) - h)`, value by value.
///
/// With `a(i) = i·step − h` the linspace (numpy computes `i * step + start`),
/// the values with `a(i) < 0` become `a(i) + 2h − h` (north or east of 0,
/// starting at exactly 0 for i = 0) and the others `a(i) − h` (south or
/// west); each group keeps its order, and the second sorts first.
struct Wrapped {
    half: f64,
    n: u64,
    step: f64,
    /// How many i have `a(i) < 0`: the values from 0 up.
    east: u64,
}

impl Wrapped {
    fn new(half: f64, n: u64) -> Wrapped {
        // numpy's `delta / div`: (stop − start) / (num − 1) with num = n + 1.
        let step = (half - -half) / n as f64;
        let mut w = Wrapped {
            half,
            n,
            step,
            east: 0,
        };
        // a(i) is non-decreasing: the first i with a(i) >= 0.
        let (mut lo, mut hi) = (0u64, n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if w.linspace(mid) < 0.0 {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        w.east = lo;
        w
    }

    fn linspace(&self, i: u64) -> f64 {
        i as f64 * self.step + -self.half
    }

    /// How many values come before the 0 value (the south or west ones).
    fn west(&self) -> u64 {
        self.n - self.east
    }

    /// The sorted value at index `j`.
    fn value(&self, j: u64) -> f64 {
        let west = self.west();
        if j < west {
            // np.mod of a non-negative value below 2h is the value itself.
            self.linspace(self.east + j) - self.half
        } else {
            // np.mod of a negative value above −2h adds 2h.
            (self.linspace(j - west) + 2.0 * self.half) - self.half
        }
    }

    /// How many values are below `v` (`np.searchsorted(values, v)`), within
    /// the sorted indexes `lo..hi`, counted from 0.
    fn below(&self, v: f64, lo: u64, hi: u64) -> u64 {
        let (mut a, mut b) = (lo, hi);
        while a < b {
            let mid = a + (b - a) / 2;
            if self.value(mid) < v {
                a = mid + 1;
            } else {
                b = mid;
            }
        }
        a
    }

    /// How many values are at most `v`.
    fn at_most(&self, v: f64) -> u64 {
        let (mut a, mut b) = (0, self.n);
        while a < b {
            let mid = a + (b - a) / 2;
            if self.value(mid) <= v {
                a = mid + 1;
            } else {
                b = mid;
            }
        }
        a
    }

    /// The label of sorted index `j`: its distance from the 0 value and the
    /// side (`pos` for 0 and above, `neg` below).
    fn label(&self, j: u64, pos: char, neg: char) -> (u64, char) {
        let west = self.west();
        if j >= west {
            (j - west, pos)
        } else {
            (west - j, neg)
        }
    }
}

/// The rows of the grid: every latitude, and the sorted indexes kept.
fn rows() -> (Wrapped, u64, u64) {
    let arc_pole_to_pole = std::f64::consts::PI * RADIUS_EQUATOR_KM;
    let n = (arc_pole_to_pole / DIST_KM).ceil() as u64;
    let lats = Wrapped::new(90.0, n);
    let first = lats.below(LATITUDE_RANGE.0, 0, n);
    let end = lats.at_most(LATITUDE_RANGE.1);
    (lats, first, end)
}

/// The columns of the row at latitude `lat`, as the reference subdivides the
/// circle of latitude there.
fn columns(lat: f64) -> Wrapped {
    let radius_at_lat = RADIUS_EQUATOR_KM * (lat * std::f64::consts::PI / 180.0).cos();
    let circumference = 2.0 * std::f64::consts::PI * radius_at_lat;
    let n = (circumference / DIST_KM).ceil() as u64;
    Wrapped::new(180.0, n.max(1))
}

/// The Major TOM 10 km cell holding (`lat`, `lon`) in degrees, e.g.
/// `434U_876L`; `None` south of the grid's first row or for a coordinate
/// that is not a number. See the module docs for how edges are decided.
pub fn grid_cell(lat: f64, lon: f64) -> Option<String> {
    if lat.is_nan() || lon.is_nan() {
        return None;
    }
    let (lats, first, end) = rows();
    // `np.searchsorted(self.lats, lat) - 1` over the kept rows.
    let below = lats.below(lat, 0, lats.n).clamp(first, end);
    if below == first {
        return None;
    }
    let row = below - 1;
    let (r, rs) = lats.label(row, 'U', 'D');
    let cols = columns(lats.value(row));
    let c = match cols.below(lon, 0, cols.n) {
        // Index −1 in Python: the last column.
        0 => cols.n - 1,
        k => k - 1,
    };
    let (c, cs) = cols.label(c, 'R', 'L');
    Some(format!("{r}{rs}_{c}{cs}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fixtures/majortom/grid_cell_vectors.json`.
    fn vectors() -> serde_json::Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/majortom/grid_cell_vectors.json"
        );
        let text = std::fs::read_to_string(path).expect("the Major TOM vectors are committed");
        serde_json::from_str(&text).expect("vectors are JSON")
    }

    #[test]
    fn every_reference_vector_is_reproduced() {
        let v = vectors();
        assert_eq!(
            v["reference"]["commit"],
            "f7078cd0e9d8bade846c1ea448cd53ac874eb727"
        );
        let cases = v["vectors"].as_array().unwrap();
        assert!(cases.len() > 300, "{} vectors", cases.len());
        let mut wrong = Vec::new();
        for c in cases {
            // Strings in the shortest round-trip form: `parse` gives the
            // exact doubles the reference was given.
            let num = |k: &str| c[k].as_str().unwrap().parse::<f64>().unwrap();
            let (lat, lon) = (num("lat"), num("lon"));
            let want = c["cell"].as_str();
            let got = grid_cell(lat, lon);
            if got.as_deref() != want {
                wrong.push(format!("({lat:?}, {lon:?}): {got:?}, reference {want:?}"));
            }
        }
        assert!(
            wrong.is_empty(),
            "{} wrong:\n{}",
            wrong.len(),
            wrong.join("\n")
        );
    }

    #[test]
    fn the_grid_has_the_reference_shape() {
        let (lats, first, end) = rows();
        assert_eq!(lats.n, 2004);
        assert_eq!(lats.value(lats.west()), 0.0);
        assert!(lats.value(first) >= -85.0 && lats.value(first - 1) < -85.0);
        assert!(lats.value(end - 1) <= 85.0 && lats.value(end) > 85.0);
        // About 4008 columns of 10 km at the equator, far fewer near the pole.
        assert_eq!(columns(0.0).n, 4008);
        assert!(columns(lats.value(end - 1)).n < 400);
    }

    #[test]
    fn edges_follow_the_reference() {
        // The equator and the prime meridian are the southern and western
        // edges of 0U_0R: a point on them is in the row and column before.
        assert_eq!(grid_cell(0.0, 0.0).as_deref(), Some("1D_1L"));
        assert_eq!(grid_cell(1e-9, 1e-9).as_deref(), Some("0U_0R"));
        // ±180° is one meridian: both are in the last column.
        assert_eq!(grid_cell(1e-9, 180.0), grid_cell(1e-9, -180.0));
        assert_eq!(grid_cell(1e-9, 180.0).as_deref(), Some("0U_2003R"));
        assert_eq!(grid_cell(-89.0, 10.0), None);
        assert_eq!(grid_cell(f64::NAN, 10.0), None);
        assert_eq!(grid_cell(10.0, f64::NAN), None);
        // North of the last row: the last row, as the reference answers.
        assert_eq!(
            grid_cell(89.0, 1e-9).map(|c| c.split('_').next().unwrap().to_owned()),
            grid_cell(84.99, 1e-9).map(|c| c.split('_').next().unwrap().to_owned())
        );
    }
}
