//! What a search scores: the row groups its filters and probe keep, and
//! its query vector, from text, a file or an example chip.

use std::sync::Arc;

use arrow_array::{Array, RecordBatch};
use futures::StreamExt;
use rsembed_schemas::chip::col;

use super::answer::string_col;
use crate::format::embeddings;
use crate::format::index::{GroupRef, Index, Pruning};
use crate::ivf::Probed;
use crate::kernels::normalize;
use crate::scan::filter::{Filters, Missing, Verdict};
use crate::scan::{default_concurrency, scan_groups, selection_of};
use crate::text::{self, TextModel};
use crate::{Error, Error as QueryError, Result};

/// The row groups to score: those the statistics of `--bbox`, `--datetime`
/// and `--max-cloud` keep, and of an IVF dataset's probed lists; with what
/// pruning did and the chips excluded for lacking a property. Groups where
/// no row can match but the count of those chips needs the rows are read
/// here, filter columns only.
pub(super) async fn select_groups(
    index: &Arc<Index>,
    filters: &Filters,
    concurrency: usize,
    queries: usize,
    probed: Option<&Probed>,
) -> Result<(Vec<(GroupRef, Arc<[u32]>)>, Pruning, Missing)> {
    let (kept, mut pruning) = index.row_groups(filters.bbox);
    let all: Arc<[u32]> = (0..queries as u32).collect();
    let mut missing = Missing::default();
    let (mut read, mut count) = (Vec::new(), Vec::new());
    for g in kept {
        let who = match probed {
            Some(p) => p.scorers(index.parts[g.part].groups[g.row_group].list),
            None => all.clone(),
        };
        if who.is_empty() {
            continue;
        }
        match filters.judge(&index.parts[g.part].groups[g.row_group]) {
            Verdict::Skip(m) => missing.add(m),
            Verdict::Count => count.push(g),
            Verdict::Read => read.push((g, who)),
        }
    }
    pruning.groups_kept = read.len() + count.len();
    pruning.rows_kept = read
        .iter()
        .map(|(g, _)| g)
        .chain(&count)
        .map(|g| index.parts[g.part].group_rows(g.row_group) as u64)
        .sum();
    if !count.is_empty() {
        let (columns, optional) = filters.columns();
        let uris: Vec<String> = index.parts.iter().map(|p| p.uri.clone()).collect();
        let filters = *filters;
        let mut scan = Box::pin(scan_groups(
            index.clone(),
            count,
            columns,
            optional,
            concurrency,
            Missing::default,
            move |m: &mut Missing, g: GroupRef, _offset, batch: &RecordBatch| {
                let keep = filters.mask(batch, &uris[g.part], m)?;
                debug_assert!(
                    !keep.contains(&true),
                    "a group the statistics rule out has a match: this is a bug"
                );
                Ok::<(), crate::Error>(())
            },
        ));
        while let Some(r) = scan.next().await {
            missing.add(r?.1);
        }
    }
    Ok((read, pruning, missing))
}

/// The model must be the one the index was embedded with.
pub(crate) fn check_model(index: &Index, m: &dyn TextModel) -> Result<()> {
    let m = m.manifest();
    if m.embed_dim != index.embed_dim {
        return Err(QueryError::flag(
            "--model",
            format!(
                "{} has embedding dimension {}, the index {}: not the model it was embedded with",
                m.name, m.embed_dim, index.embed_dim
            ),
        ));
    }
    if let Some((name, sha)) = index.model() {
        if name != m.name {
            return Err(Error::Usage(format!(
                "the index was embedded with model `{name}` (vision graph sha256 {sha}), but --model is `{}`: \
                 text and image embeddings of different models are not comparable",
                m.name
            )));
        }
    }
    Ok(())
}

/// The prompt-ensembled query of `texts`.
pub(super) fn text_query(m: &dyn TextModel, texts: &[String]) -> Result<Vec<f32>> {
    let rows = text::embed(m, texts)?;
    let dim = m.manifest().embed_dim;
    let mut mean = vec![0f64; dim];
    for r in &rows {
        for (a, x) in mean.iter_mut().zip(r) {
            *a += f64::from(*x);
        }
    }
    let mut q: Vec<f32> = mean
        .iter()
        .map(|a| (a / rows.len() as f64) as f32)
        .collect();
    normalize(&mut q)?;
    Ok(q)
}

/// A query vector from a file holding one JSON array.
pub(super) fn vector_query(path: &std::path::Path, dim: usize) -> Result<Vec<f32>> {
    let bytes = std::fs::read(path).map_err(|e| QueryError::FlagFile {
        flag: "--vector",
        path: path.to_owned(),
        source: Box::new(e),
    })?;
    let mut v: Vec<f32> =
        serde_json::from_slice(&bytes).map_err(|source| QueryError::VectorFile {
            path: path.to_owned(),
            source,
        })?;
    if v.len() != dim {
        return Err(QueryError::flag(
            "--vector",
            format!(
                "{}: {} numbers, but the index's embeddings have {dim}",
                path.display(),
                v.len()
            ),
        ));
    }
    normalize(&mut v)?;
    Ok(v)
}

/// The row and embedding of chip `id`. Row groups whose `chip_id`
/// statistics exclude it are not read.
pub(super) async fn find_chip(index: &Arc<Index>, id: &str) -> Result<(GroupRef, usize, Vec<f32>)> {
    let mut groups = Vec::new();
    for (pi, part) in index.parts.iter().enumerate() {
        for (gi, g) in part.groups.iter().enumerate() {
            if g.may_hold_chip(id) {
                groups.push(GroupRef {
                    part: pi,
                    row_group: gi,
                });
            }
        }
    }
    let want = Arc::new(id.to_owned());
    let parts = index.clone();
    let mut scan = Box::pin(scan_groups(
        index.clone(),
        groups,
        vec![col::CHIP_ID],
        Vec::new(),
        default_concurrency(),
        || None::<usize>,
        move |found: &mut Option<usize>, g: GroupRef, offset, batch: &RecordBatch| {
            if found.is_none() {
                let ids = string_col(batch, col::CHIP_ID, &parts.parts[g.part].uri)?;
                *found = (0..ids.len())
                    .find(|&i| ids.is_valid(i) && ids.value(i) == want.as_str())
                    .map(|i| offset + i);
            }
            Ok::<(), crate::Error>(())
        },
    ));
    let mut hit = None;
    while let Some(r) = scan.next().await {
        if let (g, Some(row)) = r? {
            hit = Some((g, row));
            break;
        }
    }
    let Some((g, row)) = hit else {
        return Err(QueryError::flag(
            "--like",
            format!("{id}: no chip with this id in the index"),
        ));
    };
    let sel = selection_of(&[row], index.parts[g.part].group_rows(g.row_group));
    let mut s = index.stream(g, &[col::EMBEDDING], Some(sel)).await?;
    let uri = &index.parts[g.part].uri;
    let batch = s
        .next()
        .await
        .ok_or_else(|| QueryError::dataset(uri, format!("--like {id}: its row vanished")))?
        .map_err(|source| QueryError::Read {
            uri: uri.clone(),
            source,
        })?;
    let mut v =
        embeddings(&batch, index.embed_dim, &index.parts[g.part].uri)?.row(0, index.embed_dim);
    normalize(&mut v)?;
    Ok((g, row, v))
}
