//! Tests of `stac/items.parquet` and of `write` over a stream of many chip
//! files: every item a row, JSON items only up to the limit, buffers that
//! do not grow with the number of files.

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, RecordBatch};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::metadata::ParquetMetaData;
use rsembed_schemas::chip::timestamp_type;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::geoparquet::ItemsParquet;
use super::rows::Row;
use super::tests::{file, get_json, spec, square, write_all, DAY_US, JUNE_1};
use super::*;
use object_store::memory::InMemory;

fn memory() -> Location {
    Location {
        store: Arc::new(InMemory::new()),
        prefix: object_store::path::Path::from("job"),
        url: url::Url::parse("memory:///job").unwrap(),
    }
}

/// The `i`th chip file of a synthetic job, with a recorded extent: by turns
/// one instant, a range, no footprint and no time, and two places with a
/// source item.
fn synthetic(i: u64) -> ManifestFile {
    let lon = -179.0 + (i % 3500) as f64 * 0.1;
    let lat = -80.0 + (i / 3500 % 1600) as f64 * 0.1;
    let b = [lon, lat, lon + 0.05, lat + 0.05];
    let t = JUNE_1 + i as i64 * 60_000_000;
    let extent = match i % 4 {
        0 => square(b, Some(t), Some(t)),
        1 => square(b, Some(t), Some(t + DAY_US)),
        2 => FileExtent {
            undated: 64,
            ..FileExtent::default()
        },
        _ => {
            let mut e = square(b, Some(t), Some(t));
            e.footprint
                .push(vec![[170.0, 10.0], [171.0, 10.0], [171.0, 11.0]]);
            e.sources.insert(
                format!("https://stac.example/v1/collections/s2/items/S{i}"),
                format!("S{i}"),
            );
            e
        }
    };
    ManifestFile {
        path: format!("chips/t{i:07}.parquet"),
        rows: 64,
        sha256: "ef".repeat(32),
        bytes: 1000 + i,
        extent: Some(extent),
    }
}

/// `n` synthetic files, made as the stream is read.
fn stream_of(n: u64) -> impl Stream<Item = Result<ManifestFile>> + Send + Unpin {
    futures::stream::iter((0..n).map(|i| Ok(synthetic(i))))
}

async fn parquet_bytes(out: &Location) -> Bytes {
    let got = out.store.get(&out.child(ITEMS_PARQUET)).await.unwrap();
    got.bytes().await.unwrap()
}

fn read(bytes: Bytes) -> (Vec<RecordBatch>, Arc<ParquetMetaData>) {
    let b = ParquetRecordBatchReaderBuilder::try_new(bytes).unwrap();
    let md = b.metadata().clone();
    let batches = b.build().unwrap().collect::<std::result::Result<_, _>>();
    (batches.unwrap(), md)
}

fn key_value(md: &ParquetMetaData, key: &str) -> Value {
    let kv = md.file_metadata().key_value_metadata().unwrap();
    let v = kv.iter().find(|kv| kv.key == key).unwrap();
    serde_json::from_str(v.value.as_deref().unwrap()).unwrap()
}

async fn keys_under(out: &Location, rel: &str) -> Vec<String> {
    let mut list = out.store.list(Some(&out.child(rel)));
    let mut keys = Vec::new();
    while let Some(m) = list.next().await {
        keys.push(m.unwrap().location.to_string());
    }
    keys
}

#[tokio::test]
async fn past_the_limit_every_item_is_a_row_of_the_parquet_and_none_is_json() {
    const N: u64 = 50_000;
    let out = memory();
    let spec = spec(None);
    // An item of an earlier, smaller run of the job.
    put(&out, "stac/items/old.json", &json!({})).await.unwrap();
    let limits = Limits {
        json_items: 1000,
        items_per_group: 8192,
    };
    // The count unknown: the first thousand go out as JSON until the stream
    // passes the limit, and are removed with the old item at the end.
    let w = write_with(&out, &spec, stream_of(N), None, limits)
        .await
        .unwrap();
    assert_eq!((w.items, w.json_items, w.removed), (N, false, 1001));
    assert_eq!(keys_under(&out, "stac/items").await, Vec::<String>::new());

    let bytes = parquet_bytes(&out).await;
    let (batches, md) = read(bytes.clone());
    assert_eq!(md.file_metadata().num_rows(), N as i64);
    assert_eq!(md.num_row_groups(), 7, "groups of 8192 rows as they fill");
    let ids: Vec<String> = batches
        .iter()
        .flat_map(|b| {
            let c = b.column_by_name("id").unwrap().as_string::<i32>();
            (0..c.len())
                .map(|i| c.value(i).to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(ids.len(), N as usize);
    assert!(ids
        .iter()
        .enumerate()
        .all(|(i, id)| *id == format!("t{i:07}")));
    let first = &batches[0];
    let dt = first.column_by_name("datetime").unwrap();
    assert_eq!(dt.data_type(), &timestamp_type());
    assert_eq!(
        dt.as_primitive::<TimestampMicrosecondType>().value(0),
        JUNE_1
    );
    // A range item: datetime null, its start and end set.
    assert!(dt.is_null(1));
    let end = first.column_by_name("end_datetime").unwrap();
    let end = end.as_primitive::<TimestampMicrosecondType>();
    assert_eq!(end.value(1), JUNE_1 + 60_000_000 + DAY_US);
    // No footprint: an empty polygon and no bbox.
    let geometry = first.column_by_name("geometry").unwrap().as_binary::<i32>();
    assert_eq!(geometry.value(2), [1, 3, 0, 0, 0, 0, 0, 0, 0]);
    assert!(first.column_by_name("bbox").unwrap().is_null(2));
    assert_eq!(&geometry.value(3)[..5], [1, 6, 0, 0, 0], "a MultiPolygon");
    let chips = first.column_by_name("rsembed:chips").unwrap();
    assert_eq!(chips.as_primitive::<Int64Type>().value(0), 64);

    // GeoParquet: the geometry types seen and the items' bbox.
    let col = get_json(&out, COLLECTION_FILE).await;
    let geo = key_value(&md, "geo");
    assert_eq!(geo["version"], "1.1.0");
    let g = &geo["columns"]["geometry"];
    assert_eq!(g["encoding"], "WKB");
    assert_eq!(g["geometry_types"], json!(["MultiPolygon", "Polygon"]));
    assert_eq!(g["bbox"], col["extent"]["spatial"]["bbox"][0]);
    assert_eq!(g["covering"]["bbox"]["xmin"], json!(["bbox", "xmin"]));
    // The collection, in the footer and beside it: no item links, and the
    // asset that is the file.
    let meta = key_value(&md, "stac-geoparquet");
    assert_eq!(meta["version"], "1.0.0");
    let inner = &meta["collections"][col["id"].as_str().unwrap()];
    assert_eq!(inner["extent"], col["extent"]);
    assert_eq!(inner["links"], col["links"]);
    assert!(inner["assets"].get(ITEMS_PARQUET_ASSET).is_none());
    assert_eq!(col["rsembed:chips"], 64 * N);
    let links = col["links"].as_array().unwrap();
    assert!(links.iter().all(|l| l["rel"] != "item"), "{links:?}");
    let a = &col["assets"][ITEMS_PARQUET_ASSET];
    assert_eq!(a["href"], "./items.parquet");
    assert_eq!(a["type"], PARQUET);
    assert_eq!(a["roles"], json!(["collection-mirror", "stac-items"]));
    assert_eq!(a["file:size"], bytes.len());
    assert_eq!(
        a["file:checksum"],
        format!("1220{}", hex::encode(Sha256::digest(&bytes)))
    );

    // The count known past the limit: no JSON item is written at all (any
    // would be removed), and the file is the same.
    let w = write_with(&out, &spec, stream_of(N), Some(N), limits)
        .await
        .unwrap();
    assert_eq!((w.items, w.json_items, w.removed), (N, false, 0));
    assert_eq!(parquet_bytes(&out).await, bytes);
}

use super::item::ITEMS_PARQUET_ASSET;

#[tokio::test]
async fn the_parquet_writer_holds_at_most_a_row_group_whatever_the_items() {
    const GROUP: usize = 8192;
    let out = memory();
    let ctx = Context::new(&spec(None)).unwrap();
    let mut w = ItemsParquet::create(&out, &ctx, GROUP).unwrap();
    let (mut peaks, mut peak) = (Vec::new(), 0);
    for i in 0..6 * GROUP as u64 {
        let f = synthetic(i);
        let extent = f.extent.clone().unwrap();
        w.add(Row::new(&ctx, f, extent).unwrap()).await.unwrap();
        peak = peak.max(w.buffered());
        if (i + 1) % GROUP as u64 == 0 {
            peaks.push(peak);
            peak = 0;
        }
    }
    // Each group's encoded rows go to the upload once it fills: the sixth
    // group needs what the first did.
    assert!(peaks[0] > 0);
    assert!(peaks.iter().all(|&p| p <= peaks[0] * 5 / 4), "{peaks:?}");
    assert!(peaks[0] < 8 << 20, "{peaks:?}");
    let c = collection(&ctx, &[], &Totals::default(), "float32").unwrap();
    let written = w.finish(&c, None).await.unwrap();
    assert_eq!(written.rows, 6 * GROUP as u64);
}

/// `v` with nulls left out, `+00:00` times written `Z` and an empty polygon
/// null: what a JSON item and its row read back may differ in.
fn canonical(v: &mut Value) {
    if *v == json!({"type": "Polygon", "coordinates": []}) {
        *v = Value::Null;
    }
    match v {
        Value::Object(o) => {
            o.values_mut().for_each(canonical);
            o.retain(|_, v| !v.is_null());
        }
        Value::Array(a) => a.iter_mut().for_each(canonical),
        Value::String(s) if s.ends_with("+00:00") => {
            *s = format!("{}Z", s.trim_end_matches("+00:00"));
        }
        _ => {}
    }
}

#[tokio::test]
async fn each_row_reads_back_as_the_json_item_of_its_file() {
    let out = memory();
    let spec = spec(Some(rsembed_schemas::job::StacSearch {
        cloud_cover_max: Some(20.0),
        ..Default::default()
    }));
    let mut files: Vec<ManifestFile> = (0..8).map(synthetic).collect();
    // A ring the long way round; more sources than an item lists.
    let mut wide = file("wide");
    let mut e = square([-170.0, 0.0, 170.0, 1.0], Some(JUNE_1), Some(JUNE_1));
    e.more_sources = true;
    wide.extent = Some(e);
    files.push(wide);
    let n = files.len() as u64;
    let w = write(
        &out,
        &spec,
        futures::stream::iter(files.into_iter().map(Ok)),
        Some(n),
    )
    .await
    .unwrap();
    assert!(w.json_items);
    let (batches, md) = read(parquet_bytes(&out).await);
    let meta = key_value(&md, "stac-geoparquet");
    let (_, inner) = meta["collections"]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .unwrap();
    let inner_links = inner["links"].as_array().unwrap();
    assert!(
        inner_links.iter().all(|l| l["rel"] != "item"),
        "the footer's collection lists no item: the rows are"
    );
    let mut rows = Vec::new();
    for b in &batches {
        rows.extend(crate::stac::items::rows_of(b).unwrap());
    }
    assert_eq!(rows.len() as u64, n);
    for row in rows {
        let mut row = row.unwrap();
        let id = row["id"].as_str().unwrap().to_owned();
        let mut doc = get_json(&out, &format!("stac/items/{id}.json")).await;
        canonical(&mut row);
        canonical(&mut doc);
        assert_eq!(row, doc, "{id}");
    }
    let col = get_json(&out, COLLECTION_FILE).await;
    let items = col["links"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["rel"] == "item")
        .count();
    assert_eq!(items as u64, n, "JSON items within the limit are linked");
    assert!(col["stac_extensions"].as_array().unwrap().contains(&json!(
        "https://stac-extensions.github.io/file/v2.1.0/schema.json"
    )));
}

#[tokio::test]
async fn a_failed_stream_leaves_neither_the_parquet_nor_the_collection() {
    let out = memory();
    let files = futures::stream::iter((0..100u64).map(|i| {
        if i == 60 {
            Err(Error::Output("the file list broke".into()))
        } else {
            Ok(synthetic(i))
        }
    }));
    let e = write(&out, &spec(None), files, None).await.unwrap_err();
    assert!(e.to_string().contains("the file list broke"), "{e}");
    for rel in [ITEMS_PARQUET, COLLECTION_FILE] {
        let got = out.store.get(&out.child(rel)).await;
        assert!(
            matches!(got, Err(object_store::Error::NotFound { .. })),
            "{rel}"
        );
    }
}

#[tokio::test]
async fn a_job_without_chip_files_has_an_empty_parquet() {
    let out = memory();
    let m = crate::job::output::manifest(&spec(None), 0, vec![], vec![], vec![], vec![], vec![]);
    let w = write_all(&out, &spec(None), &m).await.unwrap();
    assert_eq!((w.items, w.json_items), (0, true));
    let (batches, md) = read(parquet_bytes(&out).await);
    assert_eq!(md.file_metadata().num_rows(), 0);
    assert!(batches.iter().all(|b| b.num_rows() == 0));
    let geo = key_value(&md, "geo");
    assert_eq!(geo["columns"]["geometry"]["geometry_types"], json!([]));
}

/// Peak memory and time of `write` over `RSEMBED_STAC_ITEMS` synthetic files
/// (default 1,000,000) into a local folder, in row groups of
/// `RSEMBED_STAC_GROUP` items (default [`ITEMS_PER_GROUP`]). A measurement, not a check: run
/// it alone, as VmHWM is the whole process's.
///
/// ```text
/// RSEMBED_STAC_ITEMS=1000000 cargo test --release -p rsembed-coordinator --lib \
///   stac::out::tests_geoparquet::measure -- --ignored --nocapture
/// ```
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run alone with --ignored --nocapture"]
async fn measure() {
    let n: u64 = std::env::var("RSEMBED_STAC_ITEMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir().unwrap();
    let out = rsembed_worker::store::StoreCache::default()
        .location(dir.path().to_str().unwrap())
        .unwrap();
    let hwm = || {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        s.lines()
            .find(|l| l.starts_with("VmHWM"))
            .unwrap()
            .to_owned()
    };
    println!("before: {}", hwm());
    let t = std::time::Instant::now();
    let limits = Limits {
        items_per_group: std::env::var("RSEMBED_STAC_GROUP")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(ITEMS_PER_GROUP),
        ..LIMITS
    };
    let w = write_with(&out, &spec(None), stream_of(n), Some(n), limits)
        .await
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    let bytes = std::fs::read(dir.path().join(ITEMS_PARQUET)).unwrap();
    let footer = u32::from_le_bytes(bytes[bytes.len() - 8..bytes.len() - 4].try_into().unwrap());
    println!(
        "{n} items in groups of {}: {secs:.1} s ({:.0} items/s), items.parquet {} bytes \
         ({:.0} B/item, footer {footer}), after: {}",
        limits.items_per_group,
        n as f64 / secs,
        bytes.len(),
        bytes.len() as f64 / n as f64,
        hwm()
    );
    assert_eq!(w.items, n);
}
