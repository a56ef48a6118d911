//! The collection's `emb:source-data` link: the search as it was sent to a
//! STAC API, so following it gives the items the job embedded (and no
//! filter the server never saw), with what rsembed filtered itself beside
//! it.

use rsembed_schemas::job::{CloudCoverBy, StacSearch};
use serde_json::json;
use stac::Link;

use super::GEOJSON;
use crate::error::Result;
use crate::stac::search::cloud_cover_text;

/// `emb:source-data`: for a STAC API the search as a GET `/search` URL with
/// the parameters that were sent; else the input's URL (a catalog, an item
/// collection, a folder of images). The search as flags gave it rides along
/// in `rsembed:search`, since `--max-items` has no URL form, and what rsembed
/// applied to each item instead of the server in `rsembed:client_filter`.
pub(crate) fn source_link(input: &str, search: Option<&StacSearch>) -> Result<Link> {
    let Some(s) = search else {
        return Ok(Link::new(input, "emb:source-data").title("the job's input".to_owned()));
    };
    let mut link = match search_url(input, s) {
        Some(url) => Link::new(url, "emb:source-data")
            .r#type(GEOJSON.to_owned())
            .title("the STAC API search whose items this job embedded".to_owned()),
        None => Link::new(input, "emb:source-data")
            .title("the STAC input whose items this job embedded".to_owned()),
    };
    link.additional_fields
        .insert("rsembed:search".into(), serde_json::to_value(s)?);
    if let Some(cf) = client_filter(input, Some(s)) {
        link.additional_fields
            .insert("rsembed:client_filter".into(), cf.into());
    }
    Ok(link)
}

/// Whether `input` names a STAC API root rather than a document (a
/// catalog, collection or item collection, or an API's collection or item
/// read by its URL): http(s), a last path segment not named like a
/// document, and no `collections/<id>` in the path.
fn api_root(input: &str) -> Option<url::Url> {
    let url = url::Url::parse(input).ok()?;
    if !matches!(url.scheme(), "http" | "https") {
        return None;
    }
    let segments: Vec<&str> = url.path_segments()?.filter(|p| !p.is_empty()).collect();
    if segments
        .windows(2)
        .any(|w| w[0] == "collections" && !w[1].is_empty())
    {
        return None;
    }
    let last = segments.last().copied();
    let document = [".json", ".ndjson", ".parquet", ".geoparquet"];
    if last.is_some_and(|l| document.iter().any(|d| l.to_ascii_lowercase().ends_with(d))) {
        return None;
    }
    Some(url)
}

/// The GET `/search` URL of the search of the API rooted at `input` as it
/// was sent: `--cloud-cover-max` is in it only where the job records that
/// the server took it (`filter` or `query`). `None` when `input` names a
/// document rather than an API root.
pub(crate) fn search_url(input: &str, s: &StacSearch) -> Option<String> {
    let mut url = api_root(input)?;
    let path = format!("{}/search", url.path().trim_end_matches('/'));
    url.set_path(&path);
    let mut filter = s.filter.clone();
    let mut query = None;
    if let Some(pct) = s.cloud_cover_max {
        match s.cloud_cover_by {
            Some(CloudCoverBy::Filter) => {
                let cc = cloud_cover_text(pct);
                filter = Some(match filter {
                    Some(f) => format!("({f}) AND {cc}"),
                    None => cc,
                });
            }
            Some(CloudCoverBy::Query) => {
                query = Some(json!({"eo:cloud_cover": {"lte": pct}}).to_string());
            }
            Some(CloudCoverBy::Client) | None => {}
        }
    }
    {
        let mut q = url.query_pairs_mut();
        if !s.collections.is_empty() {
            q.append_pair("collections", &s.collections.join(","));
        }
        if let Some(b) = s.bbox {
            q.append_pair("bbox", &format!("{},{},{},{}", b[0], b[1], b[2], b[3]));
        }
        if let Some(d) = &s.datetime {
            q.append_pair("datetime", d);
        }
        if !s.ids.is_empty() {
            q.append_pair("ids", &s.ids.join(","));
        }
        if let Some(f) = &filter {
            q.append_pair("filter", f)
                .append_pair("filter-lang", "cql2-text");
        }
        if let Some(v) = &query {
            q.append_pair("query", v);
        }
    }
    Some(url.into())
}

/// The part of a STAC API search that rsembed applied to each item itself
/// and the link's request does not carry, as CQL2 text: `--cloud-cover-max`
/// against a server with neither the filter nor the query extension (or in
/// a job whose `job.json` does not say, written by an older rsembed, which
/// also judged every item itself). `None` for other inputs, whose every
/// flag rsembed applies (`rsembed:search` lists them).
pub(crate) fn client_filter(input: &str, s: Option<&StacSearch>) -> Option<String> {
    let s = s?;
    api_root(input)?;
    let pct = s.cloud_cover_max?;
    match s.cloud_cover_by {
        Some(CloudCoverBy::Filter | CloudCoverBy::Query) => None,
        Some(CloudCoverBy::Client) | None => Some(cloud_cover_text(pct)),
    }
}
