//! `manifest/failures.parquet`: its schema, and its rows to and from Arrow.

use std::sync::Arc;

use arrow_array::builder::{Int64Builder, StringBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::{ListError, Result, MAX_ERROR_BYTES, MAX_NAME_BYTES};
use crate::job::{ManifestFailedTask, ManifestFailure};

/// What a row of the failures list records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// An input that failed, as its task's error file records it:
    /// `source_uri`, `stage`, `error`, `task_id`.
    FailedInput,
    /// An input of a task given up on: `task_id`, `source_uri`, the task's
    /// last `error` and its `deliveries`.
    FailedTask,
    /// An input that gave neither a chip nor an error row: `task_id`,
    /// `source_uri`.
    WithoutChips,
}

impl FailureKind {
    /// Its name in the `kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::FailedInput => "failed_input",
            FailureKind::FailedTask => "failed_task",
            FailureKind::WithoutChips => "without_chips",
        }
    }

    fn parse(s: &str) -> Option<FailureKind> {
        [
            FailureKind::FailedInput,
            FailureKind::FailedTask,
            FailureKind::WithoutChips,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// A row of the failures list: the columns of [`failures_schema`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureRow {
    /// What the row records.
    pub kind: FailureKind,
    /// The task; null only in lists converted from a format 1 manifest,
    /// which did not record the task of a failed input or an input without
    /// chips.
    pub task_id: Option<String>,
    /// The input; null for a failed task whose inputs were not recorded.
    pub source_uri: Option<String>,
    /// `failed_input`: the stage that failed (`read`, `decode`, ...).
    pub stage: Option<String>,
    /// `failed_input`: why; `failed_task`: the task's last error.
    pub error: Option<String>,
    /// `failed_task`: deliveries before it was given up.
    pub deliveries: Option<u64>,
}

impl FailureRow {
    /// A failed input of task `task_id`.
    pub fn input(task_id: Option<&str>, f: &ManifestFailure) -> FailureRow {
        FailureRow {
            kind: FailureKind::FailedInput,
            task_id: task_id.map(str::to_owned),
            source_uri: Some(f.source_uri.clone()),
            stage: Some(f.stage.clone()),
            error: Some(f.error.clone()),
            deliveries: None,
        }
    }

    /// The rows of a failed task: one per input, or one without an input
    /// when none was recorded.
    pub fn failed_task(t: &ManifestFailedTask) -> Vec<FailureRow> {
        let row = |uri: Option<&String>| FailureRow {
            kind: FailureKind::FailedTask,
            task_id: Some(t.task_id.clone()),
            source_uri: uri.cloned(),
            stage: None,
            error: Some(t.error.clone()),
            deliveries: Some(t.deliveries),
        };
        if t.inputs.is_empty() {
            return vec![row(None)];
        }
        t.inputs.iter().map(|u| row(Some(u))).collect()
    }

    /// An input of task `task_id` that gave neither a chip nor an error row.
    pub fn without_chips(task_id: Option<&str>, source_uri: &str) -> FailureRow {
        FailureRow {
            kind: FailureKind::WithoutChips,
            task_id: task_id.map(str::to_owned),
            source_uri: Some(source_uri.to_owned()),
            stage: None,
            error: None,
            deliveries: None,
        }
    }
}

/// The Arrow schema of `manifest/failures.parquet`, column by column:
///
/// | column | type | meaning |
/// | --- | --- | --- |
/// | `kind` | Utf8, not null | `failed_input`, `failed_task` or `without_chips` ([`FailureKind`]) |
/// | `task_id` | Utf8 | the task (null only where a format 1 manifest did not record it) |
/// | `source_uri` | Utf8 | the input |
/// | `stage` | Utf8 | `failed_input`: the stage that failed |
/// | `error` | Utf8 | `failed_input`: why; `failed_task`: the task's last error |
/// | `deliveries` | Int64 | `failed_task`: deliveries before it was given up |
///
/// One row per input: a failed task of three inputs is three rows, each
/// with the task's error.
pub fn failures_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("kind", DataType::Utf8, false),
        Field::new("task_id", DataType::Utf8, true),
        Field::new("source_uri", DataType::Utf8, true),
        Field::new("stage", DataType::Utf8, true),
        Field::new("error", DataType::Utf8, true),
        Field::new("deliveries", DataType::Int64, true),
    ]))
}

/// `rows` as a batch of [`failures_schema`].
pub(crate) fn to_batch(rows: &[FailureRow]) -> Result<RecordBatch> {
    let mut kind = StringBuilder::new();
    let (mut task, mut uri) = (StringBuilder::new(), StringBuilder::new());
    let (mut stage, mut error) = (StringBuilder::new(), StringBuilder::new());
    let mut deliveries = Int64Builder::new();
    for r in rows {
        kind.append_value(r.kind.as_str());
        task.append_option(r.task_id.as_deref());
        uri.append_option(r.source_uri.as_deref());
        stage.append_option(r.stage.as_deref());
        error.append_option(r.error.as_deref().map(cut));
        deliveries.append_option(r.deliveries.map(|d| i64::try_from(d).unwrap_or(i64::MAX)));
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(kind.finish()),
        Arc::new(task.finish()),
        Arc::new(uri.finish()),
        Arc::new(stage.finish()),
        Arc::new(error.finish()),
        Arc::new(deliveries.finish()),
    ];
    Ok(RecordBatch::try_new(failures_schema(), columns)?)
}

/// `s` cut to [`MAX_ERROR_BYTES`] at a character boundary.
fn cut(s: &str) -> &str {
    if s.len() <= MAX_ERROR_BYTES {
        return s;
    }
    let mut end = MAX_ERROR_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The rows of a batch of [`failures_schema`], each value bounded by
/// [`MAX_NAME_BYTES`] (ids, URIs, stages) or [`MAX_ERROR_BYTES`] (errors).
pub(crate) fn from_batch(what: &str, b: &RecordBatch) -> Result<Vec<FailureRow>> {
    let bad = |i: usize, p: String| ListError::invalid(what, format!("row {i} of a batch: {p}"));
    let kind = b.column(0).as_string::<i32>();
    let text = |c: usize, i: usize, max: usize| {
        let a = b.column(c).as_string::<i32>();
        if a.is_null(i) {
            return Ok(None);
        }
        let v = a.value(i);
        if v.len() > max {
            let name = b.schema_ref().field(c).name().clone();
            return Err(bad(
                i,
                format!("{name} of {} bytes, more than {max}", v.len()),
            ));
        }
        Ok(Some(v.to_owned()))
    };
    let deliveries = b.column(5).as_primitive::<Int64Type>();
    let mut out = Vec::with_capacity(b.num_rows());
    for i in 0..b.num_rows() {
        let k = FailureKind::parse(kind.value(i)).ok_or_else(|| {
            bad(
                i,
                format!(
                    "kind {:?} (failed_input, failed_task or without_chips)",
                    kind.value(i)
                ),
            )
        })?;
        let d = deliveries
            .is_valid(i)
            .then(|| u64::try_from(deliveries.value(i)))
            .transpose()
            .map_err(|_| bad(i, format!("deliveries {}", deliveries.value(i))))?;
        out.push(FailureRow {
            kind: k,
            task_id: text(1, i, MAX_NAME_BYTES)?,
            source_uri: text(2, i, MAX_NAME_BYTES)?,
            stage: text(3, i, MAX_NAME_BYTES)?,
            error: text(4, i, MAX_ERROR_BYTES)?,
            deliveries: d,
        });
    }
    Ok(out)
}
