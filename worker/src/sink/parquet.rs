//! GeoParquet files: encoding chip and error files with their file metadata,
//! and reading back what the coordinator needs from them.

use arrow_array::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use rsembed_schemas::chip::{col as chip_col, embedding_type_from};
use rsembed_schemas::embedding::EmbeddingType;
use rsembed_schemas::meta::{FileMeta, RSEMBED_KEY};

use crate::error::Result;

use rsembed_schemas::chip_file::{self, schema_with_file_metadata};

/// [`rsembed_schemas::chip_file::chip_writer_properties`] of float32 embeddings.
pub fn chip_writer_properties(kv: Vec<KeyValue>) -> Result<WriterProperties> {
    chip_writer_properties_for(kv, EmbeddingType::F32)
}

/// [`rsembed_schemas::chip_file::chip_writer_properties`] of embeddings stored as `ty`.
pub fn chip_writer_properties_for(
    kv: Vec<KeyValue>,
    ty: EmbeddingType,
) -> Result<WriterProperties> {
    Ok(rsembed_schemas::chip_file::chip_writer_properties(kv, ty))
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

/// The key-value metadata of a chip file: `geo` and `rsembed`.
pub fn chip_file_metadata(meta: &FileMeta, extent: Option<[f64; 4]>) -> Result<Vec<KeyValue>> {
    Ok(chip_file::chip_file_metadata(meta, extent)?)
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

/// The empty inputs the chip file at `rel` lists, reading its footer only
/// (`finalize` lists them for the few tasks whose record counts some).
pub async fn empty_inputs_at(root: &crate::store::Location, rel: &str) -> Result<Vec<String>> {
    use object_store::ObjectStoreExt;
    use parquet::errors::ParquetError;
    use parquet::file::metadata::ParquetMetaDataReader;
    let path = root.child(rel);
    let size = root.store.head(&path).await?.size;
    // Footers of chip files are a few KiB: one request, a second when not.
    let mut want = size.min(64 * 1024);
    let meta = loop {
        let tail = root.store.get_range(&path, size - want..size).await?;
        let mut r = ParquetMetaDataReader::new();
        match r.try_parse_sized(&tail, size) {
            Ok(()) => break r.finish()?,
            Err(ParquetError::NeedMoreData(n)) if (n as u64) > want && (n as u64) <= size => {
                want = n as u64
            }
            Err(e) => return Err(e.into()),
        }
    };
    Ok(empty_inputs_in(meta.file_metadata()))
}

/// The empty inputs a chip file lists (see [`EMPTY_INPUTS_KEY`]); none when
/// the file has no such entry or it does not parse.
pub fn empty_inputs_of(bytes: &bytes::Bytes) -> Vec<String> {
    let Ok(reader) = parquet::file::serialized_reader::SerializedFileReader::new(bytes.clone())
    else {
        return Vec::new();
    };
    empty_inputs_in(parquet::file::reader::FileReader::metadata(&reader).file_metadata())
}

/// The empty inputs a footer's [`EMPTY_INPUTS_KEY`] entry lists.
fn empty_inputs_in(meta: &parquet::file::metadata::FileMetaData) -> Vec<String> {
    meta.key_value_metadata()
        .and_then(|kv| kv.iter().find(|e| e.key == EMPTY_INPUTS_KEY))
        .and_then(|e| e.value.as_deref())
        .and_then(|v| serde_json::from_str::<Vec<String>>(v).ok())
        .map(|mut v| {
            v.truncate(EMPTY_INPUTS_KEPT);
            v
        })
        .unwrap_or_default()
}
