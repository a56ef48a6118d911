//! A static catalog or collection, crawled through its `child` and `item`
//! links, depth-first in link order, on any object store or over http(s).
//! A collection of an API (`items` link, no `item` links: a STAC API or OGC
//! API Features collection URL, or the children of an API root) is paged
//! through its `items` link instead, with the search's `bbox`, `datetime`
//! and `limit` sent and every filter applied here.
//!
//! Relative hrefs resolve against the document that holds them, as it was
//! read (so a catalog copied elsewhere still works). A child-link loop is
//! noticed by the catalogs already visited (not the items: the same item
//! under two parents is the source's dedup), warned about once, and not
//! followed; the crawl goes on.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use futures::{StreamExt, TryStreamExt};
use serde_json::Value;
use url::Url;

use rsembed_schemas::job::StacSearch;

use super::emit::{href_of, links, parse, Emit, Flow};
use super::fetch::{Fetcher, MAX_DOCUMENT, MAX_ITEM};
use crate::error::{Error, Result};

/// How deep child links may nest. Real catalogs nest a handful of levels
/// (root, collection, year, month, tile); this bounds a hostile chain of
/// children that never ends without a loop.
pub const MAX_DEPTH: usize = 64;
/// Item documents read at once. Object stores answer in tens of
/// milliseconds each; sixteen at a time hides that, and the order is kept.
/// At most this many times `MAX_ITEM` bytes are held.
const ITEMS_IN_FLIGHT: usize = 16;

/// One catalog being walked: its URL, its links still to follow.
struct Level {
    url: Url,
    links: std::vec::IntoIter<stac::Link>,
    /// The `items` link of an API collection, until it is paged through.
    items: Option<Url>,
}

/// Streams the items under the catalog or collection at `url`.
pub(crate) async fn stream(
    f: &Fetcher,
    url: &str,
    search: &StacSearch,
    emit: &mut Emit<'_>,
) -> Result<()> {
    let root = Url::parse(url).map_err(|e| Error::Stac {
        url: url.into(),
        reason: format!("not a URL: {e}"),
    })?;
    let mut visited: HashSet<String> = HashSet::new();
    let mut warned = false;
    let mut stack = vec![open(f, &root, emit).await?];
    visited.insert(root.to_string());
    while let Some(level) = stack.last_mut() {
        if let Some(items) = level.items.take() {
            if super::api::stream_items_link(f, &items, search, emit).await? == Flow::Stop {
                return Ok(());
            }
            continue;
        }
        let Some(link) = level.links.next() else {
            stack.pop();
            continue;
        };
        let base = level.url.clone();
        let Ok(href) = base.join(&link.href) else {
            return Err(Error::Stac {
                url: base.to_string(),
                reason: format!("link `{}` does not resolve", link.href),
            });
        };
        if link.is_child() {
            if !visited.insert(without_fragment(&href)) {
                if !warned {
                    tracing::warn!(catalog = %base, child = %href,
                        "STAC catalog: a child link leads back to a catalog already crawled (a loop); not followed");
                    warned = true;
                }
                continue;
            }
            if stack.len() >= MAX_DEPTH {
                return Err(Error::Stac {
                    url: href.to_string(),
                    reason: format!("child links nest deeper than {MAX_DEPTH} catalogs"),
                });
            }
            let child = open(f, &href, emit).await?;
            stack.push(child);
        } else if link.is_item() {
            // The item links that follow this one are read together, in order.
            let mut run = vec![href];
            let rest = std::mem::take(&mut level.links).collect::<Vec<_>>();
            let mut rest = rest.into_iter().peekable();
            while let Some(next) = rest.next_if(|l| l.is_item()) {
                match base.join(&next.href) {
                    Ok(u) => run.push(u),
                    Err(_) => {
                        return Err(Error::Stac {
                            url: base.to_string(),
                            reason: format!("link `{}` does not resolve", next.href),
                        })
                    }
                }
            }
            level.links = rest.collect::<Vec<_>>().into_iter();
            if items(f, run, emit).await? == Flow::Stop {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Reads a catalog or collection and the links to walk.
async fn open(f: &Fetcher, url: &Url, emit: &mut Emit<'_>) -> Result<Level> {
    let doc: Value = parse(url.as_str(), &f.read(url.as_str(), MAX_DOCUMENT).await?)?;
    emit.stats.documents.fetch_add(1, Ordering::Relaxed);
    match doc.get("type").and_then(Value::as_str) {
        Some("Catalog" | "Collection") => {}
        other => {
            return Err(Error::Stac {
                url: url.to_string(),
                reason: format!(
                    "a child link leads to {}, not a Catalog or Collection",
                    other.map_or("a document without `type`".into(), |t| format!("`{t}`"))
                ),
            })
        }
    }
    let links = links(&doc);
    let items = items_link(url, &links)?;
    Ok(Level {
        url: url.clone(),
        links: links.into_iter(),
        items,
    })
}

/// The `items` link to page through: a collection's that has no `item`
/// links (a static collection lists its items; an API's pages them), on an
/// http(s) server.
fn items_link(url: &Url, links: &[stac::Link]) -> Result<Option<Url>> {
    if links.iter().any(|l| l.is_item()) {
        return Ok(None);
    }
    let Some(l) = links.iter().find(|l| l.rel == "items") else {
        return Ok(None);
    };
    let href = url.join(&l.href).map_err(|_| Error::Stac {
        url: url.to_string(),
        reason: format!("link `{}` does not resolve", l.href),
    })?;
    // Only a server pages; a file behind `items` is no API.
    Ok(super::fetch::is_http(href.as_str()).then_some(href))
}

/// Reads item documents (several at a time, in order) and sends them.
async fn items(f: &Fetcher, urls: Vec<Url>, emit: &mut Emit<'_>) -> Result<Flow> {
    let mut docs = futures::stream::iter(urls)
        .map(|u| async move {
            let got = f.read(u.as_str(), MAX_ITEM).await;
            (u, got)
        })
        .buffered(ITEMS_IN_FLIGHT)
        .map(Ok::<_, Error>);
    while let Some((url, got)) = docs.try_next().await? {
        let href = url.to_string();
        let bytes = match got {
            Ok(b) => b,
            // An outage stops the crawl (a retry may finish it); a missing
            // or oversized item is that item's error.
            Err(e)
                if e.retry_hint() != rsembed_worker::retry::RetryHint::Never
                    && !is_not_found(&e) =>
            {
                return Err(e)
            }
            Err(e) => {
                if emit.bad(href, None, format!("cannot be read: {e}")).await == Flow::Stop {
                    return Ok(Flow::Stop);
                }
                continue;
            }
        };
        emit.stats.documents.fetch_add(1, Ordering::Relaxed);
        let json: Value = match serde_json::from_slice(&bytes) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => {
                if emit.bad(href, None, "is not a JSON object".into()).await == Flow::Stop {
                    return Ok(Flow::Stop);
                }
                continue;
            }
            Err(e) => {
                if emit.bad(href, None, format!("is not JSON: {e}")).await == Flow::Stop {
                    return Ok(Flow::Stop);
                }
                continue;
            }
        };
        // The item is named by its self link; its assets resolve against
        // where it was read, which is where the catalog's files are.
        let (href, _) = href_of(&json, &url, url.as_str());
        if emit.item(json, href, url).await == Flow::Stop {
            return Ok(Flow::Stop);
        }
    }
    Ok(Flow::Go)
}

/// An item document that is not there (a 404, a missing file): a broken
/// link, which retrying does not mend.
fn is_not_found(e: &Error) -> bool {
    match e {
        Error::StacStatus { status, .. } => *status == 404 || *status == 410,
        Error::StacFetch { source, .. } => matches!(
            source.downcast_ref::<object_store::Error>(),
            Some(object_store::Error::NotFound { .. })
        ),
        _ => false,
    }
}

fn without_fragment(u: &Url) -> String {
    let mut u = u.clone();
    u.set_fragment(None);
    u.to_string()
}
