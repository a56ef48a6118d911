//! `search --vectors -` and `--queries -`: a resident search. The index
//! stays open, with its centroids and every footer (and the model's text
//! graph for `--queries -`), and each line of standard input, a vector or a
//! text, is answered as it arrives, by one JSON line on standard output:
//! `{"query": N, "results": [...]}`, or `{"query": N, "error": "..."}` for a
//! line that is not a query (not a vector of the index's dimension, not
//! UTF-8, over 1 MiB); the search goes on.
//!
//! Lines that arrive together (a client writing several before reading) are
//! answered as one batch, one pass over their row groups, each query scored
//! against its own lists as in `--vectors FILE`; a client writing one line
//! and waiting gets that line's answer alone.
//!
//! Why: a search process spends most of a single query opening the index
//! (footers, centroids), 30–40 ms at 10^6 rows, against a few ms for the
//! query itself. A client with a stream of queries (a notebook, a service)
//! pays that once.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::time::Instant;

use super::{batch, Lent, SearchArgs, SearchResult, SearchStats, Searcher};
use crate::kernels::normalize;
use crate::text;
use crate::{Error, Result};

/// Bytes of one input line, at most: a vector of D = 1152 as JSON is about
/// 25 KB. A longer line is answered with an error, and skipped unread.
const MAX_LINE_BYTES: usize = 1 << 20;

/// Lines read ahead of the search, at most: the reader waits beyond.
const LINES_AHEAD: usize = 256;
/// Bytes of input lines in one batch, at most (besides the line count,
/// [`batch::MAX_QUERIES`]): what a client writes at once is held until its
/// batch is parsed.
const BATCH_BYTES: usize = 64 << 20;

/// A line of input: its number (1-based) and text, or why it was not read.
type Line = (usize, std::result::Result<String, String>);

fn line_bytes(l: &Line) -> usize {
    l.1.as_ref().map_or(0, String::len)
}

/// Reads standard input in a thread of its own, line by line, so that the
/// search answers what has arrived while the client writes on.
fn read_lines(mut input: impl BufRead, tx: tokio::sync::mpsc::Sender<Line>) {
    let mut n = 0;
    loop {
        n += 1;
        let (line, last) = match bounded_line(&mut input) {
            Ok(None) => return,
            Ok(Some(Ok(text))) if text.trim().is_empty() => continue,
            Ok(Some(r)) => (r, false),
            Err(e) => (Err(format!("reading standard input: {e}")), true),
        };
        if tx.blocking_send((n, line)).is_err() || last {
            return;
        }
    }
}

/// The next line of `input` without its end: `None` at the end of input; an
/// error text for a line over [`MAX_LINE_BYTES`] (consumed to its end, never
/// held) or not UTF-8.
fn bounded_line(
    input: &mut impl BufRead,
) -> std::io::Result<Option<std::result::Result<String, String>>> {
    let mut buf = Vec::new();
    let mut over = false;
    let mut any = false;
    loop {
        let chunk = input.fill_buf()?;
        if chunk.is_empty() {
            break;
        }
        any = true;
        let (take, end) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        if !over {
            if buf.len() + take > MAX_LINE_BYTES + 1 {
                over = true;
                buf = Vec::new();
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        input.consume(take);
        if end {
            break;
        }
    }
    if !any {
        return Ok(None);
    }
    if over {
        return Ok(Some(Err(format!(
            "longer than {} KiB: not a query vector",
            MAX_LINE_BYTES >> 10
        ))));
    }
    Ok(Some(
        String::from_utf8(buf).map_err(|_| "not UTF-8 text".to_owned()),
    ))
}

/// Runs the resident search: answers every line of standard input, then
/// prints the closing line of the whole session to stderr.
pub(super) async fn run(args: &SearchArgs, lent: Lent<'_>, out: &mut dyn Write) -> Result<()> {
    super::one_query_source(args)?;
    if args.geojson || args.html.is_some() {
        return Err(Error::Usage(
            "rsembed search --vectors - / --queries -: answers are JSON lines, one a query; \
             --geojson and --html are for a search of a file"
                .into(),
        ));
    }
    let t0 = Instant::now();
    // Every footer held, and the chunks read kept (up to a budget): a resident
    // search reads each footer once, and the same lists again and again.
    let searcher = Searcher::open(args, lent.model, true).await?;
    let dim = searcher.index.embed_dim;
    let mut texts = match &args.queries {
        Some(_) => {
            let m = searcher.model.ok_or_else(|| {
                Error::Usage(
                    "rsembed search: --queries needs --model (the model the index was embedded with)"
                        .into(),
                )
            })?;
            Some(m.encoder().map_err(Error::Text)?)
        }
        None => None,
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Line>(LINES_AHEAD);
    std::thread::spawn(move || read_lines(std::io::stdin().lock(), tx));
    let (mut total, mut asked) = (SearchStats::default(), 0usize);
    while let Some(first) = rx.recv().await {
        let mut bytes = line_bytes(&first);
        let mut lines = vec![first];
        while lines.len() < batch::MAX_QUERIES && bytes < BATCH_BYTES {
            match rx.try_recv() {
                Ok(l) => {
                    bytes += line_bytes(&l);
                    lines.push(l);
                }
                Err(_) => break,
            }
        }
        let mut answers: BTreeMap<usize, Answer> = BTreeMap::new();
        let mut queries = Vec::new();
        let mut failed = |n: usize, why: String| {
            answers.insert(
                n,
                Answer {
                    query: n,
                    results: None,
                    error: Some(why),
                },
            );
        };
        match texts.as_mut() {
            None => {
                for (n, line) in lines {
                    match line.and_then(|l| batch::vector_line(&l, dim)) {
                        Ok(v) => queries.push((Some(n), v)),
                        Err(why) => failed(n, why),
                    }
                }
            }
            Some(enc) => {
                let mut good = Vec::new();
                for (n, line) in lines {
                    match line {
                        Ok(t) => good.push((n, t.trim().to_owned())),
                        Err(why) => failed(n, why),
                    }
                }
                let (numbers, strings): (Vec<usize>, Vec<String>) = good.into_iter().unzip();
                let rows = text::embed_with(enc.as_mut(), &strings)?;
                for (n, mut v) in numbers.into_iter().zip(rows) {
                    match normalize(&mut v) {
                        Ok(()) => queries.push((Some(n), v)),
                        Err(_) => failed(n, "its embedding is zero or not finite".into()),
                    }
                }
            }
        }
        if !queries.is_empty() {
            let (results, stats) = searcher
                .answer(args, &queries, searcher.probed(&queries).await?, None, t0)
                .await?;
            let mut by_query: BTreeMap<usize, Vec<SearchResult>> = queries
                .iter()
                .map(|(n, _)| (n.expect("numbered"), Vec::new()))
                .collect();
            for r in results {
                by_query
                    .entry(r.query.expect("numbered"))
                    .or_default()
                    .push(r);
            }
            for (n, rs) in by_query {
                answers.insert(
                    n,
                    Answer {
                        query: n,
                        results: Some(rs),
                        error: None,
                    },
                );
            }
            total.add(&stats);
            asked += queries.len();
        }
        let written = answers
            .values()
            .try_for_each(|a| {
                serde_json::to_writer(&mut *out, a)?;
                writeln!(out)
            })
            .and_then(|()| out.flush());
        match written {
            Ok(()) => {}
            // The client went away: the session is over, quietly.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(Error::Io(e)),
        }
    }
    let p = &total.pruning;
    eprintln!(
        "rsembed search: scored {} of {} rows; read {} of {} row groups ({asked} queries, row groups counted once a batch){}; {:.1} MiB fetched; {:.3} s",
        total.rows_scored,
        p.rows_total,
        p.groups_kept,
        p.groups_total,
        super::excluded(args, &total.missing),
        total.bytes_read as f64 / (1024.0 * 1024.0),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The answer to one line. Written as is, not through a JSON tree, so that
/// cosines print as `--json` prints them (shortest float32 form).
#[derive(serde::Serialize)]
struct Answer {
    query: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    results: Option<Vec<SearchResult>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_bounded_numbered_and_blank_ones_skipped() {
        let long = "9".repeat(MAX_LINE_BYTES + 10);
        let bytes = [
            b"[1, 0]\n\n".as_slice(),
            long.as_bytes(),
            b"\n\xff\xfe\n[0, 2]",
        ]
        .concat();
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        read_lines(std::io::Cursor::new(bytes), tx);
        let mut got = Vec::new();
        while let Ok(l) = rx.try_recv() {
            got.push(l);
        }
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(got[0], (1, Ok("[1, 0]\n".to_owned())));
        assert_eq!(got[1].0, 3);
        assert!(got[1].1.as_ref().unwrap_err().contains("longer than"));
        assert_eq!(got[2].0, 4);
        assert!(got[2].1.as_ref().unwrap_err().contains("UTF-8"));
        assert_eq!(got[3], (5, Ok("[0, 2]".to_owned())));
        assert_eq!(batch::vector_line("[0, 2]", 2), Ok(vec![0.0, 1.0]));
        assert!(batch::vector_line("[0, 2, 3]", 2)
            .unwrap_err()
            .contains("3 numbers"));
        assert!(batch::vector_line("[0, 0]", 2)
            .unwrap_err()
            .contains("zero"));
        assert!(batch::vector_line("{}", 2)
            .unwrap_err()
            .contains("JSON array"));
    }
}
