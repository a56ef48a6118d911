//! Pass 1: every row's sort key (Hilbert index of its centre, then its chip
//! id), the chip-id digest that proves every row is written once, and the
//! sample the output files are split by.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Float64Type;
use arrow_array::{Array, RecordBatch};
use futures::StreamExt;
use rsembed_schemas::chip::col;

use super::{Progress, HILBERT_ORDER, NO_CENTRE, SAMPLE_ROWS};
use crate::format::index::{GroupRef, Index};
use crate::scan::{default_concurrency, scan_groups};
use crate::{Error as QueryError, Result};

/// A row's sort key: Hilbert index of its centre, then its chip id.
pub type Key = (u64, u128);

// ---- Hilbert keys ------------------------------------------------------------

/// The index of cell (`x`, `y`) along the Hilbert curve of `order` (1..=32)
/// over a 2^order × 2^order grid; the curve starts at (0, 0) and ends at
/// (2^order − 1, 0), and consecutive indexes are adjacent cells.
pub(crate) fn hilbert_index(order: u32, x: u32, y: u32) -> u64 {
    assert!((1..=32).contains(&order), "Hilbert order {order}");
    let max = u32::MAX >> (32 - order);
    let (mut x, mut y) = (x & max, y & max);
    let mut d = 0u64;
    let mut s = 1u32 << (order - 1);
    while s > 0 {
        let rx = u32::from(x & s != 0);
        let ry = u32::from(y & s != 0);
        d += u64::from(s) * u64::from(s) * u64::from((3 * rx) ^ ry);
        if ry == 0 {
            if rx == 1 {
                x = max - x;
                y = max - y;
            }
            std::mem::swap(&mut x, &mut y);
        }
        s >>= 1;
    }
    d
}

/// The Hilbert key of a chip centre: order 32 over the whole globe, lon
/// [-180, 180] × lat [-90, 90] (values outside are clamped); `NO_CENTRE`
/// for a missing or non-finite centre.
pub fn hilbert_key(lon: Option<f64>, lat: Option<f64>) -> u64 {
    match (lon, lat) {
        (Some(lon), Some(lat)) if lon.is_finite() && lat.is_finite() => {
            let cell = |v: f64, min: f64, span: f64| {
                let t = ((v - min) / span).clamp(0.0, 1.0);
                (t * 4_294_967_296.0).min(4_294_967_295.0) as u32
            };
            hilbert_index(
                HILBERT_ORDER,
                cell(lon, -180.0, 360.0),
                cell(lat, -90.0, 180.0),
            )
            .min(NO_CENTRE - 1)
        }
        _ => NO_CENTRE,
    }
}

/// `chip_id` as its 128 bits; `None` unless it is 32 hex digits.
pub fn parse_chip_id(s: &str) -> Option<u128> {
    (s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u128::from_str_radix(s, 16).ok())
        .flatten()
}

/// The first half of the sort key of a row of list `list` (`compact
/// --lists`): the list in the top 16 bits, then the top 48 bits of the
/// Hilbert index (order 24 per axis: cells of 2.4 m at the equator, finer
/// than any chip, and chip ids break ties). Rows without a centre stay last
/// within their list.
pub(crate) fn list_key(list: u32, hilbert: u64) -> u64 {
    debug_assert!(list < crate::ivf::MAX_LISTS);
    (u64::from(list) << 48) | (hilbert >> 16)
}

/// The list of a key made by [`list_key`].
pub(crate) fn key_list(key: u64) -> u32 {
    (key >> 48) as u32
}

/// The sort keys of a batch's rows (it needs `chip_id` and the centres; a
/// batch with a `list` column gets [`list_key`]s).
pub(super) fn batch_keys(batch: &RecordBatch, uri: &str) -> Result<Vec<Key>> {
    let lists = match batch.column_by_name(crate::ivf::LIST) {
        None => None,
        Some(c) => Some(
            c.as_primitive_opt::<arrow_array::types::Int32Type>()
                .ok_or_else(|| QueryError::column(uri, crate::ivf::LIST, "Int32"))?,
        ),
    };
    let ids = batch
        .column_by_name(col::CHIP_ID)
        .and_then(|c| c.as_string_opt::<i32>())
        .ok_or_else(|| QueryError::column(uri, col::CHIP_ID, "Utf8"))?;
    let f64s = |name: &str| {
        batch
            .column_by_name(name)
            .and_then(|c| c.as_primitive_opt::<Float64Type>())
            .ok_or_else(|| QueryError::column(uri, name, "Float64"))
    };
    let (lon, lat) = (f64s(col::CENTRE_LON)?, f64s(col::CENTRE_LAT)?);
    (0..batch.num_rows())
        .map(|i| {
            let id = ids
                .is_valid(i)
                .then(|| parse_chip_id(ids.value(i)))
                .flatten()
                .ok_or_else(|| {
                    QueryError::dataset(
                        uri,
                        format!(
                            "chip_id {:?} is not 32 hex digits",
                            ids.is_valid(i).then(|| ids.value(i))
                        ),
                    )
                })?;
            let key = hilbert_key(
                lon.is_valid(i).then(|| lon.value(i)),
                lat.is_valid(i).then(|| lat.value(i)),
            );
            let key = lists.map_or(key, |l| list_key(l.value(i) as u32, key));
            Ok((key, id))
        })
        .collect()
}

// ---- Pass 1: keys ------------------------------------------------------------

/// An order-independent digest of a set of chip ids.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct IdDigest {
    /// How many.
    pub(crate) rows: u64,
    /// Their wrapping sum.
    pub(crate) sum: u128,
    /// Their xor.
    pub(crate) xor: u128,
}

impl IdDigest {
    /// Adds one id.
    pub(crate) fn add(&mut self, id: u128) {
        self.rows += 1;
        self.sum = self.sum.wrapping_add(id);
        self.xor ^= id;
    }

    /// Adds another digest's ids.
    pub(crate) fn merge(&mut self, o: &IdDigest) {
        self.rows += o.rows;
        self.sum = self.sum.wrapping_add(o.sum);
        self.xor ^= o.xor;
    }
}

impl std::fmt::Display for IdDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sum {:032x} xor {:032x}", self.sum, self.xor)
    }
}

/// A bottom-k sample of keys by a hash of the chip id: uniform, the same on
/// every run, and every key while there are at most `cap`.
#[derive(Debug)]
struct Sample {
    cap: usize,
    threshold: Option<u64>,
    items: Vec<(u64, Key)>,
}

impl Sample {
    fn new(cap: usize) -> Sample {
        Sample {
            cap: cap.max(1),
            threshold: None,
            items: Vec::new(),
        }
    }

    fn push(&mut self, key: Key) {
        let p = mix(key.1);
        if self.threshold.is_some_and(|t| p >= t) {
            return;
        }
        self.items.push((p, key));
        if self.items.len() >= 2 * self.cap {
            self.items.select_nth_unstable_by_key(self.cap, |e| e.0);
            self.threshold = Some(self.items[self.cap].0);
            self.items.truncate(self.cap);
        }
    }

    /// The sampled keys, sorted, and whether they are all the keys pushed.
    fn finish(self) -> (Vec<Key>, bool) {
        let mut v: Vec<Key> = self.items.into_iter().map(|e| e.1).collect();
        v.sort_unstable();
        (v, self.threshold.is_none())
    }
}

/// SplitMix64's finalizer over the id's halves.
fn mix(id: u128) -> u64 {
    let mut z = (id as u64) ^ ((id >> 64) as u64);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A chip id twice in sorted keys (adjacent, or anywhere by id).
pub(super) fn find_duplicate(sorted: &[Key]) -> Option<u128> {
    if let Some(w) = sorted.windows(2).find(|w| w[0].1 == w[1].1) {
        return Some(w[0].1);
    }
    let mut ids: Vec<u128> = sorted.iter().map(|k| k.1).collect();
    ids.sort_unstable();
    ids.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// `files − 1` split keys from a sorted sample (fewer when the sample has
/// fewer distinct keys): file `i` gets the keys in `[split[i−1], split[i])`.
pub(super) fn split_keys(sample: &[Key], files: usize) -> Vec<Key> {
    let m = sample.len();
    let mut v: Vec<Key> = (1..files.max(1))
        .map(|i| i * m / files)
        .filter(|&j| j > 0 && j < m)
        .map(|j| sample[j])
        .collect();
    v.dedup();
    v
}

/// The bucket of a key.
pub(super) fn bucket_of(splits: &[Key], k: Key) -> usize {
    splits.partition_point(|s| *s <= k)
}

pub(super) struct Keys {
    pub(super) digest: IdDigest,
    pub(super) sample: Vec<Key>,
    pub(super) sample_is_complete: bool,
    pub(super) duplicate: Option<u128>,
}

pub(super) async fn read_keys(index: &Arc<Index>, progress: &Progress) -> Result<Keys> {
    let (groups, _) = index.row_groups(None);
    let uris: Arc<Vec<String>> = Arc::new(index.parts.iter().map(|p| p.uri.clone()).collect());
    let stream = scan_groups(
        index.clone(),
        groups,
        vec![col::CHIP_ID, col::CENTRE_LON, col::CENTRE_LAT],
        Vec::new(),
        default_concurrency(),
        Vec::new,
        move |acc: &mut Vec<Key>, g: GroupRef, _: usize, batch: &RecordBatch| {
            acc.extend(batch_keys(batch, &uris[g.part])?);
            Ok::<(), crate::Error>(())
        },
    );
    futures::pin_mut!(stream);
    let mut digest = IdDigest::default();
    let mut sample = Sample::new(SAMPLE_ROWS);
    while let Some(r) = stream.next().await {
        let (_, keys) = r?;
        progress.inc(keys.len() as u64);
        for k in keys {
            digest.add(k.1);
            sample.push(k);
        }
    }
    let (sample, sample_is_complete) = sample.finish();
    let duplicate = find_duplicate(&sample);
    Ok(Keys {
        digest,
        sample,
        sample_is_complete,
        duplicate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hilbert_order_1_visits_the_four_cells_in_a_u() {
        assert_eq!(hilbert_index(1, 0, 0), 0);
        assert_eq!(hilbert_index(1, 0, 1), 1);
        assert_eq!(hilbert_index(1, 1, 1), 2);
        assert_eq!(hilbert_index(1, 1, 0), 3);
    }

    #[test]
    fn hilbert_order_2_matches_the_textbook_table() {
        // want[y][x]: the 4×4 curve of the textbook figure, (0,0) (1,0) (1,1)
        // (0,1) (0,2) (0,3) (1,3) (1,2) (2,2) ... (2,0) (3,0).
        let want = [[0, 1, 14, 15], [3, 2, 13, 12], [4, 7, 8, 11], [5, 6, 9, 10]];
        for (y, row) in want.iter().enumerate() {
            for (x, d) in row.iter().enumerate() {
                assert_eq!(hilbert_index(2, x as u32, y as u32), *d, "({x}, {y})");
            }
        }
    }

    #[test]
    fn hilbert_curves_are_bijections_of_adjacent_steps() {
        for order in 1..=6u32 {
            let n = 1u32 << order;
            let mut cell = vec![None; (n * n) as usize];
            for x in 0..n {
                for y in 0..n {
                    let d = hilbert_index(order, x, y) as usize;
                    assert!(cell[d].is_none(), "order {order}: {d} twice");
                    cell[d] = Some((x as i64, y as i64));
                }
            }
            let cells: Vec<(i64, i64)> = cell.into_iter().map(Option::unwrap).collect();
            for w in cells.windows(2) {
                let step = (w[0].0 - w[1].0).abs() + (w[0].1 - w[1].1).abs();
                assert_eq!(step, 1, "order {order}: {:?} -> {:?}", w[0], w[1]);
            }
            assert_eq!(cells[0], (0, 0));
            assert_eq!(cells[cells.len() - 1], (i64::from(n) - 1, 0));
        }
    }

    #[test]
    fn a_coarser_curve_is_a_prefix_of_the_order_32_key() {
        let mut seed = 11u64;
        for _ in 0..1000 {
            seed = mix(u128::from(seed));
            let (x, y) = (seed as u32, (seed >> 32) as u32);
            let d = hilbert_index(32, x, y);
            for k in [1u32, 5, 16, 31] {
                let coarse = hilbert_index(k, x >> (32 - k), y >> (32 - k));
                assert_eq!(d >> (2 * (32 - k)), coarse, "order {k} of ({x}, {y})");
            }
        }
    }

    #[test]
    fn keys_cover_the_globe_and_put_missing_centres_last() {
        assert_eq!(hilbert_key(None, Some(1.0)), NO_CENTRE);
        assert_eq!(hilbert_key(Some(f64::NAN), Some(1.0)), NO_CENTRE);
        assert_eq!(hilbert_key(Some(-180.0), Some(-90.0)), 0);
        assert_eq!(hilbert_key(Some(180.0), Some(-90.0)), NO_CENTRE - 1);
        assert_eq!(hilbert_key(Some(500.0), Some(-100.0)), NO_CENTRE - 1);
        // Nearby points share a long prefix; far ones do not.
        let a = hilbert_key(Some(2.35), Some(48.85));
        let b = hilbert_key(Some(2.3501), Some(48.8501));
        let c = hilbert_key(Some(-74.0), Some(40.7));
        assert!((a ^ b).leading_zeros() > 20);
        assert!((a ^ c).leading_zeros() < 4);
    }

    #[test]
    fn chip_ids_parse_only_as_32_hex_digits() {
        assert_eq!(parse_chip_id(&"0".repeat(31)), None);
        assert_eq!(parse_chip_id("000000000000000000000000000000ff"), Some(255));
        assert_eq!(parse_chip_id("+00000000000000000000000000000ff"), None);
        assert_eq!(parse_chip_id("g00000000000000000000000000000ff"), None);
    }

    #[test]
    fn digests_do_not_depend_on_order_but_on_every_id() {
        let (mut a, mut b, mut c) = (
            IdDigest::default(),
            IdDigest::default(),
            IdDigest::default(),
        );
        for i in 0..100u128 {
            a.add(i * 7919);
            b.add((99 - i) * 7919);
            c.add(if i == 50 { 1 } else { i * 7919 });
        }
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut m = IdDigest::default();
        let (mut h1, mut h2) = (IdDigest::default(), IdDigest::default());
        (0..50u128).for_each(|i| h1.add(i * 7919));
        (50..100u128).for_each(|i| h2.add(i * 7919));
        m.merge(&h1);
        m.merge(&h2);
        assert_eq!(m, a);
    }

    fn keys(n: u64) -> Vec<Key> {
        (0..n)
            .map(|i| {
                (
                    mix(u128::from(i)) >> 8,
                    u128::from(mix(u128::from(i) + 1_000_000)),
                )
            })
            .collect()
    }

    #[test]
    fn a_small_dataset_is_split_exactly() {
        let mut s = Sample::new(1000);
        let all = keys(999);
        all.iter().for_each(|k| s.push(*k));
        let (sample, complete) = s.finish();
        assert!(complete);
        assert_eq!(sample.len(), 999);
        let splits = split_keys(&sample, 7);
        assert_eq!(splits.len(), 6);
        let mut sizes = [0usize; 7];
        all.iter().for_each(|k| sizes[bucket_of(&splits, *k)] += 1);
        assert!(sizes.iter().all(|&n| n == 142 || n == 143), "{sizes:?}");
    }

    #[test]
    fn a_large_dataset_is_split_about_evenly_from_its_sample() {
        let mut s = Sample::new(2000);
        let all = keys(100_000);
        all.iter().for_each(|k| s.push(*k));
        let (sample, complete) = s.finish();
        assert!(!complete);
        assert!((2000..4000).contains(&sample.len()), "{}", sample.len());
        let splits = split_keys(&sample, 10);
        let mut sizes = [0usize; 10];
        all.iter().for_each(|k| sizes[bucket_of(&splits, *k)] += 1);
        assert!(
            sizes.iter().all(|&n| (7_000..13_000).contains(&n)),
            "{sizes:?}"
        );
    }

    #[test]
    fn splits_of_few_keys_leave_no_empty_range() {
        assert!(split_keys(&[], 5).is_empty());
        let one = [(1, 1)];
        assert!(split_keys(&one, 5).is_empty());
        let k = [(1, 1), (1, 2), (5, 0)];
        assert_eq!(split_keys(&k, 10), vec![(1, 2), (5, 0)]);
        assert_eq!(bucket_of(&[(1, 2), (5, 0)], (1, 1)), 0);
        assert_eq!(bucket_of(&[(1, 2), (5, 0)], (1, 2)), 1);
        assert_eq!(bucket_of(&[(1, 2), (5, 0)], (NO_CENTRE, 0)), 2);
    }

    #[test]
    fn list_keys_sort_by_list_then_hilbert_with_missing_centres_last() {
        let paris = hilbert_key(Some(2.35), Some(48.85));
        let nyc = hilbert_key(Some(-74.0), Some(40.7));
        let mut keys = [
            list_key(1, NO_CENTRE),
            list_key(1, paris),
            list_key(0, NO_CENTRE),
            list_key(1, nyc),
            list_key(0, paris),
            list_key(65_535, 0),
        ];
        keys.sort_unstable();
        let lists: Vec<u32> = keys.iter().map(|k| key_list(*k)).collect();
        assert_eq!(lists, vec![0, 0, 1, 1, 1, 65_535]);
        assert_eq!(keys[1], list_key(0, NO_CENTRE));
        assert_eq!(keys[4], list_key(1, NO_CENTRE));
        assert_eq!(
            keys[2],
            list_key(1, nyc.min(paris)),
            "Hilbert order within a list"
        );
        assert_eq!(keys[3], list_key(1, nyc.max(paris)));
    }

    #[test]
    fn duplicates_are_found_adjacent_or_apart() {
        assert_eq!(find_duplicate(&[(1, 5), (2, 6), (3, 7)]), None);
        assert_eq!(find_duplicate(&[(1, 5), (1, 5), (3, 7)]), Some(5));
        assert_eq!(find_duplicate(&[(1, 5), (2, 6), (3, 5)]), Some(5));
    }
}
