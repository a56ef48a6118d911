//! Tests of `stac::out`: the documents, the source link, the read of chip
//! files without a recorded extent, and `write` over an in-memory store.

use super::link::{client_filter, search_url, source_link};
use super::read::add_batch;
use super::*;
use arrow_array::builder::{Float64Builder, StructBuilder, TimestampMicrosecondBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use object_store::memory::InMemory;
use rsembed_raster::geo::Footprint;
use rsembed_schemas::chip::{bbox_fields, col, timestamp_type};
use rsembed_schemas::ids::Window;
use rsembed_schemas::job::{
    CloudCoverBy, GroupingSpec, Manifest, ManifestFile, ModelRef, StacSearch, TilingSpec,
};
use rsembed_worker::sink::extent::ExtentBuilder;
use rsembed_worker::sink::parquet::encode_chips;
use rsembed_worker::sink::rows::{chip_batch, ChipRow, StacColumns};
use serde_json::{json, Value};

pub(super) const DAY_US: i64 = 86_400_000_000;
/// 2024-06-01T00:00:00Z.
pub(super) const JUNE_1: i64 = 1_717_200_000_000_000;

pub(super) fn spec(search: Option<StacSearch>) -> JobSpec {
    JobSpec::new(
        "https://stac.example/v1".into(),
        "s3://bucket/out/".into(),
        ModelRef {
            name: "tiny".into(),
            embed_dim: 8,
            sha256: "ab".repeat(32),
            files: vec![],
            preprocessor_sha256: "cd".repeat(32),
            fp16: false,
        },
        TilingSpec {
            chip_size: 64,
            stride: 32,
            bands: vec![1, 2, 3],
            scale: "auto".into(),
            min_valid: None,
            band_files: None,
            assets: None,
            cloud_mask: None,
            max_cloud: None,
            footprint_tolerance: Some(rsembed_schemas::job::DEFAULT_FOOTPRINT_TOLERANCE),
            embedding_type: Default::default(),
            align: Default::default(),
            windows: None,
            schema_version: rsembed_schemas::SCHEMA_VERSION,
        },
        GroupingSpec {
            task_files: 1,
            task_bytes: 1,
            task_chips: 1,
            shard_bytes: 1,
        },
        "2025-01-02T03:04:05Z".into(),
    )
    .with_search(search)
}

pub(super) fn file(task: &str) -> ManifestFile {
    ManifestFile {
        path: format!("chips/{task}.parquet"),
        rows: 3,
        sha256: "ef".repeat(32),
        bytes: 1234,
        extent: None,
    }
}

/// A batch of the projected columns, each row its own input (named by its
/// bbox); `times` `None` leaves them out (schema 1).
fn batch(bboxes: &[Option<[f64; 4]>], times: Option<&[(Option<i64>, Option<i64>)]>) -> RecordBatch {
    let mut b = StructBuilder::from_fields(bbox_fields(), bboxes.len());
    for bb in bboxes {
        for i in 0..4 {
            b.field_builder::<Float64Builder>(i)
                .unwrap()
                .append_value(bb.map_or(0.0, |v| v[i]));
        }
        b.append(bb.is_some());
    }
    let uris: arrow_array::StringArray = bboxes
        .iter()
        .map(|bb| Some(format!("file:///in/{bb:?}.tif")))
        .collect();
    let mut fields = vec![
        Field::new(col::BBOX, DataType::Struct(bbox_fields()), true),
        Field::new(col::SOURCE_URI, DataType::Utf8, false),
    ];
    let mut cols: Vec<ArrayRef> = vec![Arc::new(b.finish()), Arc::new(uris)];
    if let Some(times) = times {
        for (name, pick) in [(col::DATETIME, 0), (col::END_DATETIME, 1)] {
            let mut t = TimestampMicrosecondBuilder::new().with_timezone("UTC");
            for pair in times {
                t.append_option(if pick == 0 { pair.0 } else { pair.1 });
            }
            fields.push(Field::new(name, timestamp_type(), true));
            cols.push(Arc::new(t.finish()));
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap()
}

#[test]
fn a_read_unions_bboxes_and_covers_every_chips_range() {
    let mut b = ExtentBuilder::default();
    add_batch(
        &mut b,
        &batch(
            &[
                Some([1.0, 2.0, 3.0, 4.0]),
                None,
                Some([-1.0, 3.0, 2.0, 5.0]),
            ],
            Some(&[
                (Some(JUNE_1), None),
                (Some(JUNE_1 - DAY_US), Some(JUNE_1 + 2 * DAY_US)),
                (None, None),
            ]),
        ),
    )
    .unwrap();
    // A second batch widens it.
    add_batch(
        &mut b,
        &batch(
            &[Some([10.0, -9.0, 11.0, -8.0])],
            Some(&[(Some(JUNE_1 + 9 * DAY_US), None)]),
        ),
    )
    .unwrap();
    let e = b.finish();
    assert_eq!(e.bbox(), Some([-1.0, -9.0, 11.0, 5.0]));
    assert_eq!(e.footprint.len(), 2, "two places apart: {:?}", e.footprint);
    assert_eq!(
        (e.start, e.end),
        (Some(JUNE_1 - DAY_US), Some(JUNE_1 + 9 * DAY_US))
    );
    assert_eq!(e.undated, 1);
}

#[test]
fn schema_1_batches_have_no_datetime_and_bad_bboxes_are_errors() {
    let mut b = ExtentBuilder::default();
    add_batch(&mut b, &batch(&[Some([0.0, 0.0, 1.0, 1.0]), None], None)).unwrap();
    let e = b.finish();
    assert_eq!((e.start, e.undated), (None, 2));
    assert_eq!(e.bbox(), Some([0.0, 0.0, 1.0, 1.0]));
    for bad in [[2.0, 0.0, 1.0, 1.0], [0.0, f64::NAN, 1.0, 1.0]] {
        let e = add_batch(&mut ExtentBuilder::default(), &batch(&[Some(bad)], None)).unwrap_err();
        assert!(e.contains("row 0 has the bbox"), "{e}");
    }
}

/// An extent of one square footprint.
pub(super) fn square(b: [f64; 4], start: Option<i64>, end: Option<i64>) -> FileExtent {
    FileExtent {
        footprint: vec![vec![[b[0], b[1]], [b[2], b[1]], [b[2], b[3]], [b[0], b[3]]]],
        start,
        end,
        ..FileExtent::default()
    }
}

#[test]
fn items_point_at_their_chip_file_and_collection_by_relative_hrefs() {
    let ctx = Context::new(&spec(None)).unwrap();
    let e = square([1.0, 2.0, 3.0, 4.0], Some(JUNE_1), Some(JUNE_1));
    let item = item(&ctx, &file("t1"), &e).unwrap();
    let v = serde_json::to_value(&item).unwrap();
    assert_eq!(v["id"], "t1");
    assert_eq!(v["stac_version"], "1.1.0");
    assert_eq!(v["collection"], ctx.id);
    assert_eq!(v["bbox"], json!([1.0, 2.0, 3.0, 4.0]));
    assert_eq!(
        v["geometry"],
        json!({"type": "Polygon", "coordinates": [[[1.0, 2.0], [3.0, 2.0], [3.0, 4.0], [1.0, 4.0], [1.0, 2.0]]]})
    );
    let a = &v["assets"]["embeddings"];
    assert_eq!(a["href"], "../../chips/t1.parquet");
    assert_eq!(a["type"], PARQUET);
    assert_eq!(a["roles"], json!(["data"]));
    assert_eq!(a["file:size"], 1234);
    assert_eq!(a["file:checksum"], format!("1220{}", "ef".repeat(32)));
    for l in v["links"].as_array().unwrap() {
        assert_eq!(l["href"], "../collection.json", "{l}");
    }
    let p = &v["properties"];
    assert_eq!(p["datetime"], "2024-06-01T00:00:00Z");
    assert!(p.get("start_datetime").is_none());
    assert_eq!(p["rsembed:datetime_source"], "acquisition");
    assert_eq!(p["rsembed:chips"], 3);
    assert_eq!(p["processing:datetime"], "2025-01-02T03:04:05Z");
    assert_eq!(p["emb:runtime_parameters"]["chip_size"], 64);
    assert!(p.get("rsembed:wide_footprint").is_none());
    assert!(v["stac_extensions"]
        .as_array()
        .unwrap()
        .contains(&json!(EMBEDDINGS_EXTENSION)));
}

#[test]
fn places_apart_are_a_multipolygon_and_source_items_are_derived_from() {
    let ctx = Context::new(&spec(None)).unwrap();
    let mut e = square([-100.0, 46.0, -99.0, 47.0], Some(JUNE_1), Some(JUNE_1));
    e.footprint
        .push(vec![[139.0, 35.0], [140.0, 35.0], [139.5, 36.0]]);
    e.sources.insert(
        "https://stac.example/v1/collections/s2/items/A".into(),
        "A".into(),
    );
    e.sources.insert(
        "https://stac.example/v1/collections/s2/items/B".into(),
        "B".into(),
    );
    let v = serde_json::to_value(item(&ctx, &file("t"), &e).unwrap()).unwrap();
    assert_eq!(v["geometry"]["type"], "MultiPolygon");
    assert_eq!(
        v["geometry"]["coordinates"][1],
        json!([[[139.0, 35.0], [140.0, 35.0], [139.5, 36.0], [139.0, 35.0]]])
    );
    assert_eq!(v["bbox"], json!([-100.0, 35.0, 140.0, 47.0]));
    let links = v["links"].as_array().unwrap();
    for rel in ["derived_from", "emb:source-data"] {
        let of: Vec<&Value> = links.iter().filter(|l| l["rel"] == rel).collect();
        assert_eq!(of.len(), 2, "{rel}: {links:?}");
        assert_eq!(
            of[0]["href"],
            "https://stac.example/v1/collections/s2/items/A"
        );
        assert_eq!(of[0]["title"], "source item A");
        assert_eq!(of[0]["type"], GEOJSON);
    }
    // A ring the long way round in lon/lat is said to be one.
    let wide = square([-170.0, 0.0, 170.0, 1.0], None, None);
    let v = serde_json::to_value(item(&ctx, &file("t"), &wide).unwrap()).unwrap();
    assert_eq!(v["properties"]["rsembed:wide_footprint"], true);
}

#[test]
fn a_range_gives_start_and_end_and_no_times_give_the_processing_time() {
    let ctx = Context::new(&spec(None)).unwrap();
    let range = FileExtent {
        start: Some(JUNE_1),
        end: Some(JUNE_1 + DAY_US),
        undated: 1,
        ..FileExtent::default()
    };
    let v = serde_json::to_value(item(&ctx, &file("t"), &range).unwrap()).unwrap();
    let p = &v["properties"];
    assert_eq!(p["datetime"], Value::Null);
    assert_eq!(p["start_datetime"], "2024-06-01T00:00:00Z");
    assert_eq!(p["end_datetime"], "2024-06-02T00:00:00Z");
    assert_eq!(p["rsembed:chips_without_datetime"], 1);
    // No footprint: null geometry and no bbox.
    assert_eq!(v["geometry"], Value::Null);
    assert!(v.get("bbox").is_none());

    let none = FileExtent {
        undated: 2,
        ..FileExtent::default()
    };
    let v = serde_json::to_value(item(&ctx, &file("t"), &none).unwrap()).unwrap();
    assert_eq!(v["properties"]["datetime"], "2025-01-02T03:04:05Z");
    assert_eq!(v["properties"]["rsembed:datetime_source"], "processing");
    assert!(v["properties"]
        .get("rsembed:chips_without_datetime")
        .is_none());
}

#[test]
fn the_collection_has_the_extension_fields_extent_and_links() {
    let ctx = Context::new(&spec(Some(StacSearch {
        collections: vec!["s2".into()],
        ..StacSearch::default()
    })))
    .unwrap();
    let totals = Totals {
        rows: 7,
        bbox: Some([1.0, 2.0, 3.0, 4.0]),
        start: Some(JUNE_1),
        end: Some(JUNE_1 + DAY_US),
    };
    let c = collection(&ctx, &["a".into(), "b".into()], &totals, "float32").unwrap();
    let v = serde_json::to_value(&c).unwrap();
    assert_eq!(v["type"], "Collection");
    assert_eq!(v["stac_version"], "1.1.0");
    assert_eq!(v["stac_extensions"], json!([EMBEDDINGS_EXTENSION]));
    assert_eq!(v["emb:type"], "chip");
    assert_eq!(v["emb:dimensions"], 8);
    assert_eq!(v["data_type"], "float32");
    assert_eq!(v["emb:chip_layout"]["stride"], json!([32, 32]));
    assert_eq!(v["emb:chip_layout"]["grid"], "scene");
    assert_eq!(v["emb:temporal_resolution"], "acquisition");
    assert_eq!(v["rsembed:model"]["name"], "tiny");
    assert_eq!(v["rsembed:model"]["sha256"], "ab".repeat(32));
    assert_eq!(v["rsembed:chips"], 7);
    assert_eq!(
        v["extent"]["spatial"]["bbox"],
        json!([[1.0, 2.0, 3.0, 4.0]])
    );
    assert_eq!(
        v["extent"]["temporal"]["interval"],
        json!([["2024-06-01T00:00:00Z", "2024-06-02T00:00:00Z"]])
    );
    let links = v["links"].as_array().unwrap();
    let href = |rel: &str| -> Vec<&str> {
        links
            .iter()
            .filter(|l| l["rel"] == rel)
            .map(|l| l["href"].as_str().unwrap())
            .collect()
    };
    assert_eq!(href("item"), ["./items/a.json", "./items/b.json"]);
    assert_eq!(href("root"), ["./collection.json"]);
    assert_eq!(href("emb:model"), ["../job.json"]);
    assert_eq!(
        href("emb:source-data"),
        ["https://stac.example/v1/search?collections=s2"]
    );
    assert_eq!(v["item_assets"]["embeddings"]["type"], PARQUET);

    // No chip has a footprint or a time: the world, and the processing time.
    let c = collection(&ctx, &[], &Totals::default(), "float32").unwrap();
    let v = serde_json::to_value(&c).unwrap();
    assert_eq!(
        v["extent"]["spatial"]["bbox"],
        json!([[-180.0, -90.0, 180.0, 90.0]])
    );
    assert_eq!(
        v["extent"]["temporal"]["interval"],
        json!([["2025-01-02T03:04:05Z", "2025-01-02T03:04:05Z"]])
    );
}

fn full_search(by: Option<CloudCoverBy>) -> StacSearch {
    StacSearch {
        collections: vec!["sentinel-2-l2a".into(), "landsat".into()],
        bbox: Some([-1.5, 2.0, 3.0, 4.25]),
        datetime: Some("2024-06-01T00:00:00Z/..".into()),
        ids: vec!["a b".into()],
        filter: Some("platform = 'sentinel-2a'".into()),
        max_items: Some(5),
        cloud_cover_max: Some(20.0),
        cloud_cover_by: by,
    }
}

fn query_of(url: &str) -> Vec<(String, String)> {
    url::Url::parse(url)
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect()
}

fn param<'a>(q: &'a [(String, String)], k: &str) -> Option<&'a str> {
    q.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

#[test]
fn the_source_link_is_the_search_url_of_an_api_and_the_input_otherwise() {
    let s = full_search(Some(CloudCoverBy::Filter));
    let url = search_url("https://earth-search.example/v1/", &s).unwrap();
    assert_eq!(url::Url::parse(&url).unwrap().path(), "/v1/search");
    let q = query_of(&url);
    assert_eq!(param(&q, "collections"), Some("sentinel-2-l2a,landsat"));
    assert_eq!(param(&q, "bbox"), Some("-1.5,2,3,4.25"));
    assert_eq!(param(&q, "datetime"), Some("2024-06-01T00:00:00Z/.."));
    assert_eq!(param(&q, "ids"), Some("a b"));
    assert_eq!(
        param(&q, "filter"),
        Some("(platform = 'sentinel-2a') AND \"eo:cloud_cover\" <= 20")
    );
    assert_eq!(param(&q, "filter-lang"), Some("cql2-text"));
    assert_eq!(param(&q, "query"), None);
    let l = source_link("https://earth-search.example/v1/", Some(&s)).unwrap();
    assert!(l.additional_fields.get("rsembed:client_filter").is_none());

    // Documents are linked as they are; the search rides along.
    for doc in [
        "https://x.example/catalog.json",
        "https://x.example/items.ndjson",
        "s3://bucket/items.parquet",
        "file:///data/collection.json",
        // A STAC API's collection or item, read by its URL: a document too,
        // not a root to put `/search` under.
        "https://earth-search.example/v1/collections/naip",
        "https://earth-search.example/v1/collections/naip/",
        "https://earth-search.example/v1/collections/naip/items/m_4209_20200831",
    ] {
        assert_eq!(search_url(doc, &s), None, "{doc}");
        let l = source_link(doc, Some(&s)).unwrap();
        assert_eq!(l.href, doc);
        assert_eq!(l.additional_fields["rsembed:search"]["max_items"], 5);
        assert!(l.additional_fields.get("rsembed:client_filter").is_none());
    }
    let l = source_link("file:///images/", None).unwrap();
    assert_eq!(
        (l.href.as_str(), l.rel.as_str()),
        ("file:///images/", "emb:source-data")
    );
}

#[test]
fn a_cloud_cover_filter_that_was_not_sent_is_not_in_the_link() {
    let api = "https://stac.example/v1";
    // The server has the query extension: the link sends it that way.
    let q = query_of(&search_url(api, &full_search(Some(CloudCoverBy::Query))).unwrap());
    assert_eq!(param(&q, "filter"), Some("platform = 'sentinel-2a'"));
    assert_eq!(
        param(&q, "query"),
        Some(r#"{"eo:cloud_cover":{"lte":20.0}}"#)
    );
    // Neither extension (or a job.json that does not say): rsembed judged
    // every item, so the link has no cloud cover and the filter is recorded
    // beside it and on every item.
    for by in [Some(CloudCoverBy::Client), None] {
        let s = full_search(by);
        let q = query_of(&search_url(api, &s).unwrap());
        assert_eq!(
            param(&q, "filter"),
            Some("platform = 'sentinel-2a'"),
            "{by:?}"
        );
        assert_eq!(param(&q, "query"), None);
        let l = source_link(api, Some(&s)).unwrap();
        assert_eq!(
            l.additional_fields["rsembed:client_filter"],
            "\"eo:cloud_cover\" <= 20"
        );
        assert_eq!(
            client_filter(api, Some(&s)).as_deref(),
            Some("\"eo:cloud_cover\" <= 20")
        );
        let ctx = Context::new(&spec(Some(s))).unwrap();
        let v =
            serde_json::to_value(item(&ctx, &file("t"), &FileExtent::default()).unwrap()).unwrap();
        assert_eq!(
            v["properties"]["emb:runtime_parameters"]["client_filter"],
            "\"eo:cloud_cover\" <= 20"
        );
    }
    let no_cc = StacSearch {
        cloud_cover_max: None,
        ..full_search(None)
    };
    assert_eq!(client_filter(api, Some(&no_cc)), None);
    assert!(param(&query_of(&search_url(api, &no_cc).unwrap()), "query").is_none());
}

#[test]
fn a_manifest_path_that_is_not_a_chip_file_is_an_error() {
    let ctx = Context::new(&spec(None)).unwrap();
    let mut f = file("x");
    f.path = "chips/.parquet".into();
    assert!(item(&ctx, &f, &FileExtent::default()).is_err());
}

fn chip(bbox: Option<[f64; 4]>, times: (Option<i64>, Option<i64>)) -> ChipRow {
    let item = times.0.map(|t| format!("S2_{t}"));
    ChipRow {
        chip_id: "00".repeat(16),
        source_uri: item.as_ref().map_or("file:///in/a.tif".into(), |i| {
            format!("https://stac.example/v1/collections/s2/items/{i}")
        }),
        source_version: None,
        window: Window {
            x: 0,
            y: 0,
            width: 64,
            height: 64,
        },
        valid_fraction: 1.0,
        crs: None,
        footprint: bbox.map(|b| Footprint {
            wkb: vec![],
            bbox: b,
        }),
        centre: bbox.map(|b| [(b[0] + b[2]) / 2.0, (b[1] + b[3]) / 2.0]),
        embedding: vec![0.5; 8],
        stac: StacColumns {
            item_id: item,
            datetime: times.0,
            end_datetime: times.1,
            ..StacColumns::default()
        },
    }
}

/// Writes `batch` as a chip file of `out` and returns its manifest entry.
async fn put_chips(out: &Location, task: &str, batch: &RecordBatch) -> ManifestFile {
    let bytes = encode_chips(batch, vec![]).unwrap();
    let f = ManifestFile {
        path: format!("chips/{task}.parquet"),
        rows: batch.num_rows() as u64,
        sha256: "00".repeat(32),
        bytes: bytes.len() as u64,
        extent: None,
    };
    out.store
        .put(&out.child(&f.path), PutPayload::from(bytes))
        .await
        .unwrap();
    f
}

/// `write` over the manifest's files, streamed.
pub(super) async fn write_all(out: &Location, spec: &JobSpec, m: &Manifest) -> Result<StacWritten> {
    let files = futures::stream::iter(m.files.clone().into_iter().map(Ok));
    write(out, spec, files, Some(m.files.len() as u64)).await
}

pub(super) async fn get_json(out: &Location, rel: &str) -> Value {
    let b = out.store.get(&out.child(rel)).await.unwrap();
    serde_json::from_slice(&b.bytes().await.unwrap()).unwrap()
}

#[tokio::test]
async fn write_reads_both_schema_versions_through_the_store_and_drops_stale_items() {
    let out = Location {
        store: Arc::new(InMemory::new()),
        prefix: object_store::path::Path::from("job"),
        url: url::Url::parse("memory:///job").unwrap(),
    };
    let spec = spec(None);
    // Schema 2, with acquisition times (one a range) and footprints.
    let a = chip_batch(
        &[
            chip(Some([1.0, 2.0, 3.0, 4.0]), (Some(JUNE_1), None)),
            chip(
                Some([0.0, 3.0, 2.0, 5.0]),
                (Some(JUNE_1 + DAY_US), Some(JUNE_1 + 2 * DAY_US)),
            ),
        ],
        8,
        Default::default(),
    )
    .unwrap();
    // Schema 2 with every STAC column null and no footprint.
    let b = chip_batch(&[chip(None, (None, None))], 8, Default::default()).unwrap();
    // Schema 1: the columns before the STAC ones.
    let c = chip_batch(
        &[chip(Some([-5.0, -5.0, -4.0, -4.0]), (None, None))],
        8,
        Default::default(),
    )
    .unwrap();
    let c = c.project(&(0..14).collect::<Vec<_>>()).unwrap();
    assert!(c.schema().index_of(col::DATETIME).is_err());
    let files = vec![
        put_chips(&out, "a", &a).await,
        put_chips(&out, "b", &b).await,
        put_chips(&out, "c", &c).await,
    ];
    put(&out, "stac/items/gone.json", &json!({})).await.unwrap();
    let m = crate::job::output::manifest(&spec, 3, files, vec![], vec![], vec![], vec![]);

    let w = write_all(&out, &spec, &m).await.unwrap();
    assert_eq!((w.items, w.removed), (3, 1));
    assert_eq!(w.collection, "memory:///job/stac/collection.json");

    let ia = get_json(&out, "stac/items/a.json").await;
    assert_eq!(ia["bbox"], json!([0.0, 2.0, 3.0, 5.0]));
    assert_eq!(ia["properties"]["datetime"], Value::Null);
    assert_eq!(ia["properties"]["start_datetime"], "2024-06-01T00:00:00Z");
    assert_eq!(ia["properties"]["end_datetime"], "2024-06-03T00:00:00Z");
    assert_eq!(ia["properties"]["rsembed:datetime_source"], "acquisition");
    assert_eq!(ia["properties"]["rsembed:chips"], 2);
    let sources: Vec<&Value> = ia["links"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["rel"] == "emb:source-data")
        .collect();
    assert_eq!(sources.len(), 2, "one link per source item: {ia}");
    assert_eq!(
        sources[0]["href"],
        format!("https://stac.example/v1/collections/s2/items/S2_{JUNE_1}")
    );
    assert_eq!(sources[0]["title"], format!("source item S2_{JUNE_1}"));
    for (id, bbox) in [("b", Value::Null), ("c", json!([-5.0, -5.0, -4.0, -4.0]))] {
        let i = get_json(&out, &format!("stac/items/{id}.json")).await;
        assert_eq!(i["properties"]["datetime"], "2025-01-02T03:04:05Z", "{id}");
        assert_eq!(i["properties"]["rsembed:datetime_source"], "processing");
        assert_eq!(i.get("bbox").cloned().unwrap_or(Value::Null), bbox, "{id}");
    }
    let col = get_json(&out, COLLECTION_FILE).await;
    assert_eq!(
        col["extent"]["spatial"]["bbox"],
        json!([[-5.0, -5.0, 3.0, 5.0]])
    );
    // Acquisition times and the processing time of the chips without one.
    assert_eq!(
        col["extent"]["temporal"]["interval"],
        json!([["2024-06-01T00:00:00Z", "2025-01-02T03:04:05Z"]])
    );
    assert_eq!(col["rsembed:chips"], 4);
    assert_eq!(col["data_type"], "float32");
    let gone = out.store.get(&out.child("stac/items/gone.json")).await;
    assert!(matches!(gone, Err(object_store::Error::NotFound { .. })));

    // Again: the same bytes.
    let before = out.store.get(&out.child(COLLECTION_FILE)).await.unwrap();
    let before = before.bytes().await.unwrap();
    write_all(&out, &spec, &m).await.unwrap();
    let after = out.store.get(&out.child(COLLECTION_FILE)).await.unwrap();
    assert_eq!(after.bytes().await.unwrap(), before);
}

#[tokio::test]
async fn a_missing_chip_file_is_a_store_error_and_a_broken_one_a_task_file_error() {
    let out = Location {
        store: Arc::new(InMemory::new()),
        prefix: object_store::path::Path::from("job"),
        url: url::Url::parse("memory:///job").unwrap(),
    };
    let spec = spec(None);
    let m =
        crate::job::output::manifest(&spec, 1, vec![file("gone")], vec![], vec![], vec![], vec![]);
    let e = write_all(&out, &spec, &m).await.unwrap_err();
    assert!(matches!(e, Error::ReadOutput { .. }), "{e:?}");
    assert!(
        e.to_string().contains("memory:///job/chips/gone.parquet"),
        "{e}"
    );

    let mut f = file("junk");
    f.bytes = 4096;
    out.store
        .put(&out.child(&f.path), PutPayload::from(vec![7u8; 4096]))
        .await
        .unwrap();
    let m = crate::job::output::manifest(&spec, 1, vec![f], vec![], vec![], vec![], vec![]);
    let e = write_all(&out, &spec, &m).await.unwrap_err();
    assert!(matches!(e, Error::TaskFile { .. }), "{e:?}");
    // Nothing claims the job is described.
    let c = out.store.get(&out.child(COLLECTION_FILE)).await;
    assert!(matches!(c, Err(object_store::Error::NotFound { .. })));
}

#[tokio::test]
async fn write_builds_items_from_recorded_extents_without_any_chip_file() {
    // The store holds no chip file at all: a read would fail the write.
    let out = Location {
        store: Arc::new(InMemory::new()),
        prefix: object_store::path::Path::from("job"),
        url: url::Url::parse("memory:///job").unwrap(),
    };
    let mut spec = spec(None);
    spec.tiling.embedding_type = rsembed_schemas::embedding::EmbeddingType::Int8;
    let mut a = file("a");
    let mut two = square(
        [-100.0, 46.0, -99.0, 47.0],
        Some(JUNE_1),
        Some(JUNE_1 + DAY_US),
    );
    two.footprint
        .push(vec![[139.0, 35.0], [140.0, 35.0], [140.0, 36.0]]);
    two.sources.insert("https://x/items/A".into(), "A".into());
    a.extent = Some(two);
    let mut b = file("b");
    b.extent = Some(FileExtent {
        undated: 3,
        ..FileExtent::default()
    });
    let m = crate::job::output::manifest(&spec, 2, vec![a, b], vec![], vec![], vec![], vec![]);
    let w = write_all(&out, &spec, &m).await.unwrap();
    assert_eq!(w.items, 2);

    let ia = get_json(&out, "stac/items/a.json").await;
    assert_eq!(ia["geometry"]["type"], "MultiPolygon");
    assert_eq!(ia["bbox"], json!([-100.0, 35.0, 140.0, 47.0]));
    assert_eq!(ia["properties"]["start_datetime"], "2024-06-01T00:00:00Z");
    let derived: Vec<&Value> = ia["links"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["rel"] == "derived_from")
        .collect();
    assert_eq!(derived.len(), 1);
    assert_eq!(derived[0]["href"], "https://x/items/A");
    let ib = get_json(&out, "stac/items/b.json").await;
    assert_eq!(ib["geometry"], Value::Null);
    assert_eq!(ib["properties"]["rsembed:datetime_source"], "processing");
    let col = get_json(&out, COLLECTION_FILE).await;
    assert_eq!(col["data_type"], "int8", "the job's type: no file was read");
    assert_eq!(col["rsembed:chips"], 6);
    assert_eq!(
        col["extent"]["spatial"]["bbox"],
        json!([[-100.0, 35.0, 140.0, 47.0]])
    );

    // A record that does not check is not trusted: the file is read, and
    // here it is missing.
    let mut bad = file("c");
    bad.extent = Some(FileExtent {
        footprint: vec![vec![[500.0, 0.0], [1.0, 0.0], [1.0, 1.0]]],
        ..FileExtent::default()
    });
    let m = crate::job::output::manifest(&spec, 1, vec![bad], vec![], vec![], vec![], vec![]);
    let e = write_all(&out, &spec, &m).await.unwrap_err();
    assert!(matches!(e, Error::ReadOutput { .. }), "{e:?}");
}

#[test]
fn the_chip_layout_names_the_lattice_and_the_cells_of_an_aligned_job() {
    let mut t = spec(None).tiling;
    t.schema_version = 3;
    let scene = super::item::chip_layout(&t);
    assert_eq!(scene["grid"], "scene");
    assert_eq!(scene["grid_origin"], "scene");
    assert!(scene.get("cell_format").is_none());
    assert_eq!(scene["grid_cell_column"], "grid_cell");
    t.align = rsembed_schemas::align::Align::Crs;
    let crs = super::item::chip_layout(&t);
    assert_eq!(crs["grid"], "crs");
    assert_eq!(crs["grid_origin"], "crs");
    assert_eq!(crs["cell_format"], "EPSG:<code>/<res>/<stride>/<col>/<row>");
    t.schema_version = 2;
    assert!(super::item::chip_layout(&t)
        .get("grid_cell_column")
        .is_none());
}
