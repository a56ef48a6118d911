use std::collections::BTreeMap;
use std::io::Cursor;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use futures::TryStreamExt;
use parquet::arrow::ArrowWriter;
use sha2::{Digest, Sha256};

use super::*;
use crate::extent::FileExtent;

fn extent(i: usize) -> Option<FileExtent> {
    match i % 4 {
        // Error files and files of older versions record none.
        0 => None,
        // Plain images: an extent with nothing in it.
        1 => Some(FileExtent::default()),
        2 => Some(FileExtent {
            footprint: vec![
                vec![[0.5, 0.25], [1.0, 0.0], [1.0, 1.0 + 1e-12]],
                vec![
                    [-179.9, -89.0],
                    [179.9, -89.0],
                    [179.9, 89.0],
                    [-179.9, 89.0],
                ],
            ],
            start: Some(1_700_000_000_000_001),
            end: Some(1_700_000_000_000_002),
            undated: 3,
            sources: BTreeMap::from([
                ("https://s/items/a".into(), "a".into()),
                ("https://s/items/b".into(), "b".into()),
            ]),
            more_sources: true,
        }),
        _ => Some(FileExtent {
            undated: 7,
            ..FileExtent::default()
        }),
    }
}

fn listed(i: usize) -> ListedFile {
    let kind = if i % 5 == 4 {
        FileKind::Errors
    } else {
        FileKind::Chips
    };
    let task_id = format!("{i:032x}");
    ListedFile {
        kind,
        file: ManifestFile {
            path: format!("{}/{task_id}.parquet", kind.as_str()),
            rows: i as u64 * 3,
            sha256: format!("{:064x}", i * 7919),
            bytes: 1000 + i as u64,
            extent: if kind == FileKind::Errors {
                None
            } else {
                extent(i)
            },
        },
        task_id,
    }
}

async fn write<R: ListRow>(rows: Vec<R>) -> Written<Vec<u8>> {
    let mut w = ListWriter::<Vec<u8>, R>::new(Vec::new()).unwrap();
    for r in rows {
        w.push(r).await.unwrap();
    }
    w.finish().await.unwrap()
}

fn format2(files: &ManifestFile, failures: &ManifestFile) -> Manifest {
    let json = serde_json::json!({
        "format": 2, "job_id": "j", "fingerprint": "f", "tasks": 1, "rows": 0,
        "failed_inputs": 0, "lists": {"files": files, "failures": failures},
        "finalized_at": "t", "software_version": "s",
    });
    parse_manifest(json.to_string().as_bytes()).unwrap()
}

fn empty_entry(path: &str) -> ManifestFile {
    ManifestFile {
        path: path.into(),
        rows: 0,
        sha256: String::new(),
        bytes: 0,
        extent: None,
    }
}

#[tokio::test]
async fn files_round_trip_exactly_over_several_row_groups() {
    let n = ROW_GROUP_ROWS + BATCH_ROWS + 3;
    let rows: Vec<ListedFile> = (0..n).map(listed).collect();
    let w = write(rows.clone()).await;
    assert_eq!(w.file.path, FILES_LIST);
    assert_eq!(w.file.rows, n as u64);
    assert_eq!(w.file.bytes, w.sink.len() as u64);
    assert_eq!(w.file.sha256, hex::encode(Sha256::digest(&w.sink)));
    let meta = parquet::file::serialized_reader::SerializedFileReader::new(bytes::Bytes::from(
        w.sink.clone(),
    ))
    .unwrap();
    let meta = parquet::file::reader::FileReader::metadata(&meta);
    assert_eq!(
        meta.num_row_groups(),
        2,
        "row groups of {ROW_GROUP_ROWS} rows"
    );
    let geo = meta
        .file_metadata()
        .key_value_metadata()
        .unwrap()
        .iter()
        .find(|kv| kv.key == "geo")
        .and_then(|kv| kv.value.clone())
        .unwrap();
    let geo: serde_json::Value = serde_json::from_str(&geo).unwrap();
    assert_eq!(geo["primary_column"], "footprint");
    assert_eq!(
        geo["columns"]["footprint"]["bbox"],
        serde_json::json!([-179.9, -89.0, 179.9, 89.0])
    );

    let m = format2(&w.file, &empty_entry(FAILURES_LIST));
    let sink = w.sink;
    let back: Vec<ListedFile> = files(&m, |_| Cursor::new(sink))
        .try_collect()
        .await
        .unwrap();
    assert_eq!(back.len(), rows.len());
    for (a, b) in back.iter().zip(&rows) {
        assert_eq!(a, b);
    }
}

#[tokio::test]
async fn failures_round_trip_with_their_kinds() {
    let input = ManifestFailure {
        source_uri: "s3://b/a.tif".into(),
        stage: "decode".into(),
        error: "é".repeat(MAX_ERROR_BYTES),
    };
    let task = ManifestFailedTask {
        task_id: "t2".into(),
        inputs: vec!["s3://b/c.tif".into(), "s3://b/d.tif".into()],
        error: "worker died".into(),
        deliveries: 5,
    };
    let lost = ManifestFailedTask {
        inputs: vec![],
        ..task.clone()
    };
    let mut rows = vec![FailureRow::input(Some("t1"), &input)];
    rows.extend(FailureRow::failed_task(&task));
    rows.extend(FailureRow::failed_task(&lost));
    rows.push(FailureRow::without_chips(Some("t3"), "s3://b/e.tif"));
    let w = write(rows.clone()).await;
    assert_eq!(w.file.rows, 5);
    let m = format2(&empty_entry(FILES_LIST), &w.file);
    let sink = w.sink;
    let back: Vec<FailureRow> = failures(&m, |_| Cursor::new(sink))
        .try_collect()
        .await
        .unwrap();
    // The error was cut to the bound, at a character boundary.
    let cut = back[0].error.as_ref().unwrap();
    assert_eq!(cut.len(), MAX_ERROR_BYTES);
    assert!(input.error.starts_with(cut.as_str()));
    rows[0].error = Some(cut.clone());
    assert_eq!(back, rows);
    assert_eq!(back[3].source_uri, None);
    assert_eq!(back[1].kind.as_str(), "failed_task");
}

#[tokio::test]
async fn a_format_1_manifest_reads_through_the_same_functions() {
    let f = |p: &str| ManifestFile {
        path: p.into(),
        rows: 2,
        sha256: "0".repeat(64),
        bytes: 9,
        extent: None,
    };
    let json = serde_json::json!({
        "format": 1, "job_id": "j", "fingerprint": "f", "tasks": 2, "rows": 4,
        "failed_inputs": 1,
        "files": [f("chips/a.parquet"), f("chips/b.parquet")],
        "error_files": [f("errors/b.parquet")],
        "failures": [{"source_uri": "x", "stage": "read", "error": "gone"}],
        "failed_tasks": [{"task_id": "c", "inputs": ["y"], "error": "e", "deliveries": 3}],
        "inputs_without_chips": 1, "without_chips": ["z"],
        "finalized_at": "t", "software_version": "s",
    });
    let m = parse_manifest(json.to_string().as_bytes()).unwrap();
    assert_eq!(
        (m.chip_file_count, m.error_file_count, m.failed_task_count),
        (2, 1, 1)
    );
    let never = |_: &ManifestFile| -> Cursor<Vec<u8>> { unreachable!("format 1 opens no list") };
    let got: Vec<ListedFile> = files(&m, never).try_collect().await.unwrap();
    let names: Vec<_> = got
        .iter()
        .map(|l| (l.kind, l.task_id.as_str(), l.file.path.as_str()))
        .collect();
    assert_eq!(
        names,
        vec![
            (FileKind::Chips, "a", "chips/a.parquet"),
            (FileKind::Chips, "b", "chips/b.parquet"),
            (FileKind::Errors, "b", "errors/b.parquet"),
        ]
    );
    let got: Vec<FailureRow> = failures(&m, never).try_collect().await.unwrap();
    let kinds: Vec<_> = got.iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds,
        vec![
            FailureKind::FailedInput,
            FailureKind::FailedTask,
            FailureKind::WithoutChips
        ]
    );
    assert_eq!(got[1].deliveries, Some(3));
}

#[test]
fn manifests_of_other_formats_are_refused() {
    let m = |format: u32, lists: bool| {
        let mut j = serde_json::json!({
            "format": format, "job_id": "j", "fingerprint": "f", "tasks": 0, "rows": 0,
            "failed_inputs": 0, "finalized_at": "t", "software_version": "s",
        });
        if lists {
            j["lists"] = serde_json::json!({
                "files": empty_entry("../files.parquet"),
                "failures": empty_entry(FAILURES_LIST),
            });
        }
        parse_manifest(j.to_string().as_bytes())
            .unwrap_err()
            .to_string()
    };
    assert!(m(3, false).contains("newer rsembed"), "{}", m(3, false));
    assert!(m(2, false).contains("without its `lists`"));
    assert!(m(2, true).contains("`..`"), "{}", m(2, true));
}

#[tokio::test]
async fn the_writer_refuses_rows_that_would_not_read_back() {
    let mut w = FilesWriter::new(Vec::new()).unwrap();
    let mut bad = listed(1);
    bad.file.path = "/etc/passwd".into();
    assert!(w
        .push(bad)
        .await
        .unwrap_err()
        .to_string()
        .contains("not relative"));
    let mut bad = listed(2);
    bad.file.extent.as_mut().unwrap().footprint = vec![vec![[0.0, 0.0]; 65]];
    assert!(w
        .push(bad)
        .await
        .unwrap_err()
        .to_string()
        .contains("65 vertices"));
    assert_eq!(w.rows(), 0);
    // What the values mean is the reader's to judge: a list keeps them.
    let mut odd = listed(2);
    odd.file.extent.as_mut().unwrap().footprint[0][0] = [200.0, 0.0];
    w.push(odd).await.unwrap();
    assert_eq!(w.rows(), 1);
}

/// A file with the list's columns, written by another writer, to play a
/// hostile list: `path` given, every other value plausible.
fn foreign_files_list(path: &str) -> Vec<u8> {
    let good = files::to_batch(&[listed(1)]).unwrap();
    let mut cols: Vec<ArrayRef> = good.columns().to_vec();
    cols[0] = Arc::new(StringArray::from(vec![path]));
    let batch = RecordBatch::try_new(files_schema(), cols).unwrap();
    let mut out = Vec::new();
    let mut w = ArrowWriter::try_new(&mut out, files_schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    out
}

#[tokio::test]
async fn hostile_lists_are_refused() {
    let read = |bytes: Vec<u8>, rows: u64| async move {
        let mut entry = empty_entry(FILES_LIST);
        entry.rows = rows;
        let m = format2(&entry, &empty_entry(FAILURES_LIST));
        files(&m, |_| Cursor::new(bytes))
            .try_collect::<Vec<_>>()
            .await
            .unwrap_err()
            .to_string()
    };
    let e = read(foreign_files_list("chips/../../x.parquet"), 1).await;
    assert!(e.contains("`..` segment"), "{e}");
    let e = read(foreign_files_list("chips/a.parquet"), 2).await;
    assert!(e.contains("1 rows, but manifest.json says 2"), "{e}");
    // Another table altogether.
    let mut out = Vec::new();
    let batch =
        RecordBatch::try_from_iter([("path", Arc::new(Int64Array::from(vec![1])) as ArrayRef)])
            .unwrap();
    let mut w = ArrowWriter::try_new(&mut out, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let e = read(out, 1).await;
    assert!(e.contains("not those rsembed writes"), "{e}");
    let e = read(b"PAR1 not parquet at all PAR1".to_vec(), 1).await;
    assert!(!e.is_empty());
}

#[test]
fn task_ids_come_from_file_names() {
    assert_eq!(task_id_of("chips/abc.parquet"), "abc");
    assert_eq!(task_id_of("errors/abc.parquet"), "abc");
    assert_eq!(task_id_of("chips/part-00001.parquet"), "part-00001");
    assert!(check_relative_path("chips/a.parquet").is_ok());
    for bad in ["", "/a", "a//b", "./a", "a/..", "s3://x/a", "a\\b"] {
        assert!(check_relative_path(bad).is_err(), "{bad}");
    }
}
