//! The rows of the windows compared, a pass at a time, and the distance of
//! each cell between two of them.

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow_array::{Array, BinaryArray, StringArray};
use arrow_array::{RecordBatch, TimestampMicrosecondArray};
use futures::StreamExt;
use rsembed_schemas::chip::col;

use super::{rfc3339, Window};
use crate::format::embeddings;
use crate::format::index::{Bboxes, GroupRef, Index};
use crate::scan::scan_groups;
use crate::{Error, Result};

/// Bytes a row costs besides its embedding: the cell, the ids and the
/// footprint, for the passes' estimate.
const ROW_OVERHEAD: u64 = 256;

/// A cell's change between two windows.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) cell: String,
    pub(crate) grid_cell: Option<String>,
    pub(crate) geometry: Option<Vec<u8>>,
    pub(crate) bbox: Option<[f64; 4]>,
    /// The windows (indexes), earlier first.
    pub(crate) a: usize,
    pub(crate) b: usize,
    pub(crate) distance: f32,
    pub(crate) chip_a: String,
    pub(crate) chip_b: String,
}

/// A row of a compared window.
struct Row {
    cell: String,
    window: usize,
    chip_id: String,
    embedding: Vec<f32>,
    grid_cell: Option<String>,
    geometry: Option<Vec<u8>>,
    bbox: Option<[f64; 4]>,
}

/// The changes of every cell between each of `pairs`, largest first; and
/// the passes it took.
pub(super) async fn collect(
    index: &Arc<Index>,
    groups: &[GroupRef],
    windows: &[Window],
    pairs: &[(usize, usize)],
    compared: &BTreeSet<usize>,
    concurrency: usize,
    memory: u64,
) -> Result<(Vec<Change>, u32)> {
    let per_row = index.embed_dim as u64 * 4 + ROW_OVERHEAD;
    let passes = index
        .rows()
        .saturating_mul(per_row)
        .div_ceil(memory.max(1))
        .max(1);
    let passes = u32::try_from(passes)
        .map_err(|_| Error::flag("--memory", "is too small for this output: give more"))?;
    let mut changes = Vec::new();
    for pass in 0..passes {
        let mut cells: HashMap<String, Vec<Row>> = HashMap::new();
        let mut scan = Box::pin(read_pass(
            index,
            groups,
            windows,
            compared,
            concurrency,
            (pass, passes),
        ));
        while let Some(r) = scan.next().await {
            for row in r?.1 {
                cells.entry(row.cell.clone()).or_default().push(row);
            }
        }
        for (cell, rows) in cells {
            changes.extend(changes_of(&cell, rows, pairs, windows)?);
        }
    }
    changes.sort_by(|x, y| {
        y.distance
            .total_cmp(&x.distance)
            .then_with(|| x.cell.cmp(&y.cell))
            .then(x.a.cmp(&y.a))
    });
    Ok((changes, passes))
}

/// The scan of one pass: the rows of the compared windows whose cell hashes
/// into it.
fn read_pass(
    index: &Arc<Index>,
    groups: &[GroupRef],
    windows: &[Window],
    compared: &BTreeSet<usize>,
    concurrency: usize,
    (pass, passes): (u32, u32),
) -> impl futures::Stream<Item = Result<(GroupRef, Vec<Row>)>> {
    let uris: Arc<Vec<String>> = Arc::new(index.parts.iter().map(|p| p.uri.clone()).collect());
    let starts: Arc<Vec<i64>> = Arc::new(windows.iter().map(|w| w.0).collect());
    let compared = Arc::new(compared.clone());
    let dim = index.embed_dim;
    scan_groups(
        index.clone(),
        groups.to_vec(),
        vec![col::CHIP_ID, col::CELL, col::WINDOW_START, col::EMBEDDING],
        vec![col::GRID_CELL, col::GEOMETRY, col::BBOX],
        concurrency,
        Vec::new,
        move |acc: &mut Vec<Row>, g: GroupRef, _, batch: &RecordBatch| {
            let uri = &uris[g.part];
            let strings = |name: &str| {
                batch
                    .column_by_name(name)
                    .map(|c| {
                        c.as_any()
                            .downcast_ref::<StringArray>()
                            .ok_or_else(|| Error::column(uri, name, "a string column"))
                    })
                    .transpose()
            };
            let ids = strings(col::CHIP_ID)?
                .ok_or_else(|| Error::column(uri, col::CHIP_ID, "present"))?;
            let cell =
                strings(col::CELL)?.ok_or_else(|| Error::column(uri, col::CELL, "present"))?;
            let grid = strings(col::GRID_CELL)?;
            let start = batch
                .column_by_name(col::WINDOW_START)
                .and_then(|c| c.as_any().downcast_ref::<TimestampMicrosecondArray>())
                .ok_or_else(|| Error::column(uri, col::WINDOW_START, "a timestamp (µs)"))?;
            let geom = batch
                .column_by_name(col::GEOMETRY)
                .and_then(|c| c.as_any().downcast_ref::<BinaryArray>());
            let bbox = Bboxes::of(batch, uri)?;
            let rows = embeddings(batch, dim, uri)?.unit_rows(dim);
            for i in 0..batch.num_rows() {
                if cell.is_null(i) || start.is_null(i) {
                    continue;
                }
                let Ok(w) = starts.binary_search(&start.value(i)) else {
                    continue;
                };
                if !compared.contains(&w)
                    || hash_of(cell.value(i)) % u64::from(passes) != u64::from(pass)
                {
                    continue;
                }
                acc.push(Row {
                    cell: cell.value(i).to_owned(),
                    window: w,
                    chip_id: ids.value(i).to_owned(),
                    embedding: rows[i * dim..(i + 1) * dim].to_vec(),
                    grid_cell: grid
                        .filter(|a| a.is_valid(i))
                        .map(|a| a.value(i).to_owned()),
                    geometry: geom.filter(|a| a.is_valid(i)).map(|a| a.value(i).to_vec()),
                    bbox: bbox.as_ref().and_then(|b| b.get(i)),
                });
            }
            Ok::<(), Error>(())
        },
    )
}

/// A stable hash of a cell (the same pass whatever the process).
fn hash_of(cell: &str) -> u64 {
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new();
    cell.hash(&mut h);
    h.finish()
}

/// The changes of one cell between each of `pairs` it has both rows of.
fn changes_of(
    cell: &str,
    mut rows: Vec<Row>,
    pairs: &[(usize, usize)],
    windows: &[Window],
) -> Result<Vec<Change>> {
    rows.sort_by_key(|r| r.window);
    for w in rows.windows(2) {
        if w[0].window == w[1].window {
            return Err(Error::dataset(
                cell,
                format!(
                    "two rows in the window from {} ({} and {}): not one row per cell and window",
                    rfc3339(windows[w[0].window].0),
                    w[0].chip_id,
                    w[1].chip_id
                ),
            ));
        }
    }
    let of = |w: usize| rows.iter().find(|r| r.window == w);
    Ok(pairs
        .iter()
        .filter_map(|&(a, b)| {
            let (ra, rb) = (of(a)?, of(b)?);
            let cos: f64 = ra
                .embedding
                .iter()
                .zip(&rb.embedding)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            Some(Change {
                cell: cell.to_owned(),
                grid_cell: rb.grid_cell.clone().or_else(|| ra.grid_cell.clone()),
                geometry: rb.geometry.clone().or_else(|| ra.geometry.clone()),
                bbox: rb.bbox.or(ra.bbox),
                a,
                b,
                distance: (1.0 - cos) as f32,
                chip_a: ra.chip_id.clone(),
                chip_b: rb.chip_id.clone(),
            })
        })
        .collect())
}
