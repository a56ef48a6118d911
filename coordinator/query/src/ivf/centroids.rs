//! `centroids.parquet`: written once by compaction, read (and checked
//! against the manifest's sha256) by every search of an IVF dataset.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int32Type, Int64Type};
use arrow_array::{Array, ArrayRef, FixedSizeListArray, Float32Array, Int32Array, Int64Array};
use arrow_array::{RecordBatch, RecordBatchOptions};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::{FutureExt, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{GetResult, GetResultPayload, ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::{ArrowWriter, ParquetRecordBatchStreamBuilder};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use rsembed_schemas::chip::embedding_type;
use rsembed_schemas::job::CENTROIDS_FILE;
use sha2::{Digest, Sha256};

use crate::format::index::{guarded, reader_panicked};
use crate::io::StoreReader;
use crate::{Error, Result};

use super::{Centroids, LIST, MAX_LISTS};

/// The schema of `centroids.parquet` for dimension `dim`.
pub fn centroids_schema(dim: usize) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(LIST, DataType::Int32, false),
        Field::new("centroid", embedding_type(dim), false),
        Field::new("rows", DataType::Int64, false),
    ]))
}

/// `centroids.parquet`'s bytes: one row per list, in list order, with the
/// rows each list got.
pub fn encode_centroids(c: &Centroids, rows: &[u64]) -> Result<Vec<u8>> {
    let schema = centroids_schema(c.dim);
    let lists = Int32Array::from_iter_values(0..c.lists() as i32);
    let values = Float32Array::from(c.values.clone());
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let centroid = FixedSizeListArray::try_new(item, c.dim as i32, Arc::new(values), None)
        .map_err(|e| encode_err(Box::new(e)))?;
    let counts = Int64Array::from_iter_values(rows.iter().map(|&n| n as i64));
    let cols: Vec<ArrayRef> = vec![Arc::new(lists), Arc::new(centroid), Arc::new(counts)];
    let batch = RecordBatch::try_new_with_options(
        schema.clone(),
        cols,
        &RecordBatchOptions::new().with_row_count(Some(c.lists())),
    )
    .map_err(|e| encode_err(Box::new(e)))?;
    // No dictionary: every centroid value is distinct, so parquet filled a
    // 1 MiB dictionary page per row group before falling back to plain, and
    // a file of 1,000 lists at D = 768 outgrew what its own reader accepts.
    let props = WriterProperties::builder()
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_max_row_group_row_count(Some(CENTROID_GROUP_ROWS))
        .build();
    let mut w = ArrowWriter::try_new(Vec::new(), schema, Some(props))
        .map_err(|e| encode_err(Box::new(e)))?;
    w.write(&batch).map_err(|e| encode_err(Box::new(e)))?;
    w.into_inner().map_err(|e| encode_err(Box::new(e)))
}

fn encode_err(source: Box<dyn std::error::Error + Send + Sync>) -> Error {
    Error::Write {
        path: CENTROIDS_FILE.to_owned(),
        source,
    }
}

/// Centroids a row group of `centroids.parquet` holds: a search that ranks
/// them as they are read holds one group (768 KiB at D = 768), not the file
/// (9.7 MiB at 3,162 lists).
pub const CENTROID_GROUP_ROWS: usize = 256;

/// Files of centroids up to this size are read once, into memory, and
/// decoded from there; larger ones are read twice a piece at a time
/// ([`read_centroids`]). At D = 768 that is up to about 1,300 lists.
pub(crate) const WHOLE_CENTROIDS_BYTES: u64 = 4 << 20;

/// Reads `centroids.parquet` (`path` in `store`, named `uri` in messages)
/// of `lists` centroids of dimension `dim` (read whole when at most `whole`
/// bytes, `WHOLE_CENTROIDS_BYTES` but in tests), checking it is the file whose
/// sha256 the manifest recorded, and hands each batch of centroids to `each`
/// as it is read: the first list's number, the values (row-major), each
/// list's rows. Returns the bytes fetched.
///
/// Never more than `WHOLE_CENTROIDS_BYTES` of the file and one batch of
/// values are held. A larger file is read twice, both times a piece at a
/// time: whole for its sha256, then its row groups for the centroids.
/// Holding the file and its decoded values was the peak of a single search
/// at 10^7 rows (19 MiB at 3,162 lists, where a group's scan needs 2;
/// docs/benchmarks.md); a small file is read once, as the bytes fetched by
/// a search of a small index are mostly its centroids. A file larger than
/// `lists` centroids can be is refused before it is read.
pub async fn read_centroids(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    uri: &str,
    sha256: &str,
    (dim, lists, whole): (usize, usize, u64),
    mut each: impl FnMut(u32, &[f32], &[u64]),
) -> Result<u64> {
    let bad = |problem: String| -> Error { Error::dataset(uri, problem) };
    if lists == 0 || lists > MAX_LISTS as usize {
        return Err(bad(format!(
            "the manifest says {lists} lists: a layout has 1 to {MAX_LISTS}"
        )));
    }
    let got = store.get(path).await?;
    let size = got.meta.size;
    // Values, a page header every 64 KiB of them at most, and the footer's
    // statistics of a group every 256 lists, with room to spare; and, in a
    // file compacted before its writer left dictionaries out, a dictionary
    // page of at most parquet's default 1 MiB a row group.
    let groups = lists.div_ceil(CENTROID_GROUP_ROWS);
    let most = (lists * (dim * 4 + 64) + (groups + 1) * (1 << 20)) as u64;
    if size > most {
        return Err(bad(format!(
            "{size} bytes: more than {lists} centroids of {dim} floats take ({most} at most)"
        )));
    }
    let same = |hash: Sha256| -> Result<()> {
        let sha = hex::encode(hash.finalize());
        if sha != sha256 {
            return Err(bad(format!(
                "sha256 {sha}, but the manifest says {sha256}: the dataset changed since it was compacted"
            )));
        }
        Ok(())
    };
    let not_parquet = |source| Error::NotParquet {
        uri: uri.to_owned(),
        source,
    };
    let mut next = 0i32;
    let mut take = |batch: &RecordBatch| -> Result<()> {
        let first = next;
        let (values, rows) = centroid_batch(batch, dim, &mut next, uri)?;
        if next as usize > lists {
            return Err(bad(format!(
                "more than {lists} centroids, but the manifest says {lists} lists"
            )));
        }
        each(first as u32, values, &rows);
        Ok(())
    };
    let read = if size <= whole {
        let bytes = got.bytes().await?;
        same(Sha256::new_with_prefix(&bytes))?;
        // The sha256 ties the file to the manifest, not to a writer that
        // made it well: parquet-rs panics on some corrupt pages.
        let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<()> {
            let batches = ParquetRecordBatchReaderBuilder::try_new(bytes)
                .map(|b| b.with_batch_size(CENTROID_GROUP_ROWS))
                .and_then(|b| b.build())
                .map_err(not_parquet)?;
            for batch in batches {
                take(&batch.map_err(|source| Error::Rows {
                    uri: uri.to_owned(),
                    source,
                })?)?;
            }
            Ok(())
        }));
        decoded.unwrap_or_else(|panic| {
            Err(Error::Read {
                uri: uri.to_owned(),
                source: reader_panicked(panic.as_ref()),
            })
        })?;
        size
    } else {
        same(sha256_of(got, uri).await?)?;
        let read = Arc::new(AtomicU64::new(size));
        let reader = StoreReader::new(store.clone(), path.clone(), size, read.clone());
        let builder = std::panic::AssertUnwindSafe(ParquetRecordBatchStreamBuilder::new(reader))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(reader_panicked(panic.as_ref())))
            .map_err(not_parquet)?;
        let batches = builder
            .with_batch_size(CENTROID_GROUP_ROWS)
            .build()
            .map_err(not_parquet)?;
        let mut batches = guarded(batches);
        while let Some(batch) = batches.next().await {
            take(&batch.map_err(|source| Error::Read {
                uri: uri.to_owned(),
                source,
            })?)?;
        }
        read.load(Ordering::Relaxed)
    };
    if next as usize != lists {
        return Err(bad(format!(
            "{next} centroids, but the manifest says {lists} lists"
        )));
    }
    Ok(read)
}

/// The sha256 of the whole of `got`, read a piece at a time: a local file
/// in 1 MiB reads on the blocking pool (object_store's stream of it is
/// 8 KiB reads, a blocking task each: 1,200 for the centroids of 3,162
/// lists), another store's body as it streams in.
async fn sha256_of(got: GetResult, uri: &str) -> Result<Sha256> {
    let mut hash = Sha256::new();
    match got.payload {
        GetResultPayload::File(mut file, _) => {
            let hashed = tokio::task::spawn_blocking(move || {
                use std::io::Read;
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    match file.read(&mut buf) {
                        Ok(0) => return Ok(hash),
                        Ok(n) => hash.update(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
            })
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|r| r);
            hashed.map_err(|e| Error::dataset(uri, format!("reading it: {e}")))
        }
        GetResultPayload::Stream(mut pieces) => {
            while let Some(piece) = pieces.try_next().await? {
                hash.update(&piece);
            }
            Ok(hash)
        }
    }
}

/// The values and row counts of one batch of `centroids.parquet`, whose
/// lists must be `next`, `next + 1`, …; `next` moves past them.
fn centroid_batch<'a>(
    batch: &'a RecordBatch,
    dim: usize,
    next: &mut i32,
    uri: &str,
) -> Result<(&'a [f32], Vec<u64>)> {
    let bad = |problem: String| -> Error { Error::dataset(uri, problem) };
    let ids = batch
        .column_by_name(LIST)
        .and_then(|c| c.as_primitive_opt::<Int32Type>())
        .ok_or_else(|| Error::column(uri, LIST, "int32"))?;
    let cents = batch
        .column_by_name("centroid")
        .and_then(|c| c.as_fixed_size_list_opt())
        .filter(|c| c.value_length() as usize == dim && c.null_count() == 0)
        .ok_or_else(|| {
            bad(format!(
                "`centroid` is not a FixedSizeList<Float32, {dim}> without nulls"
            ))
        })?;
    let counts = batch
        .column_by_name("rows")
        .and_then(|c| c.as_primitive_opt::<Int64Type>())
        .filter(|c| c.null_count() == 0)
        .ok_or_else(|| Error::column(uri, "rows", "int64 without nulls"))?;
    let v = cents
        .values()
        .as_primitive_opt::<Float32Type>()
        .ok_or_else(|| Error::column(uri, "centroid values", "float32"))?;
    for i in 0..ids.len() {
        if ids.is_null(i) || ids.value(i) != *next {
            return Err(bad(format!(
                "its lists are not 0, 1, 2, … in order (row {next})"
            )));
        }
        *next += 1;
    }
    let start = cents.offset() * dim;
    let values = &v.values()[start..start + cents.len() * dim];
    Ok((
        values,
        counts.values().iter().map(|&n| n.max(0) as u64).collect(),
    ))
}

// ---- Search --------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::test_support::centroids_file;
    use super::*;

    #[tokio::test]
    async fn centroids_round_trip_through_parquet_and_a_wrong_file_is_refused() {
        let c = Centroids {
            dim: 3,
            values: vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
        };
        let bytes = encode_centroids(&c, &[5, 0]).unwrap();
        assert_eq!(bytes, encode_centroids(&c, &[5, 0]).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let (store, path, sha) = centroids_file(dir.path(), &c, &[5, 0]);
        // Each case read both ways: streamed twice over, and whole.
        let read = |sha: String, (dim, lists): (usize, usize)| {
            let (store, path) = (store.clone(), path.clone());
            async move {
                let mut got = Vec::new();
                for whole in [0, u64::MAX] {
                    let (mut values, mut rows) = (Vec::new(), Vec::new());
                    let r = read_centroids(
                        &store,
                        &path,
                        "c",
                        &sha,
                        (dim, lists, whole),
                        |first, v, r| {
                            assert_eq!(first as usize, rows.len());
                            values.extend_from_slice(v);
                            rows.extend_from_slice(r);
                        },
                    )
                    .await;
                    got.push(r.map(|_| (values, rows)));
                }
                let whole = got.pop().unwrap();
                match (got.pop().unwrap(), whole) {
                    (Ok(a), Ok(b)) => {
                        assert_eq!(a, b, "streamed or whole");
                        Ok(a)
                    }
                    (Err(a), Err(b)) => {
                        assert_eq!(a.to_string(), b.to_string(), "streamed or whole");
                        Err(a)
                    }
                    (a, b) => panic!("streamed {a:?}, whole {b:?}"),
                }
            }
        };
        let back = read(sha.clone(), (3, 2)).await.unwrap();
        assert_eq!(back, (c.values.clone(), vec![5, 0]));
        let err = |r: Result<(Vec<f32>, Vec<u64>)>| r.unwrap_err().to_string();
        let e = err(read(sha.clone(), (3, 3)).await);
        assert!(e.contains("2 centroids, but the manifest says 3"), "{e}");
        let e = err(read(sha.clone(), (3, 1)).await);
        assert!(e.contains("more than 1 centroids"), "{e}");
        let e = err(read(sha.clone(), (4, 2)).await);
        assert!(e.contains("FixedSizeList<Float32, 4>"), "{e}");
        let e = err(read("0".repeat(64), (3, 2)).await);
        assert!(
            e.contains("the dataset changed since it was compacted"),
            "{e}"
        );
        let e = err(read(sha.clone(), (3, 1 << 20)).await);
        assert!(e.contains("a layout has 1 to 65536"), "{e}");
        // A file larger than its lists' centroids can be is not read.
        let mut big = bytes.clone();
        big.resize((2 << 20) + 4096, 0);
        std::fs::write(dir.path().join(CENTROIDS_FILE), &big).unwrap();
        let e = err(read(sha, (3, 2)).await);
        assert!(e.contains("more than 2 centroids of 3 floats take"), "{e}");
    }
}

/// The centroids `compact` writes at 1,000 lists of D = 768 are read back:
/// with a dictionary page a row group the file outgrew the reader's bound.
#[cfg(test)]
mod size_tests {
    use super::*;

    #[tokio::test]
    async fn a_thousand_lists_of_768_floats_are_written_plain_and_read_back() {
        let (lists, dim) = (1000, 768);
        // Every value distinct, as k-means' are: a dictionary of them is
        // the values over again.
        let values: Vec<f32> = (0..lists * dim)
            .map(|i| f32::from_bits(0x3f00_0000 | i as u32))
            .collect();
        let c = Centroids { dim, values };
        let rows = vec![1u64; lists];
        let dir = tempfile::tempdir().unwrap();
        let (store, path, sha) = test_support::centroids_file(dir.path(), &c, &rows);
        let size = std::fs::metadata(dir.path().join(CENTROIDS_FILE))
            .unwrap()
            .len();
        assert!(size < (lists * dim * 4 + (1 << 20)) as u64, "{size} bytes");
        let mut got = Vec::new();
        read_centroids(
            &store,
            &path,
            "c",
            &sha,
            (dim, lists, u64::MAX),
            |_, v, _| got.extend_from_slice(v),
        )
        .await
        .unwrap();
        assert_eq!(got, c.values);
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// `centroids` written as `centroids.parquet` in `dir`: its store, path
    /// and sha256.
    pub(crate) fn centroids_file(
        dir: &std::path::Path,
        c: &Centroids,
        rows: &[u64],
    ) -> (Arc<dyn ObjectStore>, Path, String) {
        let bytes = encode_centroids(c, rows).unwrap();
        std::fs::write(dir.join(CENTROIDS_FILE), &bytes).unwrap();
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir).unwrap();
        let sha = hex::encode(Sha256::digest(&bytes));
        (Arc::new(store), Path::from(CENTROIDS_FILE), sha)
    }
}
