//! `rsembed plan | run | submit` from STAC inputs, end to end: a real STAC
//! API (`rustac serve`) and item collections on the S3 test server, over
//! scenes whose COGs are on local disk and on S3. The chips must equal those
//! of the 8-bit original read from a folder, whichever processing baseline
//! and STAC version describes them; what cannot be read is an error record.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use rsembed_integration_tests::cluster::{chip_counts, finalize, wait_finished, Worker};
use rsembed_integration_tests::nats::NatsServer;
use rsembed_integration_tests::s3::S3Server;
use rsembed_integration_tests::stac::collection;
use rsembed_integration_tests::stac::StacServer;
use rsembed_integration_tests::stac_scenes::{item, make_scene, ItemStyle, SceneFiles};
use rsembed_integration_tests::*;
use serde_json::{json, Value};

/// Scenes are 512² pixels: four 256² chips, the SCL cloud covering the first.
const SIZE: u32 = 512;
const LIMIT: Duration = Duration::from_secs(300);

fn file_href(scene: &SceneFiles) -> impl Fn(&str) -> String {
    let scene = scene.clone();
    move |name| format!("file://{}", scene.path(name).display())
}

/// The search every test makes: summer 2024, collection `s2`, around both
/// scenes, at most 50 % cloud cover.
fn search_flags(bbox: [f64; 4]) -> Vec<String> {
    [
        "--collections",
        "s2",
        "--datetime",
        "2024-06-01T00:00:00Z/2024-08-31T23:59:59Z",
        "--cloud-cover-max",
        "50",
        "--bbox",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([bbox.map(|v| v.to_string()).join(",")])
    .collect()
}

fn union(a: [f64; 4], b: [f64; 4]) -> [f64; 4] {
    [
        a[0].min(b[0]) - 0.01,
        a[1].min(b[1]) - 0.01,
        a[2].max(b[2]) + 0.01,
        a[3].max(b[3]) + 0.01,
    ]
}

/// Two scenes, and items of both: the ones the search selects, and ones it
/// must not (another collection, year, place, or too cloudy).
struct Archive {
    s1: SceneFiles,
    s2: SceneFiles,
    items: Vec<Value>,
    bbox: [f64; 4],
}

fn archive(dir: &Path) -> Archive {
    let s1 = make_scene(&dir.join("s1"), SIZE, (500_000.0, 5_000_000.0), 1);
    let s2 = make_scene(&dir.join("s2"), SIZE, (520_000.0, 5_020_000.0), 2);
    let (h1, h2) = (file_href(&s1), file_href(&s2));
    let summer = "2024-06-15T10:00:00Z";
    let mut items = vec![
        // Baseline 04.00 (DN + 1000, offset −0.1), STAC 1.1 `bands`.
        item(&s1, "a", "s2", summer, json!(5), ItemStyle::V11Offset, &h1),
        // The old baseline, STAC 1.0 `eo:bands` + `raster:bands`.
        item(
            &s2,
            "b",
            "s2",
            "2024-07-10T10:00:00Z",
            json!(10.5),
            ItemStyle::V10,
            &h2,
        ),
    ];
    // No green band at all: an error record naming the item and the band.
    let mut c = item(&s1, "c", "s2", summer, json!(1), ItemStyle::V11Offset, &h1);
    c["assets"].as_object_mut().unwrap().remove("B03");
    items.push(c);
    // Blue from the other scene: grids that do not line up.
    let mut d = item(&s1, "d", "s2", summer, json!(1), ItemStyle::V11Offset, &h1);
    d["assets"]["B02"]["href"] = json!(h2("o_B02.tif"));
    items.push(d);
    // Not selected: too cloudy, another year, another collection, elsewhere.
    items.push(item(
        &s2,
        "e",
        "s2",
        summer,
        json!(90),
        ItemStyle::V11Offset,
        &h2,
    ));
    items.push(item(
        &s1,
        "f",
        "s2",
        "2023-06-15T10:00:00Z",
        json!(1),
        ItemStyle::V11Offset,
        &h1,
    ));
    items.push(item(
        &s1,
        "g",
        "l8",
        summer,
        json!(1),
        ItemStyle::V11Offset,
        &h1,
    ));
    let mut far = item(&s1, "h", "s2", summer, json!(1), ItemStyle::V11Offset, &h1);
    far["bbox"] = json!([100.0, 10.0, 100.1, 10.1]);
    far["geometry"] = json!({"type": "Polygon", "coordinates": [[
        [100.0, 10.0], [100.1, 10.0], [100.1, 10.1], [100.0, 10.1], [100.0, 10.0]]]});
    items.push(far);
    let bbox = union(s1.lonlat_bbox(), s2.lonlat_bbox());
    Archive {
        s1,
        s2,
        items,
        bbox,
    }
}

/// `rustac serve` over the items, with collections `s2` and `l8`.
fn serve(dir: &Path, items: &[Value]) -> StacServer {
    let colls = dir.join("collections.json");
    let items_file = dir.join("items.json");
    std::fs::write(&colls, collection("s2").to_string()).unwrap();
    let l8 = dir.join("l8.json");
    std::fs::write(&l8, collection("l8").to_string()).unwrap();
    stac::write_feature_collection(&items_file, items);
    StacServer::start(&[&colls, &l8, &items_file])
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Chip rows by key `(name, x, y)`: `[valid_fraction, footprint, embedding, ...]`.
fn chips(out: &Path, name_sql: &str, extra: &str) -> Vec<Value> {
    duckdb(&format!(
        "SELECT {name_sql} AS name, x, y, valid_fraction, hex(geometry::BLOB), \
         embedding::FLOAT[]{extra} FROM read_parquet('{}/chips/*.parquet', union_by_name=true) \
         ORDER BY name, y, x",
        out.display()
    ))
    .as_array()
    .unwrap()
    .clone()
}

/// Each STAC chip equals the folder run's chip of the same scene and window.
fn assert_equal_chips(stac: &[Value], folder: &[Value], scene_of: &dyn Fn(&str) -> String) {
    assert!(!stac.is_empty());
    for row in stac {
        let scene = scene_of(row[0].as_str().unwrap());
        let twin = folder
            .iter()
            .find(|f| f[0] == json!(scene) && f[1] == row[1] && f[2] == row[2])
            .unwrap_or_else(|| panic!("folder chip for {row:?}"));
        assert_eq!(row[3], twin[3], "valid_fraction of {}", row[0]);
        assert_eq!(row[4], twin[4], "footprint of {}", row[0]);
        let c = cosine(&floats(&row[5]), &floats(&twin[5]));
        assert!(
            c > 0.99999,
            "embedding of {} {} {}: cosine {c}",
            row[0],
            row[1],
            row[2]
        );
    }
}

/// The 8-bit originals of the scenes in a folder, run as files.
fn folder_run(tmp: &Path, scenes: &[(&str, &SceneFiles)]) -> Vec<Value> {
    let folder = tmp.join("folder");
    std::fs::create_dir_all(&folder).unwrap();
    for (name, s) in scenes {
        std::fs::copy(s.path("visual.tif"), folder.join(format!("{name}.tif"))).unwrap();
    }
    let out = tmp.join("folder-out");
    let o = run(&mut run_cmd(&folder, &out, &tiny_model()));
    assert_eq!(o.status.code(), Some(0), "folder run");
    chips(&out, "regexp_extract(source_uri, '([^/]+)\\.tif$', 1)", "")
}

/// `rsembed run --input <input> ... --json`, ready for more flags.
fn stac_cmd(input: &str, out: &Path) -> Command {
    let mut c = run_cmd(Path::new(input), out, &tiny_model());
    c.arg("--json");
    c
}

fn stac_run(input: &str, out: &Path, flags: &[String]) -> Output {
    run_timeout(stac_cmd(input, out).args(flags), LIMIT)
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).expect("--json prints JSON")
}

#[test]
fn api_search_embeds_both_baselines_like_the_original_with_cloud_fractions() {
    let tmp = tempfile::tempdir().unwrap();
    let a = archive(&tmp.path().join("scenes"));
    let server = serve(tmp.path(), &a.items);
    let mut flags = search_flags(a.bbox);
    flags.extend(
        [
            "--scale",
            "0:0.255",
            "--cloud-mask",
            "SCL",
            "--max-cloud",
            "0.5",
            // Item a's four chips (from its proj:shape) go out as one-chip blocks.
            "--task-chips",
            "2",
            "--task-files",
            "1",
        ]
        .map(String::from),
    );

    // The plan reads the items, not the files.
    let mut plan = rsembed();
    plan.args(["plan", "--input", &server.url(), "--json"])
        .args(&flags);
    let p = run_timeout(&mut plan, LIMIT);
    assert!(p.status.success(), "plan:\n{}", server.log());
    let p = json_of(&p);
    assert_eq!(p["inputs"], 4, "a, b, c and d: {p}");
    assert_eq!(p["stac"]["items"], 4, "{p}");
    assert_eq!(p["stac"]["bad"], 0, "{p}");
    assert!(p["stac"]["pages"].as_u64() >= Some(1), "{p}");
    // a and d by proj:shape, into four one-chip blocks each; b has no
    // proj:shape and is small, c cannot be read.
    assert_eq!(p["sharded_scenes"], 2, "{p}");
    assert_eq!(p["tasks"], 10, "{p}");

    let out = tmp.path().join("out");
    let o = stac_run(&server.url(), &out, &flags);
    assert_eq!(o.status.code(), Some(3), "c and d fail:\n{}", server.log());
    let s = json_of(&o);
    assert_eq!(s["tasks"], 10, "{s}");
    assert_eq!(s["failed_inputs"], 5, "c, and each of d's four blocks: {s}");
    assert_eq!(
        s["cloudy_chips_dropped"], 2,
        "the SCL cloud's chip of a and of b: {s}"
    );

    let errors = duckdb(&format!(
        "SELECT source_uri, error FROM '{}/errors/*.parquet' ORDER BY 1",
        out.display()
    ));
    let errors = errors.as_array().unwrap();
    let of = |id: &str| -> Vec<&Value> {
        errors
            .iter()
            .filter(|e| e[0].as_str().unwrap().ends_with(&format!("/items/{id}")))
            .collect()
    };
    let c = of("c");
    assert_eq!(c.len(), 1, "{errors:?}");
    let msg = c[0][1].as_str().unwrap();
    assert!(
        msg.contains("STAC item c") && msg.contains("green"),
        "{msg}"
    );
    let d = of("d");
    assert_eq!(d.len(), 4, "{errors:?}");
    for e in &d {
        let msg = e[1].as_str().unwrap();
        assert!(
            msg.contains("o_B02.tif"),
            "the file off the grid is named: {msg}"
        );
    }
    assert_eq!(c.len() + d.len(), errors.len(), "{errors:?}");

    // Chips and their STAC columns.
    let rows = duckdb(&format!(
        "SELECT item_id, collection, epoch_us(datetime), end_datetime IS NULL, cloud_fraction, \
         source_uri, x, y FROM '{}/chips/*.parquet' ORDER BY item_id, y, x",
        out.display()
    ));
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 6, "three chips of a and of b: {rows:?}");
    for r in rows {
        let id = r[0].as_str().unwrap();
        assert!(id == "a" || id == "b", "{r}");
        assert_eq!(r[1], "s2");
        let t = if id == "a" {
            1_718_445_600_000_000i64
        } else {
            1_720_605_600_000_000
        };
        assert_eq!(r[2], t, "{r}");
        assert_eq!(r[3], true);
        assert_eq!(r[4].as_f64(), Some(0.0), "{r}");
        assert!(
            r[5].as_str()
                .unwrap()
                .ends_with(&format!("/collections/s2/items/{id}")),
            "source_uri is the API's item URL: {r}"
        );
        assert!(!(r[6] == 0 && r[7] == 0), "the cloudy chip is dropped: {r}");
    }

    let stac = chips(&out, "item_id", "");
    let folder = folder_run(tmp.path(), &[("s1", &a.s1), ("s2", &a.s2)]);
    assert_equal_chips(&stac, &folder, &|id| {
        if id == "a" { "s1" } else { "s2" }.to_owned()
    });
    assert!(out.join("stac/collection.json").is_file());

    // The same command again is the same job: nothing runs twice.
    let again = stac_run(&server.url(), &out, &flags);
    assert_eq!(again.status.code(), Some(3));
    assert_eq!(chip_counts(&out), (6, 6, 2));
    // Another search is another job.
    let mut other = flags.clone();
    let i = other.iter().position(|f| f == "--datetime").unwrap();
    other[i + 1] = "2024-07-01T00:00:00Z/2024-08-31T23:59:59Z".into();
    let refused = stac_run(&server.url(), &out, &other);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("another job") && err.contains("--datetime"),
        "{err}"
    );
    assert_eq!(chip_counts(&out), (6, 6, 2));
}

#[test]
fn an_item_collection_on_s3_with_cogs_on_s3() {
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    s3.create_bucket("archive");
    let scene = make_scene(&tmp.path().join("s1"), SIZE, (500_000.0, 5_000_000.0), 3);
    for f in [
        "visual.tif",
        "o_B04.tif",
        "o_B03.tif",
        "o_B02.tif",
        "SCL.tif",
    ] {
        s3.upload(&scene.path(f), &format!("s3://archive/scenes/s1/{f}"));
    }
    let abs = |f: &str| format!("s3://archive/scenes/s1/{f}");
    // Relative hrefs resolve against the item collection's own URL.
    let rel = |f: &str| format!("../scenes/s1/{f}");
    let t = "2024-06-15T10:00:00Z";
    let mut items = vec![
        item(&scene, "v-abs", "s2", t, json!(2), ItemStyle::Visual, &abs),
        item(&scene, "v-rel", "s2", t, json!(2), ItemStyle::Visual, &rel),
    ];
    // A range instead of an instant: the start is `datetime`, the end kept.
    items[1]["properties"]["datetime"] = Value::Null;
    items[1]["properties"]["start_datetime"] = json!("2024-06-15T10:00:00Z");
    items[1]["properties"]["end_datetime"] = json!("2024-06-15T10:00:05Z");
    let ndjson = tmp.path().join("items.ndjson");
    stac::write_ndjson(&ndjson, &items);
    s3.upload(&ndjson, "s3://archive/catalog/items.ndjson");

    let out = tmp.path().join("out");
    let mut c = stac_cmd("s3://archive/catalog/items.ndjson", &out);
    s3.configure(&mut c);
    let o = run_timeout(&mut c, LIMIT);
    assert_eq!(o.status.code(), Some(0), "{}", s3.log());
    // Both items gave chips: an item of an item collection
    // (`items.ndjson#<id>`) is not an input "without chips".
    let summary = String::from_utf8_lossy(&o.stdout);
    assert!(!summary.contains("without chips"), "{summary}");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["inputs_without_chips"], 0, "{manifest}");

    let rows = duckdb(&format!(
        "SELECT item_id, epoch_us(datetime), epoch_us(end_datetime), cloud_fraction IS NULL \
         FROM '{}/chips/*.parquet' ORDER BY 1, 2",
        out.display()
    ));
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 8, "four chips of each item: {rows:?}");
    for r in rows {
        assert_eq!(r[1], 1_718_445_600_000_000i64, "{r}");
        let end = if r[0] == "v-rel" {
            json!(1_718_445_605_000_000i64)
        } else {
            Value::Null
        };
        assert_eq!(r[2], end, "{r}");
        assert_eq!(r[3], true, "no --cloud-mask, no cloud fraction");
    }
    let stac = chips(&out, "item_id", "");
    let folder = folder_run(tmp.path(), &[("s1", &scene)]);
    assert_equal_chips(&stac, &folder, &|_| "s1".to_owned());

    // The same COGs behind a STAC API: the baseline-04.00 bands on S3, in
    // reflectance, with the SCL on S3 too.
    let api_item = item(
        &scene,
        "o-s3",
        "s2",
        t,
        json!(2),
        ItemStyle::V11Offset,
        &abs,
    );
    let server = serve(tmp.path(), &[api_item]);
    let out = tmp.path().join("out-api");
    let mut c = stac_cmd(&server.url(), &out);
    c.args(["--scale", "0:0.255", "--cloud-mask", "SCL"]);
    s3.configure(&mut c);
    let o = run_timeout(&mut c, LIMIT);
    assert_eq!(o.status.code(), Some(0), "{}", server.log());
    let stac = chips(&out, "item_id", "");
    assert_eq!(stac.len(), 4);
    assert_equal_chips(&stac, &folder, &|_| "s1".to_owned());
}

/// `rsembed submit --input <STAC API> ... --json`.
fn submit(nats: &str, input: &str, output: &Path, flags: &[String]) -> Output {
    let mut c = rsembed();
    c.args(["submit", "--nats", nats, "--input", input, "--output"])
        .arg(output)
        .arg("--model")
        .arg(tiny_model())
        .arg("--json")
        .args(flags);
    run_timeout(&mut c, LIMIT)
}

#[test]
fn submit_from_a_stac_api_with_workers_then_finalize() {
    let tmp = tempfile::tempdir().unwrap();
    let a = archive(&tmp.path().join("scenes"));
    // The readable items only: a and b.
    let server = serve(tmp.path(), &a.items[..2]);
    let nats = NatsServer::start();
    let url = nats.url();
    let out: PathBuf = tmp.path().join("out");
    let mut flags = search_flags(a.bbox);
    flags.extend(
        [
            "--scale",
            "0:0.255",
            "--cloud-mask",
            "SCL",
            "--task-files",
            "1",
            // Each scene's four chips in one task.
            "--task-chips",
            "4",
        ]
        .map(String::from),
    );
    let o = submit(&url, &server.url(), &out, &flags);
    assert!(o.status.success(), "{}", server.log());
    let s = json_of(&o);
    assert_eq!(s["tasks"], 2, "{s}");

    let workers: Vec<Worker> = (0..2)
        .map(|i| Worker::start(&url, &format!("w{i}"), &[], &[]))
        .collect();
    let st = wait_finished(&url, &out, LIMIT);
    assert_eq!(
        (st["done"].as_u64(), st["failed"].as_u64()),
        (Some(2), Some(0)),
        "{st}"
    );
    drop(workers);
    let (code, report) = finalize(&url, &out);
    assert_eq!(code, Some(0), "finalize: {report}");
    assert_eq!(chip_counts(&out), (8, 8, 2));
    let clouds = duckdb(&format!(
        "SELECT item_id, x, y, cloud_fraction FROM '{}/chips/*.parquet' \
         WHERE cloud_fraction > 0 ORDER BY 1",
        out.display()
    ));
    assert_eq!(
        clouds,
        json!([["a", 0, 0, 1.0], ["b", 0, 0, 1.0]]),
        "the SCL cloud covers the first chip of each scene"
    );
    let coll: Value =
        serde_json::from_slice(&std::fs::read(out.join("stac/collection.json")).unwrap()).unwrap();
    assert_eq!(coll["type"], "Collection");

    // Resubmitting another search to the same output is refused.
    let mut other = flags.clone();
    let i = other.iter().position(|f| f == "--bbox").unwrap();
    other[i + 1] = "0,0,1,1".into();
    let refused = submit(&url, &server.url(), &out, &other);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--bbox"));
}
