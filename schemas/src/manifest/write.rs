//! Writing a list row by row, to any [`AsyncFileWriter`] (a local file, a
//! `Vec<u8>`, or an object store through parquet's `ParquetObjectWriter`),
//! hashed on the way: the sha256, size and row count of the file come from
//! what was written, never from reading it back.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use bytes::Bytes;
use futures::future::BoxFuture;
use parquet::arrow::async_writer::{AsyncArrowWriter, AsyncFileWriter};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use sha2::{Digest, Sha256};

use super::failures::{self, FailureRow};
use super::files::{self, ListedFile};
use super::{
    check_relative_path, ListError, Result, BATCH_ROWS, FAILURES_LIST, FILES_LIST, MAX_NAME_BYTES,
    MAX_ROW_GROUP_BYTES, ROW_GROUP_ROWS,
};
use crate::extent::{FileExtent, MAX_SOURCES, MAX_VERTICES};
use crate::job::ManifestFile;
use crate::meta::GEO_KEY;

/// A row type of a list.
pub trait ListRow: Sized + Send + 'static {
    /// The list's path, relative to the output root.
    const PATH: &'static str;
    /// The list's Arrow schema.
    fn schema() -> SchemaRef;
    /// `rows` as a batch of [`ListRow::schema`].
    fn to_batch(rows: &[Self]) -> Result<RecordBatch>;
    /// The rows of a batch read back, checked.
    fn from_batch(what: &str, b: &RecordBatch) -> Result<Vec<Self>>;
    /// Why the row cannot be written so that it reads back, if it cannot.
    fn check(&self) -> Result<(), String>;
    /// The row's bbox, for a list with a geometry column.
    fn bbox(&self) -> Option<[f64; 4]> {
        None
    }
    /// The file's key-value metadata, given the bbox of all its rows.
    fn metadata(_bbox: Option<[f64; 4]>) -> Vec<KeyValue> {
        Vec::new()
    }
}

fn name(what: &str, v: &str) -> Result<(), String> {
    if v.len() > MAX_NAME_BYTES {
        return Err(format!(
            "{what} of {} bytes, more than {MAX_NAME_BYTES}",
            v.len()
        ));
    }
    Ok(())
}

/// Whether a list can hold `e` so that it reads back: at most
/// [`MAX_VERTICES`] vertices in rings of three or more, at most
/// [`MAX_SOURCES`] sources, names of at most [`MAX_NAME_BYTES`]. What the
/// values mean (lon/lat in range, start before end) is the reader's to
/// judge ([`FileExtent::check`]): the list keeps what the worker recorded.
pub fn extent_fits(e: &FileExtent) -> Result<(), String> {
    let vertices: usize = e.footprint.iter().map(Vec::len).sum();
    if vertices > MAX_VERTICES {
        return Err(format!(
            "the footprint has {vertices} vertices, more than {MAX_VERTICES}"
        ));
    }
    if let Some(r) = e.footprint.iter().find(|r| r.len() < 3) {
        return Err(format!("a ring of {} vertices", r.len()));
    }
    if e.sources.len() > MAX_SOURCES {
        return Err(format!(
            "{} sources, more than {MAX_SOURCES}",
            e.sources.len()
        ));
    }
    for (u, i) in &e.sources {
        name("a source", u)?;
        name("an item id", i)?;
    }
    Ok(())
}

impl ListRow for ListedFile {
    const PATH: &'static str = FILES_LIST;
    fn schema() -> SchemaRef {
        files::files_schema()
    }
    fn to_batch(rows: &[Self]) -> Result<RecordBatch> {
        files::to_batch(rows)
    }
    fn from_batch(what: &str, b: &RecordBatch) -> Result<Vec<Self>> {
        files::from_batch(what, b)
    }
    fn check(&self) -> Result<(), String> {
        check_relative_path(&self.file.path)?;
        if self.task_id.is_empty() {
            return Err("an empty task id".into());
        }
        name("a task id", &self.task_id)?;
        match &self.file.extent {
            Some(e) => extent_fits(e),
            None => Ok(()),
        }
    }
    fn bbox(&self) -> Option<[f64; 4]> {
        self.file.extent.as_ref().and_then(|e| e.bbox())
    }
    fn metadata(bbox: Option<[f64; 4]>) -> Vec<KeyValue> {
        vec![KeyValue::new(
            GEO_KEY.to_owned(),
            files::geo_metadata(bbox).to_string(),
        )]
    }
}

impl ListRow for FailureRow {
    const PATH: &'static str = FAILURES_LIST;
    fn schema() -> SchemaRef {
        failures::failures_schema()
    }
    fn to_batch(rows: &[Self]) -> Result<RecordBatch> {
        failures::to_batch(rows)
    }
    fn from_batch(what: &str, b: &RecordBatch) -> Result<Vec<Self>> {
        failures::from_batch(what, b)
    }
    fn check(&self) -> Result<(), String> {
        for (what, v) in [
            ("a task id", &self.task_id),
            ("an input URI", &self.source_uri),
            ("a stage", &self.stage),
        ] {
            if let Some(v) = v {
                name(what, v)?;
            }
        }
        Ok(())
    }
}

/// An [`AsyncFileWriter`] that hashes and counts what goes through it.
struct Hashing<W> {
    inner: W,
    sha: Sha256,
    bytes: u64,
}

impl<W: AsyncFileWriter> AsyncFileWriter for Hashing<W> {
    fn write(&mut self, bs: Bytes) -> BoxFuture<'_, parquet::errors::Result<()>> {
        self.sha.update(&bs);
        self.bytes += bs.len() as u64;
        self.inner.write(bs)
    }

    fn complete(&mut self) -> BoxFuture<'_, parquet::errors::Result<()>> {
        self.inner.complete()
    }
}

/// A list written: its entry in `manifest.json`, and the sink, completed.
#[derive(Debug)]
pub struct Written<W> {
    /// Path (the list's), rows, bytes and sha256 of what was written.
    pub file: ManifestFile,
    /// The sink the file went to.
    pub sink: W,
}

/// Writes a list row by row: rows are encoded [`BATCH_ROWS`] at a time,
/// and a row group goes to the sink once it holds [`ROW_GROUP_ROWS`] rows
/// or a quarter of [`MAX_ROW_GROUP_BYTES`] encoded, so memory stays
/// bounded whatever the list's length.
pub struct ListWriter<W: AsyncFileWriter, R: ListRow> {
    out: AsyncArrowWriter<Hashing<W>>,
    buf: Vec<R>,
    rows: u64,
    bbox: Option<[f64; 4]>,
}

/// The writer of `manifest/files.parquet`.
pub type FilesWriter<W> = ListWriter<W, ListedFile>;
/// The writer of `manifest/failures.parquet`.
pub type FailuresWriter<W> = ListWriter<W, FailureRow>;

impl<W: AsyncFileWriter, R: ListRow> ListWriter<W, R> {
    /// A writer of an empty list into `sink`.
    pub fn new(sink: W) -> Result<Self> {
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_max_row_group_bytes(Some(MAX_ROW_GROUP_BYTES as usize / 4))
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .build();
        let sink = Hashing {
            inner: sink,
            sha: Sha256::new(),
            bytes: 0,
        };
        Ok(ListWriter {
            out: AsyncArrowWriter::try_new(sink, R::schema(), Some(props))?,
            buf: Vec::with_capacity(BATCH_ROWS),
            rows: 0,
            bbox: None,
        })
    }

    /// Rows given so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Appends `row`; refuses one that would not read back.
    pub async fn push(&mut self, row: R) -> Result<()> {
        row.check()
            .map_err(|e| ListError::invalid(format!("a row of {}", R::PATH), e))?;
        if let Some(b) = row.bbox() {
            self.bbox = Some(self.bbox.map_or(b, |a| {
                [
                    a[0].min(b[0]),
                    a[1].min(b[1]),
                    a[2].max(b[2]),
                    a[3].max(b[3]),
                ]
            }));
        }
        self.buf.push(row);
        self.rows += 1;
        if self.buf.len() >= BATCH_ROWS {
            self.flush_batch().await?;
        }
        Ok(())
    }

    async fn flush_batch(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let batch = R::to_batch(&self.buf)?;
        self.buf.clear();
        self.out.write(&batch).await?;
        Ok(())
    }

    /// Writes what is buffered and the footer, completes the sink (an
    /// object store upload appears here, whole), and says what was written.
    pub async fn finish(mut self) -> Result<Written<W>> {
        self.flush_batch().await?;
        for kv in R::metadata(self.bbox) {
            self.out.append_key_value_metadata(kv);
        }
        self.out.finish().await?;
        let h = self.out.into_inner();
        Ok(Written {
            file: ManifestFile {
                path: R::PATH.to_owned(),
                rows: self.rows,
                sha256: hex::encode(h.sha.finalize()),
                bytes: h.bytes,
                extent: None,
            },
            sink: h.inner,
        })
    }
}
