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

use arrow_array::{
    Array, BinaryArray, Float32Array, Float64Array, Int32Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use futures::StreamExt;
use rsembed_schemas::chip::col;
use rsembed_worker::model::ModelDir;
use rsembed_worker::store::StoreCache;
use serde_json::{json, Value};

use crate::cli::SearchArgs;
use crate::error::{Error, Result};
use parquet::column::page::Page;
use rsembed_query::format::answer;
use rsembed_query::format::embeddings;
use rsembed_query::format::footer::FOOTER_BUDGET_GROUPS;
use rsembed_query::format::index::{GroupRef, Index, Pruning};
use rsembed_query::format::pages::{Chunk, Stored};
use rsembed_query::ivf::{Probe, Probed};
use rsembed_query::kernels::{
    dots, dots4, dots4_scaled, dots_scaled, inv_norms, inv_norms_i8, normalize, Hit, TopK,
};
use rsembed_query::scan::filter::{Filters, Missing, Verdict};
use rsembed_query::scan::{default_concurrency, scan_embeddings, scan_groups, selection_of};

mod batch;
mod stream;

/// Rows scored against every query before the next rows: 256 rows of D =
/// 768 float32 are 768 KiB, which stays in L2 while a batch of queries
/// passes over it.
const SCORE_BLOCK_ROWS: usize = 256;
use crate::query::Error as QueryError;

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

/// One result, with what the output shows of its chip.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct SearchResult {
    /// The query's line number in `--vectors` or `--queries` (1-based, as
    /// an editor counts); absent for a single query.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) query: Option<usize>,
    /// 1 for the best (of its query).
    pub(crate) rank: usize,
    /// `sigmoid(exp(logit_scale)·cos + logit_bias)`; absent without a model.
    pub(crate) score: Option<f64>,
    /// Cosine between the chip's and the query's embedding.
    pub(crate) cosine: f32,
    /// The chip's id.
    pub(crate) chip_id: String,
    /// Its source.
    pub(crate) source_uri: String,
    /// Window origin and size in source pixels.
    pub(crate) x: i32,
    /// Window origin.
    pub(crate) y: i32,
    /// Window size.
    pub(crate) width: i32,
    /// Window size.
    pub(crate) height: i32,
    /// Share of real pixels.
    pub(crate) valid_fraction: f32,
    /// Source CRS.
    pub(crate) crs: Option<String>,
    /// Centre, lon/lat.
    pub(crate) centre_lon: Option<f64>,
    /// Centre, lon/lat.
    pub(crate) centre_lat: Option<f64>,
    /// The STAC item the chip comes from (schema 2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) item_id: Option<String>,
    /// Its collection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) collection: Option<String>,
    /// Acquisition time (a range's start), RFC 3339, UTC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) datetime: Option<String>,
    /// The end of the acquisition range, when the item gives one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) end_datetime: Option<String>,
    /// Share of the chip's valid pixels marked as cloud.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cloud_fraction: Option<f32>,
    /// Footprint as WKB, as stored: a batch holds up to 10,000 × K
    /// results, and WKB is a fifth of the memory of a GeoJSON tree
    /// ([`SearchResult::geometry`] converts it).
    #[serde(skip)]
    pub(crate) wkb: Option<Vec<u8>>,
    /// The tiling that cut the chip (its file's `rsembed` metadata), for
    /// reading it again (`--html`); one per file, shared by its results.
    #[serde(skip)]
    pub(crate) tiling: Option<Arc<rsembed_schemas::job::TilingSpec>>,
}

impl SearchResult {
    /// The footprint as a GeoJSON geometry.
    pub(crate) fn geometry(&self) -> Option<Value> {
        self.wkb.as_deref().and_then(wkb_to_geojson)
    }
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
pub async fn run(args: SearchArgs, out: &mut dyn Write) -> Result<()> {
    if let Some(w) = unfinished_job(&args.index).await {
        eprintln!("rsembed search: {w}");
    }
    let stdin = Some(std::path::Path::new("-"));
    if args.vectors.as_deref() == stdin || args.queries.as_deref() == stdin {
        return stream::run(&args, out).await;
    }
    let (results, stats) = search(&args).await?;
    let printed = print_results(&args, &results, out).and_then(|()| out.flush());
    if let Some(path) = &args.html {
        let missing = crate::query::html::write(&args, &results, path).await?;
        eprintln!(
            "rsembed search: wrote {} ({} hits, {missing} without a picture)",
            path.display(),
            results.len()
        );
    }
    match printed {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
        Err(e) => return Err(Error::Worker(rsembed_worker::Error::Io(e))),
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

/// The warning for an index that is the output (or its `chips/` folder) of
/// a job that has not finished: its results cover the tasks done so far.
/// A failed check only logs: it must not stop a search.
async fn unfinished_job(index: &str) -> Option<String> {
    let stores = StoreCache::default();
    let trimmed = index.trim_end_matches('/');
    let root = match trimmed.rsplit_once('/') {
        Some((parent, "chips")) => parent,
        _ => trimmed,
    };
    let check = async {
        let loc = stores.location(root)?;
        crate::job::output::JobOutput::new(loc).unfinished().await
    };
    match check.await {
        Ok(u) => u.map(|u| u.warning()),
        Err(e) => {
            tracing::debug!(error = %e, "cannot tell whether the index's job is finished");
            None
        }
    }
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
pub(crate) async fn search(args: &SearchArgs) -> Result<(Vec<SearchResult>, SearchStats)> {
    let t0 = Instant::now();
    one_query_source(args)?;
    let searcher = Searcher::open(args, false).await?;
    let index = &searcher.index;
    let dim = index.embed_dim;
    let need_model = |what: &str| -> Result<&ModelDir> {
        searcher.model.as_ref().ok_or_else(|| {
            Error::Usage(format!(
                "rsembed search: {what} needs --model (the model the index was embedded with)"
            ))
        })
    };
    // (line number, unit vector) per query; the line is None for one query.
    let (queries, exclude): (Vec<(Option<usize>, Vec<f32>)>, _) = if !args.texts.is_empty() {
        let m = need_model("a text query")?;
        (vec![(None, text_query(m, args, &args.texts)?)], None)
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
        let rows = crate::text::embed(m, &args.engine, &texts)?;
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
struct Searcher {
    model: Option<ModelDir>,
    index: Arc<Index>,
    /// The IVF layout's centroids: held by a resident search, read as
    /// they are ranked by a single pass (held through the scan they were
    /// lists × D × 4 bytes, 9 MiB at 3,162 lists of D = 768, that grew a
    /// search's peak with the lists).
    probe: Option<Probe>,
    filters: Filters,
    concurrency: usize,
}

impl Searcher {
    /// Opens the index of `args`. A `resident` search (queries line by line)
    /// holds every footer, and keeps the column chunks it reads (up to a budget);
    /// another holds [`FOOTER_BUDGET_GROUPS`] row groups' footers beyond those
    /// being read.
    async fn open(args: &SearchArgs, resident: bool) -> Result<Searcher> {
        let model = args.model.as_ref().map(ModelDir::open).transpose()?;
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
        if let Some(m) = &model {
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
                Ok::<(), crate::Error>(())
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
            .as_ref()
            .map(|m| (m.manifest.logit_scale, m.manifest.logit_bias));
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

/// The row groups to score: those the statistics of `--bbox`, `--datetime`
/// and `--max-cloud` keep, and of an IVF dataset's probed lists; with what
/// pruning did and the chips excluded for lacking a property. Groups where
/// no row can match but the count of those chips needs the rows are read
/// here, filter columns only.
async fn select_groups(
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
pub(crate) fn check_model(index: &Index, m: &ModelDir) -> Result<()> {
    if m.manifest.embed_dim != index.embed_dim {
        return Err(QueryError::flag(
            "--model",
            format!(
                "{} has embedding dimension {}, the index {}: not the model it was embedded with",
                m.manifest.name, m.manifest.embed_dim, index.embed_dim
            ),
        )
        .into());
    }
    if let Some((name, sha)) = index.model() {
        if name != m.manifest.name {
            return Err(Error::Usage(format!(
                "the index was embedded with model `{name}` (vision graph sha256 {sha}), but --model is `{}`: \
                 text and image embeddings of different models are not comparable",
                m.manifest.name
            )));
        }
    }
    Ok(())
}

/// The prompt-ensembled query of `texts`.
fn text_query(m: &ModelDir, args: &SearchArgs, texts: &[String]) -> Result<Vec<f32>> {
    let rows = crate::text::embed(m, &args.engine, texts)?;
    let dim = m.manifest.embed_dim;
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
fn vector_query(path: &std::path::Path, dim: usize) -> Result<Vec<f32>> {
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
        )
        .into());
    }
    normalize(&mut v)?;
    Ok(v)
}

/// The row and embedding of chip `id`. Row groups whose `chip_id`
/// statistics exclude it are not read.
async fn find_chip(index: &Arc<Index>, id: &str) -> Result<(GroupRef, usize, Vec<f32>)> {
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
        return Err(
            QueryError::flag("--like", format!("{id}: no chip with this id in the index")).into(),
        );
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

/// Reads the winners' columns (only their rows) and builds the results.
async fn details(
    index: &Index,
    hits: &[Hit],
    scale_bias: Option<(f64, f64)>,
    concurrency: usize,
    mut ahead: BTreeMap<GroupRef, tokio::task::JoinHandle<Ahead>>,
) -> Result<Vec<SearchResult>> {
    let mut by_group: BTreeMap<GroupRef, Vec<usize>> = BTreeMap::new();
    for h in hits {
        by_group.entry(h.group).or_default().push(h.row);
    }
    let by_group: Vec<_> = by_group
        .into_iter()
        .map(|(g, wanted)| (g, wanted, ahead.remove(&g)))
        .collect();
    // Read ahead for groups that hold no hit: not needed.
    for h in ahead.values() {
        h.abort();
    }
    // The groups are read side by side: on an object store each is a round
    // trip, and ten hits in ten groups read one after another were ten.
    let mut reads = futures::stream::iter(by_group)
        .map(|(g, wanted, ahead)| group_details(index, g, wanted, ahead))
        .buffer_unordered(concurrency.max(1));
    let mut rows: BTreeMap<(GroupRef, usize), SearchResult> = BTreeMap::new();
    while let Some(read) = reads.next().await {
        rows.extend(read?);
    }
    // Each row is taken at its last use and cloned before: in a batch,
    // queries share rows, and a copy of every row would double the peak.
    let mut uses: BTreeMap<(GroupRef, usize), usize> = BTreeMap::new();
    for h in hits {
        *uses.entry((h.group, h.row)).or_default() += 1;
    }
    hits.iter()
        .enumerate()
        .map(|(rank, h)| {
            let key = (h.group, h.row);
            let left = uses.get_mut(&key).map(|n| {
                *n -= 1;
                *n
            });
            let found = match left {
                Some(0) => rows.remove(&key),
                _ => rows.get(&key).cloned(),
            };
            let mut r = found.ok_or_else(|| {
                QueryError::dataset(
                    &index.parts[h.group.part].uri,
                    format!(
                        "row {} of row group {} could not be read back",
                        h.row, h.group.row_group
                    ),
                )
            })?;
            r.rank = rank + 1;
            r.cosine = h.cosine;
            r.score =
                scale_bias.map(|(s, b)| rsembed_query::kernels::sigmoid_score(h.cosine, s, b));
            Ok(r)
        })
        .collect()
}

/// The columns of a result, of every chip file.
const ANSWER_BASE: [&str; 11] = [
    col::CHIP_ID,
    col::SOURCE_URI,
    col::X,
    col::Y,
    col::WIDTH,
    col::HEIGHT,
    col::VALID_FRACTION,
    col::CRS,
    col::CENTRE_LON,
    col::CENTRE_LAT,
    col::GEOMETRY,
];

/// The columns of a result schema version 2 appended, where a file has them.
const ANSWER_STAC: [&str; 5] = [
    col::ITEM_ID,
    col::COLLECTION,
    col::DATETIME,
    col::END_DATETIME,
    col::CLOUD_FRACTION,
];

/// The answer columns of a part: those of every chip file, and those of
/// schema version 2 it has.
fn answer_columns(part: &rsembed_query::format::index::Part) -> Vec<&'static str> {
    ANSWER_BASE
        .iter()
        .chain(ANSWER_STAC.iter().filter(|c| part.has_column(c)))
        .copied()
        .collect()
}

/// A row group's answer columns fetched ahead of its hits, with every page
/// of them inflated where they all inflate; `None` where the in-place reader
/// does not take them or the fetch failed (the group's answer is then read
/// as any other's, which reports the failure).
type Ahead = Option<(Vec<Chunk>, Option<Vec<Vec<Page>>>)>;

/// Most row groups a single query reads ahead the answer columns of: a
/// query that scores fewer groups than there are cores leaves a core idle
/// while it scores, and its hits are in those groups.
fn read_ahead_groups() -> usize {
    // Asked once: `available_parallelism` reads the cgroup's files each call.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get())) - 1
}

/// [`Ahead`] for row group `g`.
async fn read_ahead(index: Arc<Index>, g: GroupRef) -> Ahead {
    let columns = answer_columns(&index.parts[g.part]);
    let chunks = answer_chunks(&index, g, &columns).await.ok()??;
    let pages = chunks
        .iter()
        .map(answer::inflate)
        .collect::<std::result::Result<Vec<_>, _>>()
        .ok();
    Some((chunks, pages))
}

/// The chunks of the answer `columns` of row group `g` for the in-place
/// reader ([`answer_rows`]); `None` where it does not take them.
async fn answer_chunks(index: &Index, g: GroupRef, columns: &[&str]) -> Result<Option<Vec<Chunk>>> {
    let part = &index.parts[g.part];
    if !columns.iter().all(|c| answer_type_ok(part, c)) {
        return Ok(None);
    }
    Ok(match index.flat_chunks(g, columns).await? {
        Ok(chunks) => Some(chunks),
        Err(why) => {
            tracing::debug!(uri = %part.uri, %why, "answer read by the arrow reader");
            None
        }
    })
}

/// The answer columns of rows `wanted` of row group `g`, from `ahead` when
/// they were read ahead.
async fn group_details(
    index: &Index,
    g: GroupRef,
    mut wanted: Vec<usize>,
    ahead: Option<tokio::task::JoinHandle<Ahead>>,
) -> Result<Vec<((GroupRef, usize), SearchResult)>> {
    let mut rows = Vec::with_capacity(wanted.len());
    wanted.sort_unstable();
    wanted.dedup();
    let part = &index.parts[g.part];
    let sel = selection_of(&wanted, part.group_rows(g.row_group));
    let tiling = part.file_meta.as_ref().map(|m| Arc::new(m.tiling.clone()));
    let columns = answer_columns(part);
    let ahead = match ahead {
        Some(h) => h.await.ok().flatten(),
        None => None,
    };
    let chunks = match ahead {
        Some(read) => Some(read),
        None => answer_chunks(index, g, &columns).await?.map(|c| (c, None)),
    };
    if let Some((chunks, pages)) = chunks {
        match answer_rows(g, &wanted, &columns, (&chunks, pages.as_deref()), &tiling) {
            Ok(rows) => return Ok(rows),
            Err(why) => tracing::debug!(uri = %part.uri, %why, "answer read by the arrow reader"),
        }
    }
    let mut s = index.stream(g, &columns, Some(sel)).await?;
    let mut next = wanted.iter();
    while let Some(batch) = s.next().await {
        let uri = &index.parts[g.part].uri;
        let batch = batch.map_err(|source| QueryError::Read {
            uri: uri.clone(),
            source,
        })?;
        let ids = string_col(&batch, col::CHIP_ID, uri)?;
        let uris = string_col(&batch, col::SOURCE_URI, uri)?;
        let crs = string_col(&batch, col::CRS, uri)?;
        let ints = |name: &str| -> Result<&Int32Array> {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<Int32Array>())
                .ok_or_else(|| QueryError::column(uri, name, "int32").into())
        };
        let (x, y, w, h) = (
            ints(col::X)?,
            ints(col::Y)?,
            ints(col::WIDTH)?,
            ints(col::HEIGHT)?,
        );
        let valid = batch
            .column_by_name(col::VALID_FRACTION)
            .and_then(|c| c.as_any().downcast_ref::<Float32Array>())
            .ok_or_else(|| QueryError::column(uri, col::VALID_FRACTION, "float32"))?;
        let f64s = |name: &str| -> Result<&Float64Array> {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<Float64Array>())
                .ok_or_else(|| QueryError::column(uri, name, "float64").into())
        };
        let (lon, lat) = (f64s(col::CENTRE_LON)?, f64s(col::CENTRE_LAT)?);
        let geom = batch
            .column_by_name(col::GEOMETRY)
            .and_then(|c| c.as_any().downcast_ref::<BinaryArray>())
            .ok_or_else(|| QueryError::column(uri, col::GEOMETRY, "binary"))?;
        let st = StacCols::of(&batch, uri)?;
        for i in 0..batch.num_rows() {
            let Some(&row) = next.next() else { break };
            let opt_f = |a: &Float64Array| a.is_valid(i).then(|| a.value(i));
            rows.push((
                (g, row),
                SearchResult {
                    query: None,
                    rank: 0,
                    score: None,
                    cosine: 0.0,
                    chip_id: ids.value(i).to_owned(),
                    source_uri: uris.value(i).to_owned(),
                    x: x.value(i),
                    y: y.value(i),
                    width: w.value(i),
                    height: h.value(i),
                    valid_fraction: valid.value(i),
                    crs: crs.is_valid(i).then(|| crs.value(i).to_owned()),
                    centre_lon: opt_f(lon),
                    centre_lat: opt_f(lat),
                    item_id: st.item_id.and_then(|a| opt_str(a, i)),
                    collection: st.collection.and_then(|a| opt_str(a, i)),
                    datetime: st.datetime.and_then(|a| opt_time(a, i)),
                    end_datetime: st.end_datetime.and_then(|a| opt_time(a, i)),
                    cloud_fraction: st
                        .cloud_fraction
                        .and_then(|a| a.is_valid(i).then(|| a.value(i))),
                    wkb: geom.is_valid(i).then(|| geom.value(i).to_vec()),
                    tiling: tiling.clone(),
                },
            ));
        }
    }
    Ok(rows)
}

/// A result read back, at its place.
type Found = ((GroupRef, usize), SearchResult);

/// Whether column `name` of `part` has the arrow type [`answer_rows`] reads.
fn answer_type_ok(part: &rsembed_query::format::index::Part, name: &str) -> bool {
    use arrow_schema::{DataType, TimeUnit};
    let Ok(f) = part.schema.field_with_name(name) else {
        return false;
    };
    let want = match name {
        col::X | col::Y | col::WIDTH | col::HEIGHT => DataType::Int32,
        col::VALID_FRACTION | col::CLOUD_FRACTION => DataType::Float32,
        col::CENTRE_LON | col::CENTRE_LAT => DataType::Float64,
        col::GEOMETRY => DataType::Binary,
        col::DATETIME | col::END_DATETIME => {
            return matches!(f.data_type(), DataType::Timestamp(TimeUnit::Microsecond, _));
        }
        _ => DataType::Utf8,
    };
    *f.data_type() == want
}

/// The results of rows `wanted` of row group `g` from its answer columns'
/// chunks (`columns[i]` in `chunks[i]`), read by [`rsembed_query::format::answer`];
/// `Err` with the reason where that reader does not take them.
fn answer_rows(
    g: GroupRef,
    wanted: &[usize],
    columns: &[&str],
    (chunks, inflated): (&[Chunk], Option<&[Vec<Page>]>),
    tiling: &Option<Arc<rsembed_schemas::job::TilingSpec>>,
) -> std::result::Result<Vec<Found>, String> {
    use parquet::data_type::{ByteArrayType, DoubleType, FloatType, Int32Type, Int64Type};
    let chunk = |name: &str| {
        columns
            .iter()
            .position(|c| *c == name)
            .map(|i| (&chunks[i], inflated.map(|p| p[i].clone())))
    };
    let need = |name: &str| chunk(name).ok_or_else(|| format!("no {name}"));
    let bytes = |name: &str| -> std::result::Result<Vec<Option<Vec<u8>>>, String> {
        let Some((c, pages)) = chunk(name) else {
            return Ok(vec![None; wanted.len()]);
        };
        Ok(answer::column::<ByteArrayType>(c, wanted, pages)?
            .into_iter()
            .map(|v| v.map(|b| b.data().to_vec()))
            .collect())
    };
    let strs = |name: &str| -> std::result::Result<Vec<Option<String>>, String> {
        bytes(name)?
            .into_iter()
            .map(|v| {
                v.map(|b| String::from_utf8(b).map_err(|_| format!("{name}: not UTF-8")))
                    .transpose()
            })
            .collect()
    };
    let ints = |name: &str| {
        let (c, pages) = need(name)?;
        answer::column::<Int32Type>(c, wanted, pages)
    };
    let f64s = |name: &str| {
        let (c, pages) = need(name)?;
        answer::column::<DoubleType>(c, wanted, pages)
    };
    let f32s = |name: &str| -> std::result::Result<Vec<Option<f32>>, String> {
        chunk(name).map_or(Ok(vec![None; wanted.len()]), |(c, pages)| {
            answer::column::<FloatType>(c, wanted, pages)
        })
    };
    let times = |name: &str| -> std::result::Result<Vec<Option<i64>>, String> {
        chunk(name).map_or(Ok(vec![None; wanted.len()]), |(c, pages)| {
            answer::column::<Int64Type>(c, wanted, pages)
        })
    };
    let (ids, uris, crs) = (strs(col::CHIP_ID)?, strs(col::SOURCE_URI)?, strs(col::CRS)?);
    let (x, y) = (ints(col::X)?, ints(col::Y)?);
    let (w, h) = (ints(col::WIDTH)?, ints(col::HEIGHT)?);
    let valid = f32s(col::VALID_FRACTION)?;
    let (lon, lat) = (f64s(col::CENTRE_LON)?, f64s(col::CENTRE_LAT)?);
    let geom = bytes(col::GEOMETRY)?;
    let (item, collection) = (strs(col::ITEM_ID)?, strs(col::COLLECTION)?);
    let (start, end) = (times(col::DATETIME)?, times(col::END_DATETIME)?);
    let cloud = f32s(col::CLOUD_FRACTION)?;
    let mut ids = ids.into_iter();
    let mut uris = uris.into_iter();
    let mut crs = crs.into_iter();
    let mut item = item.into_iter();
    let mut collection = collection.into_iter();
    let mut geom = geom.into_iter();
    Ok(wanted
        .iter()
        .enumerate()
        .map(|(i, &row)| {
            (
                (g, row),
                SearchResult {
                    query: None,
                    rank: 0,
                    score: None,
                    cosine: 0.0,
                    chip_id: ids.next().flatten().unwrap_or_default(),
                    source_uri: uris.next().flatten().unwrap_or_default(),
                    x: x[i].unwrap_or_default(),
                    y: y[i].unwrap_or_default(),
                    width: w[i].unwrap_or_default(),
                    height: h[i].unwrap_or_default(),
                    valid_fraction: valid[i].unwrap_or_default(),
                    crs: crs.next().flatten(),
                    centre_lon: lon[i],
                    centre_lat: lat[i],
                    item_id: item.next().flatten(),
                    collection: collection.next().flatten(),
                    datetime: start[i].and_then(rfc3339),
                    end_datetime: end[i].and_then(rfc3339),
                    cloud_fraction: cloud[i],
                    wkb: geom.next().flatten(),
                    tiling: tiling.clone(),
                },
            )
        })
        .collect())
}

/// The columns schema version 2 appended, those a batch has.
struct StacCols<'a> {
    item_id: Option<&'a StringArray>,
    collection: Option<&'a StringArray>,
    datetime: Option<&'a TimestampMicrosecondArray>,
    end_datetime: Option<&'a TimestampMicrosecondArray>,
    cloud_fraction: Option<&'a Float32Array>,
}

impl<'a> StacCols<'a> {
    fn of(batch: &'a RecordBatch, uri: &str) -> Result<StacCols<'a>> {
        fn get<'a, T: 'static>(
            batch: &'a RecordBatch,
            name: &str,
            uri: &str,
            expected: &'static str,
        ) -> Result<Option<&'a T>> {
            match batch.column_by_name(name) {
                None => Ok(None),
                Some(c) => Ok(Some(
                    c.as_any()
                        .downcast_ref::<T>()
                        .ok_or_else(|| QueryError::column(uri, name, expected))?,
                )),
            }
        }
        Ok(StacCols {
            item_id: get(batch, col::ITEM_ID, uri, "a string column")?,
            collection: get(batch, col::COLLECTION, uri, "a string column")?,
            datetime: get(batch, col::DATETIME, uri, "timestamp[µs, UTC]")?,
            end_datetime: get(batch, col::END_DATETIME, uri, "timestamp[µs, UTC]")?,
            cloud_fraction: get(batch, col::CLOUD_FRACTION, uri, "float32")?,
        })
    }
}

fn opt_str(a: &StringArray, i: usize) -> Option<String> {
    a.is_valid(i).then(|| a.value(i).to_owned())
}

/// Row `i` as RFC 3339 in UTC; `None` for a null or a time out of range.
fn opt_time(a: &TimestampMicrosecondArray, i: usize) -> Option<String> {
    a.is_valid(i).then(|| rfc3339(a.value(i))).flatten()
}

/// µs since the epoch as RFC 3339, UTC (`2024-07-01T10:30:00Z`).
pub(crate) fn rfc3339(us: i64) -> Option<String> {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(us) * 1000)
        .ok()?
        .format(&time::format_description::well_known::Rfc3339)
        .ok()
}

fn string_col<'a>(batch: &'a RecordBatch, name: &str, uri: &str) -> Result<&'a StringArray> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or_else(|| QueryError::column(uri, name, "a string column").into())
}

/// A WKB polygon (either byte order, 2D) as a GeoJSON geometry; `None` for
/// anything else or for bytes that do not parse (a footprint is only shown,
/// never trusted, here).
pub(crate) fn wkb_to_geojson(b: &[u8]) -> Option<Value> {
    // Only a plain 2D polygon (type code 3): what chip footprints are.
    let code: [u8; 4] = b.get(1..5)?.try_into().ok()?;
    let code = match b[0] {
        0 => u32::from_be_bytes(code),
        1 => u32::from_le_bytes(code),
        _ => return None,
    };
    if code != 3 {
        return None;
    }
    crate::wkb::to_geojson(b).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    use bytes::Bytes;
    use parquet::arrow::ArrowWriter;
    use parquet::file::metadata::ParquetMetaDataReader;
    use parquet::file::properties::WriterVersion;
    use rsembed_raster::geo::Footprint;
    use rsembed_schemas::embedding::EmbeddingType;
    use rsembed_schemas::ids::Window;
    use rsembed_worker::sink::parquet::chip_writer_properties_for;
    use rsembed_worker::sink::rows::{chip_batch, ChipRow, StacColumns};

    /// Every answer column, both schema versions'.
    fn answer() -> Vec<&'static str> {
        ANSWER_BASE.iter().chain(&ANSWER_STAC).copied().collect()
    }

    /// 1,000 chip rows, nulls in every nullable answer column.
    fn chip_rows() -> Vec<ChipRow> {
        (0..1000)
            .map(|i| ChipRow {
                chip_id: format!("{i:032x}"),
                source_uri: format!("s3://b/scene-{}.tif", i / 100),
                source_version: Some("1".into()),
                window: Window {
                    x: i * 16,
                    y: -i,
                    width: 16 + i % 3,
                    height: 16,
                },
                valid_fraction: i as f32 / 1000.0,
                crs: (i % 3 != 0).then(|| format!("EPSG:{}", 32600 + i % 60)),
                footprint: (i % 4 != 1).then(|| Footprint {
                    wkb: (0..(i % 50) as u8).collect(),
                    bbox: [i as f64, 0.0, i as f64 + 1.0, 1.0],
                }),
                centre: (i % 4 != 1).then(|| [i as f64 + 0.5, -0.5 * i as f64]),
                embedding: vec![0.25; 4],
                stac: StacColumns {
                    item_id: (i % 2 == 0).then(|| format!("item-{i}")),
                    collection: (i % 5 != 0).then(|| "sentinel-2-l2a".into()),
                    datetime: (i % 7 != 0).then(|| 1_700_000_000_000_000 + i as i64 * 1_000_001),
                    end_datetime: (i % 3 == 0).then(|| 1_700_000_000_000_000 + i as i64),
                    cloud_fraction: (i % 6 != 0).then(|| i as f32 / 2000.0),
                },
            })
            .collect()
    }

    /// Row group 0's answer column chunks of a chip file written with `version`.
    fn answer_chunks(rows: &[ChipRow], version: WriterVersion) -> Vec<Chunk> {
        let batch = chip_batch(rows, 4, EmbeddingType::F32).unwrap();
        // Version 2's default for byte arrays without a dictionary is
        // DELTA_BYTE_ARRAY, which the in-place read leaves to the arrow reader.
        let props = chip_writer_properties_for(Vec::new(), EmbeddingType::F32)
            .unwrap()
            .into_builder()
            .set_writer_version(version)
            .set_encoding(parquet::basic::Encoding::PLAIN)
            // Pages of 256 rows, as other writers make them: pages without
            // a chosen row are skipped, the others read from the middle.
            .set_data_page_row_count_limit(256)
            .set_write_batch_size(256)
            .build();
        let mut buf = Vec::new();
        let mut w = ArrowWriter::try_new(&mut buf, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let file = Bytes::from(buf);
        let meta = ParquetMetaDataReader::new()
            .parse_and_finish(&file)
            .unwrap();
        let rg = meta.row_group(0);
        let leaves = meta.file_metadata().schema_descr().columns().to_vec();
        answer()
            .iter()
            .map(|name| {
                let leaf = leaves
                    .iter()
                    .position(|c| c.path().parts() == [*name])
                    .unwrap();
                let (start, len) = rg.column(leaf).byte_range();
                Chunk {
                    data: file.slice(start as usize..(start + len) as usize),
                    meta: rg.column(leaf).clone(),
                    rows: rows.len(),
                }
            })
            .collect()
    }

    #[test]
    fn answer_columns_read_in_place_are_the_rows_written() {
        let rows = chip_rows();
        let g = GroupRef {
            part: 0,
            row_group: 0,
        };
        // Both page versions; rows at the edges of the 256-row pages.
        let wanted = [0, 1, 3, 7, 255, 256, 257, 511, 600, 766, 998, 999];
        for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
            let chunks = answer_chunks(&rows, version);
            assert!(chunks
                .iter()
                .all(|c| matches!(c.meta.compression(), parquet::basic::Compression::ZSTD(_))));
            let got = answer_rows(g, &wanted, &answer(), (&chunks, None), &None).unwrap();
            assert_eq!(got.len(), wanted.len());
            // Read from pages inflated ahead (a single query's idle core),
            // the same rows.
            let pages: Vec<Vec<Page>> =
                chunks.iter().map(|c| answer::inflate(c).unwrap()).collect();
            assert!(pages.iter().all(|p| p.len() > 1), "several pages a chunk");
            let ahead = answer_rows(g, &wanted, &answer(), (&chunks, Some(&pages)), &None).unwrap();
            assert_eq!(ahead, got);
            for (((gg, row), r), &w) in got.iter().zip(&wanted) {
                let e = &rows[w];
                assert_eq!((*gg, *row), (g, w));
                assert_eq!(r.chip_id, e.chip_id);
                assert_eq!(r.source_uri, e.source_uri);
                assert_eq!(
                    (r.x, r.y, r.width, r.height),
                    (e.window.x, e.window.y, e.window.width, e.window.height)
                );
                assert_eq!(r.valid_fraction, e.valid_fraction);
                assert_eq!(r.crs, e.crs, "row {w}");
                let fp = e.footprint.as_ref();
                assert_eq!(r.wkb, fp.map(|f| f.wkb.clone()), "row {w}");
                assert_eq!(r.centre_lon, e.centre.map(|c| c[0]), "row {w}");
                assert_eq!(r.centre_lat, e.centre.map(|c| c[1]), "row {w}");
                assert_eq!(r.item_id, e.stac.item_id, "row {w}");
                assert_eq!(r.collection, e.stac.collection, "row {w}");
                assert_eq!(r.datetime, e.stac.datetime.and_then(rfc3339), "row {w}");
                assert_eq!(r.end_datetime, e.stac.end_datetime.and_then(rfc3339));
                assert_eq!(r.cloud_fraction, e.stac.cloud_fraction, "row {w}");
            }
            // Rows out of order or past the group are refused, not read.
            assert!(answer_rows(g, &[5, 4], &answer(), (&chunks, None), &None).is_err());
            assert!(answer_rows(g, &[1000], &answer(), (&chunks, None), &None).is_err());
        }
    }

    #[test]
    fn corrupt_answer_chunks_are_errors_never_panics() {
        let rows = chip_rows();
        let g = GroupRef {
            part: 0,
            row_group: 0,
        };
        let clean = answer_chunks(&rows, WriterVersion::PARQUET_1_0);
        let mut rng = rsembed_query::ivf::Rng(0x5eed);
        let mut next = move || rng.next_u64();
        let (mut ok, mut refused) = (0, 0);
        for _ in 0..1500 {
            let mut chunks: Vec<Chunk> = clean
                .iter()
                .map(|c| Chunk {
                    data: c.data.clone(),
                    meta: c.meta.clone(),
                    rows: c.rows,
                })
                .collect();
            let c = next() as usize % chunks.len();
            let mut data = chunks[c].data.to_vec();
            for _ in 0..1 + next() % 4 {
                let at = next() as usize % data.len();
                data[at] ^= 1 << (next() % 8);
            }
            chunks[c].data = data.into();
            match answer_rows(g, &[2, 300, 700], &answer(), (&chunks, None), &None) {
                Ok(_) => ok += 1,
                Err(_) => refused += 1,
            }
            // Inflated ahead, every page: an error or pages, never a panic,
            // and what they give is what the chunk gives.
            let pages: std::result::Result<Vec<_>, _> =
                chunks.iter().map(answer::inflate).collect();
            if let Ok(pages) = pages {
                let ahead =
                    answer_rows(g, &[2, 300, 700], &answer(), (&chunks, Some(&pages)), &None);
                if let Ok(rows) = ahead {
                    let direct = answer_rows(g, &[2, 300, 700], &answer(), (&chunks, None), &None);
                    assert_eq!(Ok(rows), direct);
                }
            }
        }
        // Most flips land in compressed bytes and are caught; some in bytes
        // no chosen row needs.
        assert!(refused > 100, "{ok} read, {refused} refused");
    }

    #[test]
    fn wkb_polygons_become_geojson_and_garbage_does_not() {
        let mut b = vec![1u8];
        b.extend(3u32.to_le_bytes());
        b.extend(1u32.to_le_bytes());
        b.extend(4u32.to_le_bytes());
        for (x, y) in [(0.0f64, 0.0f64), (1.0, 0.0), (1.0, 1.0), (0.0, 0.0)] {
            b.extend(x.to_le_bytes());
            b.extend(y.to_le_bytes());
        }
        let g = wkb_to_geojson(&b).unwrap();
        assert_eq!(g["type"], "Polygon");
        assert_eq!(g["coordinates"][0][2], json!([1.0, 1.0]));
        // A ring count that the bytes cannot hold is refused before allocating.
        let mut bad = vec![1u8];
        bad.extend(3u32.to_le_bytes());
        bad.extend(u32::MAX.to_le_bytes());
        assert!(wkb_to_geojson(&bad).is_none());
        assert!(wkb_to_geojson(&b[..b.len() - 1]).is_none());
        assert!(wkb_to_geojson(&[]).is_none());
    }

    #[test]
    fn times_print_as_rfc3339_utc() {
        assert_eq!(
            rfc3339(1_720_000_000_000_000).as_deref(),
            Some("2024-07-03T09:46:40Z")
        );
        assert_eq!(rfc3339(1_500).as_deref(), Some("1970-01-01T00:00:00.0015Z"));
        assert_eq!(rfc3339(i64::MAX), None);
    }
}
