//! Ranged reads of a part through object_store, as parquet's async reader.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

/// Reads a part through object_store ranged gets (the size is known, so a
/// footer costs one or two requests), counting the bytes fetched.
pub struct StoreReader {
    store: Arc<dyn ObjectStore>,
    path: Path,
    size: u64,
    read: Arc<AtomicU64>,
}

impl StoreReader {
    /// A reader of `path` (`size` bytes) in `store`, adding what it fetches to `read`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        path: Path,
        size: u64,
        read: Arc<AtomicU64>,
    ) -> StoreReader {
        StoreReader {
            store,
            path,
            size,
            read,
        }
    }
}

fn parquet_err(e: object_store::Error) -> parquet::errors::ParquetError {
    parquet::errors::ParquetError::External(Box::new(e))
}

impl AsyncFileReader for StoreReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            let b = self
                .store
                .get_range(&self.path, range)
                .await
                .map_err(parquet_err)?;
            self.read.fetch_add(b.len() as u64, Ordering::Relaxed);
            Ok(b)
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            let v = self
                .store
                .get_ranges(&self.path, &ranges)
                .await
                .map_err(parquet_err)?;
            let n: usize = v.iter().map(Bytes::len).sum();
            self.read.fetch_add(n as u64, Ordering::Relaxed);
            Ok(v)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let size = self.size;
            let md = ParquetMetaDataReader::new()
                .with_arrow_reader_options(options)
                // Most footers of chip files are a few KiB: one request.
                .with_prefetch_hint(Some(64 * 1024))
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(md))
        }
        .boxed()
    }
}

/// Writes `v` as pretty JSON to `rel` under `out`, in one put: a reader sees
/// the old document or the new one.
pub async fn put_json<T: serde::Serialize>(
    out: &rsembed_store::Location,
    rel: &str,
    v: &T,
) -> crate::Result<()> {
    let bytes = serde_json::to_vec_pretty(v).map_err(|e| crate::Error::Write {
        path: format!("{}/{rel}", out.url.as_str().trim_end_matches('/')),
        source: Box::new(e),
    })?;
    out.store
        .put(&out.child(rel), object_store::PutPayload::from(bytes))
        .await?;
    Ok(())
}

/// Deletes `rel` under `out`; one that is not there is no error.
pub async fn delete_if_present(out: &rsembed_store::Location, rel: &str) -> crate::Result<()> {
    Ok(out.delete_if_present(rel).await?)
}

/// Refuses an existing output file unless `overwrite`, and checks that a
/// local one can be created, before any work (`classify`, `change`).
pub async fn check_output_file(
    out: &rsembed_store::Location,
    overwrite: bool,
) -> crate::Result<()> {
    match out.store.head(&out.prefix).await {
        Ok(_) if !overwrite => {
            return Err(crate::Error::OutputRefused {
                path: out.url.to_string(),
                problem: "already exists: pass --overwrite to replace it, or pick another --output"
                    .into(),
            })
        }
        Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => {
            return Err(crate::Error::Write {
                path: out.url.to_string(),
                source: Box::new(e),
            })
        }
    }
    if out.local_dir().is_some_and(|p| p.is_dir()) {
        return Err(crate::Error::OutputRefused {
            path: out.url.to_string(),
            problem: "is a folder: --output names the Parquet file to write".into(),
        });
    }
    out.probe_local_write("").map_err(|e| crate::Error::Write {
        path: out.url.to_string(),
        source: Box::new(e),
    })
}
