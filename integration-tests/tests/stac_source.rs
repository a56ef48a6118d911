//! STAC inputs read by `rsembed_coordinator::stac::source`: a real STAC API
//! (`rustac serve`), static catalogs on local disk and on the S3 test server,
//! item collections (.json, .ndjson, stac-geoparquet written by `rustac`),
//! and hostile sources from a scripted HTTP server. Expected item lists are
//! computed here from the generator's formulas, not from our own output.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rsembed_coordinator::stac::source::{
    detect, stream_items, Conformance, Found, ItemsFormat, SourceStats, StacInput,
};
use rsembed_integration_tests::s3::S3Server;
use rsembed_integration_tests::stac::{
    collection, item, item_id, landing_page, write_feature_collection, write_geoparquet,
    write_ndjson, Reply, ScriptServer, StacServer, ITEM_SEARCH,
};
use rsembed_schemas::job::StacSearch;
use rsembed_worker::store::StoreCache;
use serde_json::{json, Value};

/// What one search gave: the entries in order, the stats, and how it ended.
struct Got {
    found: Vec<Found>,
    stats: SourceStats,
    result: Result<(), String>,
}

impl Got {
    fn ids(&self) -> Vec<String> {
        self.found
            .iter()
            .filter_map(|f| match f {
                Found::Item(i) => Some(i.item.id.clone()),
                Found::Bad { .. } => None,
            })
            .collect()
    }

    fn bad(&self) -> Vec<(Option<String>, String)> {
        self.found
            .iter()
            .filter_map(|f| match f {
                Found::Bad { id, reason, .. } => Some((id.clone(), reason.clone())),
                Found::Item(_) => None,
            })
            .collect()
    }

    fn ok(self) -> Got {
        if let Err(e) = &self.result {
            panic!("the search failed: {e}");
        }
        self
    }

    fn err(&self) -> String {
        self.result.clone().expect_err("the search should fail")
    }
}

async fn search_input(stores: &StoreCache, input: &StacInput, search: &StacSearch) -> Got {
    let stats = SourceStats::default();
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let mut found = vec![];
    let (result, ()) = tokio::join!(stream_items(stores, input, search, &stats, tx), async {
        while let Some(f) = rx.recv().await {
            found.push(f);
        }
    });
    Got {
        found,
        stats,
        result: result.map_err(|e| format!("{e:#}")),
    }
}

async fn search(input: &str, s: &StacSearch) -> Got {
    let stores = StoreCache::default();
    let inp = detect(&stores, input)
        .await
        .unwrap_or_else(|e| panic!("detect {input}: {e}"))
        .unwrap_or_else(|| panic!("{input} is not detected as STAC"));
    search_input(&stores, &inp, s).await
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn ids(range: impl Iterator<Item = usize>) -> Vec<String> {
    range.map(item_id).collect()
}

/// The generated archive: 600 items, c1 holds those with `i % 3 != 0`
/// (STAC 1.0 for even `i`, 1.1 for odd), c2 the rest.
fn archive(dir: &Path) -> Vec<std::path::PathBuf> {
    let items: Vec<Value> = (0..600)
        .map(|i| {
            let c = if i % 3 == 0 { "c2" } else { "c1" };
            item(i, if i % 2 == 0 { "1.0.0" } else { "1.1.0" }, c)
        })
        .collect();
    let files = [
        dir.join("c1.json"),
        dir.join("c2.json"),
        dir.join("items.json"),
    ];
    std::fs::write(&files[0], collection("c1").to_string()).unwrap();
    std::fs::write(&files[1], collection("c2").to_string()).unwrap();
    write_feature_collection(&files[2], &items);
    files.to_vec()
}

fn in_box(i: usize, b: [f64; 4]) -> bool {
    let (x, y) = ((i % 50) as f64 - 25.0, ((i / 50) % 40) as f64 - 20.0);
    x <= b[2] && x + 1.0 >= b[0] && y <= b[3] && y + 1.0 >= b[1]
}

#[tokio::test]
async fn api_search_pages_over_post_and_get_alike() {
    let dir = tempfile::tempdir().unwrap();
    let files = archive(dir.path());
    let paths: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let api = StacServer::start(&paths);

    let stores = StoreCache::default();
    let detected = detect(&stores, &api.url()).await.unwrap().unwrap();
    let StacInput::Api { root, conformance } = &detected else {
        panic!("{detected:?}")
    };
    assert_eq!(root.as_str(), api.url());
    // rustac serve conforms to item search and neither extension.
    assert_eq!(
        *conformance,
        Conformance {
            item_search: true,
            filter: false,
            query: false
        }
    );

    // Collections: 400 items, two pages of 250 over POST.
    let s = StacSearch {
        collections: vec!["c1".into()],
        ..StacSearch::default()
    };
    let got = search_input(&stores, &detected, &s).await.ok();
    assert_eq!(got.ids(), ids((0..600).filter(|i| i % 3 != 0)));
    assert_eq!(got.stats.pages.load(Ordering::Relaxed), 2);
    let Found::Item(first) = &got.found[0] else {
        panic!()
    };
    assert_eq!(
        first.href,
        format!("{}collections/c1/items/item-00001", api.url())
    );
    assert_eq!(first.item.collection.as_deref(), Some("c1"));
    // Both versions come through.
    let versions: std::collections::BTreeSet<String> = got
        .found
        .iter()
        .filter_map(|f| match f {
            Found::Item(i) => Some(i.item.version.to_string()),
            _ => None,
        })
        .collect();
    assert!(versions.len() == 2, "{versions:?}");

    // The same search again gives the same sequence.
    let again = search_input(&stores, &detected, &s).await.ok();
    assert_eq!(again.ids(), got.ids());

    // --max-items stops inside the second page.
    let s = StacSearch {
        collections: vec!["c1".into()],
        max_items: Some(260),
        ..StacSearch::default()
    };
    let got = search_input(&stores, &detected, &s).await.ok();
    assert_eq!(got.ids(), ids((0..600).filter(|i| i % 3 != 0).take(260)));
    assert_eq!(got.stats.pages.load(Ordering::Relaxed), 2);
    // A small --max-items is one page of that size.
    let s = StacSearch {
        collections: vec!["c1".into()],
        max_items: Some(7),
        ..StacSearch::default()
    };
    let got = search_input(&stores, &detected, &s).await.ok();
    assert_eq!(got.ids(), ids((0..600).filter(|i| i % 3 != 0).take(7)));
    assert_eq!(got.stats.pages.load(Ordering::Relaxed), 1);

    // bbox, datetime and ids, by the server.
    let b = [-9.5, -15.5, 5.5, -12.5];
    let s = StacSearch {
        collections: vec!["c1".into(), "c2".into()],
        bbox: Some(b),
        datetime: Some("2024-03-01T00:00:00Z/2024-09-30T23:59:59Z".into()),
        ..StacSearch::default()
    };
    let got = search_input(&stores, &detected, &s).await.ok();
    let want = ids((0..600).filter(|&i| in_box(i, b) && (60..274).contains(&(i % 366))));
    assert!(!want.is_empty());
    // The server serves collection by collection.
    assert_eq!(sorted(got.ids()), want);
    let s = StacSearch {
        ids: vec![item_id(5), item_id(42), item_id(599)],
        ..StacSearch::default()
    };
    let got = search_input(&stores, &detected, &s).await.ok();
    assert_eq!(sorted(got.ids()), ids([5, 42, 599].into_iter()));

    // GET: a landing page that offers only GET search on the same server.
    let search_url = format!("{}search", api.url());
    let script = ScriptServer::start(move |r| {
        assert_eq!(r.target, "/");
        Reply::Json(200, landing_page("/", &search_url, &["GET"], ITEM_SEARCH))
    });
    // rustac serve's GET search answers 500 when `limit` meets
    // `collections` or `bbox`; datetime pages fine.
    let s = StacSearch {
        datetime: Some("2024-01-01T00:00:00Z/2024-12-31T23:59:59Z".into()),
        ..StacSearch::default()
    };
    let got_get = search(&format!("{}/", script.base()), &s).await.ok();
    assert_eq!(sorted(got_get.ids()), ids(0..600));
    assert_eq!(got_get.stats.pages.load(Ordering::Relaxed), 3);
    let got_post = search_input(&stores, &detected, &s).await.ok();
    assert_eq!(got_post.ids(), got_get.ids());
    assert_eq!(
        script.requests().len(),
        2,
        "detect and the search read the landing page"
    );
}

#[tokio::test]
async fn api_collection_and_item_urls_are_paged_and_read() {
    let dir = tempfile::tempdir().unwrap();
    let files = archive(dir.path());
    let paths: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let api = StacServer::start(&paths);
    let c1 = format!("{}collections/c1", api.url());
    let stores = StoreCache::default();

    // A collection URL: its 400 items through its `items` link, two pages.
    let d = detect(&stores, &c1).await.unwrap().unwrap();
    assert!(matches!(d, StacInput::Catalog { .. }), "{d:?}");
    let got = search(&c1, &StacSearch::default()).await.ok();
    assert_eq!(got.ids(), ids((0..600).filter(|i| i % 3 != 0)));
    assert_eq!(got.stats.pages.load(Ordering::Relaxed), 2);
    let Found::Item(first) = &got.found[0] else {
        panic!()
    };
    assert_eq!(first.href, format!("{c1}/items/item-00001"));

    // bbox and datetime (sent), ids and cloud cover (here), max-items.
    let b = [-9.5, -15.5, 5.5, -12.5];
    let s = StacSearch {
        bbox: Some(b),
        datetime: Some("2024-03-01/2024-09-30".into()),
        cloud_cover_max: Some(60.0),
        ..StacSearch::default()
    };
    let got = search(&c1, &s).await.ok();
    let want = ids((0..600).filter(|&i| {
        i % 3 != 0 && in_box(i, b) && (60..274).contains(&(i % 366)) && i % 101 <= 60
    }));
    assert!(!want.is_empty());
    assert_eq!(sorted(got.ids()), want);
    let s = StacSearch {
        ids: vec![item_id(5), item_id(6), item_id(9)],
        ..StacSearch::default()
    };
    let got = search(&c1, &s).await.ok();
    assert_eq!(sorted(got.ids()), ids([5].into_iter()), "6 and 9 are in c2");
    let s = StacSearch {
        max_items: Some(3),
        ..StacSearch::default()
    };
    let got = search(&c1, &s).await.ok();
    assert_eq!(got.ids(), ids([1, 2, 4].into_iter()));
    assert_eq!(got.stats.pages.load(Ordering::Relaxed), 1);

    // An item URL: that item.
    let one = format!("{c1}/items/{}", item_id(7));
    let d = detect(&stores, &one).await.unwrap().unwrap();
    assert!(matches!(d, StacInput::Items { .. }), "{d:?}");
    let got = search(&one, &StacSearch::default()).await.ok();
    assert_eq!(got.ids(), ids([7].into_iter()));
    let Found::Item(it) = &got.found[0] else {
        panic!()
    };
    assert_eq!(it.href, one, "named by its self link");

    // Nothing selected: an error naming the request as sent.
    let s = StacSearch {
        ids: vec!["nosuch".into()],
        ..StacSearch::default()
    };
    let e = search(&c1, &s).await.err();
    assert!(
        e.contains("the search matched no items")
            && e.contains(&format!("GET {c1}/items?limit=250"))
            && e.contains("400 left out by the filters applied here (--ids nosuch)"),
        "{e}"
    );
    let s = StacSearch {
        collections: vec!["nosuch".into()],
        ..StacSearch::default()
    };
    let e = search(&api.url(), &s).await.err();
    assert!(
        e.contains("the search matched no items")
            && e.contains(&format!("POST {}search", api.url()))
            && e.contains(r#""collections":["nosuch"]"#)
            && e.contains("gave no item"),
        "{e}"
    );
}

#[tokio::test]
async fn filters_need_a_filter_server_and_cloud_cover_falls_back_to_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let files = archive(dir.path());
    let paths: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let api = StacServer::start(&paths);

    let s = StacSearch {
        filter: Some("\"eo:cloud_cover\" < 10".into()),
        ..StacSearch::default()
    };
    let got = search(&api.url(), &s).await;
    let e = got.err();
    assert!(
        e.contains(&api.url()) && e.contains("--filter") && e.contains("filter extension"),
        "{e}"
    );
    assert!(got.found.is_empty());

    let s = StacSearch {
        cloud_cover_max: Some(10.0),
        ..StacSearch::default()
    };
    let got = search(&api.url(), &s).await.ok();
    let want = ids((0..600).filter(|i| i % 101 <= 10));
    assert_eq!(sorted(got.ids()), want);
    assert_eq!(
        got.stats.filtered.load(Ordering::Relaxed),
        600 - want.len() as u64
    );
}

#[tokio::test]
async fn a_filter_server_gets_cql2_json_and_next_links_merge() {
    // A server that conforms to filter: it checks what it is sent.
    let script = ScriptServer::start(|r| {
        let conf = [
            ITEM_SEARCH,
            &["http://www.opengis.net/spec/ogcapi-features-3/1.0/conf/filter"],
        ]
        .concat();
        match (r.method.as_str(), r.target.as_str()) {
            ("GET", "/") => Reply::Json(200, landing_page("/", "/search", &["GET", "POST"], &conf)),
            ("POST", "/search") => {
                let b = r.json();
                if b["filter-lang"] != "cql2-json" {
                    return Reply::Json(400, json!({"error": "want cql2-json"}));
                }
                let f = b["filter"].to_string();
                if !(f.contains("eo:cloud_cover") && f.contains("platform")) {
                    return Reply::Json(400, json!({"error": format!("filter {f}")}));
                }
                match b.get("token").and_then(Value::as_str) {
                    None => Reply::Json(
                        200,
                        json!({"type": "FeatureCollection",
                            "features": [item(0, "1.1.0", "c1"), item(2, "1.1.0", "c1")],
                            "links": [{"rel": "next", "href": "/search", "method": "POST",
                                "merge": true, "body": {"token": "p2"}, "headers": {"x-page": "2"}}]}),
                    ),
                    Some("p2") if r.header("x-page") == Some("2") && b["limit"] == 250 => {
                        Reply::Json(
                            200,
                            json!({"type": "FeatureCollection",
                                "features": [item(4, "1.1.0", "c1")], "links": []}),
                        )
                    }
                    _ => Reply::Json(400, json!({"error": "bad page 2 request"})),
                }
            }
            _ => Reply::Json(404, json!({})),
        }
    });
    let s = StacSearch {
        filter: Some("platform = 'sentinel-2a'".into()),
        cloud_cover_max: Some(50.0),
        ..StacSearch::default()
    };
    let got = search(&format!("{}/", script.base()), &s).await.ok();
    assert_eq!(got.ids(), ids([0, 2, 4].into_iter()));
    let reqs = script.requests();
    assert_eq!(reqs.len(), 4, "{reqs:?}");
    // The item URL comes from the API when an item has no self link.
    let Found::Item(first) = &got.found[0] else {
        panic!()
    };
    assert_eq!(
        first.href,
        format!("{}/collections/c1/items/item-00000", script.base())
    );
}

/// A static catalog: root → c1 (items 1, 2, a loop back to the root, a
/// sub-catalog with item 3), c2 (item 2 again, item 4), then a loose item 5.
fn write_catalog(dir: &Path) {
    let w = |rel: &str, v: Value| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    };
    let cat = |id: &str, links: Value| json!({"type": "Catalog", "stac_version": "1.0.0", "id": id, "description": id, "links": links});
    w(
        "catalog.json",
        cat(
            "root",
            json!([{"rel": "self", "href": "./catalog.json"},
                {"rel": "child", "href": "./c1/collection.json"},
                {"rel": "child", "href": "c2/collection.json"},
                {"rel": "item", "href": "./loose/item-00005.json"}]),
        ),
    );
    let mut c1 = collection("c1");
    c1["links"] = json!([{"rel": "root", "href": "../catalog.json"},
        {"rel": "item", "href": "./items/item-00001.json"},
        {"rel": "item", "href": "./items/item-00002.json"},
        {"rel": "child", "href": "../catalog.json"},
        {"rel": "child", "href": "./sub/catalog.json"}]);
    w("c1/collection.json", c1);
    w(
        "c1/sub/catalog.json",
        cat(
            "sub",
            json!([{"rel": "item", "href": "../../shared/item-00003.json"}]),
        ),
    );
    let mut c2 = collection("c2");
    c2["links"] = json!([{"rel": "item", "href": "../c1/items/item-00002.json"},
        {"rel": "item", "href": "./items/item-00004.json"}]);
    w("c2/collection.json", c2);
    for (rel, i, c) in [
        ("c1/items/item-00001.json", 1, "c1"),
        ("c1/items/item-00002.json", 2, "c1"),
        ("shared/item-00003.json", 3, "c1"),
        ("c2/items/item-00004.json", 4, "c2"),
        ("loose/item-00005.json", 5, "c2"),
    ] {
        let v = if i % 2 == 0 { "1.0.0" } else { "1.1.0" };
        w(rel, item(i, v, c));
    }
}

async fn check_catalog(root: &str) {
    let all = search(root, &StacSearch::default()).await.ok();
    assert_eq!(all.ids(), ids([1, 2, 3, 4, 5].into_iter()));
    assert_eq!(all.stats.duplicates.load(Ordering::Relaxed), 1);
    // root, c1, sub, c2 and five item documents (item 2 read twice).
    assert_eq!(all.stats.documents.load(Ordering::Relaxed), 4 + 6);
    let base = root.trim_end_matches("catalog.json");
    let Found::Item(third) = &all.found[2] else {
        panic!()
    };
    assert_eq!(third.href, format!("{base}shared/item-00003.json"));
    // Relative asset hrefs resolve next to the item document.
    assert_eq!(
        third.base.join("./red.tif").unwrap().as_str(),
        format!("{base}shared/red.tif")
    );

    // Client filters: bbox (item i covers x = i-25..i-24), datetime, CQL2,
    // cloud cover, collections, max-items.
    let s = StacSearch {
        bbox: Some([-21.5, -30.0, -20.5, 30.0]),
        ..StacSearch::default()
    };
    assert_eq!(search(root, &s).await.ok().ids(), ids([3, 4].into_iter()));
    let s = StacSearch {
        datetime: Some("2024-01-03T00:00:00Z/2024-01-04T23:00:00Z".into()),
        ..StacSearch::default()
    };
    assert_eq!(search(root, &s).await.ok().ids(), ids([2, 3].into_iter()));
    let s = StacSearch {
        filter: Some("platform = 'sentinel-2b' AND \"eo:cloud_cover\" > 1".into()),
        ..StacSearch::default()
    };
    assert_eq!(search(root, &s).await.ok().ids(), ids([3, 5].into_iter()));
    let s = StacSearch {
        cloud_cover_max: Some(3.0),
        collections: vec!["c1".into()],
        max_items: Some(2),
        ..StacSearch::default()
    };
    assert_eq!(search(root, &s).await.ok().ids(), ids([1, 2].into_iter()));
}

#[tokio::test]
async fn static_catalog_on_local_disk_with_a_loop_and_a_shared_item() {
    let dir = tempfile::tempdir().unwrap();
    write_catalog(dir.path());
    let root = dir.path().join("catalog.json");
    let stores = StoreCache::default();
    let d = detect(&stores, &root.to_string_lossy())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(d, StacInput::Catalog { .. }), "{d:?}");
    check_catalog(d.url().as_str()).await;
}

#[tokio::test]
async fn static_catalog_on_s3() {
    let s3 = S3Server::start();
    for (k, v) in s3.env() {
        // SAFETY of the test: only this test in this binary reads AWS_*.
        std::env::set_var(k, v);
    }
    s3.create_bucket("stac");
    let dir = tempfile::tempdir().unwrap();
    write_catalog(dir.path());
    s3.upload(dir.path(), "s3://stac/archive");
    check_catalog("s3://stac/archive/catalog.json").await;
}

#[tokio::test]
async fn static_catalog_over_http_and_a_missing_item() {
    let dir = tempfile::tempdir().unwrap();
    write_catalog(dir.path());
    let files = dir.path().to_path_buf();
    let script = ScriptServer::start(move |r| {
        match std::fs::read(files.join(r.target.trim_start_matches('/'))) {
            Ok(b) => Reply::Bytes(200, "application/json", b),
            Err(_) => Reply::Json(404, json!({"code": "NotFound"})),
        }
    });
    let root = format!("{}/catalog.json", script.base());
    check_catalog(&root).await;

    // A broken item link is that item's error; the crawl goes on.
    std::fs::remove_file(dir.path().join("shared/item-00003.json")).unwrap();
    let local = dir
        .path()
        .join("catalog.json")
        .to_string_lossy()
        .into_owned();
    for input in [root.as_str(), local.as_str()] {
        let got = search(input, &StacSearch::default()).await.ok();
        assert_eq!(got.ids(), ids([1, 2, 4, 5].into_iter()), "{input}");
        let bad = got.bad();
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(
            bad[0].1.contains("shared/item-00003.json") && bad[0].1.contains("cannot be read"),
            "{bad:?}"
        );
    }
}

#[tokio::test]
async fn item_collections_json_ndjson_and_geoparquet_read_alike() {
    let dir = tempfile::tempdir().unwrap();
    let items: Vec<Value> = (0..120)
        .map(|i| item(i, if i % 2 == 0 { "1.0.0" } else { "1.1.0" }, "c1"))
        .collect();
    let json_path = dir.path().join("items.json");
    let nd_path = dir.path().join("items.ndjson");
    let pq_path = dir.path().join("items.parquet");
    write_feature_collection(&json_path, &items);
    write_ndjson(&nd_path, &items);
    write_geoparquet(&nd_path, &pq_path);
    let b = [-20.0, -20.0, 0.5, 0.0];
    let s = StacSearch {
        bbox: Some(b),
        datetime: Some("2024-01-10T00:00:00Z/..".into()),
        cloud_cover_max: Some(90.0),
        ..StacSearch::default()
    };
    let want = ids((0..120).filter(|&i| in_box(i, b) && i >= 9 && i % 101 <= 90));
    assert!(want.len() > 10, "{want:?}");
    let stores = StoreCache::default();
    for (p, format) in [
        (&json_path, ItemsFormat::Json),
        (&nd_path, ItemsFormat::Ndjson),
        (&pq_path, ItemsFormat::Parquet),
    ] {
        let input = p.to_string_lossy().into_owned();
        let d = detect(&stores, &input).await.unwrap().unwrap();
        assert!(
            matches!(d, StacInput::Items { format: f, .. } if f == format),
            "{d:?}"
        );
        let all = search(&input, &StacSearch::default()).await.ok();
        assert_eq!(all.ids(), ids(0..120), "{input}");
        let Found::Item(i7) = &all.found[7] else {
            panic!()
        };
        assert_eq!(i7.href, format!("{}#item-00007", d.url()));
        assert_eq!(
            i7.item.properties.datetime.unwrap().to_rfc3339(),
            "2024-01-08T10:00:00+00:00",
            "{input}"
        );
        assert!(i7.item.geometry.is_some(), "{input}");
        assert!(i7.item.assets.contains_key("red"), "{input}");
        let got = search(&input, &s).await.ok();
        assert_eq!(got.ids(), want, "{input}");
    }
}

#[tokio::test]
async fn hostile_pages_end_in_clear_errors() {
    let script = ScriptServer::start(|r| {
        let page = |features: Value, links: Value| {
            Reply::Json(
                200,
                json!({"type": "FeatureCollection", "features": features, "links": links}),
            )
        };
        let (path, query) = r.target.split_once('?').unwrap_or((&r.target, ""));
        match path {
            // Each API: a landing page whose search is GET /<name>/search.
            p if p.ends_with('/') => Reply::Json(
                200,
                landing_page(p, &format!("{p}search"), &["GET"], ITEM_SEARCH),
            ),
            "/huge/search" => Reply::Endless,
            "/repeat/search" => page(
                json!([item(1, "1.1.0", "c1")]),
                json!([{"rel": "next", "href": "/repeat/search?page=2"}]),
            ),
            "/empty/search" => {
                let n: u64 = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("token="))
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0);
                page(
                    json!([]),
                    json!([{"rel": "next", "href": format!("/empty/search?token={}", n + 1)}]),
                )
            }
            "/mixed/search" => {
                let mut no_geometry = item(2, "1.1.0", "c1");
                no_geometry["geometry"] = Value::Null;
                no_geometry.as_object_mut().unwrap().remove("bbox");
                let mut cloudy = item(3, "1.0.0", "c1");
                cloudy["properties"]["eo:cloud_cover"] = json!("cloudy");
                let mut broken = item(4, "1.1.0", "c1");
                broken["assets"] = json!(5);
                page(
                    json!([
                        item(1, "1.1.0", "c1"),
                        no_geometry,
                        cloudy,
                        broken,
                        17,
                        item(5, "1.0.0", "c1")
                    ]),
                    json!([]),
                )
            }
            "/huge.json" => Reply::Endless,
            "/image" => Reply::Bytes(200, "image/tiff", b"II*\0rest of a tiff".to_vec()),
            _ => Reply::Json(404, json!({"error": "no"})),
        }
    });
    let base = script.base();

    // An endless page stops at the page cap, quickly.
    let t = Instant::now();
    let got = search(&format!("{base}/huge/"), &StacSearch::default()).await;
    let e = got.err();
    assert!(
        e.contains("/huge/search") && e.contains("exceeds 64 MiB"),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(60));

    // An endless FeatureCollection document: its own cap.
    let got = search(&format!("{base}/huge.json"), &StacSearch::default()).await;
    let e = got.err();
    assert!(e.contains("exceeds 256 MiB") && e.contains("ndjson"), "{e}");

    // A next link that repeats the request.
    let got = search(&format!("{base}/repeat/"), &StacSearch::default()).await;
    assert!(
        got.err().contains("repeats an earlier request"),
        "{}",
        got.err()
    );
    assert_eq!(got.ids(), ids([1].into_iter()));

    // Empty pages with a next link for ever.
    let got = search(&format!("{base}/empty/"), &StacSearch::default()).await;
    assert!(got.err().contains("pages in a row"), "{}", got.err());
    assert_eq!(got.stats.pages.load(Ordering::Relaxed), 8);

    // Items that cannot be judged or read are reported among the good ones.
    let s = StacSearch {
        bbox: Some([-180.0, -90.0, 180.0, 90.0]),
        cloud_cover_max: Some(100.0),
        ..StacSearch::default()
    };
    let got = search(&format!("{base}/mixed/"), &s).await.ok();
    assert_eq!(got.ids(), ids([1, 5].into_iter()));
    let bad = got.bad();
    assert_eq!(bad.len(), 4, "{bad:?}");
    assert_eq!(bad[0].0.as_deref(), Some("item-00002"));
    assert!(bad[0].1.contains("no geometry"), "{bad:?}");
    assert!(bad[1].1.contains("\"cloudy\" is not a number"), "{bad:?}");
    assert!(bad[2].1.contains("is not a STAC item"), "{bad:?}");
    assert!(bad[3].1.contains("not a JSON object"), "{bad:?}");
    assert_eq!(got.stats.bad.load(Ordering::Relaxed), 4);

    // What is not STAC is left to the plain http path.
    let stores = StoreCache::default();
    assert_eq!(
        detect(&stores, &format!("{base}/image")).await.unwrap(),
        None
    );
    assert_eq!(
        detect(&stores, &format!("{base}/missing")).await.unwrap(),
        None
    );
}

#[tokio::test]
async fn hostile_files_end_in_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    // A chain of child catalogs deeper than the crawl allows.
    for d in 0..70 {
        let p = dir.path().join(format!("deep/{}", "d/".repeat(d)));
        std::fs::create_dir_all(&p).unwrap();
        let doc = json!({"type": "Catalog", "id": format!("d{d}"), "description": "x",
            "stac_version": "1.1.0", "links": [{"rel": "child", "href": "./d/catalog.json"}]});
        std::fs::write(p.join("catalog.json"), doc.to_string()).unwrap();
    }
    let got = search(
        &dir.path().join("deep/catalog.json").to_string_lossy(),
        &StacSearch::default(),
    )
    .await;
    assert!(got.err().contains("deeper than 64"), "{}", got.err());

    // An .ndjson line over the line cap; the lines before it come through,
    // a line that is not JSON is reported.
    let p = dir.path().join("big.ndjson");
    let mut s = format!("{}\nnot json\n{{\"pad\":\"", item(1, "1.1.0", "c1"));
    s.push_str(&"x".repeat(17 << 20));
    s.push_str("\"}\n");
    std::fs::write(&p, s).unwrap();
    let got = search(&p.to_string_lossy(), &StacSearch::default()).await;
    assert!(got.err().contains("line 3 exceeds 16 MiB"), "{}", got.err());
    assert_eq!(got.ids(), ids([1].into_iter()));
    assert!(got.bad()[0].1.contains("line 2"), "{:?}", got.bad());

    // A catalog whose child is not a catalog.
    let p = dir.path().join("odd/catalog.json");
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(
        &p,
        json!({"type": "Catalog", "id": "o", "description": "o", "stac_version": "1.1.0",
            "links": [{"rel": "child", "href": "./x.json"}]})
        .to_string(),
    )
    .unwrap();
    std::fs::write(p.with_file_name("x.json"), "[1, 2]").unwrap();
    let got = search(&p.to_string_lossy(), &StacSearch::default()).await;
    assert!(got.err().contains("x.json"), "{}", got.err());
}
