//! `rsembed search`: the chips of an index that best match a query.
//!
//! Two passes. The scan reads only the `embedding` column (and the columns
//! of `--bbox`, `--datetime` and `--max-cloud`) of the row groups the
//! statistics keep, scores every row that passes the filters with one dot
//! product against the unit query vector, and keeps a bounded top-K per row
//! group, merged at the end. Then only the winners' other
//! columns are read, row by row, by row selection. Memory is a few row
//! groups' batches plus K hits, whatever the index size.
//!
//! Decisions:
//! - Several texts are prompt ensembling: the mean of their unit embeddings,
//!   normalised again, so that `cosine` stays a cosine.
//! - `--like` leaves the example chip out of its own results.
//! - The model given must be the index's (same name and dimension): a text
//!   embedding of another model is meaningless against these images. The
//!   name, not the graph sha256, is compared, so a search does not hash a
//!   gigabyte of ONNX on every query.
//! - `--datetime` and `--max-cloud` exclude chips that lack the property
//!   (`query/filter.rs`) and say how many on stderr.
//! - On a dataset compacted with `--lists`, the query ranks the centroids and
//!   only the row groups whose `list` statistics name one of the `--nprobe`
//!   best lists are read (`query/ivf.rs`), on top of the filters' pruning;
//!   the closing line counts them as any pruned group.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use rsembed_store::StoreCache;
use serde_json::{json, Value};

use crate::format::footer::FOOTER_BUDGET_GROUPS;
use crate::format::index::{GroupRef, Index, Pruning};
use crate::format::pages::Stored;
use crate::ivf::{Probe, Probed};
use crate::kernels::{
    dots, dots4, dots4_scaled, dots_scaled, inv_norms, inv_norms_i8, normalize, Hit, TopK,
};
use crate::scan::filter::{Filters, Missing};
use crate::scan::{default_concurrency, scan_embeddings};
use crate::text::{self, TextModel};
use crate::{Error, Result};

mod answer;
mod args;
mod batch;
pub mod html;
mod result;
mod select;
mod stream;

use self::answer::{details, read_ahead, read_ahead_groups, Ahead};
use self::html::ChipImages;
pub use args::SearchArgs;
pub use result::SearchResult;
pub(crate) use select::check_model;
use select::{find_chip, select_groups, text_query, vector_query};

/// What the caller lends a search: the model of `--model`, which embeds
/// text queries, and the reader of the chips an `--html` page shows.
#[derive(Clone, Copy, Default)]
pub struct Lent<'a> {
    /// The model the index was embedded with, when given.
    pub model: Option<&'a dyn TextModel>,
    /// The hits' chips, for `--html`.
    pub chips: Option<&'a dyn ChipImages>,
}

/// Rows scored against every query before the next rows: 256 rows of D =
/// 768 float32 are 768 KiB, which stays in L2 while a batch of queries
/// passes over it.
const SCORE_BLOCK_ROWS: usize = 256;

/// A row group's share of a search: the top-K of each query that scores it
/// (in the order of its scorers), and the buffers scoring reuses.
#[derive(Default)]
struct Score {
    tops: Vec<TopK>,
    cos: Vec<f32>,
    cos4: Vec<[f32; 4]>,
    norms: Vec<f32>,
    /// Rows scored (those the filters kept).
    scored: u64,
}

/// A block of rows as the kernels score it.
enum Block<'a> {
    /// int8 as stored (1 byte a value, the scale cancelled by the norm).
    Int8(&'a [i8]),
    /// Unit float32 rows as the arrow reader decoded them.
    F32(&'a [f32]),
    /// Unit float32 rows as they lie in a page.
    F32Le(&'a [[u8; 4]]),
    /// float16 rows as the arrow reader decoded them (not quite unit: scaled
    /// by their norms).
    F16(&'a [half::f16]),
    /// float16 rows as they lie in a page.
    F16Le(&'a [[u8; 2]]),
}

/// What the scan did, for the closing line on stderr.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct SearchStats {
    /// Row-group pruning by the filters' statistics.
    pub(crate) pruning: Pruning,
    /// Rows scored (after the row-level filters).
    pub(crate) rows_scored: u64,
    /// Chips excluded for lacking the property a filter is on.
    pub(crate) missing: Missing,
    /// Bytes fetched from the store, footers included.
    pub(crate) bytes_read: u64,
    /// Seconds from opening the index to the results.
    pub(crate) seconds: f64,
}

impl SearchStats {
    /// Adds the counts of a later batch of one session (`--vectors -`): row
    /// groups and rows read and scored sum over the batches; the totals and
    /// the bytes (counted since the index opened) are the latest.
    fn add(&mut self, s: &SearchStats) {
        self.pruning.groups_total = s.pruning.groups_total;
        self.pruning.rows_total = s.pruning.rows_total;
        self.pruning.groups_kept += s.pruning.groups_kept;
        self.pruning.rows_kept += s.pruning.rows_kept;
        self.rows_scored += s.rows_scored;
        self.missing.add(s.missing);
        self.bytes_read = s.bytes_read;
        self.seconds = s.seconds;
    }
}

/// Runs a search and prints its results to `out` (and one line of scan
/// statistics to stderr).
///
/// A reader that stops early (`rsembed search … | head`) is not an error:
/// on a broken pipe the output ends quietly, as in other Unix tools, with no
/// statistics line either.
pub async fn run(args: SearchArgs, lent: Lent<'_>, out: &mut dyn Write) -> Result<()> {
    let stdin = Some(std::path::Path::new("-"));
    if args.vectors.as_deref() == stdin || args.queries.as_deref() == stdin {
        return stream::run(&args, lent, out).await;
    }
    let (results, stats) = search(&args, lent.model).await?;
    let printed = print_results(&args, &results, out).and_then(|()| out.flush());
    if let Some(path) = &args.html {
        let chips = lent.chips.ok_or_else(|| {
            Error::Usage("rsembed search: --html needs a reader of the hits' chips".into())
        })?;
        let missing = html::write(&args, &results, chips, path).await?;
        eprintln!(
            "rsembed search: wrote {} ({} hits, {missing} without a picture)",
            path.display(),
            results.len()
        );
    }
    match printed {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
        Err(e) => return Err(Error::Io(e)),
    }
    let p = &stats.pruning;
    let filtered = args.bbox.is_some() || args.datetime.is_some() || args.max_cloud.is_some();
    let excluded = excluded(&args, &stats.missing);
    eprintln!(
        "rsembed search: scored {} of {} rows; read {} of {} row groups{}{excluded}; {:.1} MiB fetched; {:.3} s",
        stats.rows_scored,
        p.rows_total,
        p.groups_kept,
        p.groups_total,
        if filtered {
            format!(" ({} pruned by statistics)", p.groups_total - p.groups_kept)
        } else {
            String::new()
        },
        stats.bytes_read as f64 / (1024.0 * 1024.0),
        stats.seconds
    );
    Ok(())
}

/// The closing line's counts of chips excluded for lacking the property a
/// filter is on, one for each of `--datetime` and `--max-cloud` given.
fn excluded(args: &SearchArgs, missing: &Missing) -> String {
    let mut s = String::new();
    if args.datetime.is_some() {
        s += &format!(
            "; {} chips without a datetime excluded by --datetime",
            missing.datetime
        );
    }
    if args.max_cloud.is_some() {
        s += &format!(
            "; {} chips without a cloud_fraction excluded by --max-cloud",
            missing.cloud_fraction
        );
    }
    s
}

/// Writes the results as `--geojson`, `--json` or a table says.
fn print_results(
    args: &SearchArgs,
    results: &[SearchResult],
    out: &mut dyn Write,
) -> std::io::Result<()> {
    if args.geojson {
        let features: Vec<Value> = results
            .iter()
            .map(|r| {
                json!({
                    "type": "Feature",
                    "geometry": r.geometry(),
                    "properties": serde_json::to_value(r).unwrap_or(Value::Null),
                })
            })
            .collect();
        // serde_json's error gives back the io error's kind (BrokenPipe).
        serde_json::to_writer(
            &mut *out,
            &json!({"type": "FeatureCollection", "features": features}),
        )?;
        writeln!(out)?;
    } else if args.json {
        for r in results {
            serde_json::to_writer(&mut *out, r)?;
            writeln!(out)?;
        }
    } else {
        // The STAC columns only where some result has them: a dataset of
        // plain GeoTIFFs keeps its narrower table.
        let stac = results
            .iter()
            .any(|r| r.datetime.is_some() || r.item_id.is_some() || r.cloud_fraction.is_some());
        let stac_cells = |r: Option<&SearchResult>| -> String {
            match r {
                _ if !stac => String::new(),
                None => format!("{:<20}  {:>5}  {:<24}  ", "datetime", "cloud", "item_id"),
                Some(r) => format!(
                    "{:<20}  {:>5}  {:<24}  ",
                    r.datetime.as_deref().unwrap_or("-"),
                    r.cloud_fraction
                        .map_or("-".to_owned(), |c| format!("{c:.3}")),
                    r.item_id.as_deref().unwrap_or("-")
                ),
            }
        };
        // The query's line first in a batch, so that each query's rows read together.
        let batch = results.iter().any(|r| r.query.is_some());
        let query_cell = |r: Option<&SearchResult>| -> String {
            match r {
                _ if !batch => String::new(),
                None => format!("{:>5}  ", "query"),
                Some(r) => format!("{:>5}  ", r.query.unwrap_or(0)),
            }
        };
        writeln!(
            out,
            "{}{:>4}  {:>9}  {:>8}  {:<32}  {:<24}  {:<22}  {}source_uri",
            query_cell(None),
            "rank",
            "score",
            "cosine",
            "chip_id",
            "window (x,y w×h)",
            "centre (lon,lat)",
            stac_cells(None)
        )?;
        for r in results {
            let score = r.score.map_or("-".to_owned(), |s| format!("{s:.3e}"));
            let centre = match (r.centre_lon, r.centre_lat) {
                (Some(lon), Some(lat)) => format!("{lon:.5},{lat:.5}"),
                _ => "-".to_owned(),
            };
            let window = format!("{},{} {}×{}", r.x, r.y, r.width, r.height);
            writeln!(
                out,
                "{}{:>4}  {:>9}  {:>8.5}  {:<32}  {:<24}  {:<22}  {}{}",
                query_cell(Some(r)),
                r.rank,
                score,
                r.cosine,
                r.chip_id,
                window,
                centre,
                stac_cells(Some(r)),
                r.source_uri
            )?;
        }
    }
    Ok(())
}

/// The top-K results of a search, best first, and what the scan did.
pub(crate) async fn search(
    args: &SearchArgs,
    model: Option<&dyn TextModel>,
) -> Result<(Vec<SearchResult>, SearchStats)> {
    let t0 = Instant::now();
    one_query_source(args)?;
    let searcher = Searcher::open(args, model, false).await?;
    let index = &searcher.index;
    let dim = index.embed_dim;
    let need_model = |what: &str| -> Result<&dyn TextModel> {
        searcher.model.ok_or_else(|| {
            Error::Usage(format!(
                "rsembed search: {what} needs --model (the model the index was embedded with)"
            ))
        })
    };
    // (line number, unit vector) per query; the line is None for one query.
    let (queries, exclude): (Vec<(Option<usize>, Vec<f32>)>, _) = if !args.texts.is_empty() {
        let m = need_model("a text query")?;
        (vec![(None, text_query(m, &args.texts)?)], None)
    } else if let Some(id) = &args.like {
        let (g, row, v) = find_chip(index, id).await?;
        (vec![(None, v)], Some((g, row)))
    } else if let Some(path) = &args.vector {
        (vec![(None, vector_query(path, dim)?)], None)
    } else if let Some(path) = &args.vectors {
        (batch::vectors(path, dim)?, None)
    } else {
        let path = args.queries.as_ref().expect("one query source");
        let m = need_model("--queries")?;
        let (lines, texts): (Vec<usize>, Vec<String>) = batch::texts(path)?.into_iter().unzip();
        let rows = text::embed(m, &texts)?;
        let mut qs = Vec::with_capacity(rows.len());
        for (line, mut v) in lines.into_iter().zip(rows) {
            normalize(&mut v)?;
            qs.push((Some(line), v));
        }
        (qs, None)
    };

    let probed = searcher.probed(&queries).await?;
    searcher.answer(args, &queries, probed, exclude, t0).await
}

/// Refuses a search given no query, or more than one kind.
fn one_query_source(args: &SearchArgs) -> Result<()> {
    let sources = usize::from(!args.texts.is_empty())
        + usize::from(args.like.is_some())
        + usize::from(args.vector.is_some())
        + usize::from(args.vectors.is_some())
        + usize::from(args.queries.is_some());
    if sources != 1 {
        return Err(Error::Usage(
            "rsembed search: give the query as texts, or --like CHIP_ID, or --vector FILE, \
             or many as --vectors FILE or --queries FILE (one of them)"
                .into(),
        ));
    }
    Ok(())
}

/// An open search: the index, its centroids, the filters and the model,
/// ready to answer queries, once (`search`) or line by line (`--vectors -`).
struct Searcher<'m> {
    model: Option<&'m dyn TextModel>,
    index: Arc<Index>,
    /// The IVF layout's centroids: held by a resident search, read as
    /// they are ranked by a single pass (held through the scan they were
    /// lists × D × 4 bytes, 9 MiB at 3,162 lists of D = 768, that grew a
    /// search's peak with the lists).
    probe: Option<Probe>,
    filters: Filters,
    concurrency: usize,
}

impl<'m> Searcher<'m> {
    /// Opens the index of `args`. A `resident` search (queries line by line)
    /// holds every footer, and keeps the column chunks it reads (up to a budget);
    /// another holds [`FOOTER_BUDGET_GROUPS`] row groups' footers beyond those
    /// being read.
    async fn open(
        args: &SearchArgs,
        model: Option<&'m dyn TextModel>,
        resident: bool,
    ) -> Result<Searcher<'m>> {
        let stores = StoreCache::default();
        let footer_budget = if resident {
            usize::MAX
        } else {
            FOOTER_BUDGET_GROUPS
        };
        let mut index = Index::open(&stores, &args.index, footer_budget).await?;
        if resident {
            index.keep_chunks();
        }
        let index = Arc::new(index);
        if let Some(m) = model {
            check_model(&index, m)?;
        }
        let filters = Filters {
            bbox: args.bbox,
            datetime: args
                .datetime
                .as_deref()
                .map(rsembed_schemas::datetime::range)
                .transpose()
                .map_err(Error::Usage)?,
            max_cloud: args.max_cloud,
        };
        let probe = Probe::open(&index, args.nprobe, resident).await?;
        Ok(Searcher {
            model,
            index,
            probe,
            filters,
            concurrency: args.concurrency.unwrap_or_else(default_concurrency),
        })
    }

    /// The lists each of `queries` probes; `None` when the search is not
    /// an IVF probe.
    async fn probed(&self, queries: &[(Option<usize>, Vec<f32>)]) -> Result<Option<Probed>> {
        let Some(p) = &self.probe else {
            return Ok(None);
        };
        let qs: Vec<&[f32]> = queries.iter().map(|(_, v)| v.as_slice()).collect();
        Ok(Some(p.probe(&qs).await?))
    }

    /// The top-K results of each of `queries` (line number, unit vector),
    /// best first, query by query, scoring the row groups of the lists
    /// `probed` chose for it (all groups without), leaving out the chip
    /// `exclude`; and what the scan did, with the bytes fetched since the
    /// index opened and the seconds since `t0`.
    async fn answer(
        &self,
        args: &SearchArgs,
        queries: &[(Option<usize>, Vec<f32>)],
        probed: Option<Probed>,
        exclude: Option<(GroupRef, usize)>,
        t0: Instant,
    ) -> Result<(Vec<SearchResult>, SearchStats)> {
        let answer = self
            .answer_from_files(args, queries, probed, exclude, t0)
            .await;
        // A file cut short while its kept chunks were read: whatever the
        // answer (or its error) says, that is the error.
        self.index.check_files()?;
        answer
    }

    async fn answer_from_files(
        &self,
        args: &SearchArgs,
        queries: &[(Option<usize>, Vec<f32>)],
        probed: Option<Probed>,
        exclude: Option<(GroupRef, usize)>,
        t0: Instant,
    ) -> Result<(Vec<SearchResult>, SearchStats)> {
        let (index, filters, concurrency) = (&self.index, self.filters, self.concurrency);
        let dim = index.embed_dim;
        let nq = queries.len();
        let (groups, pruning, mut missing) =
            select_groups(index, &filters, concurrency, nq, probed.as_ref()).await?;
        let k = args.top_k;
        let vectors: Arc<Vec<Vec<f32>>> =
            Arc::new(queries.iter().map(|(_, v)| v.clone()).collect());
        // Which queries score each group: a batch on an IVF dataset scores each
        // query against its own lists only, so a query's answer is the one it
        // gets alone (and costs what its lists cost, not the batch's union).
        let scorers: Arc<BTreeMap<GroupRef, Arc<[u32]>>> =
            Arc::new(groups.iter().cloned().collect());
        let groups: Vec<GroupRef> = groups.into_iter().map(|(g, _)| g).collect();
        // A single query scoring fewer groups than there are cores: the idle
        // core reads and inflates the groups' answer columns meanwhile, so
        // that the hits' answer is a lookup once the scores are in (zstd of
        // the answer was 15 % of such a query, the scoring 22 %).
        let ahead: BTreeMap<GroupRef, tokio::task::JoinHandle<Ahead>> =
            if nq == 1 && groups.len() <= read_ahead_groups() {
                groups
                    .iter()
                    .map(|&g| (g, tokio::spawn(read_ahead(index.clone(), g))))
                    .collect()
            } else {
                BTreeMap::new()
            };
        let plan = scorers.clone();
        let mut scan = Box::pin(scan_embeddings(
            index.clone(),
            groups,
            filters,
            concurrency,
            Score::default,
            move |acc: &mut Score, g: GroupRef, first, rows: Stored<'_>, keep: Option<&[bool]>| {
                let n = rows.values() / dim;
                let who = &plan[&g];
                if acc.tops.is_empty() {
                    acc.tops = vec![TopK::new(k); who.len()];
                }
                let skip =
                    |i: usize, row: usize| keep.is_some_and(|m| !m[i]) || exclude == Some((g, row));
                // Blocks of rows small enough to stay in cache while every
                // query is scored against them: one pass over the data for all,
                // four queries a read of each row.
                for start in (0..n).step_by(SCORE_BLOCK_ROWS) {
                    let len = SCORE_BLOCK_ROWS.min(n - start);
                    let block = rows.slice(start, len, dim);
                    let push = |top: &mut TopK, i: usize, c: f32| {
                        let row = first + start + i;
                        if c >= top.threshold() && !skip(start + i, row) {
                            top.push(Hit {
                                group: g,
                                row,
                                cosine: c,
                            });
                        }
                    };
                    // Every type is scored as it is stored, widened inside the
                    // dot product: int8's scale and f16's rounding off unit
                    // length are cancelled by each row's norm.
                    let scored = match block {
                        Stored::Int8(v) => {
                            inv_norms_i8(v, dim, &mut acc.norms);
                            Block::Int8(v)
                        }
                        Stored::F16(v) => {
                            inv_norms(v, dim, &mut acc.norms);
                            Block::F16(v)
                        }
                        Stored::F16Le(v) => {
                            inv_norms(v, dim, &mut acc.norms);
                            Block::F16Le(v)
                        }
                        Stored::F32(v) => Block::F32(v),
                        Stored::F32Le(v) => Block::F32Le(v),
                    };
                    let norms = acc.norms.as_slice();
                    for (qs, tops) in who.chunks(4).zip(acc.tops.chunks_mut(4)) {
                        let q = |j: usize| vectors[qs[j.min(qs.len() - 1)] as usize].as_slice();
                        if let [top] = tops {
                            // One query (a single search): no lanes to waste.
                            acc.cos.resize(len, 0.0);
                            let (q, cos) = (q(0), &mut acc.cos);
                            match &scored {
                                Block::Int8(v) => dots_scaled(v, dim, q, norms, cos),
                                Block::F16(v) => dots_scaled(v, dim, q, norms, cos),
                                Block::F16Le(v) => dots_scaled(v, dim, q, norms, cos),
                                Block::F32(v) => dots(v, dim, q, cos),
                                Block::F32Le(v) => dots(v, dim, q, cos),
                            }
                            for (i, &c) in acc.cos.iter().enumerate() {
                                push(top, i, c);
                            }
                            continue;
                        }
                        acc.cos4.resize(len, [0.0; 4]);
                        let (four, cos4) = ([q(0), q(1), q(2), q(3)], &mut acc.cos4);
                        match &scored {
                            Block::Int8(v) => dots4_scaled(v, dim, four, norms, cos4),
                            Block::F16(v) => dots4_scaled(v, dim, four, norms, cos4),
                            Block::F16Le(v) => dots4_scaled(v, dim, four, norms, cos4),
                            Block::F32(v) => dots4(v, dim, four, cos4),
                            Block::F32Le(v) => dots4(v, dim, four, cos4),
                        }
                        for (j, top) in tops.iter_mut().enumerate() {
                            for (i, c) in acc.cos4.iter().enumerate() {
                                push(top, i, c[j]);
                            }
                        }
                    }
                }
                acc.scored += keep.map_or(n, |m| m.iter().filter(|&&k| k).count()) as u64;
                Ok::<(), Error>(())
            },
        ));
        let mut tops = vec![TopK::new(k); nq];
        let mut scored = 0;
        while let Some(r) = scan.next().await {
            let (g, acc, m) = r?;
            for (&q, t) in scorers[&g].iter().zip(acc.tops) {
                tops[q as usize].merge(t);
            }
            scored += acc.scored;
            missing.add(m);
        }
        let scale_bias = self
            .model
            .map(|m| (m.manifest().logit_scale, m.manifest().logit_bias));
        let per_query: Vec<Vec<Hit>> = tops.into_iter().map(TopK::into_sorted).collect();
        let all: Vec<Hit> = per_query.iter().flatten().copied().collect();
        let mut found = details(index, &all, scale_bias, concurrency, ahead)
            .await?
            .into_iter();
        let mut results = Vec::with_capacity(all.len());
        for ((line, _), hits) in queries.iter().zip(&per_query) {
            for (rank, r) in found.by_ref().take(hits.len()).enumerate() {
                results.push(SearchResult {
                    query: *line,
                    rank: rank + 1,
                    ..r
                });
            }
        }
        let stats = SearchStats {
            pruning,
            rows_scored: scored,
            missing,
            bytes_read: index.bytes_read() + self.probe.as_ref().map_or(0, Probe::bytes_read),
            seconds: t0.elapsed().as_secs_f64(),
        };
        Ok((results, stats))
    }
}
