//! A chip file as it is written, once for every writer (and its error
//! file's rows as they are read back): the worker's sink,
//! `compact` and the query side's outputs (`classify`). Its row schema is
//! [`crate::chip`]'s; here are its Parquet writer settings and its file
//! metadata.

pub mod rows;

use std::sync::Arc;

use arrow_schema::SchemaRef;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::chip::col;
use crate::embedding::EmbeddingType;
use crate::meta::{geo_metadata, FileMeta, GEO_KEY, RSEMBED_KEY};

/// Rows per row group of a chip file. A row group is the unit that readers
/// prune with the `bbox` and `centre_*` statistics and that a scan decodes at
/// once: 8192 rows is 32 MiB of embeddings at D = 1024, large enough for
/// sequential reads, small enough that a bbox filter on a Hilbert-sorted
/// (compacted) file skips most of it.
pub const CHIP_ROW_GROUP_ROWS: usize = 8192;

/// The Parquet leaf of the `embedding` column (a list of values), for
/// per-column writer settings.
pub fn embedding_column_path() -> ColumnPath {
    ColumnPath::new(vec![
        col::EMBEDDING.to_owned(),
        "list".to_owned(),
        "item".to_owned(),
    ])
}

/// Writer settings for chip files whose embeddings are stored as `ty` (see
/// [`CHIP_ROW_GROUP_ROWS`]), with the key-value metadata `kv`.
///
/// Statistics are kept where a filter can use them (ids, windows, `bbox`,
/// `centre_*`) and dropped where min/max mean nothing: the WKB bytes and the
/// embedding. The embedding's floats are stored plain and uncompressed: zstd
/// saves only 7 % on unit float32 vectors, and decompressing them was half of
/// a search's time, in rsembed and in DuckDB alike (docs/benchmarks.md); no
/// dictionary attempt either, which always fails on them and costs a copy of
/// every page.
///
/// int8 elements are dictionary-encoded: Parquet stores INT8 as INT32, 4 bytes
/// a value plain, but a dictionary of at most 255 values makes each an 8-bit
/// index, 1 byte, still uncompressed (zstd would save another 9 % at the cost
/// that made f32 uncompressed; docs/benchmarks.md). f16 is plain like f32.
pub fn chip_writer_properties(kv: Vec<KeyValue>, ty: EmbeddingType) -> WriterProperties {
    let embedding = embedding_column_path();
    let geometry = ColumnPath::new(vec![col::GEOMETRY.to_owned()]);
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(zstd_3()))
        .set_max_row_group_row_count(Some(CHIP_ROW_GROUP_ROWS))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_column_statistics_enabled(embedding.clone(), EnabledStatistics::None)
        .set_column_compression(embedding.clone(), Compression::UNCOMPRESSED)
        .set_column_dictionary_enabled(embedding.clone(), ty == EmbeddingType::Int8)
        .set_column_encoding(embedding, Encoding::PLAIN)
        .set_column_statistics_enabled(geometry.clone(), EnabledStatistics::None)
        .set_column_dictionary_enabled(geometry, false)
        .set_key_value_metadata(Some(kv))
        .build()
}

/// zstd at level 3, the level of every compressed column rsembed writes.
pub fn zstd_3() -> ZstdLevel {
    ZstdLevel::try_new(3).expect("zstd level 3 is in range")
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
pub fn chip_file_metadata(
    meta: &FileMeta,
    extent: Option<[f64; 4]>,
) -> Result<Vec<KeyValue>, serde_json::Error> {
    Ok(vec![
        KeyValue::new(GEO_KEY.to_owned(), geo_metadata(extent).to_string()),
        KeyValue::new(RSEMBED_KEY.to_owned(), serde_json::to_string(meta)?),
    ])
}

/// The rows of an error file (`source_uri`, `stage`, `error`), at most `limit`.
pub fn read_error_rows(
    bytes: bytes::Bytes,
    limit: usize,
) -> Result<Vec<crate::job::ManifestFailure>, parquet::errors::ParquetError> {
    use arrow_array::{Array, StringArray};
    let reader =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch?;
        let col = |name: &str| -> Result<StringArray, parquet::errors::ParquetError> {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<StringArray>().cloned())
                .ok_or_else(|| {
                    parquet::errors::ParquetError::General(format!(
                        "error file has no string column `{name}`"
                    ))
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
            out.push(crate::job::ManifestFailure {
                source_uri: get(&uri),
                stage: get(&stage),
                error: get(&error),
            });
        }
    }
    Ok(out)
}
