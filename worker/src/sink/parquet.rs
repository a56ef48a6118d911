//! GeoParquet files: encoding with file metadata, and committing through object_store.

use arrow_array::RecordBatch;
use object_store::{ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use rsembed_schemas::job::ManifestFile;
use rsembed_schemas::meta::{geo_metadata, FileMeta, GEO_KEY, RSEMBED_KEY};
use sha2::{Digest, Sha256};

use crate::error::Result;
use crate::store::Location;

/// Encodes one record batch as a Parquet file with the given key-value metadata.
pub fn encode(batch: &RecordBatch, kv: Vec<KeyValue>) -> Result<Vec<u8>> {
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_key_value_metadata(Some(kv))
        .build();
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, batch.schema(), Some(props))?;
    w.write(batch)?;
    w.close()?;
    Ok(buf)
}

/// The key-value metadata of a chip file: `geo` and `rsembed`.
pub fn chip_file_metadata(meta: &FileMeta, extent: Option<[f64; 4]>) -> Result<Vec<KeyValue>> {
    Ok(vec![
        KeyValue::new(GEO_KEY.to_owned(), geo_metadata(extent).to_string()),
        KeyValue::new(RSEMBED_KEY.to_owned(), serde_json::to_string(meta)?),
    ])
}

/// The key-value metadata of an error file: `rsembed` only (it has no geometry).
pub fn error_file_metadata(meta: &FileMeta) -> Result<Vec<KeyValue>> {
    Ok(vec![KeyValue::new(
        RSEMBED_KEY.to_owned(),
        serde_json::to_string(meta)?,
    )])
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
    })
}
