//! Compaction's checks around the rewrite: the flags' paths, the output it
//! may use, the source against its manifest, parts conformed to the chip
//! schema, and the files copied as they are.

use std::sync::Arc;

use arrow_array::{make_array, new_null_array, Array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow_schema::{ArrowError, DataType, Field, Fields, Schema, SchemaRef};
use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use rsembed_schemas::chip::{self, col, embedding_type_from, SCHEMA_VERSIONS};
use rsembed_schemas::chip_file::read_error_rows;
use rsembed_schemas::embedding::EmbeddingBuilder;
use rsembed_schemas::embedding::{EmbeddingType, SCALE_COLUMN};
use rsembed_schemas::job::{Manifest, ManifestFile, CENTROIDS_FILE, JOB_FILE, MANIFEST_FILE};
use rsembed_schemas::manifest::{ListedFile, FAILURES_LIST, FILES_LIST};
use rsembed_schemas::meta::FileMeta;
use rsembed_store::Location;
use sha2::{Digest, Sha256};

use crate::format::embeddings;
use crate::format::index::Index;
use crate::format::manifest::ManifestBuilder;
use crate::Error as QueryError;
use crate::Result;

pub(super) fn check_paths(src: &Location, out: &Location) -> Result<()> {
    let s = src.url.as_str().trim_end_matches('/');
    let o = out.url.as_str().trim_end_matches('/');
    if s == o {
        return Err(QueryError::flag(
            "--output",
            format!("{o} is the dataset being compacted: write the compaction elsewhere"),
        ));
    }
    for dir in ["chips", "errors"] {
        if o.starts_with(&format!("{s}/{dir}/")) || o == format!("{s}/{dir}") {
            return Err(QueryError::flag(
                "--output",
                format!(
                    "{o} is inside the source's {dir}/, where readers of the source would find it"
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses an output that holds a dataset, or (with `overwrite`) deletes it:
/// the manifest first, so no reader ever sees its old file list with new files.
pub(super) async fn prepare_output(out: &Location, overwrite: bool) -> Result<()> {
    let mut found = Vec::new();
    for f in [
        MANIFEST_FILE,
        FILES_LIST,
        FAILURES_LIST,
        JOB_FILE,
        CENTROIDS_FILE,
    ] {
        match out.store.head(&out.child(f)).await {
            Ok(_) => found.push(f.to_owned()),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut listed = Vec::new();
    for dir in ["chips", "errors"] {
        let l: Vec<_> = out.store.list(Some(&out.child(dir))).try_collect().await?;
        if !l.is_empty() {
            found.push(format!("{dir}/"));
        }
        listed.extend(l.into_iter().map(|m| m.location));
    }
    if found.is_empty() {
        return Ok(());
    }
    if !overwrite {
        return Err(QueryError::OutputRefused {
            path: out.url.to_string(),
            problem: format!(
                "already holds a dataset ({}): pass --overwrite to replace it, or pick another --output",
                found.join(", ")
            ),
        });
    }
    tracing::warn!(output = %out.url, "--overwrite: deleting the dataset there");
    for p in [
        out.child(MANIFEST_FILE),
        out.child(FILES_LIST),
        out.child(FAILURES_LIST),
        out.child(JOB_FILE),
        out.child(CENTROIDS_FILE),
    ]
    .into_iter()
    .chain(listed)
    {
        match out.store.delete(&p).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The chip schema of `version` (1, 2 or 3) for dimension `dim`,
/// embeddings stored as `ty`.
pub(crate) fn chip_schema_of(dim: usize, version: u32, ty: EmbeddingType) -> SchemaRef {
    chip::chip_schema_of(dim, version, ty).expect("a version of SCHEMA_VERSIONS")
}

/// The chip schema version and embedding type whose columns `fields` are;
/// `None` for none of them.
pub(crate) fn schema_version_of(fields: &Fields, dim: usize) -> Option<(u32, EmbeddingType)> {
    SCHEMA_VERSIONS
        .into_iter()
        .flat_map(|v| EmbeddingType::ALL.map(|t| (v, t)))
        .find(|&(v, t)| same_fields(fields, chip_schema_of(dim, v, t).fields()))
}

/// `batch` with its embeddings stored as `schema` says (converted from
/// whatever type they have; as they are when the types agree, so int8 is
/// never quantised twice). Float32 results are unit length, like a job's.
pub(super) fn convert_embeddings(
    batch: RecordBatch,
    schema: &SchemaRef,
    uri: &str,
) -> Result<RecordBatch> {
    let stored = |s: &Schema| {
        s.field_with_name(col::EMBEDDING)
            .ok()
            .and_then(|f| embedding_type_from(f.data_type()))
    };
    let (Some((to, dim)), Some((from, _))) = (stored(schema), stored(&batch.schema())) else {
        // Not an embedding conform knows: it says so.
        return Ok(batch);
    };
    if from == to {
        return Ok(batch);
    }
    let e = embeddings(&batch, dim, uri)?;
    let mut b = EmbeddingBuilder::new(to, dim, batch.num_rows());
    for i in 0..batch.num_rows() {
        b.append(&e.row(i, dim));
    }
    let (embedding, scale) = b.finish();
    let src = batch.schema();
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (f, c) in src.fields().iter().zip(batch.columns()) {
        match f.name().as_str() {
            SCALE_COLUMN => {}
            col::EMBEDDING => {
                fields.push(Arc::new(
                    f.as_ref()
                        .clone()
                        .with_data_type(embedding.data_type().clone()),
                ));
                columns.push(embedding.clone());
            }
            _ => {
                fields.push(f.clone());
                columns.push(c.clone());
            }
        }
    }
    if let Some(s) = scale {
        fields.push(Arc::new(Field::new(SCALE_COLUMN, DataType::Float32, false)));
        columns.push(s);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|source| {
        QueryError::Rows {
            uri: uri.to_owned(),
            source,
        }
    })
}

/// The source's files agree with its manifest (`chips`: its chip files, as
/// its list gives them, in the index's order) and each other; returns the
/// metadata of a file of the newest schema version among them, and that
/// version: what the compacted files are written as (a source of version 1
/// files stays version 1; one that holds a version 2 file is version 2,
/// with nulls in the new columns for the older files' rows).
pub(super) fn check_source(
    index: &Index,
    manifest: &Manifest,
    chips: &[ManifestFile],
) -> Result<(FileMeta, u32, EmbeddingType)> {
    let mut meta: Option<(&FileMeta, u32, EmbeddingType)> = None;
    for (part, entry) in index.parts.iter().zip(chips) {
        if part.rows() != entry.rows {
            return Err(QueryError::dataset(
                &part.uri,
                format!(
                    "{} rows, but the manifest says {}: the dataset changed since it was finalized",
                    part.rows(),
                    entry.rows
                ),
            ));
        }
        let fields = super::lists::without_list(part.schema.fields());
        let Some((version, ty)) = schema_version_of(&fields, index.embed_dim) else {
            return Err(QueryError::dataset(
                &part.uri,
                format!(
                    "its columns are not the chip schema, version 1, 2 or 3: {:?}",
                    part.schema.fields()
                ),
            ));
        };
        let m = part.file_meta.as_ref().ok_or_else(|| {
            QueryError::dataset(&part.uri, "no `rsembed` metadata: not a chip file of a job")
        })?;
        if m.job_id != manifest.job_id {
            return Err(QueryError::dataset(
                &part.uri,
                format!(
                    "written by job {}, but the manifest is job {}'s",
                    m.job_id, manifest.job_id
                ),
            ));
        }
        if meta.is_none_or(|(_, v, _)| v < version) {
            meta = Some((m, version, ty));
        }
    }
    let (m, version, ty) = meta.expect("an opened index has a part: this is a bug");
    Ok((m.clone(), version, ty))
}

/// Whether two lists of fields are the same logical columns: names, types and
/// order, aside from the names of list items and from metadata. A file that
/// PyArrow rewrote names its list items `element` where arrow-rs writes
/// `item`, and holds the same data.
pub(super) fn same_fields(a: &Fields, b: &Fields) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b.iter())
            .all(|(x, y)| x.name() == y.name() && same_type(x.data_type(), y.data_type()))
}

fn same_type(a: &DataType, b: &DataType) -> bool {
    match (a, b) {
        (DataType::List(x), DataType::List(y))
        | (DataType::LargeList(x), DataType::LargeList(y)) => {
            same_type(x.data_type(), y.data_type())
        }
        (DataType::FixedSizeList(x, n), DataType::FixedSizeList(y, m)) => {
            n == m && same_type(x.data_type(), y.data_type())
        }
        (DataType::Struct(x), DataType::Struct(y)) => same_fields(x, y),
        _ => a == b,
    }
}

/// `batch` with the columns typed exactly as `schema` says, for columns of
/// the same logical type ([`same_fields`]): only the list item names change.
/// Columns are taken by name; a nullable column the batch lacks (a file of
/// an older schema version) is all nulls.
pub(super) fn conform(
    batch: &RecordBatch,
    schema: &SchemaRef,
) -> std::result::Result<RecordBatch, ArrowError> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            let Some(c) = batch.column_by_name(f.name()) else {
                if !f.is_nullable() {
                    return Err(ArrowError::SchemaError(format!(
                        "no column `{}`, which the chip schema requires",
                        f.name()
                    )));
                }
                return Ok(new_null_array(f.data_type(), batch.num_rows()));
            };
            if c.data_type() == f.data_type() {
                return Ok(c.clone());
            }
            let data = c
                .to_data()
                .into_builder()
                .data_type(f.data_type().clone())
                .build()?;
            Ok(make_array(data))
        })
        .collect::<std::result::Result<Vec<ArrayRef>, ArrowError>>()?;
    RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )
}

pub(super) fn duplicate(src: &Location, id: u128) -> QueryError {
    QueryError::dataset(
        &src.url,
        format!(
            "chip_id {id:032x} is in it more than once (find its copies with \
             `SELECT filename, * FROM read_parquet('{}/chips/*.parquet', filename=true) \
             WHERE chip_id = '{id:032x}'`): a dataset must hold each chip once",
            src.url.as_str().trim_end_matches('/')
        ),
    )
}

/// Copies `job.json` and the error files of the source (`errors`, from its
/// list), checking the latter against the list, and gives `builder` each
/// error file and the failed inputs it holds.
pub(super) async fn copy_rest(
    src: &Location,
    out: &Location,
    errors: &[ListedFile],
    builder: &mut ManifestBuilder,
) -> Result<()> {
    match src.store.get(&src.child(JOB_FILE)).await {
        Ok(g) => {
            let bytes = g.bytes().await?;
            out.store
                .put(&out.child(JOB_FILE), PutPayload::from(bytes))
                .await?;
        }
        Err(object_store::Error::NotFound { .. }) => {
            tracing::warn!(source = %src.url, "the source has no {JOB_FILE}; the output has none either");
        }
        Err(e) => return Err(e.into()),
    }
    for e in errors {
        let f = &e.file;
        let bytes = src.store.get(&src.child(&f.path)).await?.bytes().await?;
        let sha = hex::encode(Sha256::digest(&bytes));
        if sha != f.sha256 {
            return Err(QueryError::dataset(
                format!("{}/{}", src.url.as_str().trim_end_matches('/'), f.path),
                format!(
                    "sha256 {sha}, but the manifest says {}: the dataset changed since it was finalized",
                    f.sha256
                ),
            ));
        }
        let failed = read_error_rows(bytes.clone(), usize::MAX)?;
        out.store
            .put(&out.child(&f.path), PutPayload::from(bytes))
            .await?;
        builder.errors_file(&e.task_id, f).await?;
        for row in &failed {
            builder.failure(Some(&e.task_id), row).await?;
        }
    }
    Ok(())
}
