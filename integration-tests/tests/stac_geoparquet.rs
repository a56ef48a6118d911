//! `<output>/stac/items.parquet`: every finished job's items as
//! stac-geoparquet, which the collection points at. Read back here by other
//! software: the `rustac` CLI (`rustac translate`, the Rust STAC reader) and
//! DuckDB, against the job's JSON items.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use rsembed_integration_tests::rasters::make_jpeg_geotiff;
use rsembed_integration_tests::stac::{rustac_bin, write_feature_collection};
use rsembed_integration_tests::stac_scenes::{item, make_scene, ItemStyle, SceneFiles};
use rsembed_integration_tests::{duckdb, run, run_cmd, tiny_model};
use serde_json::Value;

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The job's JSON items, by id.
fn json_items(output: &Path) -> BTreeMap<String, Value> {
    std::fs::read_dir(output.join("stac/items"))
        .unwrap()
        .map(|e| {
            let v = read_json(&e.unwrap().path());
            (v["id"].as_str().unwrap().to_owned(), v)
        })
        .collect()
}

/// `items.parquet` as `rustac translate` reads it, by id.
fn rustac_items(output: &Path, scratch: &Path) -> BTreeMap<String, Value> {
    let to = scratch.join("items.ndjson");
    let out = Command::new(rustac_bin())
        .arg("translate")
        .arg(output.join("stac/items.parquet"))
        .arg(&to)
        .output()
        .expect("rustac runs");
    assert!(
        out.status.success(),
        "rustac translate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(&to)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["id"].as_str().unwrap().to_owned(), v)
        })
        .collect()
}

/// An RFC 3339 UTC time as the JSON items write it.
fn z(t: &Value) -> Option<String> {
    t.as_str().map(|s| s.replace("+00:00", "Z"))
}

/// The collection's asset that is `items.parquet`, checked against the file.
fn check_collection_links_it(output: &Path) {
    let c = read_json(&output.join("stac/collection.json"));
    let a = &c["assets"]["geoparquet-items"];
    assert_eq!(a["href"], "./items.parquet", "{c}");
    assert_eq!(a["type"], "application/vnd.apache.parquet");
    let roles = a["roles"].as_array().unwrap();
    assert!(roles.iter().any(|r| r == "collection-mirror"), "{a}");
    let len = std::fs::metadata(output.join("stac/items.parquet"))
        .unwrap()
        .len();
    assert_eq!(a["file:size"], len);
}

/// Two STAC items, each a 512² scene far from the other, given as an item
/// collection file.
fn two_items(dir: &Path) -> std::path::PathBuf {
    let north = make_scene(&dir.join("north"), 512, (500_000.0, 5_000_000.0), 1);
    let south = make_scene(&dir.join("south"), 512, (500_000.0, 1_000_000.0), 2);
    let href = |s: &SceneFiles| {
        let s = s.clone();
        move |name: &str| format!("file://{}", s.path(name).display())
    };
    let (hn, hs) = (href(&north), href(&south));
    let inputs = [
        item(
            &north,
            "n1",
            "s2",
            "2024-06-15T10:00:00Z",
            serde_json::json!(5),
            ItemStyle::Visual,
            &hn,
        ),
        item(
            &south,
            "s1",
            "s2",
            "2024-07-01T10:30:00Z",
            serde_json::json!(5),
            ItemStyle::Visual,
            &hs,
        ),
    ];
    let file = dir.join("items.json");
    write_feature_collection(&file, &inputs);
    file
}

#[test]
fn rustac_and_duckdb_read_the_items_parquet_as_the_json_items() {
    let dir = tempfile::tempdir().unwrap();
    let input = two_items(dir.path());
    let output = dir.path().join("out");
    let o = run(run_cmd(&input, &output, &tiny_model()).args(["--task-files", "1"]));
    assert!(o.status.success(), "run failed");
    check_collection_links_it(&output);

    // Each scene is split into blocks: several tasks, an item each.
    let json = json_items(&output);
    assert!(json.len() > 2, "{}", json.len());
    let read = rustac_items(&output, dir.path());
    assert_eq!(
        read.keys().collect::<Vec<_>>(),
        json.keys().collect::<Vec<_>>()
    );
    let mut datetimes = Vec::new();
    for (id, j) in &json {
        let r = &read[id];
        assert_eq!(r["geometry"], j["geometry"], "{id}");
        assert_eq!(r["bbox"], j["bbox"], "{id}");
        assert_eq!(r["collection"], j["collection"], "{id}");
        let (rp, jp) = (&r["properties"], &j["properties"]);
        assert_eq!(z(&rp["datetime"]), z(&jp["datetime"]), "{id}");
        assert_eq!(rp["rsembed:chips"], jp["rsembed:chips"], "{id}");
        assert_eq!(
            r["assets"]["embeddings"]["href"],
            j["assets"]["embeddings"]["href"]
        );
        datetimes.push(z(&jp["datetime"]).unwrap());
    }
    datetimes.sort();
    datetimes.dedup();
    assert_eq!(
        datetimes,
        ["2024-06-15T10:00:00Z", "2024-07-01T10:30:00Z"],
        "each item has its scene's acquisition time"
    );

    // DuckDB reads the geometry as GeoParquet (WKB with `geo` metadata), the
    // times as timestamps, and the bbox covering as a struct.
    let rows = duckdb(&format!(
        "SELECT id, strftime(datetime, '%Y-%m-%dT%H:%M:%SZ'), ST_AsText(geometry), \
         bbox.xmin, bbox.ymax, typeof(datetime), \"rsembed:chips\" \
         FROM read_parquet('{}') ORDER BY id",
        output.join("stac/items.parquet").display()
    ));
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), json.len());
    for (r, (id, j)) in rows.iter().zip(&json) {
        assert_eq!(r[0], id.as_str());
        assert_eq!(z(&r[1]), z(&j["properties"]["datetime"]), "{id}");
        let wkt = r[2].as_str().unwrap();
        let kind = j["geometry"]["type"].as_str().unwrap().to_uppercase();
        assert!(wkt.starts_with(&format!("{kind} ((")), "{wkt} for {id}");
        let first = &j["geometry"]["coordinates"][0][0];
        let lon = first[0].as_f64().unwrap();
        assert!(wkt.contains(&format!("(({lon} ")), "{wkt} has {first}");
        assert_eq!(r[3].as_f64(), j["bbox"][0].as_f64(), "{id}");
        assert_eq!(r[4].as_f64(), j["bbox"][3].as_f64(), "{id}");
        assert_eq!(r[5], "TIMESTAMP WITH TIME ZONE");
        assert_eq!(r[6], j["properties"]["rsembed:chips"]);
    }
}

#[test]
fn an_item_without_a_footprint_is_an_empty_polygon_without_a_bbox() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::create_dir_all(&input).unwrap();
    make_jpeg_geotiff(&input.join("a.tif"), 512);
    image::RgbImage::from_fn(256, 256, |x, y| image::Rgb([x as u8, y as u8, 99]))
        .save(input.join("plain.png"))
        .unwrap();
    let o = run(run_cmd(&input, &output, &tiny_model()).args(["--task-size", "1"]));
    assert!(o.status.success(), "run failed");
    check_collection_links_it(&output);

    let json = json_items(&output);
    let read = rustac_items(&output, dir.path());
    assert_eq!(read.len(), 2);
    let (plain, _) = json
        .iter()
        .find(|(_, j)| j["geometry"].is_null())
        .expect("the PNG's item has no geometry");
    // RFC 7946 lets a reader take an empty geometry for null.
    assert_eq!(
        read[plain]["geometry"],
        serde_json::json!({"type": "Polygon", "coordinates": []})
    );
    assert!(read[plain].get("bbox").is_none_or(Value::is_null));
    let rows = duckdb(&format!(
        "SELECT id, ST_AsText(geometry), bbox IS NULL FROM read_parquet('{}') ORDER BY id",
        output.join("stac/items.parquet").display()
    ));
    let rows = rows.as_array().unwrap();
    let row = rows.iter().find(|r| r[0] == plain.as_str()).unwrap();
    assert_eq!(row[1], "POLYGON EMPTY");
    assert_eq!(row[2], true);
    let other = rows.iter().find(|r| r[0] != plain.as_str()).unwrap();
    assert!(
        other[1].as_str().unwrap().starts_with("POLYGON (("),
        "{other:?}"
    );
    assert_eq!(other[2], false);
}
