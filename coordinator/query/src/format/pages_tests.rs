//! The `embedding` column read in place (`crate::format::pages`)
//! against the arrow reader, through an index's scan.

use std::sync::Arc;

use bytes::Bytes;

use crate::format::index::{GroupRef, Index};
use crate::format::pages::{Chunk, Decode, Stored};
use crate::scan::filter::Filters;
use crate::scan::scan_embeddings;
use arrow_array::RecordBatch;
use arrow_array::{ArrayRef, FixedSizeListArray, Float16Array, Float32Array, Int8Array};
use arrow_schema::{DataType, Field, Schema};
use futures::StreamExt;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{WriterProperties, WriterVersion};
use rsembed_schemas::chip::col;
use rsembed_schemas::embedding::EmbeddingType;
use rsembed_schemas::embedding::SCALE_COLUMN;
use rsembed_store::StoreCache;

const DIM: usize = 24;
const ROWS: usize = 1100;

/// The value of row `r`, dimension `i`: distinct enough that a row out
/// of place shows.
fn value(r: usize, i: usize) -> i8 {
    ((r * 31 + i * 7) % 255) as i8
}

/// How a test file is written.
#[derive(Clone, Copy, Debug)]
enum Writer {
    /// As the chip writer: uncompressed, PLAIN (int8: a dictionary),
    /// V1 pages; small pages, so a row group has many.
    Chip,
    /// V2 pages, zstd-compressed.
    V2Zstd,
    /// Floats dictionary-encoded, as PyArrow writes them by default.
    FloatDictionary,
}

fn write(path: &std::path::Path, ty: EmbeddingType, w: Writer, null_row: Option<usize>) {
    let values: Vec<i8> = (0..ROWS)
        .flat_map(|r| (0..DIM).map(move |i| value(r, i)))
        .collect();
    let (item, array): (DataType, ArrayRef) = match ty {
        EmbeddingType::F32 => (
            DataType::Float32,
            Arc::new(Float32Array::from_iter_values(
                values.iter().map(|v| f32::from(*v)),
            )),
        ),
        EmbeddingType::F16 => (
            DataType::Float16,
            Arc::new(Float16Array::from_iter_values(
                values.iter().map(|v| half::f16::from_f32(f32::from(*v))),
            )),
        ),
        EmbeddingType::Int8 => (DataType::Int8, Arc::new(Int8Array::from(values))),
    };
    let field = Arc::new(Field::new("item", item, false));
    let nulls = null_row.map(|n| (0..ROWS).map(|r| r != n).collect());
    let list = FixedSizeListArray::try_new(field.clone(), DIM as i32, array, nulls).unwrap();
    let mut fields = vec![Field::new(
        col::EMBEDDING,
        DataType::FixedSizeList(field, DIM as i32),
        null_row.is_some(),
    )];
    let mut columns: Vec<ArrayRef> = vec![Arc::new(list)];
    if ty == EmbeddingType::Int8 {
        fields.push(Field::new(SCALE_COLUMN, DataType::Float32, false));
        columns.push(Arc::new(Float32Array::from(vec![0.01; ROWS])));
    }
    let schema = Arc::new(Schema::new(fields));
    let path_e = rsembed_schemas::chip_file::embedding_column_path();
    let mut b = WriterProperties::builder()
        .set_max_row_group_row_count(Some(500))
        .set_write_batch_size(16)
        .set_data_page_size_limit(1024)
        .set_dictionary_enabled(false)
        .set_column_dictionary_enabled(path_e.clone(), ty == EmbeddingType::Int8)
        .set_column_encoding(path_e.clone(), Encoding::PLAIN)
        .set_compression(Compression::UNCOMPRESSED);
    match w {
        Writer::Chip => {}
        Writer::V2Zstd => {
            b = b
                .set_writer_version(WriterVersion::PARQUET_2_0)
                .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap()));
        }
        Writer::FloatDictionary => b = b.set_column_dictionary_enabled(path_e, true),
    }
    let mut out = std::fs::File::create(path).unwrap();
    let mut wr = ArrowWriter::try_new(&mut out, schema.clone(), Some(b.build())).unwrap();
    wr.write(&RecordBatch::try_new(schema, columns).unwrap())
        .unwrap();
    wr.close().unwrap();
}

/// Every row the scan hands out, as float32, by row of the file; and
/// how many row groups were read in place.
async fn scan(path: &std::path::Path, ty: EmbeddingType) -> crate::Result<(Vec<Vec<f32>>, usize)> {
    let index =
        Arc::new(Index::open(&StoreCache::default(), path.to_str().unwrap(), usize::MAX).await?);
    let (groups, _) = index.row_groups(None);
    let mut in_place = 0;
    for &g in &groups {
        if let Ok(chunk) = index.embedding_chunk(g, ty).await? {
            in_place += usize::from(
                chunk
                    .decode(ty, DIM, |_, _| Ok::<(), crate::Error>(()))
                    .is_ok(),
            );
        }
    }
    let mut s = Box::pin(scan_embeddings(
        index.clone(),
        groups,
        Filters::default(),
        2,
        Vec::new,
        |acc: &mut Vec<(usize, Vec<f32>)>, _g: GroupRef, first, rows: Stored<'_>, keep| {
            assert!(keep.is_none());
            let v: Vec<f32> = match rows {
                Stored::F32(v) => v.to_vec(),
                Stored::F32Le(v) => v.iter().map(|b| f32::from_le_bytes(*b)).collect(),
                Stored::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
                Stored::F16Le(v) => v
                    .iter()
                    .map(|b| half::f16::from_le_bytes(*b).to_f32())
                    .collect(),
                Stored::Int8(v) => v.iter().map(|x| f32::from(*x)).collect(),
            };
            for (i, row) in v.chunks_exact(DIM).enumerate() {
                acc.push((first + i, row.to_vec()));
            }
            Ok::<(), crate::Error>(())
        },
    ));
    let mut rows = Vec::new();
    while let Some(r) = s.next().await {
        let (g, acc, _) = r?;
        for (i, (first, row)) in acc.into_iter().enumerate() {
            assert_eq!(first, i, "rows in order, whole, from the group's first");
            let _ = g;
            rows.push(row);
        }
    }
    Ok((rows, in_place))
}

/// The `embedding` chunk of row group `row_group` of the file `path`,
/// fetched for an in-place read.
async fn chunk_of(path: &std::path::Path, ty: EmbeddingType, row_group: usize) -> Chunk {
    let index = Index::open(&StoreCache::default(), path.to_str().unwrap(), usize::MAX)
        .await
        .unwrap();
    let g = GroupRef { part: 0, row_group };
    index.embedding_chunk(g, ty).await.unwrap().unwrap()
}

fn expected() -> Vec<Vec<f32>> {
    (0..ROWS)
        .map(|r| (0..DIM).map(|i| f32::from(value(r, i))).collect())
        .collect()
}

#[tokio::test]
async fn pages_read_in_place_give_the_rows_written() {
    let dir = tempfile::tempdir().unwrap();
    for ty in EmbeddingType::ALL {
        for w in [Writer::Chip, Writer::V2Zstd] {
            let path = dir.path().join(format!("{ty:?}-{w:?}.parquet"));
            write(&path, ty, w, None);
            let (rows, in_place) = scan(&path, ty).await.unwrap();
            assert_eq!(in_place, 3, "{ty:?} {w:?}: every row group read in place");
            assert!(rows == expected(), "{ty:?} {w:?}");
        }
    }
}

#[tokio::test]
async fn corrupt_chunks_are_layout_errors_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut outcomes = [0usize; 2];
    for ty in EmbeddingType::ALL {
        for w in [Writer::Chip, Writer::V2Zstd] {
            let path = dir.path().join(format!("{ty:?}-{w:?}.parquet"));
            write(&path, ty, w, None);
            let chunk = chunk_of(&path, ty, 0).await;
            for i in 0..400 {
                let mut bytes = chunk.data.to_vec();
                if i % 10 == 0 {
                    bytes.truncate(next() as usize % bytes.len());
                } else {
                    for _ in 0..1 + next() % 4 {
                        let at = next() as usize % bytes.len();
                        bytes[at] ^= 1 << (next() % 8);
                    }
                }
                let bad = Chunk {
                    data: Bytes::from(bytes),
                    meta: chunk.meta.clone(),
                    rows: chunk.rows,
                };
                let mut rows = 0;
                let r = bad.decode(ty, DIM, |first, s| {
                    assert_eq!(first, rows, "rows in order");
                    rows += s.values() / DIM;
                    Ok::<(), crate::Error>(())
                });
                match r {
                    Ok(()) => {
                        assert_eq!(rows, chunk.rows, "{ty:?} {w:?}: every row, once");
                        outcomes[0] += 1;
                    }
                    Err(Decode::Layout(_)) => outcomes[1] += 1,
                    Err(Decode::Fold(e)) => panic!("{e}"),
                }
            }
        }
    }
    // Flipped value bits decode (other values, the same rows); flipped
    // headers, levels and truncations do not.
    assert!(outcomes[0] > 100 && outcomes[1] > 100, "{outcomes:?}");
}

#[tokio::test]
async fn other_layouts_are_read_by_the_arrow_reader() {
    let dir = tempfile::tempdir().unwrap();
    // Dictionary-encoded floats: judged from the footer, read by arrow.
    let path = dir.path().join("dict.parquet");
    write(&path, EmbeddingType::F32, Writer::FloatDictionary, None);
    let (rows, in_place) = scan(&path, EmbeddingType::F32).await.unwrap();
    assert_eq!(in_place, 0);
    assert!(rows == expected());
    // A null row: found in the levels, and refused as the arrow reader
    // refuses it.
    for ty in EmbeddingType::ALL {
        let path = dir.path().join(format!("null-{ty:?}.parquet"));
        write(&path, ty, Writer::Chip, Some(700));
        let chunk = chunk_of(&path, ty, 1).await;
        match chunk.decode(ty, DIM, |_, _| Ok::<(), crate::Error>(())) {
            Err(Decode::Layout(why)) => assert_eq!(why, "nulls", "{ty:?}"),
            other => panic!("{ty:?}: {other:?}"),
        }
        let err = scan(&path, ty).await.unwrap_err().to_string();
        assert!(err.contains("nulls"), "{ty:?}: {err}");
    }
}
