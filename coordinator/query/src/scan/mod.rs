//! The query side's scan: row groups read in parallel, dot products over
//! contiguous embedding rows, and a bounded top-K.

use std::sync::Arc;

use arrow_array::RecordBatch;
use futures::{Stream, StreamExt};
use parquet::arrow::arrow_reader::RowSelection;

use rsembed_schemas::chip::col;

pub mod filter;

use crate::format::embeddings;
use crate::format::index::{GroupRef, Index};
use crate::format::pages::{Decode, Stored};
use crate::Error;
use filter::{Filters, Missing};

/// Row groups scanned at once when the user does not say: two per core keeps
/// one group's fetch overlapping another's decode and scoring.
pub fn default_concurrency() -> usize {
    2 * std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// Scans `groups` of `index`, reading `columns`, and those of `optional`
/// that a part has (the columns schema version 2 appended), with `concurrency` row
/// groups in flight, each on its own tokio task (so decoding and scoring use
/// every core). Each group starts from `init()`; `fold` sees each batch with
/// the row offset of its first row in the group and folds it into the
/// group's accumulator. The stream yields the groups' accumulators in the
/// order of `groups`; memory is bounded by `concurrency` groups' batches and
/// accumulators.
pub fn scan_groups<T, I, F, E>(
    index: Arc<Index>,
    groups: Vec<GroupRef>,
    columns: Vec<&'static str>,
    optional: Vec<&'static str>,
    concurrency: usize,
    init: I,
    fold: F,
) -> impl Stream<Item = Result<(GroupRef, T), E>>
where
    T: Send + 'static,
    I: Fn() -> T + Send + Sync + 'static,
    F: Fn(&mut T, GroupRef, usize, &RecordBatch) -> Result<(), E> + Send + Sync + 'static,
    E: From<Error> + Send + 'static,
{
    let fold = Arc::new(fold);
    let init = Arc::new(init);
    per_group(groups, concurrency, move |g| {
        let index = index.clone();
        let part = &index.parts[g.part];
        let columns: Vec<&'static str> = columns
            .iter()
            .chain(optional.iter().filter(|c| part.has_column(c)))
            .copied()
            .collect();
        let (fold, init) = (fold.clone(), init.clone());
        async move {
            let mut acc = init();
            each_batch(&index, g, &columns, |first, batch| {
                fold(&mut acc, g, first, batch)
            })
            .await?;
            Ok((g, acc))
        }
    })
}

/// `task(g)` of each of `groups`, each on its own tokio task (so decoding
/// and scoring use every core), `concurrency` at once; the results in the
/// order of `groups`.
fn per_group<T, Fut, E>(
    groups: Vec<GroupRef>,
    concurrency: usize,
    task: impl Fn(GroupRef) -> Fut,
) -> impl Stream<Item = Result<T, E>>
where
    T: Send + 'static,
    Fut: std::future::Future<Output = Result<T, E>> + Send + 'static,
    E: From<Error> + Send + 'static,
{
    futures::stream::iter(groups)
        .map(move |g| {
            let task = tokio::spawn(task(g));
            async move {
                task.await.map_err(|source| Error::Task {
                    what: "scan task",
                    source,
                })?
            }
        })
        .buffered(concurrency.max(1))
}

/// Scans the `embedding` column of `groups` for a search, with
/// `concurrency` row groups in flight, each on its own tokio task. A chunk
/// laid out as the chip writer lays it is read in place from its pages
/// ([`crate::format::pages`]); any other (another writer's, or one the page
/// reader finds malformed) with the arrow reader, from the start of the
/// group and with a fresh accumulator, so `fold` must keep every effect in
/// its accumulator. `fold(acc, g, first_row, rows, keep)` sees the group's
/// rows in order, in runs of whole rows, with `filters`' verdict on each
/// row when there are filters (their columns are read first, alone). The
/// stream yields each group's accumulator, in the order of `groups`, with
/// the chips the filters excluded for lacking a property.
pub fn scan_embeddings<T, I, F, E>(
    index: Arc<Index>,
    groups: Vec<GroupRef>,
    filters: Filters,
    concurrency: usize,
    init: I,
    fold: F,
) -> impl Stream<Item = Result<(GroupRef, T, Missing), E>>
where
    T: Send + 'static,
    I: Fn() -> T + Send + Sync + 'static,
    F: Fn(&mut T, GroupRef, usize, Stored<'_>, Option<&[bool]>) -> Result<(), E>
        + Send
        + Sync
        + 'static,
    E: From<Error> + Send + 'static,
{
    let fold = Arc::new(fold);
    let init = Arc::new(init);
    per_group(groups, concurrency, move |g| {
        let (index, fold, init) = (index.clone(), fold.clone(), init.clone());
        async move {
            let mut missing = Missing::default();
            let mask = filter_mask(&index, g, &filters, &mut missing).await?;
            let part = &index.parts[g.part];
            let (ty, dim) = part.embedding_type()?;
            let keep = |first: usize, n: usize| -> Result<Option<&[bool]>, Error> {
                let Some(m) = &mask else { return Ok(None) };
                match m.get(first..first + n) {
                    Some(k) => Ok(Some(k)),
                    None => Err(Error::dataset(
                        &part.uri,
                        "its `embedding` column has more rows than its filter columns",
                    )),
                }
            };
            let mut acc = init();
            let why = match index.embedding_chunk(g, ty).await? {
                Ok(chunk) => {
                    let decoded = chunk.decode(ty, dim, |first, rows| {
                        fold(&mut acc, g, first, rows, keep(first, rows.values() / dim)?)
                    });
                    match decoded {
                        Ok(()) => return Ok((g, acc, missing)),
                        Err(Decode::Fold(e)) => return Err(e),
                        Err(Decode::Layout(why)) => why,
                    }
                }
                Err(why) => why,
            };
            tracing::debug!(target: crate::LOG, part = %part.uri, row_group = g.row_group, why, "embedding read with the arrow reader");
            acc = init();
            let read = each_batch(&index, g, &[col::EMBEDDING], |first, batch| {
                let rows = Stored::from(embeddings(batch, dim, &part.uri)?);
                fold(&mut acc, g, first, rows, keep(first, batch.num_rows())?)
            })
            .await?;
            if mask.as_ref().is_some_and(|m| m.len() != read) {
                return Err(Error::dataset(
                    &part.uri,
                    "its `embedding` column has fewer rows than its filter columns",
                )
                .into());
            }
            Ok((g, acc, missing))
        }
    })
}

/// `filters`' verdict on each row of group `g` (`None` without filters),
/// counting the chips that lack a filtered property into `missing`.
async fn filter_mask(
    index: &Index,
    g: GroupRef,
    filters: &Filters,
    missing: &mut Missing,
) -> Result<Option<Vec<bool>>, Error> {
    if !filters.any() {
        return Ok(None);
    }
    let part = &index.parts[g.part];
    let (mut columns, optional) = filters.columns();
    columns.extend(optional.into_iter().filter(|c| part.has_column(c)));
    let mut mask = Vec::with_capacity(part.group_rows(g.row_group).min(1 << 20));
    each_batch(index, g, &columns, |_, batch| {
        mask.extend(filters.mask(batch, &part.uri, missing)?);
        Ok::<(), Error>(())
    })
    .await?;
    Ok(Some(mask))
}

/// Hands each batch of `columns` of group `g` to `f` with the group row of
/// its first row, in order; the rows read.
async fn each_batch<E: From<Error>>(
    index: &Index,
    g: GroupRef,
    columns: &[&str],
    mut f: impl FnMut(usize, &RecordBatch) -> Result<(), E>,
) -> Result<usize, E> {
    let mut stream = index.stream(g, columns, None).await?;
    let mut read = 0usize;
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|source| Error::Read {
            uri: index.parts[g.part].uri.clone(),
            source,
        })?;
        f(read, &batch)?;
        read += batch.num_rows();
    }
    Ok(read)
}

/// The rows `rows` (sorted, distinct, within the group) as a row selection.
pub fn selection_of(rows: &[usize], group_rows: usize) -> RowSelection {
    let ranges = rows.iter().map(|&r| r..r + 1);
    RowSelection::from_consecutive_ranges(ranges, group_rows)
}
