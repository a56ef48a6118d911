//! GeoParquet files: encoding chip and error files with their file metadata,
//! and reading back what the coordinator needs from them.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use rsembed_schemas::chip::{col as chip_col, embedding_type_from};
use rsembed_schemas::embedding::EmbeddingType;
use rsembed_schemas::meta::{geo_metadata, FileMeta, GEO_KEY, RSEMBED_KEY};

use crate::error::Result;

/// Rows per row group of a chip file. A row group is the unit that readers
/// prune with the `bbox` and `centre_*` statistics and that a scan decodes at
/// once: 8192 rows is 32 MiB of embeddings at D = 1024, large enough for
/// sequential reads, small enough that a bbox filter on a Hilbert-sorted
/// (compacted) file skips most of it.
pub const CHIP_ROW_GROUP_ROWS: usize = 8192;

/// Rows per data page of every column but the embedding. A search reads its
/// hits' other columns (id, footprint, source...) back with a row selection,
/// and Parquet decompresses whole pages: with one page per column chunk,
/// every hit cost decompressing its whole row group's footprints and ids.
/// Pages of 256 rows cut that to the hits' pages (the reader skips the
/// others from their headers, no offset index needed) for 3.3 bytes of page
/// headers and lost compression a row (10⁶ rows of D = 768, 0.1 % of the
/// file; docs/benchmarks.md). The embedding keeps size-limited pages: the
/// scan reads all of it.
pub const CHIP_PAGE_ROWS: usize = 256;

/// Writer settings for chip files (see [`CHIP_ROW_GROUP_ROWS`]).
///
/// Statistics are kept where a filter can use them (ids, windows, `bbox`,
/// `centre_*`) and dropped where min/max mean nothing: the WKB bytes and the
/// embedding. The embedding's floats are stored plain and uncompressed: zstd
/// saves only 7 % on unit float32 vectors, and decompressing them was half of
/// a search's time, in rsembed and in DuckDB alike (docs/benchmarks.md); no
/// dictionary attempt either, which always fails on them and costs a copy of
/// every page.
pub fn chip_writer_properties(kv: Vec<KeyValue>) -> Result<WriterProperties> {
    chip_writer_properties_for(kv, EmbeddingType::F32)
}

/// The Parquet leaf of the `embedding` column (a list of values), for
/// per-column writer settings.
pub fn embedding_column_path() -> ColumnPath {
    ColumnPath::new(vec![
        chip_col::EMBEDDING.to_owned(),
        "list".to_owned(),
        "item".to_owned(),
    ])
}

/// [`chip_writer_properties`] for embeddings stored as `ty`.
///
/// int8 elements are dictionary-encoded: Parquet stores INT8 as INT32, 4 bytes
/// a value plain, but a dictionary of at most 255 values makes each an 8-bit
/// index, 1 byte, still uncompressed (zstd would save another 9 % at the cost
/// that made f32 uncompressed; docs/benchmarks.md). f16 is plain like f32.
pub fn chip_writer_properties_for(
    kv: Vec<KeyValue>,
    ty: EmbeddingType,
) -> Result<WriterProperties> {
    let embedding = embedding_column_path();
    let geometry = ColumnPath::new(vec![chip_col::GEOMETRY.to_owned()]);
    Ok(WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_max_row_group_row_count(Some(CHIP_ROW_GROUP_ROWS))
        .set_data_page_row_count_limit(CHIP_PAGE_ROWS)
        .set_write_batch_size(CHIP_PAGE_ROWS)
        .set_column_data_page_row_count_limit(embedding.clone(), usize::MAX)
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_column_statistics_enabled(embedding.clone(), EnabledStatistics::None)
        .set_column_compression(embedding.clone(), Compression::UNCOMPRESSED)
        .set_column_dictionary_enabled(embedding.clone(), ty == EmbeddingType::Int8)
        .set_column_encoding(embedding, Encoding::PLAIN)
        .set_column_statistics_enabled(geometry.clone(), EnabledStatistics::None)
        .set_column_dictionary_enabled(geometry, false)
        .set_key_value_metadata(Some(kv))
        .build())
}

/// Encodes one record batch of chip rows as a chip file (the writer
/// settings of its embedding type).
pub fn encode_chips(batch: &RecordBatch, kv: Vec<KeyValue>) -> Result<Vec<u8>> {
    let ty = batch
        .schema()
        .field_with_name(chip_col::EMBEDDING)
        .ok()
        .and_then(|f| embedding_type_from(f.data_type()))
        .map_or(EmbeddingType::F32, |(t, _)| t);
    encode_with(batch, chip_writer_properties_for(kv, ty)?)
}

/// Encodes one record batch as a Parquet file with the given key-value metadata.
pub fn encode(batch: &RecordBatch, kv: Vec<KeyValue>) -> Result<Vec<u8>> {
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_key_value_metadata(Some(kv))
        .build();
    encode_with(batch, props)
}

fn encode_with(batch: &RecordBatch, props: WriterProperties) -> Result<Vec<u8>> {
    let schema = schema_with_file_metadata(&batch.schema(), &props);
    let batch = batch.clone().with_schema(schema.clone())?;
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, schema, Some(props))?;
    w.write(&batch)?;
    w.close()?;
    Ok(buf)
}

/// `schema` with the writer's key-value metadata (`geo`, `rsembed`) in its
/// own metadata too. Arrow C++ (so PyArrow and GeoPandas) takes a file's
/// schema metadata only from the embedded `ARROW:schema` when there is one
/// and ignores the Parquet key-value list: without this, GeoPandas finds no
/// `geo` and refuses the file. parquet-rs writes each key once either way.
pub fn schema_with_file_metadata(schema: &SchemaRef, props: &WriterProperties) -> SchemaRef {
    let mut md = schema.metadata().clone();
    for kv in props.key_value_metadata().into_iter().flatten() {
        if let Some(v) = &kv.value {
            md.insert(kv.key.clone(), v.clone());
        }
    }
    Arc::new(schema.as_ref().clone().with_metadata(md))
}

/// The key-value metadata of a chip file: `geo` and `rsembed`.
pub fn chip_file_metadata(meta: &FileMeta, extent: Option<[f64; 4]>) -> Result<Vec<KeyValue>> {
    Ok(vec![
        KeyValue::new(GEO_KEY.to_owned(), geo_metadata(extent).to_string()),
        KeyValue::new(RSEMBED_KEY.to_owned(), serde_json::to_string(meta)?),
    ])
}

/// The key-value metadata of an error file: `rsembed` only (it has no geometry).
pub(crate) fn error_file_metadata(meta: &FileMeta) -> Result<Vec<KeyValue>> {
    Ok(vec![KeyValue::new(
        RSEMBED_KEY.to_owned(),
        serde_json::to_string(meta)?,
    )])
}

/// Key of a chip file's footer metadata listing the task's inputs that gave
/// neither a chip nor an error row (JSON array of URIs, at most
/// [`EMPTY_INPUTS_KEPT`]), so a resumed run still reports them.
pub const EMPTY_INPUTS_KEY: &str = "rsembed.empty_inputs";

/// How many empty inputs one chip file lists.
pub const EMPTY_INPUTS_KEPT: usize = 1000;

/// The metadata entry listing `empty` inputs; `None` when there are none.
pub(crate) fn empty_inputs_entry(empty: &[String]) -> Result<Option<KeyValue>> {
    if empty.is_empty() {
        return Ok(None);
    }
    let kept = &empty[..empty.len().min(EMPTY_INPUTS_KEPT)];
    Ok(Some(KeyValue::new(
        EMPTY_INPUTS_KEY.to_owned(),
        serde_json::to_string(kept)?,
    )))
}

/// The empty inputs a chip file lists (see [`EMPTY_INPUTS_KEY`]); none when
/// the file has no such entry or it does not parse.
pub fn empty_inputs_of(bytes: &bytes::Bytes) -> Vec<String> {
    let Ok(reader) = parquet::file::serialized_reader::SerializedFileReader::new(bytes.clone())
    else {
        return Vec::new();
    };
    parquet::file::reader::FileReader::metadata(&reader)
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|e| e.key == EMPTY_INPUTS_KEY))
        .and_then(|e| e.value.as_deref())
        .and_then(|v| serde_json::from_str::<Vec<String>>(v).ok())
        .map(|mut v| {
            v.truncate(EMPTY_INPUTS_KEPT);
            v
        })
        .unwrap_or_default()
}

/// The rows of an error file (`source_uri`, `stage`, `error`), at most `limit`.
pub fn read_error_rows(
    bytes: bytes::Bytes,
    limit: usize,
) -> Result<Vec<rsembed_schemas::job::ManifestFailure>> {
    use arrow_array::{Array, StringArray};
    let reader =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch?;
        let col = |name: &str| -> Result<StringArray> {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<StringArray>().cloned())
                .ok_or_else(|| {
                    crate::Error::Parquet(parquet::errors::ParquetError::General(format!(
                        "error file has no string column `{name}`"
                    )))
                })
        };
        let (uri, stage, error) = (col("source_uri")?, col("stage")?, col("error")?);
        for i in 0..batch.num_rows() {
            if out.len() >= limit {
                return Ok(out);
            }
            let get = |a: &StringArray| {
                if a.is_null(i) {
                    String::new()
                } else {
                    a.value(i).to_owned()
                }
            };
            out.push(rsembed_schemas::job::ManifestFailure {
                source_uri: get(&uri),
                stage: get(&stage),
                error: get(&error),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use parquet::column::page::Page;
    use parquet::file::reader::FileReader;
    use parquet::file::serialized_reader::SerializedFileReader;
    use rsembed_schemas::ids::Window;

    use super::*;
    use crate::sink::rows::{chip_batch, ChipRow};

    /// Rows of every data page of each leaf column of row group 0.
    fn page_rows(file: Vec<u8>) -> Vec<(String, Vec<u32>)> {
        let reader = SerializedFileReader::new(Bytes::from(file)).unwrap();
        let group = reader.get_row_group(0).unwrap();
        let columns = group.metadata().columns().to_vec();
        columns
            .iter()
            .enumerate()
            .map(|(c, meta)| {
                let mut pages = group.get_column_page_reader(c).unwrap();
                let mut rows = Vec::new();
                while let Some(page) = pages.get_next_page().unwrap() {
                    match page {
                        Page::DataPage { num_values, .. } => rows.push(num_values),
                        Page::DataPageV2 { num_rows, .. } => rows.push(num_rows),
                        Page::DictionaryPage { .. } => {}
                    }
                }
                (meta.column_path().string(), rows)
            })
            .collect()
    }

    #[test]
    fn answer_columns_are_paged_by_rows_and_the_embedding_by_size() {
        let n = 1000;
        let rows: Vec<ChipRow> = (0..n)
            .map(|i| ChipRow {
                chip_id: format!("{i:032x}"),
                source_uri: format!("file:///x/{}.tif", i / 300),
                source_version: Some("1".into()),
                window: Window {
                    x: i * 8,
                    y: 0,
                    width: 8,
                    height: 8,
                },
                valid_fraction: 1.0,
                crs: Some("EPSG:4326".into()),
                footprint: None,
                embedding: vec![0.5; 16],
                stac: Default::default(),
            })
            .collect();
        for ty in [EmbeddingType::F32, EmbeddingType::Int8] {
            let batch = chip_batch(&rows, 16, ty).unwrap();
            let columns = page_rows(encode_chips(&batch, Vec::new()).unwrap());
            for (path, pages) in &columns {
                if path.starts_with(chip_col::EMBEDDING) && !path.ends_with("scale") {
                    // 16 values a row: one page of 16,000 values, far under 1 MiB.
                    assert_eq!(pages, &[16 * n as u32], "{path}");
                } else {
                    let n = n as usize;
                    assert_eq!(pages.len(), n.div_ceil(CHIP_PAGE_ROWS), "{path}: {pages:?}");
                    assert!(
                        pages.iter().all(|&r| r as usize <= CHIP_PAGE_ROWS),
                        "{path}: {pages:?}"
                    );
                    assert_eq!(pages.iter().sum::<u32>() as usize, n, "{path}");
                }
            }
        }
    }
}
