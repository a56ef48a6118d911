//! What the sources of STAC items share: the input kinds and their
//! conformance, the items found, the sending end that judges, dedups, counts
//! and sends them, and the reading of their documents and links.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;
use sha2::Digest;
use tokio::sync::mpsc::Sender;
use url::Url;

use super::search::{ClientFilter, Verdict};
use crate::error::{Error, Result};

/// A STAC input.
#[derive(Debug, Clone, PartialEq)]
pub enum StacInput {
    /// A STAC API root; its landing page's conformsTo holds item-search.
    Api {
        /// The landing page.
        root: Url,
        /// What the server conforms to.
        conformance: Conformance,
    },
    /// A static catalog.json or collection.json (any object store URL or
    /// path), or a collection of an API (its URL, `…/collections/<id>`),
    /// whose items are paged through its `items` link.
    Catalog {
        /// The document, as a canonical URL.
        url: String,
    },
    /// An ItemCollection: .json FeatureCollection, .ndjson, stac-geoparquet
    /// .parquet; or one Item (an API's item URL, `…/items/<id>`).
    Items {
        /// The file, as a canonical URL.
        url: String,
        /// How it is written.
        format: ItemsFormat,
    },
}

impl StacInput {
    /// The input's URL.
    pub fn url(&self) -> String {
        match self {
            StacInput::Api { root, .. } => root.to_string(),
            StacInput::Catalog { url } | StacInput::Items { url, .. } => url.clone(),
        }
    }
}

/// The search classes a STAC API conforms to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Conformance {
    /// Item search (`/search`).
    pub item_search: bool,
    /// The filter extension (CQL2).
    pub filter: bool,
    /// The query extension.
    pub query: bool,
}

impl Conformance {
    /// The classes named in a `conformsTo` list.
    pub fn of(conforms_to: &[Value]) -> Conformance {
        let mut c = Conformance::default();
        for uri in conforms_to.iter().filter_map(Value::as_str) {
            // Versions differ (v1.0.0, v1.0.0-rc.2, ...); the class names do not.
            if uri.contains("api.stacspec.org/") {
                if uri.ends_with("/item-search") {
                    c.item_search = true;
                } else if uri.ends_with("/item-search#filter") {
                    c.filter = true;
                } else if uri.ends_with("/item-search#query") {
                    c.query = true;
                }
            } else if uri.contains("/ogcapi-features-3/") && uri.ends_with("/conf/filter")
                || uri.contains("/cql2/")
                    && (uri.ends_with("/conf/cql2-text") || uri.ends_with("/conf/basic-cql2"))
            {
                c.filter = true;
            }
        }
        c
    }
}

/// How an item collection is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemsFormat {
    /// One GeoJSON FeatureCollection (or one Feature).
    Json,
    /// One item per line.
    Ndjson,
    /// stac-geoparquet.
    Parquet,
}

/// One item found.
#[derive(Debug, Clone)]
pub struct FoundItem {
    /// Absolute URL of the item: its self link, else the API's item URL
    /// `<root>/collections/<c>/items/<id>`, else the document it was read from
    /// (with `#<id>` for an item inside an item collection).
    pub href: String,
    /// Base URL against which the item's relative asset hrefs resolve.
    pub base: Url,
    /// The item.
    pub item: stac::Item,
}

/// What the source found.
#[derive(Debug, Clone)]
pub enum Found {
    /// A selected item.
    Item(Box<FoundItem>),
    /// An item that cannot be judged or read (non-numeric eo:cloud_cover when
    /// --cloud-cover-max is given, no geometry under a client-side --bbox, an
    /// item that does not parse inside an otherwise good page): becomes the
    /// item's error record, so nothing is skipped silently.
    Bad {
        /// Where the item is (as [`FoundItem::href`]).
        href: String,
        /// Its id, when it has one.
        id: Option<String>,
        /// Why it cannot be used.
        reason: String,
    },
}

/// Counts of a source's work, for progress and the summary.
#[derive(Debug, Default)]
pub struct SourceStats {
    /// Documents read: landing pages, catalogs, collections, item files.
    pub documents: AtomicU64,
    /// API pages, `.ndjson` lines or stac-geoparquet batches read.
    pub pages: AtomicU64,
    /// Items sent ([`Found::Item`]).
    pub items: AtomicU64,
    /// Items the client filters did not select.
    pub filtered: AtomicU64,
    /// Items reached a second time (two parents, an unstable page order).
    pub duplicates: AtomicU64,
    /// Items sent as [`Found::Bad`].
    pub bad: AtomicU64,
}

/// A document's links that parse (a link that does not is no link).
pub(crate) fn links(doc: &Value) -> Vec<stac::Link> {
    doc.get("links")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|l| serde_json::from_value(l.clone()).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A document as JSON, or an error naming it.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(url: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::Stac {
        url: url.into(),
        reason: format!("not STAC JSON: {e}"),
    })
}

/// Whether the stream goes on after an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Go,
    Stop,
}

/// The sending end of a source: judges, dedups, counts and sends.
pub(crate) struct Emit<'a> {
    pub(super) tx: Sender<Found>,
    pub(crate) stats: &'a SourceStats,
    pub(super) seen: HashSet<u128>,
    pub(super) max: Option<u64>,
    pub(super) sent: u64,
    pub(super) filter: ClientFilter,
    /// The first request sent to a server, as a person reads it (the
    /// search as sent, for the error of an empty one), and how many were.
    pub(super) asked: Option<String>,
    pub(super) asked_total: u64,
    /// The receiver hung up: the planner stopped, so no error of our own.
    pub(super) closed: bool,
}

impl Emit<'_> {
    /// Notes a first request to a server.
    pub(crate) fn asked(&mut self, request: String) {
        self.asked_total += 1;
        self.asked.get_or_insert(request);
    }

    /// Whether `max_items` entries were sent.
    pub(crate) fn full(&self) -> bool {
        self.max.is_some_and(|m| self.sent >= m)
    }

    /// How many more entries are wanted; `None`: all.
    pub(crate) fn remaining(&self) -> Option<u64> {
        self.max.map(|m| m.saturating_sub(self.sent))
    }

    /// How many entries were sent.
    pub(crate) fn sent(&self) -> u64 {
        self.sent
    }

    /// Judges one item (its JSON) and sends it when selected. `href` and
    /// `base` as [`FoundItem`] says.
    pub(crate) async fn item(&mut self, json: Value, href: String, base: Url) -> Flow {
        let id = json.get("id").and_then(Value::as_str).map(str::to_owned);
        match self.filter.judge(&json) {
            Verdict::Drop => {
                self.stats.filtered.fetch_add(1, Ordering::Relaxed);
                return Flow::Go;
            }
            Verdict::Bad(reason) => return self.bad(href, id, reason).await,
            Verdict::Keep => {}
        }
        if !self.first_time(&href) {
            return Flow::Go;
        }
        if id.as_deref().is_none_or(str::is_empty) {
            return self.send(bad(href, None, "has no id".into())).await;
        }
        match serde_json::from_value::<stac::Item>(json) {
            Ok(item) => {
                self.stats.items.fetch_add(1, Ordering::Relaxed);
                self.send(Found::Item(Box::new(FoundItem { href, base, item })))
                    .await
            }
            Err(e) => {
                self.send(bad(href, id, format!("is not a STAC item: {e}")))
                    .await
            }
        }
    }

    /// Sends an item that cannot be used (once per href).
    pub(crate) async fn bad(&mut self, href: String, id: Option<String>, reason: String) -> Flow {
        if !self.first_time(&href) {
            return Flow::Go;
        }
        self.send(bad(href, id, reason)).await
    }

    fn first_time(&mut self, href: &str) -> bool {
        let h = sha2::Sha256::digest(href.as_bytes());
        let key = u128::from_le_bytes(h[..16].try_into().expect("16 bytes of 32"));
        let new = self.seen.insert(key);
        if !new {
            self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
        }
        new
    }

    async fn send(&mut self, found: Found) -> Flow {
        if let Found::Bad { href, reason, .. } = &found {
            self.stats.bad.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(item = %href, reason = %reason, "STAC item cannot be used");
        }
        if self.tx.send(found).await.is_err() {
            self.closed = true;
            return Flow::Stop;
        }
        self.sent += 1;
        if self.full() {
            Flow::Stop
        } else {
            Flow::Go
        }
    }
}

fn bad(href: String, id: Option<String>, reason: String) -> Found {
    let reason = match &id {
        Some(id) => format!("STAC item {id} ({href}): {reason}"),
        None => format!("STAC item {href}: {reason}"),
    };
    Found::Bad { href, id, reason }
}

/// An item's href and base: its self link (resolved against `doc`), else
/// `fallback`. The base is the self link too, unless `read_from` is given
/// (an item document of a static catalog: where it was actually read).
pub(crate) fn href_of(json: &Value, doc: &Url, fallback: &str) -> (String, Url) {
    let self_link = json
        .get("links")
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .find(|l| l.get("rel").and_then(Value::as_str) == Some("self"))
        })
        .and_then(|l| l.get("href").and_then(Value::as_str))
        .and_then(|h| doc.join(h).ok());
    match self_link {
        Some(u) => (u.to_string(), u),
        None => {
            let base = Url::parse(fallback).unwrap_or_else(|_| doc.clone());
            (fallback.to_owned(), base)
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conformance_classes_of_any_version() {
        let c = Conformance::of(&[
            json!("https://api.stacspec.org/v1.0.0/core"),
            json!("https://api.stacspec.org/v1.0.0-rc.2/item-search"),
            json!("https://api.stacspec.org/v1.0.0-rc.2/item-search#query"),
        ]);
        assert_eq!(
            c,
            Conformance {
                item_search: true,
                filter: false,
                query: true
            }
        );
        let c = Conformance::of(&[
            json!("https://api.stacspec.org/v1.0.0/item-search"),
            json!("http://www.opengis.net/spec/ogcapi-features-3/1.0/conf/filter"),
            json!(7),
        ]);
        assert!(c.item_search && c.filter && !c.query);
        let c = Conformance::of(&[json!("https://api.stacspec.org/v1.0.0/item-search#filter")]);
        assert!(c.filter && !c.item_search);
    }

    #[test]
    fn hrefs_prefer_the_self_link() {
        let doc = Url::parse("s3://b/cat/items.ndjson").unwrap();
        let with_self = json!({"id": "a", "links": [{"rel": "self", "href": "a/a.json"}]});
        let (h, b) = href_of(&with_self, &doc, "s3://b/cat/items.ndjson#a");
        assert_eq!(h, "s3://b/cat/a/a.json");
        assert_eq!(b.as_str(), "s3://b/cat/a/a.json");
        let (h, b) = href_of(&json!({"id": "a"}), &doc, "s3://b/cat/items.ndjson#a");
        assert_eq!(h, "s3://b/cat/items.ndjson#a");
        assert_eq!(b.as_str(), "s3://b/cat/items.ndjson#a");
    }
}
