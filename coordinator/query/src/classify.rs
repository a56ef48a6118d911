//! `rsembed classify`: zero-shot labels for every chip of an index.
//!
//! Each label becomes a text through the template and is embedded once;
//! every chip's embedding is scored against all of them, and the best
//! `--top` labels (by SigLIP score, which orders as the cosine does) are
//! kept. The output is one Parquet file keyed by `chip_id`, written as a
//! stream (one row group per row group of the index, in index order) with
//! an object-store multipart upload: memory stays a few row groups whatever
//! the index size, and a failed run leaves no partial file.
//!
//! Output columns: `chip_id`, the best `label` with its `score` and
//! `cosine`, and `top_labels`, a list of {label, score, cosine}, best
//! first. Scores are SigLIP's independent sigmoids, not a softmax: they do
//! not sum to one, and every label may be unlikely.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::builder::{Float32Builder, ListBuilder, StringBuilder, StructBuilder};
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow_schema::{ArrowError, DataType, Field, Fields, Schema, SchemaRef};
use clap::Args;
use futures::StreamExt;
use parquet::arrow::AsyncArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use rsembed_schemas::chip::col;
use rsembed_store::StoreCache;
use serde_json::json;

use crate::format::embeddings;
use crate::format::footer::FOOTER_BUDGET_GROUPS;
use crate::format::index::{GroupRef, Index};
use crate::io::{check_output_file, AtomicUpload};
use crate::kernels::{dots, sigmoid_score};
use crate::scan::{default_concurrency, scan_groups};
use crate::search::check_model;
use crate::text::{self, TextModel};
use crate::{Error, Error as QueryError, Result};

/// Labels one run may have: each is a text-graph input and a dot product per chip.
const MAX_LABELS: usize = 100_000;

/// `rsembed classify`.
#[derive(Debug, Clone, Args)]
pub struct ClassifyArgs {
    /// The dataset (as for `search`).
    #[arg(long, env = "RSEMBED_INDEX")]
    pub index: String,
    /// Labels, one per line (blank lines and lines starting with `#` are skipped).
    #[arg(long, env = "RSEMBED_LABELS")]
    pub labels: PathBuf,
    /// Prompt template; `{}` is replaced by the label (e.g. "a satellite image of {}").
    #[arg(long, env = "RSEMBED_TEMPLATE", default_value = "{}")]
    pub template: String,
    /// Labels kept per chip, best first (at least 1).
    #[arg(long, env = "RSEMBED_TOP", default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub top: usize,
    /// The output Parquet file (local path or object store URL).
    #[arg(long, env = "RSEMBED_OUTPUT")]
    pub output: String,
    /// Replace the file at `--output` when there is one; without it an
    /// existing file is refused.
    #[arg(long, env = "RSEMBED_OVERWRITE")]
    pub overwrite: bool,
    /// Row groups scored at once. Default: twice the number of cores.
    #[arg(long, env = "RSEMBED_SCAN_CONCURRENCY")]
    pub concurrency: Option<usize>,
    /// Print the summary as JSON.
    #[arg(long, env = "RSEMBED_JSON")]
    pub json: bool,
}

/// What a classification wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClassifySummary {
    /// The output file.
    pub(crate) output: String,
    /// Chips labelled (every chip of the index).
    pub(crate) rows: u64,
    /// Labels scored.
    pub(crate) labels: usize,
    /// How many chips got each label as their best, most frequent first.
    pub(crate) best_counts: Vec<(String, u64)>,
    /// Seconds.
    pub(crate) seconds: f64,
}

impl ClassifySummary {
    /// The summary for a terminal.
    pub fn render(&self) -> String {
        let mut s = format!(
            "rsembed classify: {} chips, {} labels, {:.1} s\n  output          {}\n  best label counts\n",
            self.rows, self.labels, self.seconds, self.output
        );
        for (l, n) in self.best_counts.iter().take(10) {
            s.push_str(&format!("    {n:>10}  {l}\n"));
        }
        s
    }
}

/// The labels of a labels file: one per line, trimmed; blank lines and
/// `#` comments skipped; duplicates refused (their scores would be equal and
/// their order arbitrary).
pub(crate) fn read_labels(text: &str) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        if !seen.insert(l.to_owned()) {
            return Err(QueryError::flag(
                "--labels",
                format!("line {}: `{l}` is given twice", i + 1),
            ));
        }
        out.push(l.to_owned());
        if out.len() > MAX_LABELS {
            return Err(Error::Usage(format!(
                "--labels: more than {MAX_LABELS} labels"
            )));
        }
    }
    if out.is_empty() {
        return Err(Error::Usage("--labels: the file has no labels".into()));
    }
    Ok(out)
}

/// The text a label is embedded as.
pub(crate) fn apply_template(template: &str, label: &str) -> String {
    template.replace("{}", label)
}

fn output_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(col::CHIP_ID, DataType::Utf8, false),
        Field::new("label", DataType::Utf8, false),
        Field::new("score", DataType::Float32, false),
        Field::new("cosine", DataType::Float32, false),
        Field::new(
            "top_labels",
            DataType::List(Arc::new(Field::new(
                "item",
                DataType::Struct(top_fields()),
                false,
            ))),
            false,
        ),
    ]))
}

fn top_fields() -> Fields {
    Fields::from(vec![
        Field::new("label", DataType::Utf8, false),
        Field::new("score", DataType::Float32, false),
        Field::new("cosine", DataType::Float32, false),
    ])
}

/// Labels every chip of `args.index` and writes `args.output`.
pub async fn classify(args: ClassifyArgs, model: &dyn TextModel) -> Result<ClassifySummary> {
    let t0 = Instant::now();
    if !args.template.contains("{}") {
        return Err(QueryError::flag(
            "--template",
            format!("`{}` has no `{{}}` for the label", args.template),
        ));
    }
    if args.top == 0 {
        return Err(QueryError::flag("--top", "must be at least 1"));
    }
    let text = std::fs::read_to_string(&args.labels).map_err(|e| QueryError::FlagFile {
        flag: "--labels",
        path: args.labels.clone(),
        source: Box::new(e),
    })?;
    let labels = read_labels(&text)?;
    let stores = StoreCache::default();
    let out_loc = stores.location(&args.output)?;
    check_output_file(&out_loc, args.overwrite).await?;
    let index = Arc::new(Index::open(&stores, &args.index, FOOTER_BUDGET_GROUPS).await?);
    check_model(&index, model)?;
    let dim = index.embed_dim;
    let prompts: Vec<String> = labels
        .iter()
        .map(|l| apply_template(&args.template, l))
        .collect();
    let label_rows: Vec<f32> = text::embed(model, &prompts)?
        .into_iter()
        .flatten()
        .collect();

    let (scale, bias) = (model.manifest().logit_scale, model.manifest().logit_bias);
    let kv = vec![KeyValue::new(
        "rsembed".to_owned(),
        json!({
            "kind": "zero-shot labels",
            "schema_version": 1,
            "index": index.root.url.as_str(),
            "job_id": index.manifest.as_ref().map(|m| m.job_id.clone()),
            "model_name": model.manifest().name,
            "model_sha256": index.model().map(|(_, s)| s.to_owned()),
            "template": args.template,
            "labels": labels,
            "top": args.top,
            "logit_scale": scale,
            "logit_bias": bias,
            "software_version": rsembed_schemas::SOFTWARE_VERSION,
        })
        .to_string(),
    )];
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).map_err(parquet_err)?,
        ))
        .set_key_value_metadata(Some(kv))
        .build();
    // In the Arrow schema too, where PyArrow looks.
    let schema = rsembed_schemas::chip_file::schema_with_file_metadata(&output_schema(), &props);
    let sink = AtomicUpload::new(&out_loc.store, out_loc.prefix.clone(), 8);
    let mut writer = AsyncArrowWriter::try_new(sink, schema.clone(), Some(props)).map_err(|e| {
        QueryError::Write {
            path: out_loc.url.to_string(),
            source: Box::new(e),
        }
    })?;

    let (groups, _) = index.row_groups(None);
    let labels = Arc::new(labels);
    let label_rows = Arc::new(label_rows);
    let uris: Arc<Vec<String>> = Arc::new(index.parts.iter().map(|p| p.uri.clone()).collect());
    let top = args.top.min(labels.len());
    let fold_labels = labels.clone();
    let fold_schema = schema.clone();
    let mut scan = Box::pin(scan_groups(
        index.clone(),
        groups,
        vec![col::CHIP_ID, col::EMBEDDING],
        Vec::new(),
        args.concurrency.unwrap_or_else(default_concurrency),
        Vec::<RecordBatch>::new,
        move |acc: &mut Vec<RecordBatch>, g: GroupRef, _offset, batch: &RecordBatch| {
            let rows = embeddings(batch, dim, &uris[g.part])?.unit_rows(dim);
            let ids = batch
                .column_by_name(col::CHIP_ID)
                .and_then(|c| c.as_any().downcast_ref::<StringArray>())
                .ok_or_else(|| QueryError::column(&uris[g.part], col::CHIP_ID, "a string"))?;
            acc.push(
                label_batch(
                    &fold_schema,
                    ids,
                    &rows,
                    dim,
                    &label_rows,
                    &fold_labels,
                    top,
                    (scale, bias),
                )
                .map_err(|source| QueryError::Rows {
                    uri: uris[g.part].clone(),
                    source,
                })?,
            );
            Ok::<(), crate::Error>(())
        },
    ));
    let mut best = vec![0u64; labels.len()];
    let index_of: std::collections::HashMap<&str, usize> = labels
        .iter()
        .enumerate()
        .map(|(i, l)| (l.as_str(), i))
        .collect();
    let write_err = |e: parquet::errors::ParquetError| QueryError::Write {
        path: out_loc.url.to_string(),
        source: Box::new(e),
    };
    let written: Result<u64> = async {
        let mut rows = 0u64;
        while let Some(r) = scan.next().await {
            let (_, batches) = r?;
            for b in batches {
                rows += b.num_rows() as u64;
                let l = b
                    .column(1)
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .expect("label column is utf8");
                for i in 0..l.len() {
                    best[index_of[l.value(i)]] += 1;
                }
                writer.write(&b).await.map_err(write_err)?;
            }
            // One row group per index row group keeps the output's order and
            // its writer's buffer bounded.
            writer.flush().await.map_err(write_err)?;
        }
        writer.finish().await.map_err(write_err)?;
        Ok(rows)
    }
    .await;
    // A failed run leaves no partial file.
    let rows = match written {
        Ok(rows) => rows,
        Err(e) => {
            writer.into_inner().abort().await;
            return Err(e);
        }
    };
    if rows != index.rows() {
        return Err(QueryError::Incomplete {
            path: out_loc.url.to_string(),
            problem: format!("wrote {rows} rows but the index has {}", index.rows()),
        });
    }
    let mut best_counts: Vec<(String, u64)> = labels
        .iter()
        .cloned()
        .zip(best)
        .filter(|(_, n)| *n > 0)
        .collect();
    best_counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(ClassifySummary {
        output: out_loc.url.to_string(),
        rows,
        labels: labels.len(),
        best_counts,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

fn parquet_err(e: parquet::errors::ParquetError) -> Error {
    Error::Parquet(e)
}

/// The output rows of one batch of chips.
#[allow(clippy::too_many_arguments)]
fn label_batch(
    schema: &SchemaRef,
    ids: &StringArray,
    rows: &[f32],
    dim: usize,
    label_rows: &[f32],
    labels: &[String],
    top: usize,
    (scale, bias): (f64, f64),
) -> std::result::Result<RecordBatch, ArrowError> {
    let n = ids.len();
    let nl = labels.len();
    let mut chip_id = StringBuilder::with_capacity(n, n * 32);
    let mut label = StringBuilder::new();
    let mut score = Float32Builder::with_capacity(n);
    let mut cosine = Float32Builder::with_capacity(n);
    let mut list = ListBuilder::new(StructBuilder::from_fields(top_fields(), n * top)).with_field(
        Arc::new(Field::new("item", DataType::Struct(top_fields()), false)),
    );
    let mut cos = vec![0f32; nl];
    let mut order: Vec<usize> = Vec::with_capacity(nl);
    for (i, row) in rows.chunks_exact(dim).take(n).enumerate() {
        // Label-major: one dot per label of this chip.
        dots(label_rows, dim, row, &mut cos);
        order.clear();
        order.extend(0..nl);
        let by = |a: &usize, b: &usize| cos[*b].total_cmp(&cos[*a]).then(a.cmp(b));
        if top < nl {
            order.select_nth_unstable_by(top - 1, by);
            order.truncate(top);
        }
        order.sort_by(by);
        chip_id.append_value(ids.value(i));
        let b = order[0];
        label.append_value(&labels[b]);
        score.append_value(sigmoid_score(cos[b], scale, bias) as f32);
        cosine.append_value(cos[b]);
        let s = list.values();
        for &j in &order {
            s.field_builder::<StringBuilder>(0)
                .expect("label field")
                .append_value(&labels[j]);
            s.field_builder::<Float32Builder>(1)
                .expect("score field")
                .append_value(sigmoid_score(cos[j], scale, bias) as f32);
            s.field_builder::<Float32Builder>(2)
                .expect("cosine field")
                .append_value(cos[j]);
            s.append(true);
        }
        list.append(true);
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(chip_id.finish()),
        Arc::new(label.finish()),
        Arc::new(score.finish()),
        Arc::new(cosine.finish()),
        Arc::new(list.finish()),
    ];
    RecordBatch::try_new(schema.clone(), cols)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_skip_comments_and_refuse_duplicates() {
        let l = read_labels("# land cover\nforest\n\n  river \nairport\n").unwrap();
        assert_eq!(l, vec!["forest", "river", "airport"]);
        assert!(read_labels("a\nb\na\n").is_err());
        assert!(read_labels("# nothing\n\n").is_err());
    }

    #[test]
    fn the_template_takes_the_label() {
        assert_eq!(
            apply_template("a satellite image of {}", "a harbour"),
            "a satellite image of a harbour"
        );
    }
}
