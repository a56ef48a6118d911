//! A chip file's [`FileExtent`]: the outline of its chips, their time range
//! and their source items, computed from the rows as the file is written and
//! recorded in its footer ([`EXTENT_KEY`]) and on its [`ManifestFile`].
//!
//! # The outline
//!
//! Chips are grouped into parts by source input (and by side of the prime
//! meridian, so a scene cut by the antimeridian makes two parts, not one
//! around the globe). A part's outline is the convex hull of its chips' bbox
//! corners: it never misses a chip (each chip's footprint lies in its bbox)
//! and adds little on a scene, which is convex already. Parts whose bboxes
//! touch or overlap (or lie within a metre) become one polygon, so the
//! polygons never overlap; parts apart stay apart, so a search between two
//! places finds nothing. Vertices are put on a grid of 10⁻⁷° (the polygon
//! grown a hair first, so it still holds every chip), which keeps the JSON
//! short and exact when read back.
//!
//! The outline has at most [`MAX_VERTICES`] vertices in all. Over that,
//! parts near each other merge: their bboxes are snapped to a lon/lat grid
//! whose cell doubles (from 2⁻¹⁰°) until at most `MAX_VERTICES / 4` polygons
//! are left; then each polygon gets a share of the vertices and drops its
//! cheapest edges (extending their neighbours, so it still holds the hull)
//! within its bbox. A merge of parts only near each other never makes a
//! polygon wider than 180° of longitude; only when nothing else holds the
//! bound do all parts become one polygon, which then runs the long way round
//! in lon/lat (a task of chips spread around the globe). The worker logs it,
//! and the STAC item says so (`rsembed:wide_footprint`).
//!
//! [`ManifestFile`]: rsembed_schemas::job::ManifestFile

use std::collections::HashMap;

use parquet::file::metadata::KeyValue;
use rsembed_schemas::extent::{FileExtent, EXTENT_KEY, MAX_SOURCES, MAX_VERTICES};

use super::hull::{convex_hull, enclose, Pt};
use super::rows::AsChipRow;
use super::snap;
use crate::error::Result;

/// Polygons at most: each may need a rectangle's four vertices.
const MAX_POLYGONS: usize = MAX_VERTICES / 4;
/// The first grid cell, in degrees, of the merge of parts near each other.
const FIRST_CELL: f64 = 1.0 / 1024.0;
/// Share of a polygon's area that dropping edges may add beyond the budget's
/// needs: a scene's hull has a vertex per chip along a bent edge, and its
/// outline needs few.
const SLACK: f64 = 0.01;
/// Parts kept apart at most: past this, parts are re-keyed by a grid cell
/// (a file of very many inputs, e.g. one compacted), which bounds memory.
const MAX_PARTS: usize = 1024;
/// Points a part holds before they are reduced to their hull.
const COMPACT_AT: usize = 4096;
/// The first cell, in degrees, of the re-keying past [`MAX_PARTS`].
const FIRST_KEY_CELL: f64 = 1.0;
/// Parts closer than this (degrees, about a metre) are one polygon: each
/// polygon is put on the [`snap::GRID`] within [`REACH`] of its bbox, so
/// polygons of parts further apart never meet.
const GAP: f64 = 1e-5;
/// How far a polygon put on the grid may reach beyond its bbox.
const REACH: f64 = 4e-6;

/// What a part is keyed by: its side of the prime meridian (west: centre
/// lon < 0), and its source input, or a grid cell once there are too many.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Key {
    Source(bool, String),
    Cell(bool, i64, i64),
}

/// Chips of one part: the bbox over them and points whose hull holds them.
#[derive(Debug, Clone)]
struct Part {
    bbox: [f64; 4],
    points: Vec<Pt>,
}

impl Part {
    fn add(&mut self, b: [f64; 4], points: &[Pt]) {
        self.bbox = union(self.bbox, b);
        self.points.extend_from_slice(points);
        if self.points.len() > COMPACT_AT {
            self.points = convex_hull(std::mem::take(&mut self.points));
        }
    }
}

fn union(a: [f64; 4], b: [f64; 4]) -> [f64; 4] {
    [
        a[0].min(b[0]),
        a[1].min(b[1]),
        a[2].max(b[2]),
        a[3].max(b[3]),
    ]
}

fn corners(b: [f64; 4]) -> [Pt; 4] {
    [[b[0], b[1]], [b[2], b[1]], [b[2], b[3]], [b[0], b[3]]]
}

/// Builds a [`FileExtent`] chip by chip, in bounded memory.
#[derive(Debug, Default)]
pub struct ExtentBuilder {
    parts: HashMap<Key, Part>,
    /// Cell size of [`Key::Cell`] once parts are keyed by cell.
    key_cell: Option<f64>,
    extent: FileExtent,
}

impl ExtentBuilder {
    /// Adds one chip: its input, footprint bbox (lon/lat), acquisition time
    /// range (µs) and STAC item id. A bbox that is not finite or has
    /// min > max is left out (the caller checks what it reads).
    pub fn add(
        &mut self,
        source: &str,
        bbox: Option<[f64; 4]>,
        datetime: Option<i64>,
        end: Option<i64>,
        item_id: Option<&str>,
    ) {
        if let Some(b) =
            bbox.filter(|b| b.iter().all(|v| v.is_finite()) && b[0] <= b[2] && b[1] <= b[3])
        {
            self.add_bbox(source, b);
        }
        match datetime {
            Some(t) => self.add_time(t, end),
            None => self.extent.undated += 1,
        }
        if let Some(id) = item_id {
            self.add_source(source, id);
        }
    }

    fn add_bbox(&mut self, source: &str, b: [f64; 4]) {
        let west = b[0] + b[2] < 0.0;
        let key = match self.key_cell {
            None => Key::Source(west, source.to_owned()),
            Some(c) => cell_key(west, b, c),
        };
        self.parts
            .entry(key)
            .or_insert(Part {
                bbox: b,
                points: Vec::new(),
            })
            .add(b, &corners(b));
        if self.parts.len() > MAX_PARTS {
            self.rekey();
        }
    }

    /// Merges parts by the grid cell of their bbox's centre, doubling the
    /// cell until at most half of [`MAX_PARTS`] are left.
    fn rekey(&mut self) {
        let mut cell = self.key_cell.map_or(FIRST_KEY_CELL, |c| c * 2.0);
        loop {
            let mut merged: HashMap<Key, Part> = HashMap::new();
            for (key, part) in std::mem::take(&mut self.parts) {
                let west = match key {
                    Key::Source(w, _) | Key::Cell(w, ..) => w,
                };
                let k = cell_key(west, part.bbox, cell);
                match merged.get_mut(&k) {
                    Some(m) => m.add(part.bbox, &part.points),
                    None => {
                        merged.insert(k, part);
                    }
                }
            }
            self.parts = merged;
            self.key_cell = Some(cell);
            if self.parts.len() <= MAX_PARTS / 2 || cell > 360.0 {
                return;
            }
            cell *= 2.0;
        }
    }

    fn add_time(&mut self, start: i64, end: Option<i64>) {
        let end = end.unwrap_or(start).max(start);
        let e = &mut self.extent;
        e.start = Some(e.start.map_or(start, |s| s.min(start)));
        e.end = Some(e.end.map_or(end, |x| x.max(end)));
    }

    fn add_source(&mut self, uri: &str, item_id: &str) {
        let e = &mut self.extent;
        if e.sources.contains_key(uri) {
            return;
        }
        if e.sources.len() < MAX_SOURCES {
            e.sources.insert(uri.to_owned(), item_id.to_owned());
        } else {
            // Keep the first MAX_SOURCES in URL order, so the record does
            // not depend on the order of rows.
            e.more_sources = true;
            if e.sources
                .last_key_value()
                .is_some_and(|(k, _)| k.as_str() > uri)
            {
                e.sources.pop_last();
                e.sources.insert(uri.to_owned(), item_id.to_owned());
            }
        }
    }

    /// The extent of the chips added.
    pub fn finish(self) -> FileExtent {
        // In key order: which near parts merge first must not depend on
        // the hash map's order.
        let mut parts: Vec<(Key, Part)> = self.parts.into_iter().collect();
        parts.sort_by(|a, b| a.0.cmp(&b.0));
        let parts = parts.into_iter().map(|(_, p)| p).collect();
        FileExtent {
            footprint: outline(parts),
            ..self.extent
        }
    }
}

fn cell_key(west: bool, b: [f64; 4], cell: f64) -> Key {
    let (x, y) = ((b[0] + b[2]) / 2.0, (b[1] + b[3]) / 2.0);
    Key::Cell(west, (x / cell).floor() as i64, (y / cell).floor() as i64)
}

/// The extent of a task's rows.
pub fn of_rows<R: AsChipRow>(rows: &[R]) -> FileExtent {
    let mut b = ExtentBuilder::default();
    for row in rows {
        let r = row.chip();
        let window = row
            .cells()
            .and_then(|c| Some((c.window_start?, c.window_end?)));
        let (t, end) = row_time(r.stac.datetime, r.stac.end_datetime, window);
        b.add(
            &r.source_uri,
            r.footprint.as_ref().map(|f| f.bbox),
            t,
            end,
            r.stac.item_id.as_deref(),
        );
    }
    b.finish()
}

/// A row's time range for the extent: its acquisition's, or, for a
/// composite of a window's acquisitions (a median row has no one
/// acquisition), its window's, whose end is exclusive: the last microsecond
/// before it. Without this a median task's file, and its STAC item, would
/// have no date.
fn row_time(
    datetime: Option<i64>,
    end: Option<i64>,
    window: Option<(i64, i64)>,
) -> (Option<i64>, Option<i64>) {
    match (datetime, window) {
        (Some(t), _) => (Some(t), end),
        (None, Some((a, b))) => (Some(a), Some(b.saturating_sub(1).max(a))),
        (None, None) => (None, None),
    }
}

/// The footer entry that records `extent` ([`EXTENT_KEY`]).
pub fn entry(extent: &FileExtent) -> Result<KeyValue> {
    Ok(KeyValue::new(
        EXTENT_KEY.to_owned(),
        serde_json::to_string(extent)?,
    ))
}

/// The extent a footer records; `None` when it has none (a file of an older
/// version) or one that does not parse or check.
pub fn from_footer(kv: Option<&Vec<KeyValue>>) -> Option<FileExtent> {
    let v = kv?.iter().find(|e| e.key == EXTENT_KEY)?.value.as_deref()?;
    match serde_json::from_str::<FileExtent>(v).map_err(|e| e.to_string()) {
        Ok(e) => match e.check() {
            Ok(()) => Some(e),
            Err(why) => {
                tracing::warn!(%why, "a chip file's recorded extent is not usable");
                None
            }
        },
        Err(why) => {
            tracing::warn!(%why, "a chip file's recorded extent does not parse");
            None
        }
    }
}

/// A group of parts on its way to a polygon.
struct Group {
    bbox: [f64; 4],
    points: Vec<Pt>,
}

/// The polygons of a footprint over `parts` (see the module notes).
fn outline(parts: Vec<Part>) -> Vec<Vec<Pt>> {
    let mut groups: Vec<Group> = parts
        .into_iter()
        .map(|p| Group {
            bbox: p.bbox,
            points: convex_hull(p.points),
        })
        .collect();
    groups = merge(groups, None);
    let mut cell = FIRST_CELL;
    while groups.len() > MAX_POLYGONS {
        if cell > 360.0 {
            tracing::warn!(
                groups = groups.len(),
                "a chip file's chips lie in too many places apart to outline them \
                 separately: one polygon holds them all"
            );
            let all = groups.into_iter().reduce(|mut a, b| {
                a.bbox = union(a.bbox, b.bbox);
                a.points.extend(b.points);
                a
            });
            groups = all.into_iter().collect();
            break;
        }
        groups = merge(groups, Some(cell));
        cell *= 2.0;
    }
    let mut hulls: Vec<(Vec<Pt>, [f64; 4])> = groups
        .into_iter()
        .map(|g| (convex_hull(g.points), g.bbox))
        .collect();
    // Small outlines first: what they leave of the budget goes to the rest.
    hulls.sort_by(|a, b| {
        a.0.len()
            .cmp(&b.0.len())
            .then(a.1[0].total_cmp(&b.1[0]))
            .then(a.1[1].total_cmp(&b.1[1]))
    });
    let mut left = MAX_VERTICES;
    let n = hulls.len();
    let mut polygons: Vec<Vec<Pt>> = Vec::with_capacity(n);
    for (k, (hull, bbox)) in hulls.into_iter().enumerate() {
        let share = left / (n - k);
        let p = snap::outward(&enclose(&hull, share.max(4), bbox, SLACK), bbox, REACH);
        left -= p.len().min(left);
        polygons.push(p);
    }
    polygons.sort_by(|a, b| {
        a[0][0]
            .total_cmp(&b[0][0])
            .then(a[0][1].total_cmp(&b[0][1]))
    });
    polygons
}

/// `b` snapped outward to a grid of `cell` degrees (in cells); without a
/// cell, grown by half the [`GAP`], so bboxes closer than that meet.
fn snapped(b: [f64; 4], cell: Option<f64>) -> [f64; 4] {
    match cell {
        None => [
            b[0] - GAP / 2.0,
            b[1] - GAP / 2.0,
            b[2] + GAP / 2.0,
            b[3] + GAP / 2.0,
        ],
        Some(c) => [
            (b[0] / c).floor(),
            (b[1] / c).floor(),
            (b[2] / c).ceil(),
            (b[3] / c).ceil(),
        ],
    }
}

fn meet(a: [f64; 4], b: [f64; 4]) -> bool {
    a[0] <= b[2] && b[0] <= a[2] && a[1] <= b[3] && b[1] <= a[3]
}

/// Merges groups whose bboxes are within [`GAP`], and with a `cell`, groups
/// whose bboxes snapped to it do, unless that would make a group wider than
/// 180° of longitude; until no two are left to merge.
fn merge(mut groups: Vec<Group>, cell: Option<f64>) -> Vec<Group> {
    loop {
        let n = groups.len();
        let snap: Vec<[f64; 4]> = groups.iter().map(|g| snapped(g.bbox, cell)).collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| snap[a][0].total_cmp(&snap[b][0]).then(a.cmp(&b)));
        let mut root: Vec<usize> = (0..n).collect();
        let mut bbox: Vec<[f64; 4]> = groups.iter().map(|g| g.bbox).collect();
        let mut merged = false;
        for (k, &i) in order.iter().enumerate() {
            for &j in &order[k + 1..] {
                if snap[j][0] > snap[i][2] {
                    break;
                }
                if !meet(snap[i], snap[j]) {
                    continue;
                }
                let (ri, rj) = (find(&mut root, i), find(&mut root, j));
                if ri == rj {
                    continue;
                }
                let u = union(bbox[ri], bbox[rj]);
                let overlap = meet(snapped(groups[i].bbox, None), snapped(groups[j].bbox, None));
                if !overlap && u[2] - u[0] > 180.0 {
                    continue;
                }
                let (lo, hi) = (ri.min(rj), ri.max(rj));
                root[hi] = lo;
                bbox[lo] = u;
                merged = true;
            }
        }
        if !merged {
            return groups;
        }
        let mut out: Vec<Option<Group>> = (0..n).map(|_| None).collect();
        for (i, g) in groups.into_iter().enumerate() {
            let r = find(&mut root, i);
            match &mut out[r] {
                Some(m) => {
                    m.bbox = union(m.bbox, g.bbox);
                    m.points.extend(g.points);
                }
                slot => *slot = Some(g),
            }
        }
        groups = out
            .into_iter()
            .flatten()
            .map(|g| Group {
                points: convex_hull(g.points),
                bbox: g.bbox,
            })
            .collect();
    }
}

fn find(root: &mut [usize], mut i: usize) -> usize {
    while root[i] != i {
        root[i] = root[root[i]];
        i = root[i];
    }
    i
}

#[cfg(test)]
#[path = "extent_tests.rs"]
mod tests;
