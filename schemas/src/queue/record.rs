//! The compact form of a done record, and a job's running totals.
//!
//! A job of 10⁷ tasks keeps 10⁷ done records in the state bucket until it is
//! forgotten, so a record holds only what exactly-once and `finalize` need:
//! the two files' rows, bytes and digests, the chip file's extent, a count of
//! inputs without chips, and when and how long. Paths are not stored (a
//! task's files are `chips/<task>.parquet` and `errors/<task>.parquet`), nor
//! the output (the job id names it) or the worker. It is encoded with
//! postcard (varints, no field names): about 90 bytes for a plain image task
//! against 200 to 400 as JSON (`docs/decisions.md`, "Job state at rest").

use serde::{Deserialize, Serialize};

use super::TaskDone;
use crate::extent::FileExtent;
use crate::job::ManifestFile;

/// The first byte of a stored [`DoneRecord`]: records of another format are
/// refused rather than misread.
pub const RECORD_FORMAT: u8 = 1;

/// The first byte of a record that counts a window task's unclear cells:
/// format 1's bytes, then the count. Only such a record is written in it, so
/// every other job's records stay readable by a coordinator before it.
const RECORD_FORMAT_WINDOW: u8 = 2;

/// Coordinates on the outline grid of 10⁻⁷ degrees.
const PER_DEGREE: f64 = 1e7;

/// `<job>.d.<task>`: a finished task, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DoneRecord {
    /// The chip file.
    pub chips: FileRecord,
    /// The error file, when some input failed.
    pub errors: Option<FileRecord>,
    /// Inputs that gave neither a chip nor an error row.
    pub without_chips: u64,
    /// When the task finished, ms since the epoch.
    pub finished_ms: i64,
    /// Seconds the task took on the worker.
    pub seconds: f32,
    /// A window task's cells with no clear pixel: stored after the rest, in
    /// `RECORD_FORMAT_WINDOW` only.
    #[serde(skip)]
    pub unclear_cells: u64,
}

/// One of a task's files, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Rows.
    pub rows: u64,
    /// Bytes.
    pub bytes: u64,
    /// SHA-256.
    pub sha256: [u8; 32],
    /// What a chip file's rows cover.
    pub extent: Option<Extent>,
}

/// A [`FileExtent`], with its outline in grid steps where it lies on the grid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Extent {
    footprint: Outline,
    start: Option<i64>,
    end: Option<i64>,
    undated: u64,
    sources: Vec<(String, String)>,
    more_sources: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Outline {
    /// Every vertex a multiple of 10⁻⁷°, as the worker records them.
    Grid(Vec<Vec<[i32; 2]>>),
    /// Anything else, kept exactly.
    Float(Vec<Vec<[f64; 2]>>),
}

impl Outline {
    fn of(rings: &[Vec<[f64; 2]>]) -> Outline {
        let step = |v: f64| {
            let i = (v * PER_DEGREE).round();
            (i.abs() <= i32::MAX as f64 && i / PER_DEGREE == v).then_some(i as i32)
        };
        let grid: Option<Vec<Vec<[i32; 2]>>> = rings
            .iter()
            .map(|r| r.iter().map(|&[x, y]| Some([step(x)?, step(y)?])).collect())
            .collect();
        match grid {
            Some(g) => Outline::Grid(g),
            None => Outline::Float(rings.to_vec()),
        }
    }

    fn rings(self) -> Vec<Vec<[f64; 2]>> {
        match self {
            Outline::Float(r) => r,
            Outline::Grid(g) => g
                .into_iter()
                .map(|r| {
                    r.into_iter()
                        .map(|[x, y]| [x as f64 / PER_DEGREE, y as f64 / PER_DEGREE])
                        .collect()
                })
                .collect(),
        }
    }
}

impl Extent {
    fn of(e: &FileExtent) -> Extent {
        Extent {
            footprint: Outline::of(&e.footprint),
            start: e.start,
            end: e.end,
            undated: e.undated,
            sources: e
                .sources
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            more_sources: e.more_sources,
        }
    }

    fn into_file_extent(self) -> FileExtent {
        FileExtent {
            footprint: self.footprint.rings(),
            start: self.start,
            end: self.end,
            undated: self.undated,
            sources: self.sources.into_iter().collect(),
            more_sources: self.more_sources,
        }
    }
}

impl FileRecord {
    fn of(f: &ManifestFile) -> FileRecord {
        let mut sha256 = [0; 32];
        // A digest that is not 64 hex digits (none the worker writes) is
        // stored as zeros rather than failing the task.
        let _ = hex::decode_to_slice(&f.sha256, &mut sha256);
        FileRecord {
            rows: f.rows,
            bytes: f.bytes,
            sha256,
            extent: f.extent.as_ref().map(Extent::of),
        }
    }

    fn into_manifest_file(self, path: String) -> ManifestFile {
        ManifestFile {
            path,
            rows: self.rows,
            sha256: hex::encode(self.sha256),
            bytes: self.bytes,
            extent: self.extent.map(Extent::into_file_extent),
        }
    }
}

impl DoneRecord {
    /// What is stored of `done`.
    pub fn of(done: &TaskDone) -> DoneRecord {
        DoneRecord {
            chips: FileRecord::of(&done.chips_file),
            errors: done.errors_file.as_ref().map(FileRecord::of),
            without_chips: done.without_chips(),
            finished_ms: rfc3339_ms(&done.finished_at).unwrap_or(0),
            seconds: done.seconds as f32,
            unclear_cells: done.unclear_cells,
        }
    }

    /// The stored bytes: [`RECORD_FORMAT`], then the record; or
    /// `RECORD_FORMAT_WINDOW`, the record and its unclear cells.
    pub fn encode(&self) -> Vec<u8> {
        let window = self.unclear_cells > 0;
        let mut out = vec![if window {
            RECORD_FORMAT_WINDOW
        } else {
            RECORD_FORMAT
        }];
        out.extend(postcard::to_stdvec(self).expect("a record serializes"));
        if window {
            out.extend(postcard::to_stdvec(&self.unclear_cells).expect("a count serializes"));
        }
        out
    }

    /// Reads stored bytes. Every length in them is bounded by the bytes
    /// themselves (postcard allocates for what it has read).
    pub fn decode(bytes: &[u8]) -> Result<DoneRecord, String> {
        match bytes.split_first() {
            Some((&RECORD_FORMAT, rest)) => {
                postcard::from_bytes(rest).map_err(|e| format!("done record: {e}"))
            }
            Some((&RECORD_FORMAT_WINDOW, rest)) => {
                let bad = |e: postcard::Error| format!("done record: {e}");
                let (mut d, rest): (DoneRecord, _) =
                    postcard::take_from_bytes(rest).map_err(bad)?;
                d.unclear_cells = postcard::from_bytes(rest).map_err(bad)?;
                Ok(d)
            }
            Some((f, _)) => Err(format!(
                "done record of format {f}, not {RECORD_FORMAT}: written by another version"
            )),
            None => Err("empty done record".into()),
        }
    }

    /// The record as a [`TaskDone`] of task `task_id` (paths rebuilt; the
    /// output and worker, not stored, are left empty).
    pub fn into_task_done(self, task_id: &str) -> TaskDone {
        TaskDone {
            chips_file: self
                .chips
                .into_manifest_file(format!("chips/{task_id}.parquet")),
            errors_file: self
                .errors
                .map(|e| e.into_manifest_file(format!("errors/{task_id}.parquet"))),
            output: None,
            empty_inputs: vec![],
            inputs_without_chips: self.without_chips,
            unclear_cells: self.unclear_cells,
            worker: String::new(),
            finished_at: ms_rfc3339(self.finished_ms),
            seconds: f64::from(self.seconds),
        }
    }
}

fn rfc3339_ms(s: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

fn ms_rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// Width of a rate bucket, ms.
const BUCKET_MS: i64 = 10_000;
/// The rate covers the tasks that finished in the last this many ms of
/// finishing.
const RATE_WINDOW_MS: i64 = 300_000;

/// `<job>.totals`: a job's counts, folded from its done and failed records in
/// stream order up to [`JobTotals::seq`]. `status` reads this and the records
/// after it, so a poll costs what finished since the last fold, not the job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobTotals {
    /// The last stream sequence folded in.
    pub seq: u64,
    /// Tasks done.
    pub done: u64,
    /// Tasks given up on.
    pub failed: u64,
    /// Chip rows.
    pub chips: u64,
    /// Inputs recorded in errors/.
    pub failed_inputs: u64,
    /// Inputs that gave neither a chip nor an error row.
    pub inputs_without_chips: u64,
    /// A windowed job's cells with no clear pixel in their window.
    #[serde(default, skip_serializing_if = "super::is_zero")]
    pub unclear_cells: u64,
    /// Chips finished per 10 s, over the last five minutes of
    /// finishing: the rate, in bounded space.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent: Vec<RateBucket>,
}

/// The tasks that finished in one bucket of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateBucket {
    /// `finished_ms / BUCKET_MS`.
    pub at: i64,
    /// Chips.
    pub chips: u64,
    /// When the first of them started, ms.
    pub first_start_ms: i64,
    /// When the last of them finished, ms.
    pub last_end_ms: i64,
}

impl JobTotals {
    /// Counts a done record in (`sign` -1 takes one out again).
    pub fn add_done(&mut self, d: &DoneRecord, sign: i64) {
        let add = |v: &mut u64, n: u64| {
            *v = if sign < 0 {
                v.saturating_sub(n)
            } else {
                v.saturating_add(n)
            }
        };
        add(&mut self.done, 1);
        add(&mut self.chips, d.chips.rows);
        add(
            &mut self.failed_inputs,
            d.errors.as_ref().map_or(0, |e| e.rows),
        );
        add(&mut self.inputs_without_chips, d.without_chips);
        add(&mut self.unclear_cells, d.unclear_cells);
        if sign > 0 && d.finished_ms > 0 {
            self.note_finish(d);
        }
    }

    /// Counts a failed task in (`sign` -1 takes one out again).
    pub fn add_failed(&mut self, sign: i64) {
        self.failed = if sign < 0 {
            self.failed.saturating_sub(1)
        } else {
            self.failed.saturating_add(1)
        };
    }

    fn note_finish(&mut self, d: &DoneRecord) {
        let at = d.finished_ms.div_euclid(BUCKET_MS);
        let start = d.finished_ms - (f64::from(d.seconds) * 1000.0) as i64;
        match self.recent.iter_mut().find(|b| b.at == at) {
            Some(b) => {
                b.chips += d.chips.rows;
                b.first_start_ms = b.first_start_ms.min(start);
                b.last_end_ms = b.last_end_ms.max(d.finished_ms);
            }
            None => self.recent.push(RateBucket {
                at,
                chips: d.chips.rows,
                first_start_ms: start,
                last_end_ms: d.finished_ms,
            }),
        }
        let last = self.recent.iter().map(|b| b.at).max().unwrap_or(at);
        let keep = RATE_WINDOW_MS / BUCKET_MS;
        self.recent.retain(|b| b.at >= last - keep);
        self.recent.sort_by_key(|b| b.at);
    }

    /// Chips per second of the tasks that finished in the last five minutes
    /// of finishing (the whole job's rate when it is shorter).
    pub fn chips_per_s(&self) -> Option<f64> {
        let last = self.recent.iter().map(|b| b.last_end_ms).max()?;
        let start = self.recent.iter().map(|b| b.first_start_ms).min()?;
        let chips: u64 = self.recent.iter().map(|b| b.chips).sum();
        Some(chips as f64 / ((last - start) as f64 / 1000.0).max(1e-3))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(extent: Option<FileExtent>) -> TaskDone {
        TaskDone {
            chips_file: ManifestFile {
                path: "chips/t1.parquet".into(),
                rows: 64,
                sha256: "ab".repeat(32),
                bytes: 123_456,
                extent,
            },
            errors_file: None,
            output: Some("file:///out".into()),
            empty_inputs: vec!["a.png".into()],
            inputs_without_chips: 0,
            unclear_cells: 0,
            worker: "w1".into(),
            finished_at: "2026-12-06T10:00:00.250Z".into(),
            seconds: 1.5,
        }
    }

    #[test]
    fn a_record_keeps_what_finalize_needs_in_a_few_bytes() {
        let extent = FileExtent {
            footprint: vec![vec![
                [-99.997, 35.1],
                [-99.9970001, 35.1],
                [-99.9970001, 35.2],
                [-99.997, 35.2],
            ]],
            start: Some(1_700_000_000_000_000),
            end: Some(1_700_000_000_000_000),
            ..Default::default()
        };
        let d = done(Some(extent.clone()));
        let stored = DoneRecord::of(&d).encode();
        // A four-vertex outline and a date: 114 bytes, against 389 as JSON.
        assert!(stored.len() <= 120, "{} bytes", stored.len());
        let back = DoneRecord::decode(&stored).unwrap().into_task_done("t1");
        assert_eq!(back.chips_file, d.chips_file);
        assert_eq!(back.chips_file.extent, Some(extent));
        assert_eq!(back.without_chips(), 1);
        assert_eq!(back.finished_at, "2026-12-06T10:00:00.25Z");
        assert_eq!(back.seconds, 1.5);
    }

    #[test]
    fn a_window_task_s_unclear_cells_are_kept_in_format_2_only() {
        let plain = DoneRecord::of(&done(None)).encode();
        assert_eq!(plain[0], RECORD_FORMAT, "other jobs' records are unchanged");
        let mut d = done(None);
        d.unclear_cells = 300;
        let stored = DoneRecord::of(&d).encode();
        assert_eq!(stored[0], RECORD_FORMAT_WINDOW);
        assert_eq!(
            &stored[1..plain.len()],
            &plain[1..],
            "format 1's bytes, then the count"
        );
        let back = DoneRecord::decode(&stored).unwrap();
        assert_eq!(back.unclear_cells, 300);
        let mut totals = JobTotals::default();
        totals.add_done(&back, 1);
        totals.add_done(&DoneRecord::decode(&plain).unwrap(), 1);
        assert_eq!((totals.done, totals.unclear_cells), (2, 300));
        assert_eq!(back.into_task_done("t1").unclear_cells, 300);
        // A count cut short is an error, not a zero.
        assert!(DoneRecord::decode(&stored[..stored.len() - 1]).is_err());
    }

    #[test]
    fn an_outline_off_the_grid_is_kept_exactly() {
        let e = FileExtent {
            footprint: vec![vec![[0.1 + 0.2, 1.0], [2.0, 1.0], [2.0, 3.0]]],
            ..Default::default()
        };
        let stored = DoneRecord::of(&done(Some(e.clone()))).encode();
        let back = DoneRecord::decode(&stored).unwrap().into_task_done("t1");
        assert_eq!(back.chips_file.extent, Some(e));
    }

    #[test]
    fn hostile_bytes_are_an_error() {
        assert!(DoneRecord::decode(&[]).is_err());
        assert!(DoneRecord::decode(&[9, 1, 2])
            .unwrap_err()
            .contains("format 9"));
        // A length prefix claiming far more than there is.
        assert!(DoneRecord::decode(&[RECORD_FORMAT, 1, 1, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
    }

    #[test]
    fn totals_count_in_and_out_and_keep_a_bounded_rate() {
        let mut t = JobTotals::default();
        for i in 0..1000 {
            let mut d = DoneRecord::of(&done(None));
            d.finished_ms = 1_000_000 + i * 1000;
            d.seconds = 1.0;
            t.add_done(&d, 1);
        }
        assert_eq!(
            (t.done, t.chips, t.inputs_without_chips),
            (1000, 64_000, 1000)
        );
        assert!(t.recent.len() <= 31, "{}", t.recent.len());
        // 64 chips a second over the window.
        let r = t.chips_per_s().unwrap();
        assert!((r - 64.0).abs() < 1.0, "{r}");
        let d = DoneRecord::of(&done(None));
        t.add_done(&d, -1);
        assert_eq!((t.done, t.chips), (999, 63_936));
        t.add_failed(1);
        t.add_failed(-1);
        t.add_failed(-1);
        assert_eq!(t.failed, 0);
    }
}
