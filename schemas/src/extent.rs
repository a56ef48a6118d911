//! What one chip file covers, recorded with the file: where its chips lie
//! (an outline of a bounded number of vertices), when they were acquired,
//! and the STAC items they came from.
//!
//! The worker computes it from the rows it writes and records it twice: in
//! the file's key-value metadata ([`EXTENT_KEY`], so a run that resumes reads
//! it from the footer alone) and on the file's [`ManifestFile`] record (so the
//! done record of a distributed task carries it). The STAC items of a job are
//! written from these records without opening a chip file.
//!
//! [`ManifestFile`]: crate::job::ManifestFile

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Key of a chip file's footer metadata holding its [`FileExtent`] as JSON.
pub const EXTENT_KEY: &str = "rsembed.extent";

/// Vertices of a footprint, over all its polygons, at most. A polygon has
/// at least 3, so a footprint has at most `MAX_VERTICES / 4` polygons
/// when each may need a rectangle.
pub const MAX_VERTICES: usize = 64;

/// Source items recorded per file, at most: a chip file holds one task's
/// scenes, usually a few; past this [`FileExtent::more_sources`] says so.
pub const MAX_SOURCES: usize = 100;

/// What the chips of one file cover. Every field is left out of the JSON
/// when empty, so a file of plain images costs a few bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FileExtent {
    /// Polygons in lon/lat (OGC:CRS84) that together cover every chip's
    /// footprint: each one outer ring, counter-clockwise, open (the first
    /// vertex is not repeated). They do not overlap. Empty when no chip has a
    /// footprint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub footprint: Vec<Vec<[f64; 2]>>,
    /// Earliest chip `datetime`, µs since the epoch, UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<i64>,
    /// Latest chip `end_datetime` (or `datetime` where a chip has no end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<i64>,
    /// Chips whose `datetime` is null.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub undated: u64,
    /// The STAC items the chips came from: `source_uri` (the item's URL) to
    /// `item_id`, the first [`MAX_SOURCES`] in URL order.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sources: BTreeMap<String, String>,
    /// Whether there were more than [`MAX_SOURCES`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub more_sources: bool,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl FileExtent {
    /// The bbox of the footprint: xmin, ymin, xmax, ymax.
    pub fn bbox(&self) -> Option<[f64; 4]> {
        self.footprint
            .iter()
            .flatten()
            .map(|&[x, y]| [x, y, x, y])
            .reduce(|a, b| {
                [
                    a[0].min(b[0]),
                    a[1].min(b[1]),
                    a[2].max(b[2]),
                    a[3].max(b[3]),
                ]
            })
    }

    /// Checks what a record read back holds (a done record or a footer is
    /// data, and a hostile one must not make a reader allocate or trust
    /// nonsense): at most [`MAX_VERTICES`] vertices, rings of three or
    /// more, lon/lat in range, `start <= end`, at most [`MAX_SOURCES`]
    /// sources.
    pub fn check(&self) -> Result<(), String> {
        let vertices: usize = self.footprint.iter().map(Vec::len).sum();
        if vertices > MAX_VERTICES {
            return Err(format!(
                "the footprint has {vertices} vertices, more than {MAX_VERTICES}"
            ));
        }
        for ring in &self.footprint {
            if ring.len() < 3 {
                return Err(format!("a ring of {} vertices", ring.len()));
            }
            for &[x, y] in ring {
                if !((-180.0..=180.0).contains(&x) && (-90.0..=90.0).contains(&y)) {
                    return Err(format!("the vertex [{x}, {y}] is not a lon/lat"));
                }
            }
        }
        if let (Some(s), Some(e)) = (self.start, self.end) {
            if s > e {
                return Err(format!("start {s} is after end {e}"));
            }
        }
        if self.start.is_some() != self.end.is_some() {
            return Err("a start without an end, or an end without a start".into());
        }
        if self.sources.len() > MAX_SOURCES {
            return Err(format!(
                "{} sources, more than {MAX_SOURCES}",
                self.sources.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_extent_is_an_empty_object_and_old_records_read() {
        assert_eq!(serde_json::to_string(&FileExtent::default()).unwrap(), "{}");
        let e: FileExtent = serde_json::from_str("{}").unwrap();
        assert_eq!(e, FileExtent::default());
        assert_eq!(e.bbox(), None);
        assert!(e.check().is_ok());
    }

    #[test]
    fn the_bbox_is_the_footprints_and_bad_records_are_refused() {
        let e = FileExtent {
            footprint: vec![
                vec![[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]],
                vec![[10.0, -5.0], [11.0, -5.0], [11.0, -4.0]],
            ],
            start: Some(1),
            end: Some(2),
            ..FileExtent::default()
        };
        assert_eq!(e.bbox(), Some([0.0, -5.0, 11.0, 1.0]));
        assert!(e.check().is_ok());
        let back: FileExtent = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
        assert_eq!(back, e);

        let bad = |f: &dyn Fn(&mut FileExtent)| {
            let mut b = e.clone();
            f(&mut b);
            b.check().unwrap_err()
        };
        assert!(bad(&|b| b.footprint[0].truncate(2)).contains("ring of 2"));
        assert!(bad(&|b| b.footprint[0][0] = [181.0, 0.0]).contains("not a lon/lat"));
        assert!(bad(&|b| b.footprint[0][0] = [f64::NAN, 0.0]).contains("not a lon/lat"));
        assert!(bad(&|b| b.start = Some(3)).contains("after"));
        assert!(bad(&|b| b.end = None).contains("without"));
        assert!(bad(&|b| b.footprint = vec![vec![[0.0, 0.0]; 65]]).contains("65 vertices"));
        assert!(bad(&|b| {
            b.sources = (0..=MAX_SOURCES)
                .map(|i| (i.to_string(), "x".into()))
                .collect()
        })
        .contains("sources"));
    }
}
