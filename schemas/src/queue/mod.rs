//! What travels through NATS in distributed mode: the task message on the
//! work queue, and the job-state records in the KV bucket.
//!
//! The message carries everything a worker needs to run the task for any job
//! (output, tiling, the model it must be run with), so one fleet of workers
//! serves every job without reading job state first.

use serde::{Deserialize, Serialize};

use crate::job::{ManifestFile, TilingSpec};
use crate::task::Task;

mod record;
pub use record::{DoneRecord, JobTotals, RateBucket, RECORD_FORMAT};

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The newest task message format; a worker terminates a message of a
/// format it does not know. Format 2 is a message whose tiling an older
/// worker would misread ([`TaskMessage::format_for`]): chip schema 3 or
/// `--align crs`. Such a worker, which reads format 1 only, refuses it
/// instead of writing files of another schema or chips off the lattice.
/// Format 3 is a windowed job's (`--windows`): a format-2 worker would embed
/// every acquisition of a window rather than each cell's composite.
pub const MESSAGE_FORMAT: u32 = 3;

/// The task message formats this version reads.
pub const MESSAGE_FORMATS: std::ops::RangeInclusive<u32> = 1..=MESSAGE_FORMAT;

/// A task on the work queue (`rsembed.tasks.<job_id>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskMessage {
    /// [`MESSAGE_FORMAT`].
    pub format: u32,
    /// The job's model fingerprint ([`crate::job::ModelRef::fingerprint`]): a
    /// worker whose own differs must not run the task.
    pub model_fingerprint: String,
    /// The model's name, for the log line of a worker that cannot serve it.
    pub model_name: String,
    /// The job's output URL.
    pub output: String,
    /// The job's tiling.
    pub tiling: TilingSpec,
    /// The task (its `job_id` names the job).
    pub task: Task,
}

impl TaskMessage {
    /// The format of a message of `tiling`: 1 when a worker of format 1
    /// runs it as the job means (a job of chip schema 2 and scene
    /// alignment), else 2.
    pub fn format_for(tiling: &TilingSpec) -> u32 {
        if tiling.windows.is_some() {
            3
        } else if tiling.schema_version <= 2 && tiling.align.is_scene() {
            1
        } else {
            2
        }
    }
}

/// `done.<job>.<task>`: the task's files are written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskDone {
    /// The chip file.
    pub chips_file: ManifestFile,
    /// The error file, when some input failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errors_file: Option<ManifestFile>,
    /// The output URL the files were written to (absent in records of older
    /// workers). `status` and `finalize` count a record only for its output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Inputs of the task that gave neither a chip nor an error row (at most
    /// a thousand). Records of older workers carried them; a record now
    /// carries only [`TaskDone::inputs_without_chips`], and the names are in
    /// the chip file's footer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub empty_inputs: Vec<String>,
    /// How many inputs of the task gave neither a chip nor an error row.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inputs_without_chips: u64,
    /// A window task's cells with no clear pixel in the window: no row.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unclear_cells: u64,
    /// The worker that wrote them.
    pub worker: String,
    /// RFC 3339.
    pub finished_at: String,
    /// Seconds the task took on the worker.
    pub seconds: f64,
}

impl TaskDone {
    /// Inputs of the task that gave neither a chip nor an error row, in
    /// records of any version.
    pub fn without_chips(&self) -> u64 {
        self.inputs_without_chips
            .max(self.empty_inputs.len() as u64)
    }
}

/// `failed.<job>.<task>`: the task was given up (terminated, or delivered
/// `max_deliver` times), with the last error a worker reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskFailed {
    /// The task.
    pub task_id: String,
    /// The last error a worker reported, or why it was given up.
    pub error: String,
    /// How many times it was delivered.
    pub deliveries: u64,
    /// `terminated` (a worker gave up on it) or `max_deliveries` (JetStream did).
    pub reason: String,
    /// RFC 3339.
    pub failed_at: String,
    /// The task message, so `submit --retry-failed` can requeue it without
    /// planning again.
    pub message: String,
}

/// `lasterr.<job>.<task>`: the last error of a task that is being retried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskError {
    /// The error.
    pub error: String,
    /// The delivery it happened on.
    pub delivery: u64,
    /// The worker.
    pub worker: String,
}

/// `run.<job>.<task>`: a worker holds the task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRunning {
    /// The worker.
    pub worker: String,
    /// RFC 3339.
    pub started_at: String,
    /// The delivery.
    pub delivery: u64,
    /// RFC 3339 of the worker's last progress on it (renewed with every
    /// in-progress ack). A mark whose heartbeat is older than the consumer's
    /// ack wait is held by no live worker. Absent in older workers' marks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_at: Option<String>,
}

/// `job.<job>`: what `submit` planned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The job.
    pub job_id: String,
    /// Output URL.
    pub output: String,
    /// Tasks in the plan.
    pub tasks: u64,
    /// Inputs in the plan.
    pub inputs: u64,
    /// Tasks this submit published (new ones; not the duplicates or done ones).
    pub published: u64,
    /// RFC 3339 of the latest submit.
    pub submitted_at: String,
    /// Whether planning finished: `status` counts an ETA only then.
    pub planned: bool,
    /// A windowed job's items that no window holds.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub outside_windows: u64,
    /// A windowed job's acquisitions left out of a task by `--max-scenes`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped_past_max_scenes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_round_trips() {
        let m = TaskMessage {
            format: MESSAGE_FORMAT,
            model_fingerprint: "f".into(),
            model_name: "m".into(),
            output: "s3://b/out".into(),
            tiling: TilingSpec {
                chip_size: 256,
                stride: 256,
                bands: vec![1, 2, 3],
                scale: "auto".into(),
                min_valid: None,
                band_files: None,
                assets: None,
                cloud_mask: None,
                max_cloud: None,
                footprint_tolerance: Some(crate::job::DEFAULT_FOOTPRINT_TOLERANCE),
                embedding_type: Default::default(),
                align: Default::default(),
                windows: None,
                schema_version: crate::SCHEMA_VERSION,
            },
            task: Task::new("job", vec![]),
        };
        let s = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<TaskMessage>(&s).unwrap(), m);
    }

    #[test]
    fn only_messages_an_older_worker_runs_right_keep_format_1() {
        let mut t: TilingSpec = serde_json::from_str(
            r#"{"chip_size":256,"stride":256,"bands":[1,2,3],"scale":"auto","min_valid":null}"#,
        )
        .unwrap();
        assert_eq!(t.schema_version, 2, "an older submit's message");
        assert_eq!(TaskMessage::format_for(&t), 1);
        t.schema_version = 3;
        assert_eq!(TaskMessage::format_for(&t), 2);
        t.schema_version = 2;
        t.align = crate::align::Align::Crs;
        assert_eq!(TaskMessage::format_for(&t), 2);
        t.schema_version = 3;
        t.windows = Some(crate::window::WindowSpec {
            duration: "P3M".into(),
            composite: crate::window::Composite::Best,
            max_scenes: 64,
            cell_blocks: true,
        });
        assert_eq!(
            TaskMessage::format_for(&t),
            3,
            "a format-2 worker would not composite"
        );
        assert!((1..=3).all(|f| MESSAGE_FORMATS.contains(&f)));
    }
}
