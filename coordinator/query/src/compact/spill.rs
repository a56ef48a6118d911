//! Pass 2: every row routed to its output file's bucket, buffered and
//! appended to a local spill file as self-contained Parquet frames.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::path::{Path as FsPath, PathBuf};

use arrow_array::{RecordBatch, UInt32Array};
use arrow_schema::SchemaRef;
use arrow_select::take::take_record_batch;
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use rsembed_schemas::chip::{col, embedding_type_from};
use rsembed_schemas::chip_file::{embedding_column_path, CHIP_ROW_GROUP_ROWS};
use rsembed_schemas::embedding::EmbeddingType;

use super::keys::{batch_keys, bucket_of, Key};
use super::source::{conform, convert_embeddings};
use super::{SPILL_BUFFER_BYTES, SPILL_FRAME_BYTES};
use crate::{Error as QueryError, Result};

pub(super) fn spill_err(p: &FsPath, source: std::io::Error) -> QueryError {
    QueryError::Spill {
        path: p.to_path_buf(),
        source,
    }
}

fn frame_err(p: &FsPath, e: impl std::error::Error + Send + Sync + 'static) -> QueryError {
    QueryError::SpillFrame {
        path: p.to_path_buf(),
        source: Box::new(e),
    }
}

// ---- Pass 2: route into spill buckets ----------------------------------------

/// The buckets' spill files and their in-memory buffers.
pub(super) struct Spill {
    dir: PathBuf,
    schema: SchemaRef,
    buffers: Vec<Vec<RecordBatch>>,
    buffered: Vec<usize>,
    total: usize,
    /// Rows routed to each bucket.
    pub(super) rows: Vec<u64>,
    /// Bytes written to spill files.
    pub(super) bytes: u64,
}

/// Spill frames: uncompressed and without dictionaries (read once, soon), but
/// an int8 `embedding` dictionary-encoded. Parquet has no 8-bit physical
/// type: plain int8 is stored as INT32, four bytes a value, and a 10⁷-row
/// int8 compaction spilled 33.8 GB for 7.5 GB of input; with its dictionary
/// (at most 256 values) a value takes one byte, as in the chip files.
fn spill_properties(schema: &SchemaRef) -> WriterProperties {
    let int8 = schema
        .field_with_name(col::EMBEDDING)
        .ok()
        .and_then(|f| embedding_type_from(f.data_type()))
        .is_some_and(|(t, _)| t == EmbeddingType::Int8);
    WriterProperties::builder()
        .set_compression(Compression::UNCOMPRESSED)
        .set_dictionary_enabled(false)
        .set_column_dictionary_enabled(embedding_column_path(), int8)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_max_row_group_row_count(None)
        .build()
}

impl Spill {
    pub(super) fn new(dir: &FsPath, schema: SchemaRef, buckets: usize) -> Spill {
        Spill {
            dir: dir.to_path_buf(),
            schema,
            buffers: vec![Vec::new(); buckets],
            buffered: vec![0; buckets],
            total: 0,
            rows: vec![0; buckets],
            bytes: 0,
        }
    }

    pub(super) fn path(&self, b: usize) -> PathBuf {
        self.dir.join(format!("bucket-{b:05}.spill"))
    }

    /// Sends each row of `batch` to its bucket.
    pub(super) fn route(&mut self, batch: RecordBatch, splits: &[Key], uri: &str) -> Result<()> {
        let batch = convert_embeddings(batch, &self.schema, uri)?;
        let batch = conform(&batch, &self.schema).map_err(|source| QueryError::Rows {
            uri: uri.to_owned(),
            source,
        })?;
        let buckets: Vec<u32> = batch_keys(&batch, uri)?
            .into_iter()
            .map(|k| bucket_of(splits, k) as u32)
            .collect();
        let Some(&first) = buckets.first() else {
            return Ok(());
        };
        if buckets.iter().all(|&b| b == first) {
            return self.push(first as usize, batch);
        }
        let mut order: Vec<u32> = (0..buckets.len() as u32).collect();
        order.sort_by_key(|&i| buckets[i as usize]);
        for run in order.chunk_by(|a, b| buckets[*a as usize] == buckets[*b as usize]) {
            let rows =
                take_record_batch(&batch, &UInt32Array::from(run.to_vec())).map_err(|source| {
                    QueryError::Rows {
                        uri: uri.to_owned(),
                        source,
                    }
                })?;
            self.push(buckets[run[0] as usize] as usize, rows)?;
        }
        Ok(())
    }

    fn push(&mut self, b: usize, batch: RecordBatch) -> Result<()> {
        let size = batch.get_array_memory_size();
        self.rows[b] += batch.num_rows() as u64;
        self.buffers[b].push(batch);
        self.buffered[b] += size;
        self.total += size;
        if self.buffered[b] >= SPILL_FRAME_BYTES {
            self.flush(b)?;
        }
        if self.total > SPILL_BUFFER_BYTES {
            let mut by_size: Vec<usize> = (0..self.buffers.len()).collect();
            by_size.sort_unstable_by_key(|&i| std::cmp::Reverse(self.buffered[i]));
            for i in by_size {
                if self.total <= SPILL_BUFFER_BYTES / 2 {
                    break;
                }
                self.flush(i)?;
            }
        }
        Ok(())
    }

    /// Appends bucket `b`'s buffer to its spill file as one frame: its length
    /// (u64, little-endian), then a Parquet file of its rows.
    fn flush(&mut self, b: usize) -> Result<()> {
        let batches = std::mem::take(&mut self.buffers[b]);
        self.total -= std::mem::take(&mut self.buffered[b]);
        if batches.is_empty() {
            return Ok(());
        }
        let props = spill_properties(&self.schema);
        let path = self.path(b);
        let mut w = ArrowWriter::try_new(Vec::new(), self.schema.clone(), Some(props))
            .map_err(|e| frame_err(&path, e))?;
        for batch in &batches {
            w.write(batch).map_err(|e| frame_err(&path, e))?;
        }
        drop(batches);
        let frame = w.into_inner().map_err(|e| frame_err(&path, e))?;
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| spill_err(&path, e))?;
        f.write_all(&(frame.len() as u64).to_le_bytes())
            .and_then(|()| f.write_all(&frame))
            .map_err(|e| spill_err(&path, e))?;
        self.bytes += 8 + frame.len() as u64;
        Ok(())
    }

    pub(super) fn flush_all(&mut self) -> Result<()> {
        (0..self.buffers.len()).try_for_each(|b| self.flush(b))
    }

    /// The rows of a spill file, frame by frame; none when it does not exist.
    /// A frame longer than what is left of the file is refused before its
    /// buffer is allocated: a corrupt length must not abort the process.
    pub(super) fn read(path: &FsPath) -> Result<Vec<RecordBatch>> {
        let f = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(spill_err(path, e)),
        };
        let mut left = f.metadata().map_err(|e| spill_err(path, e))?.len();
        let mut r = BufReader::new(f);
        let mut out = Vec::new();
        loop {
            let mut len = [0u8; 8];
            match r.read_exact(&mut len) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(spill_err(path, e)),
            }
            left = left.saturating_sub(8);
            let n = u64::from_le_bytes(len);
            if n > left {
                return Err(QueryError::SpillCorrupt {
                    path: path.to_path_buf(),
                    problem: format!("a frame of {n} bytes, but {left} bytes are left in the file"),
                });
            }
            left -= n;
            let mut frame = vec![0u8; n as usize];
            r.read_exact(&mut frame).map_err(|e| spill_err(path, e))?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(Bytes::from(frame))
                .and_then(|b| b.with_batch_size(CHIP_ROW_GROUP_ROWS).build())
                .map_err(|e| frame_err(path, e))?;
            for batch in reader {
                out.push(batch.map_err(|e| frame_err(path, e))?);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_int8_spill_takes_about_a_byte_a_value_and_reads_back_the_same() {
        use arrow_array::builder::{FixedSizeListBuilder, Int8Builder};
        use arrow_schema::{DataType, Field, Schema};
        use std::sync::Arc;
        let (rows, dim): (usize, usize) = (2000, 256);
        let item = Arc::new(Field::new("item", DataType::Int8, false));
        let schema = Arc::new(Schema::new(vec![Field::new(
            col::EMBEDDING,
            DataType::FixedSizeList(item.clone(), dim as i32),
            false,
        )]));
        assert!(embedding_type_from(schema.field(0).data_type()).is_some());
        let mut b = FixedSizeListBuilder::new(Int8Builder::new(), dim as i32).with_field(item);
        let mut x = 1u32;
        for _ in 0..rows {
            for _ in 0..dim {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                b.values().append_value((x >> 24) as i8);
            }
            b.append(true);
        }
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(b.finish())]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut spill = Spill::new(dir.path(), schema, 1);
        spill.push(0, batch.clone()).unwrap();
        spill.flush_all().unwrap();
        let values = (rows * dim) as u64;
        assert!(
            spill.bytes < values * 5 / 4,
            "{} bytes for {values} int8 values",
            spill.bytes
        );
        let back = Spill::read(&spill.path(0)).unwrap();
        let back = arrow_select::concat::concat_batches(&back[0].schema(), &back).unwrap();
        assert_eq!(back, batch);
    }

    #[test]
    fn a_frame_longer_than_the_file_is_refused_before_it_is_allocated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bucket-00000.spill");
        // A length no allocator can serve, then a few bytes.
        let mut bytes = (u64::MAX / 2).to_le_bytes().to_vec();
        bytes.extend_from_slice(b"PAR1");
        std::fs::write(&path, &bytes).unwrap();
        let err = Spill::read(&path).expect_err("a corrupt spill is an error");
        let msg = err.to_string();
        assert!(
            msg.contains("bucket-00000.spill") && msg.contains("4 bytes are left"),
            "{msg}"
        );
        assert!(matches!(err, QueryError::SpillCorrupt { .. }));
    }
}
