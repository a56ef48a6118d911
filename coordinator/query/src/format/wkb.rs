//! Well-known binary to GeoJSON: the seven OGC types, 2D, ISO Z/M/ZM and
//! EWKB flags (extra ordinates dropped past Z). Every count is checked
//! against the bytes left before anything is allocated.
//!
//! One decoder for the crate: stac-geoparquet geometries (any type) and the
//! footprints `search` prints (2D polygons, see `query::result::wkb_to_geojson`).

use serde_json::{json, Value};

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| format!("ends early at byte {}", self.at))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self, le: bool) -> Result<u32, String> {
        let s: [u8; 4] = self.take(4)?.try_into().expect("4 bytes");
        Ok(if le {
            u32::from_le_bytes(s)
        } else {
            u32::from_be_bytes(s)
        })
    }
    fn f64(&mut self, le: bool) -> Result<f64, String> {
        let s: [u8; 8] = self.take(8)?.try_into().expect("8 bytes");
        Ok(if le {
            f64::from_le_bytes(s)
        } else {
            f64::from_be_bytes(s)
        })
    }
    /// A count of things of at least `min` bytes each, bounded by what is left.
    fn count(&mut self, le: bool, min: usize) -> Result<usize, String> {
        let n = self.u32(le)? as usize;
        if n.saturating_mul(min) > self.b.len() - self.at {
            return Err(format!("a count of {n} is more than the bytes left"));
        }
        Ok(n)
    }
}

pub fn to_geojson(b: &[u8]) -> Result<Value, String> {
    let mut r = Reader { b, at: 0 };
    let g = geometry(&mut r, 0)?;
    Ok(g)
}

fn geometry(r: &mut Reader<'_>, depth: u32) -> Result<Value, String> {
    if depth > 8 {
        return Err("collections nest too deep".into());
    }
    let le = match r.take(1)?[0] {
        0 => false,
        1 => true,
        o => return Err(format!("byte order {o}")),
    };
    let code = r.u32(le)?;
    let (mut dims, mut kind) = (2usize, code & 0x0fff_ffff);
    if code & 0x2000_0000 != 0 {
        r.u32(le)?; // EWKB SRID
    }
    if code & 0x8000_0000 != 0 {
        dims += 1;
    }
    if code & 0x4000_0000 != 0 {
        dims += 1;
    }
    match kind / 1000 {
        0 => {}
        1 | 2 => dims += 1,
        3 => dims += 2,
        _ => return Err(format!("geometry type {code}")),
    }
    kind %= 1000;
    let point = |r: &mut Reader<'_>| -> Result<Value, String> {
        let mut c = Vec::with_capacity(dims.min(3));
        for d in 0..dims {
            let v = r.f64(le)?;
            if d < 3 {
                c.push(v);
            }
        }
        Ok(json!(c))
    };
    let line = |r: &mut Reader<'_>| -> Result<Value, String> {
        let n = r.count(le, dims * 8)?;
        (0..n)
            .map(|_| point(r))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::from)
    };
    let polygon = |r: &mut Reader<'_>| -> Result<Value, String> {
        let n = r.count(le, 4)?;
        (0..n)
            .map(|_| line(r))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::from)
    };
    let many = |r: &mut Reader<'_>, want: u32| -> Result<Value, String> {
        let n = r.count(le, 5)?;
        let mut parts = Vec::with_capacity(n);
        for _ in 0..n {
            let g = geometry(r, depth + 1)?;
            let t = g["type"].as_str().unwrap_or("");
            if !matches!((want, t), (1, "Point") | (2, "LineString") | (3, "Polygon")) {
                return Err(format!("a {t} inside a multi-geometry of type {want}"));
            }
            parts.push(g["coordinates"].clone());
        }
        Ok(Value::from(parts))
    };
    Ok(match kind {
        1 => {
            let c = point(r)?;
            // An empty point is written as NaN coordinates.
            if c.as_array().is_some_and(|a| a.iter().any(|v| v.is_null())) {
                Value::Null
            } else {
                json!({"type": "Point", "coordinates": c})
            }
        }
        2 => json!({"type": "LineString", "coordinates": line(r)?}),
        3 => json!({"type": "Polygon", "coordinates": polygon(r)?}),
        4 => json!({"type": "MultiPoint", "coordinates": many(r, 1)?}),
        5 => json!({"type": "MultiLineString", "coordinates": many(r, 2)?}),
        6 => json!({"type": "MultiPolygon", "coordinates": many(r, 3)?}),
        7 => {
            let n = r.count(le, 5)?;
            let gs = (0..n)
                .map(|_| geometry(r, depth + 1))
                .collect::<Result<Vec<_>, _>>()?;
            json!({"type": "GeometryCollection", "geometries": gs})
        }
        other => return Err(format!("geometry type {other}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le_polygon() -> Vec<u8> {
        let mut b = vec![1u8];
        b.extend(3u32.to_le_bytes());
        b.extend(1u32.to_le_bytes());
        b.extend(4u32.to_le_bytes());
        for (x, y) in [(0.0f64, 0.0f64), (1.0, 0.0), (1.0, 1.0), (0.0, 0.0)] {
            b.extend(x.to_le_bytes());
            b.extend(y.to_le_bytes());
        }
        b
    }

    #[test]
    fn polygons_points_and_multis_decode() {
        let g = to_geojson(&le_polygon()).unwrap();
        assert_eq!(g["type"], "Polygon");
        assert_eq!(g["coordinates"][0][2], json!([1.0, 1.0]));
        // Big-endian point Z (ISO 1001).
        let mut p = vec![0u8];
        p.extend(1001u32.to_be_bytes());
        for v in [5.0f64, 6.0, 7.0] {
            p.extend(v.to_be_bytes());
        }
        assert_eq!(
            to_geojson(&p).unwrap()["coordinates"],
            json!([5.0, 6.0, 7.0])
        );
        let mut m = vec![1u8];
        m.extend(6u32.to_le_bytes());
        m.extend(2u32.to_le_bytes());
        m.extend(le_polygon());
        m.extend(le_polygon());
        let g = to_geojson(&m).unwrap();
        assert_eq!(g["type"], "MultiPolygon");
        assert_eq!(g["coordinates"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn hostile_wkb_is_an_error_not_an_allocation() {
        let mut b = vec![1u8];
        b.extend(2u32.to_le_bytes());
        b.extend(u32::MAX.to_le_bytes());
        assert!(to_geojson(&b).unwrap_err().contains("count"));
        assert!(to_geojson(&le_polygon()[..20]).is_err());
        assert!(to_geojson(&[7]).is_err());
        let mut t = vec![1u8];
        t.extend(99u32.to_le_bytes());
        assert!(to_geojson(&t).is_err());
        // Collections nested past the bound.
        let mut deep = Vec::new();
        for _ in 0..20 {
            deep.push(1u8);
            deep.extend(7u32.to_le_bytes());
            deep.extend(1u32.to_le_bytes());
        }
        assert!(to_geojson(&deep).is_err());
    }
}
