//! What a STAC `--input` can be besides an API root, a catalog and an item
//! collection file, and what `plan` and `run` say about it (issue 28): an
//! API's collection URL and item URL (`rustac serve`), JSON that is not STAC,
//! a search that matches nothing, date-only `--datetime`, `plan`'s chip and
//! byte estimate, and items whose asset is a PNG or JPEG.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use rsembed_integration_tests::rasters::make_jpeg_geotiff;
use rsembed_integration_tests::stac::{collection, Reply, ScriptServer, StacServer};
use rsembed_integration_tests::stac_scenes::{item, make_scene, ItemStyle, SceneFiles};
use rsembed_integration_tests::*;
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(300);

fn file_href(scene: &SceneFiles) -> impl Fn(&str) -> String {
    let scene = scene.clone();
    move |name| format!("file://{}", scene.path(name).display())
}

/// `rustac serve` over `items`, with collections `naip` and `other`.
fn serve(dir: &Path, items: &[Value]) -> StacServer {
    let naip = dir.join("naip.json");
    let other = dir.join("other.json");
    let items_file = dir.join("items.json");
    std::fs::write(&naip, collection("naip").to_string()).unwrap();
    std::fs::write(&other, collection("other").to_string()).unwrap();
    stac::write_feature_collection(&items_file, items);
    StacServer::start(&[&naip, &other, &items_file])
}

fn run_stac(input: &str, out: &Path, flags: &[&str]) -> Output {
    let mut c = run_cmd(Path::new(input), out, &tiny_model());
    c.arg("--json").args(flags);
    run_timeout(&mut c, LIMIT)
}

fn plan(input: &str, flags: &[&str]) -> Output {
    let mut c = rsembed();
    c.args(["plan", "--json", "--input", input]).args(flags);
    run_timeout(&mut c, LIMIT)
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).expect("--json prints JSON")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Chips per item: `[item_id, collection, chips]`, by item.
fn chips_per_item(out: &Path) -> Value {
    duckdb(&format!(
        "SELECT item_id, collection, count(*) FROM '{}/chips/*.parquet' GROUP BY 1, 2 ORDER BY 1",
        out.display()
    ))
}

/// Two 512² scenes (four chips each): n1 and n2 in `naip`, o1 in `other`.
fn naip_archive(dir: &Path) -> (StacServer, Vec<Value>) {
    let s1 = make_scene(&dir.join("s1"), 512, (500_000.0, 5_000_000.0), 1);
    let s2 = make_scene(&dir.join("s2"), 512, (520_000.0, 5_020_000.0), 2);
    let (h1, h2) = (file_href(&s1), file_href(&s2));
    let items = vec![
        item(
            &s1,
            "n1",
            "naip",
            "2024-02-10T10:00:00Z",
            json!(1),
            ItemStyle::Visual,
            &h1,
        ),
        item(
            &s2,
            "n2",
            "naip",
            "2024-05-10T10:00:00Z",
            json!(1),
            ItemStyle::Visual,
            &h2,
        ),
        item(
            &s1,
            "o1",
            "other",
            "2024-02-10T10:00:00Z",
            json!(1),
            ItemStyle::Visual,
            &h1,
        ),
    ];
    (serve(dir, &items), items)
}

#[test]
fn collection_and_item_urls_embed_their_items() {
    let tmp = tempfile::tempdir().unwrap();
    let (server, _) = naip_archive(tmp.path());
    let naip = format!("{}collections/naip", server.url());

    // A collection URL: that collection's items, through its `items` link.
    let out = tmp.path().join("collection");
    let o = run_stac(&naip, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", server.log());
    assert_eq!(
        chips_per_item(&out),
        json!([["n1", "naip", 4], ["n2", "naip", 4]])
    );
    let geo = duckdb(&format!(
        "SELECT count(*) FROM '{}/chips/*.parquet' WHERE geometry IS NULL",
        out.display()
    ));
    assert_eq!(geo, json!([[0]]), "scene chips have footprints");

    // The same filters as a search: a date-only --datetime (sent to the
    // items endpoint), and --ids (applied here: rustac's items endpoint
    // does not take it).
    let out = tmp.path().join("winter");
    let o = run_stac(&naip, &out, &["--datetime", "2024-01-01/2024-03-31"]);
    assert_eq!(o.status.code(), Some(0), "{}", server.log());
    assert_eq!(chips_per_item(&out), json!([["n1", "naip", 4]]));
    let spec: Value =
        serde_json::from_slice(&std::fs::read(out.join("job.json")).unwrap()).unwrap();
    assert_eq!(
        spec["search"]["datetime"], "2024-01-01T00:00:00Z/2024-03-31T23:59:59.999999Z",
        "a date-only end is the end of that day: {spec}"
    );
    let out = tmp.path().join("ids");
    let o = run_stac(&naip, &out, &["--ids", "n2"]);
    assert_eq!(o.status.code(), Some(0), "{}", server.log());
    assert_eq!(chips_per_item(&out), json!([["n2", "naip", 4]]));

    // An item URL: that item.
    let out = tmp.path().join("item");
    let o = run_stac(&format!("{naip}/items/n2"), &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", server.log());
    assert_eq!(chips_per_item(&out), json!([["n2", "naip", 4]]));
    let uris = duckdb(&format!(
        "SELECT DISTINCT source_uri FROM '{}/chips/*.parquet'",
        out.display()
    ));
    assert_eq!(uris, json!([[format!("{naip}/items/n2")]]));
}

#[test]
fn json_that_is_not_stac_is_refused_before_anything_is_written() {
    let server = ScriptServer::start(|r| match r.target.as_str() {
        "/thing" => Reply::Json(200, json!({"hello": "world", "answer": 42})),
        "/feature" => Reply::Json(
            200,
            json!({"type": "Feature", "geometry": null, "properties": {}}),
        ),
        "/topology" => Reply::Json(200, json!({"type": "Topology", "objects": {}})),
        "/list" => Reply::Json(200, json!([1, 2, 3])),
        _ => Reply::Json(404, json!({"code": "NotFound"})),
    });
    let tmp = tempfile::tempdir().unwrap();
    for (path, says) in [
        ("/thing", "keys: hello, answer"),
        ("/feature", "without `stac_version`"),
        ("/topology", "`Topology`"),
        ("/list", "an array"),
    ] {
        let input = format!("{}{path}", server.base());
        let out = tmp.path().join(path.trim_start_matches('/'));
        let o = run_stac(&input, &out, &[]);
        assert_eq!(o.status.code(), Some(1), "{path}");
        let e = stderr(&o);
        assert!(e.contains("not STAC") && e.contains(says), "{path}: {e}");
        assert!(!out.exists(), "{path}: nothing is written");
        let p = plan(&input, &[]);
        assert_eq!(p.status.code(), Some(1), "{path}");
        assert!(stderr(&p).contains(says), "{path}");
    }
}

#[test]
fn a_search_that_matches_nothing_fails_naming_the_search() {
    let tmp = tempfile::tempdir().unwrap();
    let (server, items) = naip_archive(tmp.path());
    let check = |input: &str, flags: &[&str], says: &[&str]| {
        let out = tmp.path().join("out");
        let o = run_stac(input, &out, flags);
        assert_eq!(o.status.code(), Some(1), "{input} {flags:?}");
        let e = stderr(&o);
        assert!(e.contains("the search matched no items"), "{e}");
        assert!(!e.contains("skipped as not images"), "{e}");
        for s in says {
            assert!(e.contains(s), "{s}: {e}");
        }
        assert!(!out.exists(), "nothing is written");
        let p = plan(input, flags);
        assert_eq!(
            p.status.code(),
            Some(1),
            "plan fails like run: {input} {flags:?}"
        );
        assert!(stderr(&p).contains("the search matched no items"));
    };
    // The API search as sent: POST /search with its body.
    check(
        &server.url(),
        &["--collections", "nosuch"],
        &["POST", "/search", r#""collections":["nosuch"]"#],
    );
    // A collection URL: the items request as sent, and what the filters
    // applied here left out.
    check(
        &format!("{}collections/naip", server.url()),
        &["--ids", "nosuch"],
        &[
            "GET",
            "/collections/naip/items?limit=250",
            "2 left out",
            "--ids nosuch",
        ],
    );
    // An empty item collection, and one whose items the filters all leave out.
    let empty = tmp.path().join("empty.json");
    stac::write_feature_collection(&empty, &[]);
    check(
        empty.to_str().unwrap(),
        &[],
        &["empty.json", "gave no item"],
    );
    let full = tmp.path().join("three.json");
    stac::write_feature_collection(&full, &items);
    check(
        full.to_str().unwrap(),
        &["--collections", "nosuch"],
        &["three.json", "3 left out", "--collections nosuch"],
    );
}

/// `chips_estimate` and `bytes` of `plan`, and the chips `run` makes; the
/// estimate must be within 5 % (here: no chip is dropped, so it is exact).
fn estimate_and_run(input: &str, out: &Path, flags: &[&str]) -> (Value, u64) {
    let p = plan(input, flags);
    assert!(p.status.success());
    let p = json_of(&p);
    let o = run_stac(input, out, flags);
    assert_eq!(o.status.code(), Some(0));
    let made = json_of(&o)["chips"].as_u64().unwrap();
    let est = p["chips_estimate"].as_u64().unwrap();
    assert!(
        est.abs_diff(made) * 20 <= made,
        "plan estimates {est} chips, run makes {made}: {p}"
    );
    (p, made)
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

#[test]
fn plan_estimates_chips_and_bytes_from_item_shapes_and_headers() {
    let tmp = tempfile::tempdir().unwrap();
    // 520² is a 3x3 grid of 256² chips; 512² a 2x2 one.
    let s1 = make_scene(&tmp.path().join("s1"), 520, (500_000.0, 5_000_000.0), 1);
    let s2 = make_scene(&tmp.path().join("s2"), 512, (520_000.0, 5_020_000.0), 2);
    let t = "2024-02-10T10:00:00Z";
    let items = vec![
        // proj:shape and file:size: measured without a read.
        item(
            &s1,
            "a",
            "naip",
            t,
            json!(1),
            ItemStyle::Visual,
            &file_href(&s1),
        ),
        // Neither: a HEAD per band file, and their headers.
        item(
            &s2,
            "b",
            "naip",
            t,
            json!(1),
            ItemStyle::V10,
            &file_href(&s2),
        ),
    ];
    let server = serve(tmp.path(), &items);
    let (p, made) = estimate_and_run(
        &server.url(),
        &tmp.path().join("out"),
        &["--collections", "naip"],
    );
    assert_eq!(made, 13);
    assert_eq!(p["chips_estimate"], 13, "{p}");
    assert_eq!(p["unmeasured_inputs"], 0, "{p}");
    let bytes = size(&s1.path("visual.tif"))
        + ["B04.tif", "B03.tif", "B02.tif"]
            .iter()
            .map(|f| size(&s2.path(f)))
            .sum::<u64>();
    assert_eq!(p["bytes"], bytes, "file:size, else a HEAD: {p}");
    // The counts agree: one input per selected item.
    assert_eq!(p["inputs"], 2, "{p}");
    assert_eq!(p["stac"]["selected"], p["inputs"], "{p}");

    // A local 1024² COG, below --shard-bytes: its header, not "about one".
    let cog = tmp.path().join("cog").join("aerial.tif");
    std::fs::create_dir_all(cog.parent().unwrap()).unwrap();
    make_jpeg_geotiff(&cog, 1024);
    let (p, made) = estimate_and_run(cog.to_str().unwrap(), &tmp.path().join("cog-out"), &[]);
    assert_eq!(made, 16);
    assert_eq!(p["chips_estimate"], 16, "{p}");
    assert_eq!(
        p["tasks"], 1,
        "the header is read, the scene not split: {p}"
    );
    assert_eq!(p["bytes"], size(&cog), "{p}");
}

/// The committed images, and a folder run of them.
fn folder_chips(tmp: &Path, files: &[(&str, PathBuf)]) -> Value {
    let folder = tmp.join("folder");
    std::fs::create_dir_all(&folder).unwrap();
    for (name, src) in files {
        std::fs::copy(src, folder.join(name)).unwrap();
    }
    let out = tmp.join("folder-out");
    let o = run(&mut run_cmd(&folder, &out, &tiny_model()));
    assert_eq!(o.status.code(), Some(0));
    duckdb(&format!(
        "SELECT regexp_extract(source_uri, '([^/]+)$', 1), width, height, embedding::FLOAT[] \
         FROM '{}/chips/*.parquet' ORDER BY 1",
        out.display()
    ))
}

#[test]
fn png_and_jpeg_assets_embed_like_the_same_files_in_a_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let png = fixture_images().join("aerial_256.png");
    let jpg = fixture_images().join("odd_511x383.jpg");
    // An href without an extension: told by its media type and its bytes.
    let bare = tmp.path().join("photo");
    std::fs::copy(&jpg, &bare).unwrap();
    let image_item = |id: &str, href: &Path, media: &str| {
        json!({"type": "Feature", "stac_version": "1.1.0", "id": id, "collection": "photos",
            "geometry": {"type": "Polygon", "coordinates": [[[10.0, 50.0], [10.01, 50.0],
                [10.01, 50.01], [10.0, 50.01], [10.0, 50.0]]]},
            "bbox": [10.0, 50.0, 10.01, 50.01],
            "properties": {"datetime": "2024-04-02T09:30:00Z"}, "links": [],
            "assets": {"visual": {"href": format!("file://{}", href.display()), "type": media,
                "roles": ["visual"], "proj:shape": [1000, 1000]}}})
    };
    let items = tmp.path().join("photos.json");
    stac::write_feature_collection(
        &items,
        &[
            image_item("p-png", &png, "image/png"),
            image_item("p-jpg", &bare, "image/jpeg"),
        ],
    );
    let out = tmp.path().join("out");
    // Two-chip tasks: a proj:shape must not split an image into blocks.
    let o = run_stac(items.to_str().unwrap(), &out, &["--task-chips", "2"]);
    assert_eq!(o.status.code(), Some(0));
    let stac = duckdb(&format!(
        "SELECT item_id, collection, epoch_us(datetime), x, y, width, height, \
         geometry IS NULL, crs IS NULL, embedding::FLOAT[] FROM '{}/chips/*.parquet' ORDER BY 1",
        out.display()
    ));
    let folder = folder_chips(
        tmp.path(),
        &[
            ("aerial_256.png", png.clone()),
            ("odd_511x383.jpg", jpg.clone()),
        ],
    );
    let stac = stac.as_array().unwrap();
    assert_eq!(stac.len(), 2, "one chip per image: {stac:?}");
    // By item id p-jpg, p-png; by file name aerial_256.png, odd_511x383.jpg.
    for (row, twin) in [(&stac[0], &folder[1]), (&stac[1], &folder[0])] {
        assert_eq!(row[1], "photos");
        assert_eq!(row[2], 1_712_050_200_000_000i64, "{row}");
        assert_eq!((&row[3], &row[4]), (&json!(0), &json!(0)));
        assert_eq!(
            (&row[5], &row[6]),
            (&twin[1], &twin[2]),
            "whole image: {row}"
        );
        assert_eq!(row[7], true, "an image asset has no footprint of its own");
        assert_eq!(row[8], true);
        let f = |v: &Value| -> Vec<f64> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        };
        let c = cosine(&f(&row[9]), &f(&twin[3]));
        assert!(c > 0.99999, "{} vs {}: cosine {c}", row[0], twin[0]);
    }
}
