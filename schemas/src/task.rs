//! Task messages: the unit of work a worker takes, runs and commits as one file.

use serde::{Deserialize, Serialize};

use crate::ids::IdHasher;

/// One input of a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// One file of a scene stored one file per band.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BandFile {
    /// The `--band-files` suffix this file matched.
    pub suffix: String,
    /// Canonical URL of the file.
    pub uri: String,
    /// Size in bytes.
    pub size: u64,
    /// ETag, or size + modification time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
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

/// A task: a deterministic group of inputs of one job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// The job this task belongs to.
    pub job_id: String,
    /// 32 hex chars; names `chips/<task_id>.parquet` and `errors/<task_id>.parquet`.
    pub task_id: String,
    /// Inputs in listing order.
    pub inputs: Vec<TaskInput>,
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
