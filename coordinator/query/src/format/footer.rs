//! What an open index keeps of its files' footers.
//!
//! parquet-rs holds a parsed footer in about 14 KiB of memory per row group
//! (23 column chunks of metadata), six times its size on disk. A search that
//! held every footer grew with the row count: 59 MiB at 10^6 rows, 114 MiB
//! at 10^7 with the same rows per list (docs/benchmarks.md). So an index
//! keeps, per row group, only the [`GroupStats`] that pruning, the IVF probe
//! and `--like` use, a few hundred bytes, and whole footers only for the
//! parts being read, in [`Footers`], within a budget of row groups.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow_schema::{DataType, Schema, TimeUnit};
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::file::metadata::RowGroupMetaData;
use parquet::file::statistics::Statistics;
use parquet::schema::types::SchemaDescriptor;
use rsembed_schemas::chip::col;
use tokio::sync::OnceCell;

use super::LIST;
use crate::Result;

/// Row groups whose parsed footers an index holds beyond those being read:
/// about 7 MiB at 14 KiB a group. Enough for every footer of a small
/// dataset (read once, at open) and for the parts a probe reads.
pub const FOOTER_BUDGET_GROUPS: usize = 512;

/// A column's statistics in one row group, as far as they go.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stats<T> {
    /// Nothing usable: no statistics, no null count, or another type.
    Unknown,
    /// `nulls` null rows (all of them when the file lacks the column); the
    /// others lie in [min, max], which are `None` when every row is null.
    Known {
        nulls: u64,
        min: Option<T>,
        max: Option<T>,
    },
}

/// The bounds of a row group's `bbox` column, from its statistics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BboxStats {
    /// Every row's bbox is null.
    all_null: bool,
    /// Least `xmin`, `ymin`, greatest `xmax`, `ymax`.
    xmin: Option<f64>,
    ymin: Option<f64>,
    xmax: Option<f64>,
    ymax: Option<f64>,
}

impl BboxStats {
    /// False only when the statistics prove that no row's bbox meets `b`
    /// (or that every row's bbox is null).
    pub fn may_intersect(&self, b: [f64; 4]) -> bool {
        if self.all_null {
            return false;
        }
        let [w, s, e, n] = b;
        // A group is out when every row lies wholly west, east, south or north of the box.
        let out = matches!(self.xmax, Some(v) if v < w)
            || matches!(self.xmin, Some(v) if v > e)
            || matches!(self.ymax, Some(v) if v < s)
            || matches!(self.ymin, Some(v) if v > n);
        !out
    }
}

/// What an index keeps of one row group's footer.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupStats {
    /// Rows in the group.
    pub rows: u64,
    /// `bbox` bounds; `None` proves nothing (no column or no statistics).
    pub bbox: Option<BboxStats>,
    /// `datetime`, in µs.
    pub datetime: Stats<i64>,
    /// `end_datetime`, in µs.
    pub end_datetime: Stats<i64>,
    /// `cloud_fraction`.
    pub cloud_fraction: Stats<f32>,
    /// Least and greatest `list`, when the statistics give both.
    pub list: Option<(i32, i32)>,
    /// Least `chip_id`, when the statistics give it.
    chip_id_min: Option<Box<[u8]>>,
    /// Greatest `chip_id`, when the statistics give it.
    chip_id_max: Option<Box<[u8]>>,
}

impl GroupStats {
    /// Whether the group may hold chip `id`: false only when its `chip_id`
    /// statistics exclude it.
    pub fn may_hold_chip(&self, id: &str) -> bool {
        let id = id.as_bytes();
        let below = self.chip_id_min.as_deref().is_some_and(|m| m > id);
        let above = self.chip_id_max.as_deref().is_some_and(|m| m < id);
        !(below || above)
    }
}

/// Where a column the statistics are read from lies in a file.
#[derive(Debug, Clone, Copy)]
enum Column {
    /// The file lacks it: every row is null.
    Absent,
    /// There, but not a top-level leaf of the expected type: unknown.
    Other,
    /// Leaf column `i`.
    Leaf(usize),
}

/// The columns of one file that [`GroupStats`] are read from.
#[derive(Debug, Clone, Copy)]
pub struct StatsColumns {
    bbox: Option<[usize; 4]>,
    datetime: Column,
    end_datetime: Column,
    cloud_fraction: Column,
    list: Option<usize>,
    chip_id: Option<usize>,
}

impl StatsColumns {
    /// Finds them in a file's Arrow and Parquet schemas.
    pub fn find(schema: &Schema, descr: &SchemaDescriptor) -> StatsColumns {
        let top = |name: &str| {
            descr
                .columns()
                .iter()
                .position(|c| c.path().parts() == [name])
        };
        let typed = |name: &str, ok: fn(&DataType) -> bool| match schema.field_with_name(name) {
            Err(_) => Column::Absent,
            Ok(f) => match top(name) {
                Some(i) if ok(f.data_type()) => Column::Leaf(i),
                _ => Column::Other,
            },
        };
        let micros = |t: &DataType| matches!(t, DataType::Timestamp(TimeUnit::Microsecond, _));
        let mut bbox = [usize::MAX; 4];
        for (i, c) in descr.columns().iter().enumerate() {
            let parts = c.path().parts();
            if parts.len() == 2 && parts[0] == col::BBOX {
                if let Some(k) = ["xmin", "ymin", "xmax", "ymax"]
                    .iter()
                    .position(|n| *n == parts[1])
                {
                    bbox[k] = i;
                }
            }
        }
        StatsColumns {
            bbox: (!bbox.contains(&usize::MAX)).then_some(bbox),
            datetime: typed(col::DATETIME, micros),
            end_datetime: typed(col::END_DATETIME, micros),
            cloud_fraction: typed(col::CLOUD_FRACTION, |t| *t == DataType::Float32),
            list: top(LIST),
            chip_id: top(col::CHIP_ID),
        }
    }

    /// The statistics of row group `rg`.
    pub fn of(&self, rg: &RowGroupMetaData) -> GroupStats {
        let rows = rg.num_rows().max(0) as u64;
        let stats = |leaf: usize| rg.column(leaf).statistics();
        let bbox = self.bbox.and_then(|[x0, y0, x1, y1]| {
            let double = |leaf| match stats(leaf) {
                Some(Statistics::Double(s)) => Some(s),
                _ => None,
            };
            let (sx0, sy0, sx1, sy1) = (double(x0)?, double(y0)?, double(x1)?, double(y1)?);
            Some(BboxStats {
                all_null: sx0.null_count_opt() == Some(rows),
                xmin: sx0.min_opt().copied(),
                ymin: sy0.min_opt().copied(),
                xmax: sx1.max_opt().copied(),
                ymax: sy1.max_opt().copied(),
            })
        });
        let micros = |c: Column| {
            column_stats(c, rows, rg, |st| match st {
                Statistics::Int64(s) => {
                    Some(known(s.null_count_opt(), rows, s.min_opt(), s.max_opt()))
                }
                _ => None,
            })
        };
        let cloud_fraction = column_stats(self.cloud_fraction, rows, rg, |st| match st {
            Statistics::Float(s) => Some(known(s.null_count_opt(), rows, s.min_opt(), s.max_opt())),
            _ => None,
        });
        let list = self.list.and_then(|i| match stats(i) {
            Some(Statistics::Int32(s)) => Some((*s.min_opt()?, *s.max_opt()?)),
            _ => None,
        });
        let (chip_id_min, chip_id_max) = match self.chip_id.and_then(stats) {
            Some(Statistics::ByteArray(s)) => (
                s.min_opt().map(|m| m.data().into()),
                s.max_opt().map(|m| m.data().into()),
            ),
            _ => (None, None),
        };
        GroupStats {
            rows,
            bbox,
            datetime: micros(self.datetime),
            end_datetime: micros(self.end_datetime),
            cloud_fraction,
            list,
            chip_id_min,
            chip_id_max,
        }
    }
}

/// The statistics of column `c` in row group `rg` by `of` (`None`: not the
/// expected kind); every row null where the file lacks the column.
fn column_stats<T>(
    c: Column,
    rows: u64,
    rg: &RowGroupMetaData,
    of: impl Fn(&Statistics) -> Option<Stats<T>>,
) -> Stats<T> {
    match c {
        Column::Absent => all_null(rows),
        Column::Other => Stats::Unknown,
        Column::Leaf(i) => rg
            .column(i)
            .statistics()
            .and_then(of)
            .unwrap_or(Stats::Unknown),
    }
}

fn all_null<T>(rows: u64) -> Stats<T> {
    Stats::Known {
        nulls: rows,
        min: None,
        max: None,
    }
}

fn known<T: Copy>(nulls: Option<u64>, rows: u64, min: Option<&T>, max: Option<&T>) -> Stats<T> {
    match nulls {
        // Without a null count, "no row matches" leaves the missing unknown.
        None => Stats::Unknown,
        Some(n) if n > rows => Stats::Unknown,
        // Values without bounds: the statistics prove nothing of them.
        Some(n) if n < rows && (min.is_none() || max.is_none()) => Stats::Unknown,
        Some(n) => Stats::Known {
            nulls: n,
            min: min.copied(),
            max: max.copied(),
        },
    }
}

/// The parsed footers an index holds: those of the parts being read (their
/// streams hold them too), and up to [`FOOTER_BUDGET_GROUPS`] row groups'
/// worth of others, least recently used out first.
#[derive(Debug)]
pub struct Footers {
    budget: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    /// Row groups of the footers in `parts`.
    groups: usize,
    /// Uses so far: the clock of least recently used.
    tick: u64,
    parts: HashMap<usize, Slot>,
}

#[derive(Debug)]
struct Slot {
    /// Shared by concurrent readers of one part: its footer is loaded once.
    footer: Arc<OnceCell<ArrowReaderMetadata>>,
    groups: usize,
    used: u64,
}

impl Footers {
    /// Holds up to `budget` row groups' footers beyond those being read.
    pub fn new(budget: usize) -> Footers {
        Footers {
            budget,
            held: Mutex::new(Held::default()),
        }
    }

    /// Keeps the footer of `part`, read when the index opened, if it fits
    /// the budget: a small dataset's footers are then read once.
    pub fn offer(&self, part: usize, footer: &ArrowReaderMetadata) {
        let groups = footer.metadata().num_row_groups();
        let mut h = self.held.lock().expect("footer cache lock");
        if h.groups + groups > self.budget || h.parts.contains_key(&part) {
            return;
        }
        h.groups += groups;
        h.parts.insert(
            part,
            Slot {
                footer: Arc::new(OnceCell::new_with(Some(footer.clone()))),
                groups,
                used: 0,
            },
        );
    }

    /// The footer of `part` (`groups` row groups), from `load` when it is
    /// not held. Others are let go, least recently used first, to stay in
    /// the budget.
    pub async fn get<F, E>(
        &self,
        part: usize,
        groups: usize,
        load: F,
    ) -> Result<ArrowReaderMetadata, E>
    where
        F: std::future::Future<Output = Result<ArrowReaderMetadata, E>>,
    {
        let cell = {
            let mut h = self.held.lock().expect("footer cache lock");
            h.tick += 1;
            let tick = h.tick;
            if let Some(s) = h.parts.get_mut(&part) {
                s.used = tick;
                s.footer.clone()
            } else {
                let footer = Arc::new(OnceCell::new());
                h.groups += groups;
                h.parts.insert(
                    part,
                    Slot {
                        footer: footer.clone(),
                        groups,
                        used: tick,
                    },
                );
                while h.groups > self.budget {
                    let Some(old) = h
                        .parts
                        .iter()
                        .filter(|(p, _)| **p != part)
                        .min_by_key(|(_, s)| s.used)
                        .map(|(p, _)| *p)
                    else {
                        break;
                    };
                    let s = h.parts.remove(&old).expect("present");
                    h.groups -= s.groups;
                }
                footer
            }
        };
        cell.get_or_try_init(|| load).await.cloned()
    }

    /// Parts whose footers are held now.
    #[cfg(test)]
    fn held(&self) -> Vec<usize> {
        let h = self.held.lock().expect("footer cache lock");
        let mut v: Vec<usize> = h.parts.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, Int32Array, RecordBatch};
    use arrow_schema::Field;
    use bytes::Bytes;
    use parquet::arrow::arrow_reader::ArrowReaderOptions;
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The footer of a file of `groups` one-row groups.
    fn footer(groups: usize) -> ArrowReaderMetadata {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int32, false)]));
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(1))
            .build();
        let mut buf = Vec::new();
        let mut w = ArrowWriter::try_new(&mut buf, schema.clone(), Some(props)).unwrap();
        let v: ArrayRef = Arc::new(Int32Array::from_iter_values(0..groups as i32));
        w.write(&RecordBatch::try_new(schema, vec![v]).unwrap())
            .unwrap();
        w.close().unwrap();
        ArrowReaderMetadata::load(&Bytes::from(buf), ArrowReaderOptions::default()).unwrap()
    }

    #[tokio::test]
    async fn footers_stay_in_the_budget_and_load_once() {
        let f = Footers::new(10);
        let (four, three) = (footer(4), footer(3));
        // Offered at open while they fit: parts 0 and 1 (8 groups), not 2.
        for p in 0..3 {
            f.offer(p, &four);
        }
        assert_eq!(f.held(), [0, 1]);
        let loads = AtomicUsize::new(0);
        let load = || {
            let (loads, m) = (&loads, four.clone());
            async move {
                loads.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
                Ok::<_, crate::Error>(m)
            }
        };
        // Held: not loaded again.
        f.get(1, 4, load()).await.unwrap();
        f.get(0, 4, load()).await.unwrap();
        assert_eq!(loads.load(Ordering::Relaxed), 0);
        // Part 2 lets go of the least recently used, part 1.
        let got = f
            .get(2, 3, async { Ok::<_, crate::Error>(three.clone()) })
            .await
            .unwrap();
        assert_eq!(got.metadata().num_row_groups(), 3);
        assert_eq!(f.held(), [0, 2]);
        // A part over the budget alone is still given, and lets go of the rest.
        let big = footer(12);
        f.get(3, 12, async { Ok::<_, crate::Error>(big.clone()) })
            .await
            .unwrap();
        assert_eq!(f.held(), [3]);
        // Concurrent readers of one part load it once.
        let (a, b) = tokio::join!(f.get(4, 4, load()), f.get(4, 4, load()));
        a.unwrap();
        b.unwrap();
        assert_eq!(loads.load(Ordering::Relaxed), 1);
    }
}
