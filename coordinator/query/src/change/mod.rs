//! `rsembed change`: how far each cell's embedding moved between two time
//! windows of a window job's output (`run --windows`), ranked.
//!
//! For each pair of windows (consecutive windows by default, or the two
//! holding `--from` and `--to`), every cell with a row in both gets
//! `distance` = 1 − cosine of its two embeddings (f32, f16 and int8 outputs
//! alike: each row as a unit float32 vector). The pairs are written as one
//! GeoParquet file, largest distance first, with the cell's footprint; `--top
//! K` prints the K largest.
//!
//! Decisions:
//! - Consecutive means consecutive among the windows the output holds: a
//!   cell without a row in one of them (all cloud) has no pair for that
//!   step, rather than a pair that spans two steps and would rank as a
//!   larger change.
//! - Memory is bounded by `--memory`: the rows of the windows compared are
//!   read in as many passes as their embeddings need, each pass keeping the
//!   cells whose hash falls in it (a cell's rows are always in one pass).
//!   The pairs themselves (about 200 bytes each, no embedding) are held to
//!   be ranked.
//! - Two rows of one cell in one window are not a window job's output: an
//!   error names the cell, never a silent pick.

mod args;
mod pairs;
mod write;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::{Array, TimestampMicrosecondArray};
use futures::StreamExt;
use rsembed_schemas::chip::col;
use rsembed_store::StoreCache;
use serde::Serialize;

use crate::format::footer::FOOTER_BUDGET_GROUPS;
use crate::format::index::{GroupRef, Index};
use crate::io::check_output_file;
use crate::scan::{default_concurrency, scan_groups};
use crate::{Error, Result};

pub use args::ChangeArgs;
use pairs::collect;
pub(crate) use pairs::Change;

/// A window of the output: its start and end, µs since the epoch (UTC).
pub(crate) type Window = (i64, i64);

/// What `change` wrote.
#[derive(Debug, Clone, Serialize)]
pub struct ChangeSummary {
    /// The output file.
    pub output: String,
    /// The windows the output holds, in order (RFC 3339 starts).
    pub windows: Vec<String>,
    /// The pairs of windows compared (RFC 3339 starts).
    pub compared: Vec<(String, String)>,
    /// Rows written: one per cell and pair of windows.
    pub rows: u64,
    /// Passes over the rows that `--memory` needed.
    pub passes: u32,
    /// The largest changes, when `--top` was given.
    pub top: Vec<TopChange>,
    /// Seconds.
    pub seconds: f64,
}

/// One of the largest changes, as `--top` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct TopChange {
    /// The cell.
    pub cell: String,
    /// Its Major TOM cell.
    pub grid_cell: Option<String>,
    /// The earlier window's start.
    pub window_a: String,
    /// The later window's start.
    pub window_b: String,
    /// 1 − cosine.
    pub distance: f32,
}

impl ChangeSummary {
    /// The summary for a terminal.
    pub fn render(&self) -> String {
        let mut s = format!(
            "change: {} rows ({} pairs of windows of {}) -> {}\n",
            self.rows,
            self.compared.len(),
            self.windows.len(),
            self.output
        );
        if !self.top.is_empty() {
            s += &format!(
                "{:>4}  {:>8}  {:<20}  {:<20}  {:<10}  cell\n",
                "rank", "distance", "window_a", "window_b", "grid_cell"
            );
            for (i, t) in self.top.iter().enumerate() {
                s += &format!(
                    "{:>4}  {:>8.5}  {:<20}  {:<20}  {:<10}  {}\n",
                    i + 1,
                    t.distance,
                    t.window_a,
                    t.window_b,
                    t.grid_cell.as_deref().unwrap_or("-"),
                    t.cell
                );
            }
        }
        s += &format!("  {:.2} s, {} pass(es)\n", self.seconds, self.passes);
        s
    }
}

/// Compares the windows of `args.index` and writes `args.output`.
pub async fn change(args: ChangeArgs) -> Result<ChangeSummary> {
    let t0 = Instant::now();
    let from = args.from.as_deref().map(instant).transpose()?;
    let to = args.to.as_deref().map(instant).transpose()?;
    if let (Some(a), Some(b)) = (from, to) {
        if a >= b {
            return Err(Error::flag("--to", "must come after --from"));
        }
    }
    let stores = StoreCache::default();
    let out = stores.location(&args.output)?;
    check_output_file(&out, args.overwrite).await?;
    let index = Arc::new(Index::open(&stores, &args.index, FOOTER_BUDGET_GROUPS).await?);
    for part in &index.parts {
        for c in [col::CELL, col::WINDOW_START, col::WINDOW_END] {
            if !part.has_column(c) {
                return Err(Error::dataset(
                    &part.uri,
                    format!(
                        "no `{c}` column: not the output of a window job (`rsembed run --windows`), \
                         whose rows are one per cell and window"
                    ),
                ));
            }
        }
    }
    let concurrency = args.concurrency.unwrap_or_else(default_concurrency);
    let (groups, _) = index.row_groups(None);
    let windows = windows_of(&index, &groups, concurrency).await?;
    let pairs = pairs_of(&windows, from, to)?;
    let compared: BTreeSet<usize> = pairs.iter().flat_map(|&(a, b)| [a, b]).collect();
    let (changes, passes) = collect(
        &index,
        &groups,
        &windows,
        &pairs,
        &compared,
        concurrency,
        args.memory,
    )
    .await?;
    let rows = write::write(&out, &index, &changes, &windows).await?;
    Ok(ChangeSummary {
        output: out.url.to_string(),
        windows: windows.iter().map(|w| rfc3339(w.0)).collect(),
        compared: pairs
            .iter()
            .map(|&(a, b)| (rfc3339(windows[a].0), rfc3339(windows[b].0)))
            .collect(),
        rows,
        passes,
        top: changes
            .iter()
            .take(args.top.unwrap_or(0))
            .map(|c| TopChange {
                cell: c.cell.clone(),
                grid_cell: c.grid_cell.clone(),
                window_a: rfc3339(windows[c.a].0),
                window_b: rfc3339(windows[c.b].0),
                distance: c.distance,
            })
            .collect(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// `--from`/`--to` as µs since the epoch: an RFC 3339 instant, or a date's
/// first microsecond (UTC).
fn instant(s: &str) -> Result<i64> {
    match rsembed_schemas::datetime::range(s) {
        Ok((Some(start), _)) if !s.contains('/') => Ok(start),
        Ok(_) => Err(Error::Usage(format!(
            "`{s}`: want one RFC 3339 instant or date, not an interval"
        ))),
        Err(e) => Err(Error::Usage(format!("`{s}`: {e}"))),
    }
}

/// The windows the output holds, in order: every distinct (start, end) of
/// its rows.
async fn windows_of(
    index: &Arc<Index>,
    groups: &[GroupRef],
    concurrency: usize,
) -> Result<Vec<Window>> {
    let uris: Arc<Vec<String>> = Arc::new(index.parts.iter().map(|p| p.uri.clone()).collect());
    let mut scan = Box::pin(scan_groups(
        index.clone(),
        groups.to_vec(),
        vec![col::WINDOW_START, col::WINDOW_END],
        Vec::new(),
        concurrency,
        BTreeSet::<Window>::new,
        move |acc: &mut BTreeSet<Window>, g: GroupRef, _, batch| {
            let ts = |name: &str| {
                batch
                    .column_by_name(name)
                    .and_then(|c| c.as_any().downcast_ref::<TimestampMicrosecondArray>())
                    .ok_or_else(|| Error::column(&uris[g.part], name, "a timestamp (µs)"))
            };
            let (start, end) = (ts(col::WINDOW_START)?, ts(col::WINDOW_END)?);
            for i in 0..batch.num_rows() {
                if start.is_valid(i) && end.is_valid(i) {
                    acc.insert((start.value(i), end.value(i)));
                }
            }
            Ok::<(), Error>(())
        },
    ));
    let mut all = BTreeSet::new();
    while let Some(r) = scan.next().await {
        all.extend(r?.1);
    }
    let windows: Vec<Window> = all.into_iter().collect();
    for w in windows.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(Error::dataset(
                index.root.url.as_str(),
                format!(
                    "windows overlap ({} to {} and {} to {}): rows of two window jobs mixed?",
                    rfc3339(w[0].0),
                    rfc3339(w[0].1),
                    rfc3339(w[1].0),
                    rfc3339(w[1].1)
                ),
            ));
        }
    }
    Ok(windows)
}

/// The pairs of windows to compare (indexes into `windows`, earlier first).
fn pairs_of(windows: &[Window], from: Option<i64>, to: Option<i64>) -> Result<Vec<(usize, usize)>> {
    let holding = |t: i64, flag: &'static str| {
        windows
            .iter()
            .position(|w| w.0 <= t && t < w.1)
            .ok_or_else(|| {
                Error::flag(
                    flag,
                    format!("{} is in no window of the output", rfc3339(t)),
                )
            })
    };
    let pairs: Vec<(usize, usize)> = match (from, to) {
        (Some(a), Some(b)) => {
            let (a, b) = (holding(a, "--from")?, holding(b, "--to")?);
            if a == b {
                return Err(Error::flag(
                    "--to",
                    "is in the same window as --from: nothing to compare",
                ));
            }
            vec![(a, b)]
        }
        _ => (1..windows.len())
            .filter(|&k| from.is_none_or(|t| windows[k - 1].1 > t))
            .filter(|&k| to.is_none_or(|t| windows[k].0 <= t))
            .map(|k| (k - 1, k))
            .collect(),
    };
    if pairs.is_empty() {
        return Err(Error::Usage(format!(
            "rsembed change: the output holds {} window(s){}: no two to compare",
            windows.len(),
            if from.is_some() || to.is_some() {
                " between --from and --to"
            } else {
                ""
            }
        )));
    }
    Ok(pairs)
}

/// µs since the epoch as RFC 3339 (the number itself out of range).
pub(crate) fn rfc3339(us: i64) -> String {
    rsembed_schemas::datetime::micros_rfc3339(us).unwrap_or_else(|| us.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400_000_000;

    fn quarters() -> Vec<Window> {
        (0..4).map(|k| (k * 90 * DAY, (k + 1) * 90 * DAY)).collect()
    }

    #[test]
    fn consecutive_windows_pair_by_default_and_from_to_pick_two() {
        let w = quarters();
        assert_eq!(pairs_of(&w, None, None).unwrap(), [(0, 1), (1, 2), (2, 3)]);
        assert_eq!(
            pairs_of(&w, Some(100 * DAY), None).unwrap(),
            [(1, 2), (2, 3)]
        );
        assert_eq!(pairs_of(&w, None, Some(100 * DAY)).unwrap(), [(0, 1)]);
        assert_eq!(
            pairs_of(&w, Some(10 * DAY), Some(300 * DAY)).unwrap(),
            [(0, 3)]
        );
        assert!(pairs_of(&w, Some(10 * DAY), Some(20 * DAY)).is_err());
        assert!(pairs_of(&w, Some(-DAY), Some(20 * DAY)).is_err());
        assert!(pairs_of(&w[..1], None, None).is_err());
    }

    #[test]
    fn from_and_to_take_dates_and_instants_not_intervals() {
        assert_eq!(instant("1970-01-02").unwrap(), DAY);
        assert_eq!(instant("1970-01-01T00:00:01Z").unwrap(), 1_000_000);
        assert!(instant("1970-01-01/1970-01-02").is_err());
        assert!(instant("yesterday").is_err());
    }
}
