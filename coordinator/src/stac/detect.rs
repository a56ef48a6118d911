//! What a STAC `--input` is: an API root (by its landing page's
//! `conformsTo`), a static catalog or collection (an API's collection URL
//! among them), an item collection or one item, told apart from the inputs
//! the planner already knows (images, scenes, archives, folders). JSON that
//! is none of these is refused here, before a job writes anything.

use rsembed_worker::input::InputKind;
use rsembed_worker::store::StoreCache;
use serde_json::Value;
use url::Url;

use super::emit::{links, parse, Conformance, ItemsFormat, StacInput};
use super::fetch::{self, Fetcher, MAX_DOCUMENT};
use super::search::cut;
use crate::error::{Error, Result};

/// How much of a `.json` is read to find its `type`: STAC writers put it
/// first, and a catalog is smaller than this anyway.
const SNIFF: usize = 1 << 20;

/// `Ok(None)`: not a STAC input (an image, a folder, a TIFF over http, ...).
pub async fn detect(stores: &StoreCache, input: &str) -> Result<Option<StacInput>> {
    if InputKind::of(input).is_some() {
        return Ok(None);
    }
    let http = fetch::is_http(input);
    let url = if http {
        Url::parse(input).map_err(|e| Error::Usage(format!("--input {input}: {e}")))?
    } else {
        stores.location(input)?.url
    };
    let lower = url.path().to_ascii_lowercase();
    let items = |format| {
        Ok(Some(StacInput::Items {
            url: url.to_string(),
            format,
        }))
    };
    if [".ndjson", ".jsonl", ".geojsonl"]
        .iter()
        .any(|e| lower.ends_with(e))
    {
        return items(ItemsFormat::Ndjson);
    }
    if lower.ends_with(".parquet") || lower.ends_with(".geoparquet") {
        return items(ItemsFormat::Parquet);
    }
    let f = Fetcher::new(stores)?;
    if lower.ends_with(".json") || lower.ends_with(".geojson") {
        return detect_json(&f, &url).await.map(Some);
    }
    if !http {
        return Ok(None);
    }
    let Some(doc) = landing_page(&f, &url).await? else {
        return Ok(None);
    };
    of_document(&f, &url, &doc).await
}

/// A `.json` input: what its `type` says.
async fn detect_json(f: &Fetcher, url: &Url) -> Result<StacInput> {
    let (head, complete) = f.prefix(url.as_str(), SNIFF).await?;
    let not_stac = |what: String| {
        Error::Stac {
        url: url.to_string(),
        reason: format!(
            "{what}; a STAC input is a Catalog, a Collection, a FeatureCollection of items, or an API root"
        ),
    }
    };
    let t = match type_of(&head) {
        TypeScan::Found(t) => t,
        TypeScan::Truncated if !complete => {
            return Err(not_stac(format!(
                "no `type` within its first {} MiB",
                SNIFF >> 20
            )))
        }
        TypeScan::Missing | TypeScan::Truncated => {
            return Err(not_stac("a JSON object without `type`".into()))
        }
        TypeScan::NotAnObject(e) => return Err(not_stac(format!("not a JSON object ({e})"))),
    };
    match t.as_str() {
        "Catalog" | "Collection" => {
            // A landing page is a Catalog too; only its conformsTo tells.
            if fetch::is_http(url.as_str()) {
                let doc: Value = parse(url.as_str(), &f.read(url.as_str(), MAX_DOCUMENT).await?)?;
                if let Some(api) = as_api(url, &doc) {
                    return Ok(api);
                }
            }
            Ok(StacInput::Catalog {
                url: url.to_string(),
            })
        }
        "FeatureCollection" | "Feature" => Ok(StacInput::Items {
            url: url.to_string(),
            format: ItemsFormat::Json,
        }),
        other => Err(not_stac(format!("its type is `{other}`"))),
    }
}

/// The JSON document at an http(s) URL that is not named like a file the
/// planner knows; `None` when it is not JSON, or the server refuses it (the
/// caller's plain-http path reports that).
async fn landing_page(f: &Fetcher, url: &Url) -> Result<Option<Value>> {
    // Not JSON (a TIFF, an HTML page): left after its first bytes.
    match f.json_document(url.as_str(), MAX_DOCUMENT).await {
        Ok(Some(bytes)) => Ok(serde_json::from_slice(&bytes).ok()),
        Ok(None) => Ok(None),
        Err(Error::StacStatus { status, .. }) if status < 500 && status != 429 && status != 408 => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// What a JSON document at `url` is as an input.
async fn of_document(f: &Fetcher, url: &Url, doc: &Value) -> Result<Option<StacInput>> {
    if let Some(api) = as_api(url, doc) {
        return Ok(Some(api));
    }
    // A landing page may list its conformance only at /conformance.
    if doc.get("conformsTo").is_none() {
        if let Some(href) = links(doc)
            .into_iter()
            .find(|l| l.rel == "conformance")
            .and_then(|l| url.join(&l.href).ok())
        {
            if let Ok(bytes) = f.read(href.as_str(), MAX_DOCUMENT).await {
                if let Ok(c) = serde_json::from_slice::<Value>(&bytes) {
                    let mut d = doc.clone();
                    d["conformsTo"] = c.get("conformsTo").cloned().unwrap_or(Value::Null);
                    if let Some(api) = as_api(url, &d) {
                        return Ok(Some(api));
                    }
                }
            }
        }
    }
    classify(url, doc).map(Some)
}

/// What a JSON document at an http(s) URL that is not an API root is as an
/// input: a catalog or collection (crawled, or paged through its `items`
/// link: a collection URL of an API), an item collection, or one item (an
/// item URL of an API). JSON that is not STAC is refused here, naming what it
/// is, before a job writes anything: read as an image, it would only become
/// a decode error after the job had started.
fn classify(url: &Url, doc: &Value) -> Result<StacInput> {
    let not_stac = |what: String| Error::Stac {
        url: url.to_string(),
        reason: format!(
            "{what}: JSON, but not STAC; a STAC input is an API root, a Catalog, a Collection, \
             a FeatureCollection of items or an Item"
        ),
    };
    let t = match doc {
        Value::Object(m) => match m.get("type") {
            Some(Value::String(t)) => t.as_str(),
            Some(other) => return Err(not_stac(format!("its `type` is {}", short(other)))),
            None => {
                let keys: Vec<&str> = m.keys().map(String::as_str).take(8).collect();
                return Err(not_stac(format!(
                    "an object without `type` (its keys: {})",
                    if keys.is_empty() {
                        "none".into()
                    } else {
                        keys.join(", ")
                    }
                )));
            }
        },
        Value::Array(_) => return Err(not_stac("an array".into())),
        _ => return Err(not_stac("not an object".into())),
    };
    let items = || StacInput::Items {
        url: url.to_string(),
        format: ItemsFormat::Json,
    };
    match t {
        "Catalog" | "Collection" => Ok(StacInput::Catalog {
            url: url.to_string(),
        }),
        "FeatureCollection" => Ok(items()),
        "Feature" if doc.get("stac_version").is_some() => Ok(items()),
        "Feature" => Err(not_stac(
            "a GeoJSON Feature without `stac_version`, so not a STAC Item".into(),
        )),
        other => Err(not_stac(format!("its type is `{}`", cut(other)))),
    }
}

/// A JSON value shown in an error, cut to a readable length.
fn short(v: &Value) -> String {
    cut(&v.to_string())
}

/// An API root, when the document's conformsTo holds item-search.
fn as_api(url: &Url, doc: &Value) -> Option<StacInput> {
    let c = Conformance::of(doc.get("conformsTo")?.as_array()?);
    c.item_search.then(|| StacInput::Api {
        root: url.clone(),
        conformance: c,
    })
}

/// What the start of a JSON document says its `type` is.
#[derive(Debug, PartialEq)]
enum TypeScan {
    Found(String),
    /// A whole object without `type`.
    Missing,
    /// The bytes end before `type` was seen.
    Truncated,
    NotAnObject(String),
}

/// Reads top-level keys until `type`, so a 200 MiB FeatureCollection is
/// recognised from its first bytes.
fn type_of(head: &[u8]) -> TypeScan {
    use serde::de::{Deserializer, Error as _, IgnoredAny, MapAccess, Visitor};
    // The visitor stops at `type` by failing with this mark: serde_json
    // insists on reading a map to its end otherwise.
    const MARK: &str = "\u{1}type=";
    struct TypeOf;
    impl<'de> Visitor<'de> for TypeOf {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<(), A::Error> {
            while let Some(k) = m.next_key::<String>()? {
                if k == "type" {
                    let v: Value = m.next_value()?;
                    let t = v.as_str().map(str::to_owned).unwrap_or(v.to_string());
                    return Err(A::Error::custom(format!("{MARK}{t}\u{1}")));
                }
                m.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }
    let mut de = serde_json::Deserializer::from_slice(head);
    match de.deserialize_map(TypeOf) {
        Ok(()) => TypeScan::Missing,
        Err(e) => {
            let s = e.to_string();
            if let Some(rest) = s.split_once(MARK).map(|(_, r)| r) {
                TypeScan::Found(rest.split('\u{1}').next().unwrap_or("").to_owned())
            } else if e.is_eof() {
                TypeScan::Truncated
            } else {
                TypeScan::NotAnObject(s)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_type_is_found_in_a_prefix() {
        let t = |s: &str| type_of(s.as_bytes());
        assert_eq!(
            t(r#"{"stac_version":"1.1.0","type":"Catalog","links":[{"#),
            TypeScan::Found("Catalog".into())
        );
        assert_eq!(
            t(r#"{"features":[{"type":"Feature"}],"type":"FeatureCollection"}"#),
            TypeScan::Found("FeatureCollection".into())
        );
        assert_eq!(t(r#"{"features":[{"type":"Feat"#), TypeScan::Truncated);
        assert_eq!(t(r#"{"a":1}"#), TypeScan::Missing);
        assert!(matches!(t("[1,2]"), TypeScan::NotAnObject(_)));
        assert!(matches!(t("GIF89a"), TypeScan::NotAnObject(_)));
        assert_eq!(t(r#"{"type":7}"#), TypeScan::Found("7".into()));
    }

    #[test]
    fn json_answers_are_stac_or_refused_naming_what_they_are() {
        let u = Url::parse("http://h/collections/naip").unwrap();
        let ok = |doc: Value| classify(&u, &doc).unwrap();
        let err = |doc: Value| classify(&u, &doc).unwrap_err().to_string();
        assert!(matches!(
            ok(
                json!({"type": "Collection", "id": "naip", "links": [{"rel": "items", "href": "items"}]})
            ),
            StacInput::Catalog { .. }
        ));
        assert!(matches!(
            ok(json!({"type": "Feature", "stac_version": "1.1.0", "id": "a"})),
            StacInput::Items {
                format: ItemsFormat::Json,
                ..
            }
        ));
        assert!(matches!(
            ok(json!({"type": "FeatureCollection", "features": []})),
            StacInput::Items { .. }
        ));
        let e = err(json!({"type": "Feature", "properties": {}}));
        assert!(
            e.contains("without `stac_version`") && e.contains("not STAC"),
            "{e}"
        );
        let e = err(json!({"hello": 1, "world": 2}));
        assert!(e.contains("keys: hello, world"), "{e}");
        assert!(err(json!({"type": "Topology"})).contains("`Topology`"));
        assert!(err(json!({"type": 7})).contains("`type` is 7"));
        assert!(err(json!([1, 2])).contains("an array"));
        let long = "x".repeat(500);
        assert!(
            err(json!({ "type": long })).len() < 400,
            "cut to a readable length"
        );
    }

    #[tokio::test]
    async fn files_the_planner_knows_are_not_stac() {
        let stores = StoreCache::default();
        for input in ["a.tif", "s3://b/x.tar.gz", "https://h/x.png", "some/folder"] {
            assert_eq!(detect(&stores, input).await.unwrap(), None, "{input}");
        }
        let d = detect(&stores, "s3://b/items.ndjson").await.unwrap();
        assert!(matches!(
            d,
            Some(StacInput::Items {
                format: ItemsFormat::Ndjson,
                ..
            })
        ));
        let d = detect(&stores, "/data/items.parquet")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(d.url(), "file:///data/items.parquet");
    }

    #[tokio::test]
    async fn json_files_are_told_apart_by_type() {
        let dir = tempfile::tempdir().unwrap();
        let stores = StoreCache::default();
        let write = |name: &str, body: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, body).unwrap();
            p.to_string_lossy().into_owned()
        };
        let cat = write("catalog.json", r#"{"type":"Catalog","id":"c","links":[]}"#);
        assert!(matches!(
            detect(&stores, &cat).await.unwrap(),
            Some(StacInput::Catalog { .. })
        ));
        let fc = write("fc.json", r#"{"type":"FeatureCollection","features":[]}"#);
        assert!(matches!(
            detect(&stores, &fc).await.unwrap(),
            Some(StacInput::Items {
                format: ItemsFormat::Json,
                ..
            })
        ));
        let other = write("other.json", r#"{"type":"Topology"}"#);
        let e = detect(&stores, &other).await.unwrap_err().to_string();
        assert!(e.contains("`Topology`"), "{e}");
        let notjson = write("x.json", "hello");
        let e = detect(&stores, &notjson).await.unwrap_err().to_string();
        assert!(e.contains("not a JSON object"), "{e}");
    }
}
