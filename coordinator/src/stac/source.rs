//! What a STAC `--input` is, and its items as a stream.
//!
//! [`detect`] (in `detect.rs`) tells a STAC API root, a static catalog or
//! collection, an API collection or item URL and an item collection apart
//! from the inputs the planner already knows (images, scenes, archives,
//! folders), and refuses JSON that is none of these; [`stream_items`] sends the items a search
//! selects, in a deterministic order, into a bounded channel, so the planner
//! holds one page at a time however large the search, and ends in an error
//! naming the search when it selects nothing.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use rsembed_schemas::job::StacSearch;
use rsembed_worker::store::StoreCache;
use tokio::sync::mpsc::Sender;

pub use super::detect::detect;
use super::emit::Emit;
pub use super::emit::{Conformance, Found, FoundItem, ItemsFormat, SourceStats, StacInput};
use super::fetch::Fetcher;
use super::search::{as_flags, ClientFilter};
use crate::error::{Error, Result};

/// Streams every selected item into `tx` in a deterministic order, stopping
/// after `search.max_items` items; returns when done. Dedups items by href
/// (a 128-bit hash per item, not the strings) so an item reached twice
/// (two parents, an unstable API page order) is planned once.
///
/// [`Found::Bad`] counts towards `max_items` like an item: both become one
/// entry of the plan. A receiver that hangs up ends the stream quietly.
pub async fn stream_items(
    stores: &StoreCache,
    input: &StacInput,
    search: &StacSearch,
    stats: &SourceStats,
    tx: Sender<Found>,
) -> Result<()> {
    let f = Fetcher::new(stores)?;
    let api = matches!(input, StacInput::Api { .. });
    let filter = ClientFilter::new(search, !api).map_err(Error::Usage)?;
    let mut emit = Emit {
        tx,
        stats,
        seen: HashSet::new(),
        max: search.max_items,
        sent: 0,
        filter,
        asked: None,
        asked_total: 0,
        closed: false,
    };
    if emit.full() {
        return Ok(());
    }
    match input {
        StacInput::Api { root, conformance } => {
            super::api::stream(&f, root, *conformance, search, &mut emit).await
        }
        StacInput::Catalog { url } => super::catalog::stream(&f, url, search, &mut emit).await,
        StacInput::Items { url, format } => {
            super::items::stream(&f, stores, url, *format, &mut emit).await
        }
    }?;
    if emit.sent == 0 && !emit.closed {
        return Err(no_items(input, search, &emit));
    }
    Ok(())
}

/// The error of a search that selected nothing, with the search as sent
/// (requests to a server) and what the client filters left out: an empty
/// plan must say which search was empty, not that a folder held no images.
fn no_items(input: &StacInput, search: &StacSearch, emit: &Emit<'_>) -> Error {
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let (filtered, duplicates) = (n(&emit.stats.filtered), n(&emit.stats.duplicates));
    let source = match (&emit.asked, input) {
        (Some(first), _) if emit.asked_total > 1 => {
            format!("{first} (and {} more item requests)", emit.asked_total - 1)
        }
        (Some(first), _) => first.clone(),
        (None, StacInput::Catalog { url }) => format!("{url} (a static catalog)"),
        (None, StacInput::Items { url, .. }) => format!("{url} (an item collection)"),
        (None, StacInput::Api { root, .. }) => root.to_string(),
    };
    let what = if filtered == 0 && duplicates == 0 {
        "gave no item".to_owned()
    } else {
        let mut parts = Vec::new();
        if filtered > 0 {
            let flags = as_flags(search);
            let by = if flags.is_empty() {
                String::new()
            } else {
                format!(" ({flags})")
            };
            parts.push(format!(
                "{filtered} left out by the filters applied here{by}"
            ));
        }
        if duplicates > 0 {
            parts.push(format!("{duplicates} repeated"));
        }
        format!(
            "gave {} item(s): {}",
            filtered + duplicates,
            parts.join(", ")
        )
    };
    Error::NoInputs(format!("the search matched no items: {source} {what}"))
}
