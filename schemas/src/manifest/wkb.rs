//! A file's footprint ([`FileExtent::footprint`]) as WKB and back, exactly:
//! an ISO WKB MultiPolygon, little-endian, 2D, one ring per polygon, each
//! ring closed by repeating its first vertex (as WKB requires), which the
//! decoder drops again.
//!
//! The decoder reads only what the encoder writes, and checks every count
//! against the bytes left and [`MAX_VERTICES`] before it allocates.
//!
//! [`FileExtent::footprint`]: crate::extent::FileExtent::footprint

use crate::extent::MAX_VERTICES;

const MULTI_POLYGON: u32 = 6;
const POLYGON: u32 = 3;

/// `footprint` as a WKB MultiPolygon; `None` for an empty footprint.
pub fn encode(footprint: &[Vec<[f64; 2]>]) -> Option<Vec<u8>> {
    if footprint.is_empty() {
        return None;
    }
    let vertices: usize = footprint.iter().map(|r| r.len() + 1).sum();
    let mut b = Vec::with_capacity(9 + footprint.len() * 13 + vertices * 16);
    b.push(1);
    b.extend_from_slice(&MULTI_POLYGON.to_le_bytes());
    b.extend_from_slice(&(footprint.len() as u32).to_le_bytes());
    for ring in footprint {
        b.push(1);
        b.extend_from_slice(&POLYGON.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&(ring.len() as u32 + 1).to_le_bytes());
        for [x, y] in ring.iter().chain(ring.first()) {
            b.extend_from_slice(&x.to_le_bytes());
            b.extend_from_slice(&y.to_le_bytes());
        }
    }
    Some(b)
}

/// The footprint [`encode`] wrote: open rings, at most [`MAX_VERTICES`]
/// vertices in all.
pub fn decode(b: &[u8]) -> Result<Vec<Vec<[f64; 2]>>, String> {
    let mut r = Reader { b, at: 0 };
    r.header(MULTI_POLYGON)?;
    let polygons = r.count(9)?;
    let mut out = Vec::with_capacity(polygons.min(MAX_VERTICES));
    let mut vertices = 0usize;
    for _ in 0..polygons {
        r.header(POLYGON)?;
        let rings = r.u32()?;
        if rings != 1 {
            return Err(format!("a polygon of {rings} rings (one is written)"));
        }
        let n = r.count(16)?;
        if n < 4 {
            return Err(format!(
                "a ring of {n} points (a closed ring has 4 or more)"
            ));
        }
        vertices += n - 1;
        if vertices > MAX_VERTICES {
            return Err(format!("more than {MAX_VERTICES} vertices"));
        }
        let mut ring = Vec::with_capacity(n);
        for _ in 0..n {
            ring.push([r.f64()?, r.f64()?]);
        }
        let last = ring.pop().expect("a ring of 4 or more points");
        if last.map(f64::to_bits) != ring[0].map(f64::to_bits) {
            return Err("a ring that is not closed".into());
        }
        out.push(ring);
    }
    if r.at != b.len() {
        return Err(format!("{} bytes after the geometry", b.len() - r.at));
    }
    Ok(out)
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let s = self
            .b
            .get(self.at..self.at + N)
            .ok_or_else(|| format!("ends early at byte {}", self.at))?;
        self.at += N;
        Ok(s.try_into().expect("N bytes"))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn f64(&mut self) -> Result<f64, String> {
        Ok(f64::from_le_bytes(self.take()?))
    }
    fn header(&mut self, ty: u32) -> Result<(), String> {
        let [order] = self.take()?;
        if order != 1 {
            return Err("big-endian WKB (little-endian is written)".into());
        }
        let t = self.u32()?;
        if t != ty {
            return Err(format!("geometry type {t}, not {ty}"));
        }
        Ok(())
    }
    /// A count of things of at least `min` bytes each, bounded by what is left.
    fn count(&mut self, min: usize) -> Result<usize, String> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min) > self.b.len() - self.at {
            return Err(format!("a count of {n} is more than the bytes left"));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn footprints_round_trip_exactly() {
        let f = vec![
            vec![[0.1, 0.2], [1.0, 0.0], [1.0, 1.0 + f64::EPSILON]],
            vec![
                [-180.0, -90.0],
                [180.0, -90.0],
                [180.0, 90.0],
                [-180.0, 90.0],
            ],
        ];
        let b = encode(&f).unwrap();
        assert_eq!(b.len(), 9 + 2 * 13 + 9 * 16);
        assert_eq!(decode(&b).unwrap(), f);
        assert_eq!(encode(&[]), None);
    }

    #[test]
    fn hostile_bytes_are_refused_before_allocating() {
        let good = encode(&[vec![[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]]]).unwrap();
        let mut huge = good.clone();
        huge[5..9].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge)
            .unwrap_err()
            .contains("more than the bytes left"));
        let mut open = good.clone();
        let n = open.len();
        open[n - 8..].copy_from_slice(&5.0f64.to_le_bytes());
        assert!(decode(&open).unwrap_err().contains("not closed"));
        assert!(decode(&good[..good.len() - 1]).is_err());
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(decode(&trailing).unwrap_err().contains("after"));
        let many = vec![vec![[0.0, 0.0]; MAX_VERTICES + 1]];
        assert!(decode(&encode(&many).unwrap())
            .unwrap_err()
            .contains("vertices"));
    }
}
