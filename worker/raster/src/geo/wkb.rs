//! Well-Known Binary encoding of footprint polygons (ISO/OGC SFA, 2D).

/// WKB geometry type code of a Polygon.
const WKB_POLYGON: u32 = 3;
/// Byte-order flag for little-endian (NDR).
const WKB_NDR: u8 = 1;

/// A single-ring Polygon as little-endian WKB; `ring` must already be closed.
pub fn polygon_wkb(ring: &[(f64, f64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(13 + 16 * ring.len());
    out.push(WKB_NDR);
    out.extend_from_slice(&WKB_POLYGON.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    // Rings come from densified chip outlines, far below u32::MAX points.
    out.extend_from_slice(&(ring.len() as u32).to_le_bytes());
    for (x, y) in ring {
        out.extend_from_slice(&x.to_le_bytes());
        out.extend_from_slice(&y.to_le_bytes());
    }
    out
}

/// Test helper: the exterior ring of a WKB polygon written by [`polygon_wkb`].
#[cfg(test)]
pub(crate) fn decode_polygon(wkb: &[u8]) -> Vec<(f64, f64)> {
    let u32_at = |o: usize| u32::from_le_bytes(wkb[o..o + 4].try_into().unwrap());
    let f64_at = |o: usize| f64::from_le_bytes(wkb[o..o + 8].try_into().unwrap());
    assert_eq!(wkb[0], WKB_NDR);
    assert_eq!(u32_at(1), WKB_POLYGON);
    assert_eq!(u32_at(5), 1);
    let n = u32_at(9) as usize;
    assert_eq!(wkb.len(), 13 + 16 * n);
    (0..n)
        .map(|i| (f64_at(13 + 16 * i), f64_at(21 + 16 * i)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn square() {
        let ring = [(0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0), (0.0, 0.0)];
        let wkb = polygon_wkb(&ring);
        assert_eq!(&wkb[..13], &[1, 3, 0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0]);
        assert_eq!(&wkb[13 + 16..13 + 24], &1.0f64.to_le_bytes());
        assert_eq!(decode_polygon(&wkb), ring.to_vec());
    }
}
