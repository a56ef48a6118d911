//! The query commands, run by the `rsembed-query` crate (`coordinator/query/`).
//! The coordinator lends it what it does not hold: the model's text graph
//! on ONNX Runtime ([`crate::text::OrtText`]), the hits' chips read again
//! from their sources for `search --html` (`query/thumbs.rs`), and the warning for
//! an index whose job has not finished.

mod thumbs;

use std::io::Write;

use rsembed_query::classify::ClassifySummary;
use rsembed_query::compact::{CompactArgs, CompactSummary};
use rsembed_query::search::Lent;
use rsembed_store::StoreCache;

use crate::cli::{ClassifyCommand, SearchCommand};
use crate::error::Result;
use crate::job::output::JobOutput;
use crate::text::OrtText;

/// `rsembed search`: runs it and prints its results to `out`.
pub async fn search(args: SearchCommand, out: &mut dyn Write) -> Result<()> {
    if let Some(w) = unfinished_job(&args.search.index).await {
        eprintln!("rsembed search: {w}");
    }
    let model = args
        .model
        .as_deref()
        .map(|m| OrtText::open(m, &args.engine))
        .transpose()?;
    let chips = args
        .search
        .html
        .is_some()
        .then(|| thumbs::SourceChips::new(model.as_ref().map(OrtText::dir)));
    let lent = Lent {
        model: model.as_ref().map(|m| m as _),
        chips: chips.as_ref().map(|c| c as _),
    };
    Ok(rsembed_query::search::run(args.search, lent, out).await?)
}

/// `rsembed classify`.
pub async fn classify(args: ClassifyCommand) -> Result<ClassifySummary> {
    let model = OrtText::open(&args.model, &args.engine)?;
    Ok(rsembed_query::classify::classify(args.classify, &model).await?)
}

/// `rsembed compact`.
pub async fn compact(args: CompactArgs) -> Result<CompactSummary> {
    Ok(rsembed_query::compact::compact(args).await?)
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
        JobOutput::new(loc).unfinished().await
    };
    match check.await {
        Ok(u) => u.map(|u| u.warning()),
        Err(e) => {
            tracing::debug!(error = %e, "cannot tell whether the index's job is finished");
            None
        }
    }
}
