//! A STAC API item search, page by page, and the pages of a collection's
//! `items` link (OGC API Features), which follow the same `next` links.
//!
//! Our own small client rather than stac-io's (docs/decisions.md, "STAC
//! reading"): every page is read with a byte cap, `next` links are followed
//! as the STAC API spec says (method, `body`, `headers`, `merge`), POST is
//! used when the landing page offers it, and a paging loop ends in an error.

use std::collections::HashSet;

use rsembed_schemas::job::{CloudCoverBy, StacSearch};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sha2::Digest;
use url::Url;

use super::emit::{href_of, links, parse, Conformance, Emit, Flow};
use super::fetch::{Fetcher, Request, MAX_DOCUMENT, MAX_PAGE};
use super::search::{cloud_cover_text, normalize_datetime, parse_filter};
use crate::error::{Error, Result};

/// Items per page asked for. Earth Search and the Planetary Computer allow
/// up to 1000; 250 keeps a page at a few MiB and a request at seconds.
const PAGE_SIZE: u64 = 250;
/// Pages in a row that bring no new item (empty, or all seen before) before
/// the paging is called broken: a server that serves an empty page with a
/// `next` link forever must not keep the planner busy forever.
const MAX_IDLE_PAGES: u32 = 8;

/// One page of a search.
#[derive(Deserialize)]
struct Page {
    #[serde(default)]
    features: Vec<Value>,
    #[serde(default)]
    links: Vec<Value>,
}

/// Streams the search's items from the API at `root`.
pub(crate) async fn stream(
    f: &Fetcher,
    root: &Url,
    conformance: Conformance,
    search: &StacSearch,
    emit: &mut Emit<'_>,
) -> Result<()> {
    let landing: Value = parse(root.as_str(), &f.read(root.as_str(), MAX_DOCUMENT).await?)?;
    emit.stats
        .documents
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (href, post) = search_endpoint(root, &landing);
    let req = first_request(href, post, search, conformance, emit.remaining())
        .map_err(|reason| Error::Usage(format!("STAC API {root}: {reason}")))?;
    tracing::info!(url = %req.url, method = %req.method, "STAC search");
    pages(f, req, &|feature| api_item_url(root, feature), emit)
        .await
        .map(|_| ())
}

/// Streams the items behind a collection's `items` link (OGC API Features,
/// which a STAC API's collections follow): GET with the parameters every
/// such endpoint takes (`bbox`, `datetime`, `limit`); the rest of the search
/// (`--ids`, `--collections`, `--filter`, `--cloud-cover-max`) is applied on
/// the client, as for a static catalog. An endpoint need not know `ids`,
/// and one that is strict about parameters refuses the request.
pub(crate) async fn stream_items_link(
    f: &Fetcher,
    items: &Url,
    search: &StacSearch,
    emit: &mut Emit<'_>,
) -> Result<Flow> {
    let req = items_request(items, search, emit.remaining())
        .map_err(|reason| Error::Usage(format!("STAC collection {items}: {reason}")))?;
    tracing::info!(url = %req.url, "STAC collection items");
    pages(f, req, &|feature| item_under(items, feature), emit).await
}

/// The first request of an `items` link.
fn items_request(
    items: &Url,
    search: &StacSearch,
    remaining: Option<u64>,
) -> Result<Request, String> {
    let datetime = search
        .datetime
        .as_deref()
        .map(normalize_datetime)
        .transpose()?;
    let mut url = items.clone();
    {
        let mut q = url.query_pairs_mut();
        if let Some(b) = search.bbox {
            let b: Vec<String> = b.iter().map(f64::to_string).collect();
            q.append_pair("bbox", &b.join(","));
        }
        if let Some(d) = &datetime {
            q.append_pair("datetime", d);
        }
        let limit = remaining.map_or(PAGE_SIZE, |r| r.clamp(1, PAGE_SIZE));
        q.append_pair("limit", &limit.to_string());
    }
    Ok(Request::get(url))
}

/// Follows a search's pages from `req` on, sending each item to `emit`.
/// `fallback` names an item without a self link.
async fn pages(
    f: &Fetcher,
    mut req: Request,
    fallback: &(dyn Fn(&Value) -> Option<String> + Sync),
    emit: &mut Emit<'_>,
) -> Result<Flow> {
    emit.asked(describe(&req));
    let mut asked = HashSet::new();
    let mut idle = 0;
    loop {
        if !asked.insert(request_key(&req)) {
            return Err(Error::Stac {
                url: req.url.to_string(),
                reason: "the `next` link repeats an earlier request: the server's paging loops"
                    .into(),
            });
        }
        let bytes = f.send(&req, MAX_PAGE).await?;
        emit.stats
            .pages
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let page: Page = serde_json::from_slice(&bytes).map_err(|e| Error::Stac {
            url: req.url.to_string(),
            reason: format!("the search page is not a FeatureCollection: {e}"),
        })?;
        drop(bytes);
        let new_before = new_count(emit);
        for feature in page.features {
            let fallback = fallback(&feature).unwrap_or_else(|| {
                let id = feature.get("id").and_then(Value::as_str).unwrap_or("");
                format!("{}#{id}", req.url)
            });
            let (href, base) = href_of(&feature, &req.url, &fallback);
            if !feature.is_object() {
                if emit.bad(href, None, "is not a JSON object".into()).await == Flow::Stop {
                    return Ok(Flow::Stop);
                }
                continue;
            }
            if emit.item(feature, href, base).await == Flow::Stop {
                return Ok(Flow::Stop);
            }
        }
        idle = if new_count(emit) == new_before {
            idle + 1
        } else {
            0
        };
        let Some(next) = page
            .links
            .into_iter()
            .find(|l| l.get("rel").and_then(Value::as_str) == Some("next"))
        else {
            return Ok(Flow::Go);
        };
        if idle >= MAX_IDLE_PAGES {
            return Err(Error::Stac {
                url: req.url.to_string(),
                reason: format!(
                    "{MAX_IDLE_PAGES} pages in a row brought no new item but still link a next page: the server's paging loops"
                ),
            });
        }
        req = next_request(&req, &next).map_err(|reason| Error::Stac {
            url: req.url.to_string(),
            reason,
        })?;
    }
}

/// A request as a person reads it: method, URL and JSON body.
fn describe(req: &Request) -> String {
    match &req.body {
        Some(b) => format!(
            "{} {} {}",
            req.method,
            req.url,
            serde_json::to_string(b).unwrap_or_default()
        ),
        None => format!("{} {}", req.method, req.url),
    }
}

/// Items sent, filtered or bad so far: what a page that brings something new
/// changes (duplicates do not).
fn new_count(emit: &Emit<'_>) -> u64 {
    use std::sync::atomic::Ordering::Relaxed;
    emit.sent() + emit.stats.filtered.load(Relaxed)
}

/// The search link of a landing page and whether it takes POST (preferred:
/// a long `--ids` or filter does not fit a URL); `<root>/search` by GET when
/// the page names none.
fn search_endpoint(root: &Url, landing: &Value) -> (Url, bool) {
    let mut found: Option<(Url, bool)> = None;
    for l in links(landing).into_iter().filter(|l| l.rel == "search") {
        let Ok(href) = root.join(&l.href) else {
            continue;
        };
        let post = l
            .method
            .as_deref()
            .is_some_and(|m| m.eq_ignore_ascii_case("POST"));
        if found.as_ref().is_none_or(|(_, p)| post && !p) {
            found = Some((href, post));
        }
    }
    found.unwrap_or_else(|| {
        let mut u = root.clone();
        if !u.path().ends_with('/') {
            u.set_path(&format!("{}/", u.path()));
        }
        (u.join("search").expect("a relative path joins"), false)
    })
}

/// The first page's request. `remaining`: items still wanted (`--max-items`).
fn first_request(
    href: Url,
    post: bool,
    search: &StacSearch,
    conf: Conformance,
    remaining: Option<u64>,
) -> Result<Request, String> {
    if search.filter.is_some() && !conf.filter {
        return Err(
            "--filter needs a server that conforms to the STAC API filter extension (CQL2), and this one does not (its conformsTo lists no filter class)"
                .into(),
        );
    }
    let limit = remaining.map_or(PAGE_SIZE, |r| r.clamp(1, PAGE_SIZE));
    // Servers take RFC 3339 only (rustac refuses a date); the flag is
    // normalised already, a search built otherwise is here.
    let datetime = search
        .datetime
        .as_deref()
        .map(normalize_datetime)
        .transpose()?;
    // Where the cloud cover goes is the one rule job.json records
    // (`cloud_cover_by`), so the collection's source link repeats this request.
    let by = cloud_cover_by(conf);
    let sent_as = |how: CloudCoverBy| search.cloud_cover_max.filter(|_| by == how);
    // `--filter` is refused above unless the server takes CQL2.
    let filter = match (
        &search.filter,
        sent_as(CloudCoverBy::Filter).map(cloud_cover_text),
    ) {
        (Some(f), Some(c)) => Some(format!("({f}) AND {c}")),
        (Some(f), None) => Some(f.clone()),
        (None, c) => c,
    };
    let query = sent_as(CloudCoverBy::Query).map(|max| json!({"eo:cloud_cover": {"lte": max}}));
    if post {
        let mut body = Map::new();
        if !search.collections.is_empty() {
            body.insert("collections".into(), json!(search.collections));
        }
        if !search.ids.is_empty() {
            body.insert("ids".into(), json!(search.ids));
        }
        if let Some(b) = search.bbox {
            body.insert("bbox".into(), json!(b));
        }
        if let Some(d) = &datetime {
            body.insert("datetime".into(), json!(d));
        }
        body.insert("limit".into(), json!(limit));
        if let Some(text) = &filter {
            let expr = parse_filter(text)?;
            let v = expr
                .to_value()
                .map_err(|e| format!("--filter `{text}` has no CQL2 JSON form: {e}"))?;
            body.insert("filter".into(), v);
            body.insert("filter-lang".into(), json!("cql2-json"));
        }
        if let Some(q) = query {
            body.insert("query".into(), q);
        }
        return Ok(Request {
            method: reqwest::Method::POST,
            url: href,
            headers: Map::new(),
            body: Some(body),
        });
    }
    let mut url = href;
    {
        let mut q = url.query_pairs_mut();
        let join = |v: &[String]| v.join(",");
        if !search.collections.is_empty() {
            q.append_pair("collections", &join(&search.collections));
        }
        if !search.ids.is_empty() {
            q.append_pair("ids", &join(&search.ids));
        }
        if let Some(b) = search.bbox {
            let b: Vec<String> = b.iter().map(f64::to_string).collect();
            q.append_pair("bbox", &b.join(","));
        }
        if let Some(d) = &datetime {
            q.append_pair("datetime", d);
        }
        q.append_pair("limit", &limit.to_string());
        if let Some(text) = &filter {
            parse_filter(text)?;
            q.append_pair("filter", text);
            q.append_pair("filter-lang", "cql2-text");
        }
        if let Some(qv) = query {
            q.append_pair("query", &qv.to_string());
        }
    }
    Ok(Request::get(url))
}

/// The request a `next` link asks for, after `prev` (STAC API item search,
/// "Pagination"): its method (GET when absent), its href, and its `body` and
/// `headers` — merged into the previous request's when `merge` is true.
fn next_request(prev: &Request, link: &Value) -> Result<Request, String> {
    let link: stac::Link = serde_json::from_value(link.clone())
        .map_err(|e| format!("the `next` link does not parse: {e}"))?;
    let url = prev
        .url
        .join(&link.href)
        .map_err(|e| format!("the `next` link `{}` is not a URL: {e}", link.href))?;
    let method = match link
        .method
        .as_deref()
        .map(str::to_ascii_uppercase)
        .as_deref()
    {
        None | Some("GET") => reqwest::Method::GET,
        Some("POST") => reqwest::Method::POST,
        Some(other) => {
            return Err(format!(
                "the `next` link's method `{other}` is not GET or POST"
            ))
        }
    };
    let merge = link.merge.unwrap_or(false);
    let merged = |old: Option<&Map<String, Value>>, new: Option<Map<String, Value>>| {
        if merge {
            let mut m = old.cloned().unwrap_or_default();
            m.extend(new.unwrap_or_default());
            m
        } else {
            new.unwrap_or_default()
        }
    };
    let headers = merged(Some(&prev.headers), link.headers);
    let body = (method == reqwest::Method::POST).then(|| match link.body {
        // A POST link without a body repeats the search: sending `{}` would
        // be a search for everything.
        None if !merge => prev.body.clone().unwrap_or_default(),
        b => merged(prev.body.as_ref(), b),
    });
    Ok(Request {
        method,
        url,
        headers,
        body,
    })
}

/// A 128-bit fingerprint of a request, to notice a `next` link that repeats.
fn request_key(r: &Request) -> u128 {
    let mut h = sha2::Sha256::new();
    h.update(r.method.as_str());
    h.update([0]);
    h.update(r.url.as_str());
    h.update([0]);
    h.update(serde_json::to_vec(&r.headers).unwrap_or_default());
    h.update([0]);
    if let Some(b) = &r.body {
        h.update(serde_json::to_vec(b).unwrap_or_default());
    }
    u128::from_le_bytes(h.finalize()[..16].try_into().expect("16 of 32 bytes"))
}

/// `<root>/collections/<c>/items/<id>`, the item's URL in an OGC API.
fn api_item_url(root: &Url, feature: &Value) -> Option<String> {
    let c = feature.get("collection")?.as_str()?;
    let id = feature.get("id")?.as_str()?;
    let mut u = root.clone();
    u.set_query(None);
    u.set_fragment(None);
    u.path_segments_mut()
        .ok()?
        .pop_if_empty()
        .extend(["collections", c, "items", id]);
    Some(u.to_string())
}

/// `<items>/<id>`, an item's URL under a collection's `items` link.
fn item_under(items: &Url, feature: &Value) -> Option<String> {
    let id = feature.get("id")?.as_str()?;
    let mut u = items.clone();
    u.set_query(None);
    u.set_fragment(None);
    u.path_segments_mut().ok()?.pop_if_empty().push(id);
    Some(u.to_string())
}

/// How a search of an API that conforms to `c` sends `--cloud-cover-max`, as
/// `api::first_request` builds it: CQL2 when the server has the filter
/// extension, else the query extension, else not at all (rsembed judges
/// each item). Recorded in the job's search, so the output's
/// `emb:source-data` link is the request as it was sent.
pub(crate) fn cloud_cover_by(c: Conformance) -> CloudCoverBy {
    if c.filter {
        CloudCoverBy::Filter
    } else if c.query {
        CloudCoverBy::Query
    } else {
        CloudCoverBy::Client
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(filter: bool, query: bool) -> Conformance {
        Conformance {
            item_search: true,
            filter,
            query,
        }
    }

    fn full() -> StacSearch {
        StacSearch {
            collections: vec!["s2".into(), "l8".into()],
            bbox: Some([1.0, 2.0, 3.0, 4.5]),
            datetime: Some("2024-06-01T00:00:00Z/..".into()),
            ids: vec!["a".into()],
            filter: Some("platform = 'sentinel-2a'".into()),
            max_items: Some(10),
            cloud_cover_max: Some(20.0),
            cloud_cover_by: None,
        }
    }

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn post_bodies_carry_the_search_and_cql2_json() {
        let r = first_request(
            url("http://h/search"),
            true,
            &full(),
            conf(true, true),
            Some(10),
        )
        .unwrap();
        assert_eq!(r.method, reqwest::Method::POST);
        let b = Value::Object(r.body.unwrap());
        assert_eq!(b["collections"], json!(["s2", "l8"]));
        assert_eq!(b["bbox"], json!([1.0, 2.0, 3.0, 4.5]));
        assert_eq!(b["limit"], json!(10));
        assert_eq!(b["filter-lang"], json!("cql2-json"));
        assert_eq!(b["filter"]["op"], json!("and"));
        let text = b["filter"].to_string();
        assert!(
            text.contains("eo:cloud_cover") && text.contains("sentinel-2a"),
            "{text}"
        );
        // filter wins over query when both are there.
        assert!(b.get("query").is_none());
    }

    #[test]
    fn get_urls_carry_the_search_and_cql2_text() {
        let r = first_request(
            url("http://h/search"),
            false,
            &full(),
            conf(true, false),
            None,
        )
        .unwrap();
        let q: Map<String, Value> = r
            .url
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), json!(v)))
            .collect();
        assert_eq!(q["collections"], json!("s2,l8"));
        assert_eq!(q["bbox"], json!("1,2,3,4.5"));
        assert_eq!(q["limit"], json!("250"));
        assert_eq!(q["filter-lang"], json!("cql2-text"));
        assert_eq!(
            q["filter"],
            json!("(platform = 'sentinel-2a') AND \"eo:cloud_cover\" <= 20")
        );
    }

    #[test]
    fn cloud_cover_goes_by_query_else_stays_on_the_client() {
        let s = StacSearch {
            cloud_cover_max: Some(5.0),
            ..StacSearch::default()
        };
        let r = first_request(url("http://h/search"), true, &s, conf(false, true), None).unwrap();
        assert_eq!(
            r.body.unwrap()["query"],
            json!({"eo:cloud_cover": {"lte": 5.0}})
        );
        let r = first_request(url("http://h/search"), true, &s, conf(false, false), None).unwrap();
        let b = r.body.unwrap();
        assert!(b.get("query").is_none() && b.get("filter").is_none());
        let r = first_request(url("http://h/search"), false, &s, conf(false, true), None).unwrap();
        assert!(r.url.as_str().contains("query="), "{}", r.url);
    }

    #[test]
    fn a_filter_needs_a_filter_server() {
        let e = first_request(
            url("http://h/search"),
            true,
            &full(),
            conf(false, true),
            None,
        )
        .unwrap_err();
        assert!(
            e.contains("--filter") && e.contains("filter extension"),
            "{e}"
        );
        let bad = StacSearch {
            filter: Some("a <<< 1".into()),
            ..StacSearch::default()
        };
        assert!(
            first_request(url("http://h/search"), true, &bad, conf(true, false), None).is_err()
        );
    }

    #[test]
    fn next_links_merge_bodies_and_headers_when_asked() {
        let mut prev = first_request(
            url("http://h/search"),
            true,
            &full(),
            conf(true, false),
            None,
        )
        .unwrap();
        prev.headers.insert("x-a".into(), json!("1"));
        let merged = next_request(
            &prev,
            &json!({"rel": "next", "href": "search", "method": "POST", "merge": true,
                "body": {"token": "t2"}, "headers": {"x-b": "2"}}),
        )
        .unwrap();
        let b = merged.body.as_ref().unwrap();
        assert_eq!(b["token"], json!("t2"));
        assert_eq!(b["collections"], json!(["s2", "l8"]));
        assert_eq!(merged.headers.len(), 2);
        assert_eq!(merged.url.as_str(), "http://h/search");
        let replaced = next_request(
            &prev,
            &json!({"rel": "next", "href": "http://h/search", "method": "POST", "body": {"token": "t2"}}),
        )
        .unwrap();
        assert_eq!(
            Value::Object(replaced.body.unwrap()),
            json!({"token": "t2"})
        );
        assert!(replaced.headers.is_empty());
        let bodiless = next_request(
            &prev,
            &json!({"rel": "next", "href": "search?page=2", "method": "POST"}),
        )
        .unwrap();
        assert_eq!(bodiless.body, prev.body);
        let get = next_request(&prev, &json!({"rel": "next", "href": "/search?page=2"})).unwrap();
        assert_eq!(get.method, reqwest::Method::GET);
        assert!(get.body.is_none());
        assert_eq!(get.url.as_str(), "http://h/search?page=2");
        assert!(next_request(
            &prev,
            &json!({"rel": "next", "href": "x", "method": "DELETE"})
        )
        .is_err());
        assert_ne!(request_key(&prev), request_key(&merged));
        assert_eq!(request_key(&merged), request_key(&merged.clone()));
    }

    #[test]
    fn items_links_get_bbox_datetime_and_limit_only() {
        let r = items_request(&url("http://h/collections/c/items"), &full(), Some(10)).unwrap();
        assert_eq!(r.method, reqwest::Method::GET);
        let q: Vec<(String, String)> = r.url.query_pairs().into_owned().collect();
        let keys: Vec<&str> = q.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["bbox", "datetime", "limit"]);
        assert_eq!(q[2].1, "10");
        assert_eq!(describe(&r), format!("GET {}", r.url), "the search as sent");
        let r = items_request(&url("http://h/c/items"), &StacSearch::default(), None).unwrap();
        assert_eq!(r.url.as_str(), "http://h/c/items?limit=250");
        // Dates go out as RFC 3339, which every server reads.
        let dated = StacSearch {
            datetime: Some("2024-01-01/2024-03-31".into()),
            ..StacSearch::default()
        };
        let r = items_request(&url("http://h/c/items"), &dated, None).unwrap();
        let d = r
            .url
            .query_pairs()
            .find(|(k, _)| k == "datetime")
            .unwrap()
            .1;
        assert_eq!(d, "2024-01-01T00:00:00Z/2024-03-31T23:59:59.999999Z");
        let r = first_request(
            url("http://h/search"),
            true,
            &dated,
            conf(false, false),
            None,
        )
        .unwrap();
        assert_eq!(
            r.body.unwrap()["datetime"],
            "2024-01-01T00:00:00Z/2024-03-31T23:59:59.999999Z"
        );
        assert_eq!(
            item_under(&url("http://h/c/items/"), &json!({"id": "a b"})).unwrap(),
            "http://h/c/items/a%20b"
        );
    }

    #[test]
    fn post_is_preferred_and_search_defaults_to_root_search() {
        let landing = json!({"links": [
            {"rel": "search", "href": "/api/search", "method": "GET"},
            {"rel": "search", "href": "/api/search", "method": "POST"}]});
        let (u, post) = search_endpoint(&url("http://h/api/"), &landing);
        assert_eq!((u.as_str(), post), ("http://h/api/search", true));
        let (u, post) = search_endpoint(&url("http://h/api"), &json!({"links": []}));
        assert_eq!((u.as_str(), post), ("http://h/api/search", false));
        assert_eq!(
            api_item_url(
                &url("http://h/api/"),
                &json!({"collection": "c", "id": "a b"})
            )
            .unwrap(),
            "http://h/api/collections/c/items/a%20b"
        );
    }
}
