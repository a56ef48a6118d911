//! Task messages: the unit of work a worker takes, runs and commits as one file.

use serde::{Deserialize, Serialize};

use crate::ids::IdHasher;

/// One input of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskInput {
    /// Canonical URL of the object (`file:///abs/path`, `s3://bucket/key`, ...).
    pub uri: String,
    /// Object size in bytes, from the listing.
    pub size: u64,
    /// ETag, or size + modification time: becomes `source_version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// For a scene split over several tasks: the block of the chip grid this task covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chips: Option<ChipBlock>,
    /// For a scene stored one file per band (`--band-files`): its files, in
    /// channel order; `uri` then names the scene, not a file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<BandFile>,
    /// For a STAC item: what the item says about itself and its assets. `uri`
    /// is then the item's self href, and `parts` its selected assets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<Box<ItemInfo>>,
}

/// What a STAC item contributes to its chips, resolved by the planner so that
/// a worker needs nothing but the task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemInfo {
    /// The item's `id`.
    pub id: String,
    /// The item's `collection`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collection: Option<String>,
    /// Microseconds since the Unix epoch, UTC: `datetime`, or
    /// `start_datetime` for an item that covers a range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datetime: Option<i64>,
    /// Microseconds since the Unix epoch, UTC: `end_datetime`, for a range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_datetime: Option<i64>,
    /// `eo:cloud_cover` (percent of the scene), when the item gives a
    /// number: which acquisitions a window past `--max-scenes` drops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_cover: Option<f64>,
    /// Per channel, in R,G,B order: the physical value of a sample is
    /// `DN * scale + offset` (`raster:scale`, `raster:offset`). Empty when no
    /// selected band gives them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<Option<Units>>,
    /// `--cloud-mask`: the asset whose pixels say where the clouds are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<CloudMask>,
    /// The scene's grid (width, height) as the item's `proj:shape` gives it,
    /// when the planner split the scene by it; a worker that finds another
    /// grid records an error instead of cutting the wrong blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grid: Option<[u32; 2]>,
    /// Where the scene's grid lies in its CRS, as the item's projection
    /// extension says: what places a window's acquisition on the CRS lattice
    /// without a read. A worker that finds the file elsewhere records an
    /// error instead of cutting cells the task does not hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proj: Option<ItemProj>,
    /// Why the item cannot be read (an asset it lacks, a value that is not
    /// what STAC says it is): the worker writes this as the item's error
    /// record instead of reading anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An item's grid in its CRS: `proj:code` (or `proj:epsg`) and
/// `proj:transform` of the asset whose `proj:shape` is the scene's grid.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ItemProj {
    /// The CRS's EPSG code.
    pub epsg: u32,
    /// The affine in GDAL's order: x = t0 + col·t1 + row·t2,
    /// y = t3 + col·t4 + row·t5.
    pub transform: [f64; 6],
}

/// A linear map from stored numbers to physical units: `DN * scale + offset`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Units {
    /// `raster:scale` (1 when only the offset is given).
    pub scale: f64,
    /// `raster:offset` (0 when only the scale is given).
    pub offset: f64,
}

/// How a cloud-mask asset marks clouds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskKind {
    /// Sentinel-2 L2A scene classification: classes 3 (cloud shadow), 8 and 9
    /// (cloud, medium and high probability) and 10 (thin cirrus) are cloud.
    Scl,
    /// Landsat Collection 2 `QA_PIXEL`: bits 1 to 4 (dilated cloud, cirrus,
    /// cloud, cloud shadow) are cloud.
    QaPixel,
}

/// `--cloud-mask`: `ASSET` (a Sentinel-2 SCL), `ASSET:scl` or `ASSET:qa_pixel`
/// (a Landsat Collection 2 QA_PIXEL), as the asset key and its kind.
pub fn parse_cloud_mask(s: &str) -> Result<(String, MaskKind), String> {
    let (asset, kind) = match s.rsplit_once(':') {
        None => (s, MaskKind::Scl),
        Some((a, k)) => match k.to_ascii_lowercase().as_str() {
            "scl" => (a, MaskKind::Scl),
            "qa_pixel" => (a, MaskKind::QaPixel),
            _ => {
                return Err(format!(
                    "--cloud-mask `{s}`: ASSET (a Sentinel-2 SCL), ASSET:scl or ASSET:qa_pixel"
                ))
            }
        },
    };
    if asset.trim().is_empty() {
        return Err(format!("--cloud-mask `{s}`: the asset key is empty"));
    }
    Ok((asset.to_owned(), kind))
}

/// The cloud-mask asset of an item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CloudMask {
    /// How its values mark clouds.
    pub kind: MaskKind,
    /// The file: its grid must line up with the scene's (it may be coarser).
    pub file: BandFile,
}

/// One file of a scene stored one file per band.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BandFile {
    /// The `--band-files` suffix this file matched.
    pub suffix: String,
    /// Canonical URL of the file.
    pub uri: String,
    /// Size in bytes; 0 when the planner does not know it (a STAC asset
    /// without `file:size`), and the worker asks the store.
    pub size: u64,
    /// ETag, or size + modification time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// 1-based bands of this file that the scene takes, in channel order.
    /// Empty: its first band (a one-band file, as `--band-files` names). A
    /// STAC `visual` asset gives `[1, 2, 3]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bands: Vec<u32>,
}

/// A rectangle of the chip grid, in chip units (columns and rows of chips).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChipBlock {
    /// First chip column.
    pub col: u32,
    /// First chip row.
    pub row: u32,
    /// Chip columns in the block.
    pub cols: u32,
    /// Chip rows in the block.
    pub rows: u32,
}

/// The time window of a task of a windowed job (`--windows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskWindow {
    /// Its index among the job's windows, from 0.
    pub index: u32,
    /// Its first microsecond since the Unix epoch, UTC.
    pub start: i64,
    /// The first microsecond after it.
    pub end: i64,
}

/// A block of one CRS lattice's cells (`--align crs`): a window's task
/// covers the cells of one block, from every acquisition of the window that
/// overlaps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellBlock {
    /// The lattice, as a cell names it before its column and row:
    /// `EPSG:<code>/<res>/<stride>`.
    pub lattice: String,
    /// First cell column.
    pub col: i64,
    /// First cell row (rows count south).
    pub row: i64,
    /// Cell columns in the block.
    pub cols: u32,
    /// Cell rows in the block.
    pub rows: u32,
}

impl CellBlock {
    /// Whether `cell` (`EPSG:<code>/<res>/<stride>/<col>/<row>`) is in the block.
    pub fn holds(&self, cell: &str) -> bool {
        let Some(rest) = cell
            .strip_prefix(self.lattice.as_str())
            .and_then(|r| r.strip_prefix('/'))
        else {
            return false;
        };
        let Some((c, r)) = rest.split_once('/') else {
            return false;
        };
        let (Ok(c), Ok(r)) = (c.parse::<i64>(), r.parse::<i64>()) else {
            return false;
        };
        let inside = |v: i64, first: i64, n: u32| v >= first && v - first < i64::from(n);
        inside(c, self.col, self.cols) && inside(r, self.row, self.rows)
    }
}

/// A task: a deterministic group of inputs of one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// The job this task belongs to.
    pub job_id: String,
    /// 32 hex chars; names `chips/<task_id>.parquet` and `errors/<task_id>.parquet`.
    pub task_id: String,
    /// Inputs in listing order; in a window's task, its acquisitions, by
    /// time then URL.
    pub inputs: Vec<TaskInput>,
    /// For a windowed job: the window whose acquisitions `inputs` are, each
    /// cell of them one row. Absent otherwise (and in older messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<TaskWindow>,
    /// For a window's task split by cells: the block whose cells it writes.
    /// Absent when the task covers every cell of its acquisitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cells: Option<CellBlock>,
}

impl Task {
    /// Makes a task whose id depends only on the job and the input URIs.
    ///
    /// Versions are left out on purpose: when an input changes, re-running the
    /// job rewrites the same task file instead of adding a second one beside it.
    pub fn new(job_id: &str, inputs: Vec<TaskInput>) -> Task {
        let mut h = IdHasher::new("rsembed.task.v1");
        h.str(job_id);
        for i in &inputs {
            h.str(&i.uri);
            if let Some(b) = i.chips {
                h.i64(b.col.into())
                    .i64(b.row.into())
                    .i64(b.cols.into())
                    .i64(b.rows.into());
            }
        }
        Task {
            job_id: job_id.to_owned(),
            task_id: h.hex128(),
            inputs,
            window: None,
            cells: None,
        }
    }

    /// The task of `window`'s acquisitions `inputs`, for the cells of
    /// `cells` (all of them when `None`): its id depends on the job, the
    /// window, the block and the input URIs, as [`Task::new`]'s does.
    pub fn in_window(
        job_id: &str,
        window: TaskWindow,
        cells: Option<CellBlock>,
        inputs: Vec<TaskInput>,
    ) -> Task {
        let plain = Task::new(job_id, inputs);
        let mut h = IdHasher::new("rsembed.task.window.v1");
        h.str(&plain.task_id)
            .i64(window.index.into())
            .i64(window.start)
            .i64(window.end);
        // Without a block the id is the one a whole-window task always had.
        if let Some(b) = &cells {
            h.str(&b.lattice)
                .i64(b.col)
                .i64(b.row)
                .i64(b.cols.into())
                .i64(b.rows.into());
        }
        Task {
            task_id: h.hex128(),
            window: Some(window),
            cells,
            ..plain
        }
    }

    /// Object path of the chip file, relative to the output root.
    pub fn chips_path(&self) -> String {
        format!("chips/{}.parquet", self.task_id)
    }

    /// Object path of the error file, relative to the output root.
    pub fn errors_path(&self) -> String {
        format!("errors/{}.parquet", self.task_id)
    }
}

/// Whether `uri` ends a task group of about `target` inputs.
///
/// Boundaries are content-defined (a hash of the URI), not every `target`-th
/// input, so adding or removing one file changes the task around it and leaves
/// every other task id, and so every finished file, as it was. `len` is the size
/// of the group including `uri`; groups are capped at `2 * target`.
pub fn ends_group(uri: &str, len: usize, target: usize) -> bool {
    let target = target.max(1);
    if len >= 2 * target {
        return true;
    }
    let h = IdHasher::new("rsembed.boundary.v1").str(uri).hex128();
    let v = u64::from_str_radix(&h[..16], 16).expect("hex digest is valid hex");
    v.is_multiple_of(target as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(uri: &str) -> TaskInput {
        TaskInput {
            uri: uri.into(),
            size: 1,
            version: Some("v".into()),
            chips: None,
            parts: vec![],
            item: None,
        }
    }

    #[test]
    fn task_id_ignores_versions_but_not_uris() {
        let a = Task::new("job", vec![input("file:///a")]);
        let mut b_in = input("file:///a");
        b_in.version = Some("other".into());
        let b = Task::new("job", vec![b_in]);
        assert_eq!(a.task_id, b.task_id);
        assert_ne!(
            a.task_id,
            Task::new("job", vec![input("file:///b")]).task_id
        );
        assert_ne!(
            a.task_id,
            Task::new("job2", vec![input("file:///a")]).task_id
        );
        assert_eq!(a.chips_path(), format!("chips/{}.parquet", a.task_id));
    }

    #[test]
    fn a_cell_block_holds_its_lattice_s_cells_only() {
        let b = CellBlock {
            lattice: "EPSG:32633/10/256".into(),
            col: -2,
            row: 5,
            cols: 3,
            rows: 2,
        };
        assert!(b.holds("EPSG:32633/10/256/-2/5"));
        assert!(b.holds("EPSG:32633/10/256/0/6"));
        assert!(!b.holds("EPSG:32633/10/256/1/6"), "past the last column");
        assert!(!b.holds("EPSG:32633/10/256/0/7"), "past the last row");
        assert!(!b.holds("EPSG:32633/10/256/-3/5"));
        assert!(!b.holds("EPSG:32633/10/2560/0/5"), "another stride");
        assert!(!b.holds("EPSG:32634/10/256/0/5"), "another CRS");
        assert!(!b.holds("EPSG:32633/10/256/x/5"));
        let w = TaskWindow {
            index: 0,
            start: 0,
            end: 1,
        };
        let whole = Task::in_window("job", w, None, vec![input("file:///a")]);
        let block = Task::in_window("job", w, Some(b.clone()), vec![input("file:///a")]);
        assert_ne!(whole.task_id, block.task_id);
        let other = CellBlock { col: 1, ..b };
        let next = Task::in_window("job", w, Some(other), vec![input("file:///a")]);
        assert_ne!(block.task_id, next.task_id);
    }

    #[test]
    fn a_window_s_task_is_named_by_its_window_too() {
        let w = TaskWindow {
            index: 1,
            start: 10,
            end: 20,
        };
        let plain = Task::new("job", vec![input("file:///a")]);
        let a = Task::in_window("job", w, None, vec![input("file:///a")]);
        assert_ne!(a.task_id, plain.task_id);
        assert_eq!(a, Task::in_window("job", w, None, vec![input("file:///a")]));
        let other = TaskWindow { index: 2, ..w };
        assert_ne!(
            Task::in_window("job", other, None, vec![input("file:///a")]).task_id,
            a.task_id
        );
        // Recorded in the message; absent from a plain task's.
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(
            json["window"],
            serde_json::json!({"index": 1, "start": 10, "end": 20})
        );
        assert_eq!(serde_json::from_value::<Task>(json).unwrap(), a);
        assert!(serde_json::to_value(&plain)
            .unwrap()
            .get("window")
            .is_none());
    }

    fn groups(uris: &[String], target: usize) -> Vec<Vec<String>> {
        let mut out = vec![];
        let mut cur = vec![];
        for u in uris {
            cur.push(u.clone());
            if ends_group(u, cur.len(), target) {
                out.push(std::mem::take(&mut cur));
            }
        }
        if !cur.is_empty() {
            out.push(cur);
        }
        out
    }

    #[test]
    fn inserting_one_input_changes_only_its_group() {
        let uris: Vec<String> = (0..2000).map(|i| format!("s3://b/img{i:05}.png")).collect();
        let before = groups(&uris, 16);
        assert!(before.iter().all(|g| g.len() <= 32));
        let mean = uris.len() as f64 / before.len() as f64;
        assert!((8.0..32.0).contains(&mean), "mean group size {mean}");

        let mut more = uris.clone();
        more.insert(1000, "s3://b/img00999x.png".into());
        let after = groups(&more, 16);
        let changed = after.iter().filter(|g| !before.contains(g)).count();
        assert!(changed <= 2, "{changed} groups changed");
    }
}
