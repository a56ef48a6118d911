//! Objects written for a Parquet writer, whole or not at all.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use object_store::buffered::BufWriter;
use parquet::arrow::async_writer::AsyncFileWriter;
use parquet::errors::ParquetError;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

/// An upload of one object for a Parquet writer: one put, or a multipart
/// upload that appears whole on completion; hashes what it writes, and can
/// be aborted whatever state it failed in.
pub struct AtomicUpload {
    inner: BufWriter,
    sha: Sha256,
    bytes: u64,
    /// Set once completion starts: object_store's `BufWriter` panics
    /// ("Already shut down") when a failed shutdown is then aborted.
    closing: bool,
}

impl AtomicUpload {
    /// An upload of `path`, `concurrency` parts of 10 MiB at once.
    pub fn new(
        store: &Arc<dyn object_store::ObjectStore>,
        path: object_store::path::Path,
        concurrency: usize,
    ) -> AtomicUpload {
        AtomicUpload {
            inner: BufWriter::new(store.clone(), path).with_max_concurrency(concurrency),
            sha: Sha256::new(),
            bytes: 0,
            closing: false,
        }
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Hex SHA-256 of the bytes written so far.
    pub fn sha256(&self) -> String {
        hex::encode(self.sha.clone().finalize())
    }

    /// Gives up the upload, leaving no object; errors are of no use then.
    pub async fn abort(&mut self) {
        if !self.closing {
            if let Err(e) = self.inner.abort().await {
                tracing::warn!(target: crate::LOG, error = %e, "aborting an upload failed");
            }
        }
    }
}

impl AsyncFileWriter for AtomicUpload {
    fn write(&mut self, bs: Bytes) -> BoxFuture<'_, parquet::errors::Result<()>> {
        self.sha.update(&bs);
        self.bytes += bs.len() as u64;
        async move {
            self.inner
                .put(bs)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        }
        .boxed()
    }

    fn complete(&mut self) -> BoxFuture<'_, parquet::errors::Result<()>> {
        self.closing = true;
        async move { Ok(self.inner.shutdown().await?) }.boxed()
    }
}
