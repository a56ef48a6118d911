//! Committing output files to object storage: one put per file, which object
//! stores make atomic, so a reader sees a whole file or none; pull workers
//! create each file once ([`Commit::CreateOnce`]), as redeliveries may race.

use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use rsembed_schemas::job::ManifestFile;
use sha2::{Digest, Sha256};

use crate::error::Result;
use crate::store::Location;

/// How the task's files are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Plain puts (embedded mode, one writer).
    Overwrite,
    /// Conditional creates: a file that exists was written whole by an earlier
    /// delivery of the same task (puts are atomic), so it is kept and described
    /// instead of written again. Stores without conditional puts overwrite.
    CreateOnce,
}

impl Commit {
    /// Writes `bytes` at `rel` under `root` the way `self` says.
    pub async fn put(
        self,
        root: &Location,
        rel: &str,
        bytes: Vec<u8>,
        rows: u64,
    ) -> Result<ManifestFile> {
        match self {
            Commit::Overwrite => put(root, rel, bytes, rows).await,
            Commit::CreateOnce => put_once(root, rel, bytes, rows).await,
        }
    }
}

/// Writes `bytes` at `rel` under `root` in one put, which object stores make
/// atomic: a reader sees the whole file or none of it, and a task written twice
/// leaves one file.
pub async fn put(root: &Location, rel: &str, bytes: Vec<u8>, rows: u64) -> Result<ManifestFile> {
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let n = bytes.len() as u64;
    root.store
        .put(&root.child(rel), PutPayload::from(bytes))
        .await?;
    Ok(ManifestFile {
        path: rel.to_owned(),
        rows,
        sha256,
        bytes: n,
        extent: None,
    })
}

/// Like [`put`], but never replaces a file: when `rel` exists (an earlier
/// delivery of the same task wrote it, whole, since puts are atomic), that
/// file is kept and described. Where the store has no conditional put (S3
/// without `AWS_CONDITIONAL_PUT=etag`), it overwrites, which is safe because
/// the name depends only on the task.
pub(crate) async fn put_once(
    root: &Location,
    rel: &str,
    bytes: Vec<u8>,
    rows: u64,
) -> Result<ManifestFile> {
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let n = bytes.len() as u64;
    let path = root.child(rel);
    let opts = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    match root
        .store
        .put_opts(&path, PutPayload::from(bytes.clone()), opts)
        .await
    {
        Ok(_) => Ok(ManifestFile {
            path: rel.to_owned(),
            rows,
            sha256,
            bytes: n,
            extent: None,
        }),
        Err(object_store::Error::AlreadyExists { .. }) => {
            tracing::info!(
                path = rel,
                "kept the file an earlier delivery of this task wrote"
            );
            describe(root, rel).await
        }
        Err(object_store::Error::NotImplemented { .. }) => put(root, rel, bytes, rows).await,
        Err(e) => Err(e.into()),
    }
}

/// Digest, size and row count of an existing Parquet file.
pub async fn describe(root: &Location, rel: &str) -> Result<ManifestFile> {
    let bytes = root.store.get(&root.child(rel)).await?.bytes().await?;
    describe_bytes(rel, bytes)
}

/// Digest, size and row count of the Parquet file `bytes`, stored at `rel`,
/// and the extent its footer records (chip files of this version).
pub fn describe_bytes(rel: &str, bytes: bytes::Bytes) -> Result<ManifestFile> {
    let reader = parquet::file::serialized_reader::SerializedFileReader::new(bytes.clone())?;
    let meta = parquet::file::reader::FileReader::metadata(&reader).file_metadata();
    Ok(ManifestFile {
        path: rel.to_owned(),
        rows: meta.num_rows() as u64,
        sha256: hex::encode(Sha256::digest(&bytes)),
        bytes: bytes.len() as u64,
        extent: super::extent::from_footer(meta.key_value_metadata()),
    })
}
