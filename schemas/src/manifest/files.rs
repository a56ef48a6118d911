//! `manifest/files.parquet`: its schema, and its rows to and from Arrow.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, ArrayRef, Float64Array, ListArray, RecordBatch, StructArray};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};

use super::{check_relative_path, wkb, ListError, Result, MAX_NAME_BYTES};
use crate::chip::{bbox_fields, timestamp_type};
use crate::extent::{FileExtent, MAX_SOURCES};
use crate::job::ManifestFile;

/// What a file of the files list holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// A chip file, `chips/<task_id>.parquet`.
    Chips,
    /// An error file, `errors/<task_id>.parquet`.
    Errors,
}

impl FileKind {
    /// Its name in the `kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::Chips => "chips",
            FileKind::Errors => "errors",
        }
    }

    fn parse(s: &str) -> Option<FileKind> {
        match s {
            "chips" => Some(FileKind::Chips),
            "errors" => Some(FileKind::Errors),
            _ => None,
        }
    }
}

/// A row of the files list.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedFile {
    /// Chip file or error file.
    pub kind: FileKind,
    /// The task that wrote it (for a compacted dataset's part, its name).
    pub task_id: String,
    /// Path, rows, bytes, sha256 and extent.
    pub file: ManifestFile,
}

fn source_fields() -> Fields {
    Fields::from(vec![
        Field::new("source_uri", DataType::Utf8, false),
        Field::new("item_id", DataType::Utf8, false),
    ])
}

fn sources_type() -> DataType {
    DataType::List(Arc::new(Field::new(
        "item",
        DataType::Struct(source_fields()),
        false,
    )))
}

/// The Arrow schema of `manifest/files.parquet`, column by column:
///
/// | column | type | meaning |
/// | --- | --- | --- |
/// | `path` | Utf8, not null | the file, relative to the output root |
/// | `task_id` | Utf8, not null | the task that wrote it (a compacted part: its name) |
/// | `kind` | Utf8, not null | `chips` or `errors` |
/// | `rows` | Int64, not null | rows in the file |
/// | `bytes` | Int64, not null | its size |
/// | `sha256` | Utf8, not null | hex SHA-256 of its bytes |
/// | `datetime_start` | Timestamp(µs, UTC) | earliest chip `datetime` |
/// | `datetime_end` | Timestamp(µs, UTC) | latest chip `end_datetime` (else `datetime`) |
/// | `bbox` | Struct{xmin, ymin, xmax, ymax: Float64} | the footprint's bbox (GeoParquet 1.1 covering) |
/// | `footprint` | Binary | WKB MultiPolygon in lon/lat covering every chip; null when no chip has one |
/// | `undated` | Int64 | chips whose `datetime` is null |
/// | `sources` | List<Struct{source_uri, item_id: Utf8}> | the STAC items the chips came from, the first 100 by URL |
/// | `more_sources` | Boolean | whether there were more than 100 |
///
/// The last seven are the file's [`FileExtent`], as the worker recorded
/// it: all null where it recorded none (error files, files of older
/// versions); `undated`, `sources` and `more_sources` are set wherever
/// it did.
pub fn files_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("path", DataType::Utf8, false),
        Field::new("task_id", DataType::Utf8, false),
        Field::new("kind", DataType::Utf8, false),
        Field::new("rows", DataType::Int64, false),
        Field::new("bytes", DataType::Int64, false),
        Field::new("sha256", DataType::Utf8, false),
        Field::new("datetime_start", timestamp_type(), true),
        Field::new("datetime_end", timestamp_type(), true),
        Field::new("bbox", DataType::Struct(bbox_fields()), true),
        Field::new("footprint", DataType::Binary, true),
        Field::new("undated", DataType::Int64, true),
        Field::new("sources", sources_type(), true),
        Field::new("more_sources", DataType::Boolean, true),
    ]))
}

/// The GeoParquet 1.1 `geo` metadata of a files list: `footprint` is the
/// primary column, `bbox` its covering, `bbox` of the file the union of
/// its rows'.
pub(crate) fn geo_metadata(bbox: Option<[f64; 4]>) -> serde_json::Value {
    let mut col = serde_json::json!({
        "encoding": "WKB",
        "geometry_types": ["MultiPolygon"],
        "covering": {
            "bbox": {
                "xmin": ["bbox", "xmin"],
                "ymin": ["bbox", "ymin"],
                "xmax": ["bbox", "xmax"],
                "ymax": ["bbox", "ymax"],
            }
        }
    });
    if let Some(b) = bbox {
        col["bbox"] = serde_json::json!(b);
    }
    serde_json::json!({
        "version": "1.1.0",
        "primary_column": "footprint",
        "columns": { "footprint": col },
    })
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// `rows` as a batch of [`files_schema`].
pub(crate) fn to_batch(rows: &[ListedFile]) -> Result<RecordBatch> {
    let n = rows.len();
    let mut path = StringBuilder::new();
    let mut task = StringBuilder::new();
    let mut kind = StringBuilder::new();
    let (mut nrows, mut bytes) = (Int64Builder::new(), Int64Builder::new());
    let mut sha = StringBuilder::new();
    let ts = || TimestampMicrosecondBuilder::with_capacity(n).with_timezone("UTC");
    let (mut start, mut end) = (ts(), ts());
    let mut bbox: [Vec<f64>; 4] = Default::default();
    let mut bbox_valid = Vec::with_capacity(n);
    let mut footprint = BinaryBuilder::new();
    let mut undated = Int64Builder::new();
    let (mut offsets, mut uris, mut items) =
        (vec![0i32], StringBuilder::new(), StringBuilder::new());
    let mut sources_valid = Vec::with_capacity(n);
    let mut listed = 0usize;
    let mut more = BooleanBuilder::new();
    for r in rows {
        let f = &r.file;
        path.append_value(&f.path);
        task.append_value(&r.task_id);
        kind.append_value(r.kind.as_str());
        nrows.append_value(int(f.rows));
        bytes.append_value(int(f.bytes));
        sha.append_value(&f.sha256);
        let e = f.extent.as_ref();
        start.append_option(e.and_then(|e| e.start));
        end.append_option(e.and_then(|e| e.end));
        let b = e.and_then(FileExtent::bbox);
        for (i, v) in bbox.iter_mut().enumerate() {
            v.push(b.map_or(0.0, |b| b[i]));
        }
        bbox_valid.push(b.is_some());
        footprint.append_option(e.and_then(|e| wkb::encode(&e.footprint)));
        undated.append_option(e.map(|e| int(e.undated)));
        if let Some(e) = e {
            for (uri, item) in &e.sources {
                uris.append_value(uri);
                items.append_value(item);
            }
            listed += e.sources.len();
        }
        let len = i32::try_from(listed).map_err(|_| {
            ListError::invalid("manifest/files.parquet", "more sources than a batch holds")
        })?;
        offsets.push(len);
        sources_valid.push(e.is_some());
        more.append_option(e.map(|e| e.more_sources));
    }
    let bbox = StructArray::try_new(
        bbox_fields(),
        bbox.into_iter()
            .map(|v| Arc::new(Float64Array::from(v)) as ArrayRef)
            .collect(),
        Some(NullBuffer::from(bbox_valid)),
    )?;
    let sources = StructArray::try_new(
        source_fields(),
        vec![Arc::new(uris.finish()), Arc::new(items.finish())],
        None,
    )?;
    let DataType::List(item) = sources_type() else {
        unreachable!("sources_type is a list")
    };
    let sources = ListArray::try_new(
        item,
        OffsetBuffer::new(offsets.into()),
        Arc::new(sources),
        Some(NullBuffer::from(sources_valid)),
    )?;
    let columns: Vec<ArrayRef> = vec![
        Arc::new(path.finish()),
        Arc::new(task.finish()),
        Arc::new(kind.finish()),
        Arc::new(nrows.finish()),
        Arc::new(bytes.finish()),
        Arc::new(sha.finish()),
        Arc::new(start.finish()),
        Arc::new(end.finish()),
        Arc::new(bbox),
        Arc::new(footprint.finish()),
        Arc::new(undated.finish()),
        Arc::new(sources),
        Arc::new(more.finish()),
    ];
    Ok(RecordBatch::try_new(files_schema(), columns)?)
}

/// The rows of a batch of [`files_schema`], each checked: what a hostile
/// list can make a caller hold is bounded by [`MAX_NAME_BYTES`],
/// [`MAX_VERTICES`](crate::extent::MAX_VERTICES) and [`MAX_SOURCES`] a row.
pub(crate) fn from_batch(what: &str, b: &RecordBatch) -> Result<Vec<ListedFile>> {
    let bad = |i: usize, p: String| ListError::invalid(what, format!("row {i} of a batch: {p}"));
    let c = |i: usize| b.column(i);
    let (path, task, kind) = (
        c(0).as_string::<i32>(),
        c(1).as_string::<i32>(),
        c(2).as_string::<i32>(),
    );
    let (rows, bytes) = (
        c(3).as_primitive::<Int64Type>(),
        c(4).as_primitive::<Int64Type>(),
    );
    let sha = c(5).as_string::<i32>();
    let start = c(6).as_primitive::<TimestampMicrosecondType>();
    let end = c(7).as_primitive::<TimestampMicrosecondType>();
    let footprint = c(9).as_binary::<i32>();
    let undated = c(10).as_primitive::<Int64Type>();
    let sources = c(11).as_list::<i32>();
    let more = c(12).as_boolean();
    let mut out = Vec::with_capacity(b.num_rows());
    for i in 0..b.num_rows() {
        let p = path.value(i);
        check_relative_path(p).map_err(|e| bad(i, e))?;
        let t = task.value(i);
        if t.is_empty() || t.len() > MAX_NAME_BYTES {
            return Err(bad(i, format!("a task id of {} bytes", t.len())));
        }
        let k = FileKind::parse(kind.value(i))
            .ok_or_else(|| bad(i, format!("kind {:?} (chips or errors)", kind.value(i))))?;
        let s = sha.value(i);
        if s.len() != 64 || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad(i, format!("sha256 {s:?} is not 64 hex digits")));
        }
        let count = |a: &arrow_array::Int64Array, name: &str| {
            u64::try_from(a.value(i)).map_err(|_| bad(i, format!("{name} {}", a.value(i))))
        };
        let extent = if undated.is_null(i) {
            None
        } else {
            let fp = if footprint.is_null(i) {
                Vec::new()
            } else {
                wkb::decode(footprint.value(i)).map_err(|e| bad(i, format!("footprint: {e}")))?
            };
            let list = sources.value(i);
            if list.len() > MAX_SOURCES {
                return Err(bad(
                    i,
                    format!("{} sources, more than {MAX_SOURCES}", list.len()),
                ));
            }
            let list = list.as_struct();
            let (u, it) = (
                list.column(0).as_string::<i32>(),
                list.column(1).as_string::<i32>(),
            );
            let mut sources = BTreeMap::new();
            for j in 0..list.len() {
                let (u, it) = (u.value(j), it.value(j));
                if u.len().max(it.len()) > MAX_NAME_BYTES {
                    return Err(bad(
                        i,
                        format!("a source of more than {MAX_NAME_BYTES} bytes"),
                    ));
                }
                sources.insert(u.to_owned(), it.to_owned());
            }
            Some(FileExtent {
                footprint: fp,
                start: start.is_valid(i).then(|| start.value(i)),
                end: end.is_valid(i).then(|| end.value(i)),
                undated: count(undated, "undated")?,
                sources,
                more_sources: more.is_valid(i) && more.value(i),
            })
        };
        out.push(ListedFile {
            kind: k,
            task_id: t.to_owned(),
            file: ManifestFile {
                path: p.to_owned(),
                rows: count(rows, "rows")?,
                sha256: s.to_owned(),
                bytes: count(bytes, "bytes")?,
                extent,
            },
        });
    }
    Ok(out)
}
