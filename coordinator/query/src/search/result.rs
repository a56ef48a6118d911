//! One result of a search, as every output shows it: JSON lines, GeoJSON
//! and the `--html` page.

use std::sync::Arc;

use serde_json::Value;

/// One result, with what the output shows of its chip.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SearchResult {
    /// The query's line number in `--vectors` or `--queries` (1-based, as
    /// an editor counts); absent for a single query.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query: Option<usize>,
    /// 1 for the best (of its query).
    pub rank: usize,
    /// `sigmoid(exp(logit_scale)·cos + logit_bias)`; absent without a model.
    pub score: Option<f64>,
    /// Cosine between the chip's and the query's embedding.
    pub cosine: f32,
    /// The chip's id.
    pub chip_id: String,
    /// Its source.
    pub source_uri: String,
    /// Window origin and size in source pixels.
    pub x: i32,
    /// Window origin.
    pub y: i32,
    /// Window size.
    pub width: i32,
    /// Window size.
    pub height: i32,
    /// Share of real pixels.
    pub valid_fraction: f32,
    /// Source CRS.
    pub crs: Option<String>,
    /// Centre, lon/lat.
    pub centre_lon: Option<f64>,
    /// Centre, lon/lat.
    pub centre_lat: Option<f64>,
    /// The STAC item the chip comes from (schema 2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item_id: Option<String>,
    /// Its collection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub collection: Option<String>,
    /// Acquisition time (a range's start), RFC 3339, UTC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub datetime: Option<String>,
    /// The end of the acquisition range, when the item gives one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_datetime: Option<String>,
    /// Share of the chip's valid pixels marked as cloud.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cloud_fraction: Option<f32>,
    /// The chip's cell of the CRS lattice (`--align crs`, schema 3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cell: Option<String>,
    /// The Major TOM cell of its centre (schema 3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grid_cell: Option<String>,
    /// The start of its time window (`--windows`), RFC 3339, UTC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_start: Option<String>,
    /// The end of its time window (exclusive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_end: Option<String>,
    /// Footprint as WKB, as stored: a batch holds up to 10,000 × K
    /// results, and WKB is a fifth of the memory of a GeoJSON tree
    /// ([`SearchResult::geometry`] converts it).
    #[serde(skip)]
    pub wkb: Option<Vec<u8>>,
    /// The tiling that cut the chip (its file's `rsembed` metadata), for
    /// reading it again (`--html`); one per file, shared by its results.
    #[serde(skip)]
    pub tiling: Option<Arc<rsembed_schemas::job::TilingSpec>>,
}

impl SearchResult {
    /// The footprint as a GeoJSON geometry.
    pub fn geometry(&self) -> Option<Value> {
        self.wkb.as_deref().and_then(wkb_to_geojson)
    }
}

/// A WKB polygon (either byte order, 2D) as a GeoJSON geometry; `None` for
/// anything else or for bytes that do not parse (a footprint is only shown,
/// never trusted, here).
pub(crate) fn wkb_to_geojson(b: &[u8]) -> Option<Value> {
    // Only a plain 2D polygon (type code 3): what chip footprints are.
    let code: [u8; 4] = b.get(1..5)?.try_into().ok()?;
    let code = match b[0] {
        0 => u32::from_be_bytes(code),
        1 => u32::from_le_bytes(code),
        _ => return None,
    };
    if code != 3 {
        return None;
    }
    crate::format::wkb::to_geojson(b).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wkb_polygons_become_geojson_and_garbage_does_not() {
        let mut b = vec![1u8];
        b.extend(3u32.to_le_bytes());
        b.extend(1u32.to_le_bytes());
        b.extend(4u32.to_le_bytes());
        for (x, y) in [(0.0f64, 0.0f64), (1.0, 0.0), (1.0, 1.0), (0.0, 0.0)] {
            b.extend(x.to_le_bytes());
            b.extend(y.to_le_bytes());
        }
        let g = wkb_to_geojson(&b).unwrap();
        assert_eq!(g["type"], "Polygon");
        assert_eq!(g["coordinates"][0][2], json!([1.0, 1.0]));
        // A ring count that the bytes cannot hold is refused before allocating.
        let mut bad = vec![1u8];
        bad.extend(3u32.to_le_bytes());
        bad.extend(u32::MAX.to_le_bytes());
        assert!(wkb_to_geojson(&bad).is_none());
        assert!(wkb_to_geojson(&b[..b.len() - 1]).is_none());
        assert!(wkb_to_geojson(&[]).is_none());
    }
}
