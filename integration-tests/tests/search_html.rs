//! `rsembed search --html`: a page of the hits of a real dataset, opened in
//! a real headless browser (Debian's `chromium`, installed by
//! scripts/setup-test-env.sh).
//!
//! The dataset mixes what a thumbnail must read like the pipeline did: an
//! 8-bit GeoTIFF with edge chips padded, a 16-bit one under `--scale auto`
//! with nodata, a tar archive's PNG members (one smaller than the model's
//! input, so resized; one named to inject markup), and a whole image deleted
//! after the run (a placeholder, not a failed search). Pictures are compared
//! with GDAL's cut of the same window and Pillow's resize of the same image,
//! and embedded again to give their chips' embeddings. STAC items (read again
//! from their items file, with their units) and `--band-files` scenes have
//! tests of their own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use rsembed_integration_tests::rasters::{gdal_translate, make_geotiff16, Scene16};
use rsembed_integration_tests::*;

/// The member whose name tries to run a script in the page.
const HOSTILE: &str =
    "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">.png";

/// An 8-bit RGB GeoTIFF of 600×300, LZW: three chip columns and two rows of
/// 256, the last of each padded; beside `make_geotiff16`'s scene (EPSG:32633),
/// so the overview shows both.
fn make_scene8(dst: &Path) {
    let src = fixture_images().join("aerial_256.png");
    gdal_translate(
        &[
            "-of",
            "GTiff",
            "-co",
            "TILED=YES",
            "-co",
            "COMPRESS=LZW",
            "-outsize",
            "600",
            "300",
            "-r",
            "cubic",
            "-a_srs",
            "EPSG:32633",
            "-a_ullr",
            "403500",
            "5000000",
            "409500",
            "4997000",
        ],
        &src,
        dst,
    );
}

fn make_tar(dst: &Path, members: &[(&str, PathBuf)]) {
    let script = "import sys, tarfile\n\
                  with tarfile.open(sys.argv[1], 'w') as t:\n\
                  \x20   for i in range(2, len(sys.argv), 2):\n\
                  \x20       t.add(sys.argv[i + 1], arcname=sys.argv[i])\n";
    let mut c = Command::new(python());
    c.args(["-c", script]).arg(dst);
    for (name, path) in members {
        c.arg(name).arg(path);
    }
    assert!(
        c.status().unwrap().success(),
        "python wrote {}",
        dst.display()
    );
}

/// An RGB8 image decoded from a PNG `data:` URI.
fn decode_data_uri(uri: &str) -> image::RgbImage {
    let b64 = uri
        .strip_prefix("data:image/png;base64,")
        .expect("a PNG data URI");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    image::load_from_memory_with_format(&bytes, image::ImageFormat::Png)
        .unwrap()
        .to_rgb8()
}

/// One hit's card of the page: its HTML.
fn cards(page: &str) -> Vec<&str> {
    page.split("<figure class=\"hit\"").skip(1).collect()
}

fn card_img(card: &str) -> Option<&str> {
    let at = card.find("<img src=\"")? + "<img src=\"".len();
    card[at..].split('"').next()
}

fn chromium() -> PathBuf {
    let p = PathBuf::from("/usr/bin/chromium");
    assert!(
        p.is_file(),
        "chromium is missing: scripts/setup-test-env.sh installs it (apt-get install chromium)"
    );
    p
}

/// Headless Chromium with flags for a machine without network, and a fresh profile.
fn browser(profile: &Path) -> Command {
    let mut c = Command::new(chromium());
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--virtual-time-budget=10000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

/// The page with a checker that writes what the browser made of it into the
/// DOM (the page itself has no script, and its policy allows none: the copy
/// allows inline script for the checker alone).
fn with_checker(page: &str) -> String {
    let checker = r#"<script>
window.addEventListener('load', () => {
  const imgs = [...document.querySelectorAll('img')];
  const svg = document.querySelector('svg.overview').getBoundingClientRect();
  const v = {
    imgs: imgs.length,
    decoded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
    sizes: imgs.map(i => [i.naturalWidth, i.naturalHeight]),
    title: document.title,
    scripts: document.querySelectorAll('script').length,
    onerror: document.querySelectorAll('[onerror]').length,
    figures: document.querySelectorAll('figure.hit').length,
    missing: document.querySelectorAll('.missing').length,
    polygons: document.querySelectorAll('svg.overview polygon').length,
    svg: [svg.width, svg.height],
  };
  const pre = document.createElement('pre');
  pre.id = 'verdict';
  pre.textContent = 'VERDICT' + JSON.stringify(v) + 'END';
  document.body.appendChild(pre);
});
</script>"#;
    let csp = "default-src 'none'; img-src data:; style-src 'unsafe-inline'";
    assert!(page.contains(csp), "the page has its policy");
    page.replacen(
        csp,
        "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'",
        1,
    )
    .replacen("</body>", &format!("{checker}</body>"), 1)
}

#[test]
fn search_html_page_shows_every_hit_as_the_model_saw_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    make_scene8(&data.join("scene8.tif"));
    make_geotiff16(
        &data.join("scene16.tif"),
        Scene16 {
            width: 300,
            height: 300,
            tile: 128,
            nodata: Some(((280, 280), (40, 30))),
        },
    );
    let imgs = fixture_images();
    make_tar(
        &data.join("chips.tar"),
        &[
            ("sub/wide.png", imgs.join("wide_300x200.png")),
            (HOSTILE, imgs.join("gray_128.png")),
        ],
    );
    std::fs::copy(imgs.join("rgba_200x300.png"), data.join("gone.png")).unwrap();
    let out = tmp.path().join("index");
    let o = run(&mut run_cmd(&data, &out, &tiny_model()));
    assert_eq!(o.status.code(), Some(0), "run succeeds");
    std::fs::remove_file(data.join("gone.png")).unwrap();

    let page_path = tmp.path().join("page.html");
    let mut c = rsembed();
    c.arg("search")
        .arg("--model")
        .arg(tiny_model())
        .arg("--index")
        .arg(&out)
        .args(["--top-k", "50", "--html"])
        .arg(&page_path)
        .arg("an aerial photograph of a harbour");
    let o = run_timeout(&mut c, Duration::from_secs(120));
    assert!(o.status.success(), "search --html succeeds");
    let stdout = String::from_utf8(o.stdout).unwrap();
    let stderr = String::from_utf8(o.stderr).unwrap();
    // 6 + 4 scene chips, 2 members, 1 image: all of them, table as usual.
    let hits = 13;
    assert_eq!(stdout.lines().count(), 1 + hits, "the table is printed");
    let closing = stderr.lines().last().unwrap();
    assert!(
        closing.starts_with("rsembed search: scored 13 of 13 rows; read "),
        "the closing line stays last: {closing}"
    );
    assert!(
        stderr.contains("(13 hits, 1 without a picture)"),
        "{stderr}"
    );

    let page = std::fs::read_to_string(&page_path).unwrap();
    let cards = cards(&page);
    assert_eq!(cards.len(), hits);
    // Self-contained: every source of the page is a data URI, nothing else loads.
    for (i, _) in page.match_indices(" src=\"") {
        assert!(page[i..].starts_with(" src=\"data:image/png;base64,"));
    }
    assert!(!page.contains("<script") && !page.contains("<link") && !page.contains("@import"));
    assert!(
        page.contains("&lt;script&gt;document.title="),
        "the hostile name is shown as text"
    );

    // The unreadable source is a placeholder saying why.
    let gone: Vec<&&str> = cards.iter().filter(|c| c.contains("gone.png")).collect();
    assert_eq!(gone.len(), 1);
    assert!(gone[0].contains("class=\"missing\"") && card_img(gone[0]).is_none());
    assert!(
        gone[0].to_lowercase().contains("not found") || gone[0].contains("No such file"),
        "{}",
        gone[0]
    );

    // An edge chip, padded right and below, is GDAL's cut of the same window
    // (zero outside the raster, as the pipeline pads an 8-bit scene without nodata).
    let edge = cards
        .iter()
        .find(|c| c.contains("scene8.tif") && c.contains("<td>512,256 256×256 px</td>"))
        .expect("the bottom-right chip of scene8.tif");
    let got = decode_data_uri(card_img(edge).unwrap());
    let reference = tmp.path().join("ref.png");
    gdal_translate(
        &["-of", "PNG", "-srcwin", "512", "256", "256", "256"],
        &data.join("scene8.tif"),
        &reference,
    );
    let want = image::open(&reference).unwrap().to_rgb8();
    assert_eq!(got.dimensions(), (256, 256));
    assert!(
        got.as_raw() == want.as_raw(),
        "the chip is GDAL's window, pixel for pixel"
    );
    assert_eq!(got.get_pixel(100, 100), &image::Rgb([0, 0, 0]), "padding");

    // A whole image smaller than the model's input: resized as Pillow resizes
    // it (bicubic, the tiny model's preprocessor_config.json), to 256².
    let wide = cards
        .iter()
        .find(|c| c.contains("chips.tar#sub/wide.png"))
        .expect("the wide member");
    let got = decode_data_uri(card_img(wide).unwrap());
    let pil = tmp.path().join("pil.rgb");
    let st = Command::new(python())
        .args([
            "-c",
            "import sys; from PIL import Image; \
             im = Image.open(sys.argv[1]).convert('RGB').resize((256, 256), Image.BICUBIC); \
             open(sys.argv[2], 'wb').write(im.tobytes())",
        ])
        .arg(imgs.join("wide_300x200.png"))
        .arg(&pil)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(got.dimensions(), (256, 256));
    assert!(
        got.as_raw() == &std::fs::read(&pil).unwrap(),
        "Pillow's resize, byte for byte"
    );

    // Every picture is the model's input: embedded again as a whole image
    // (at the model's size, so preprocessing only normalizes), it gives its
    // chip's embedding, the 16-bit `--scale auto` chips and the resized
    // members included.
    let again = tmp.path().join("again");
    std::fs::create_dir_all(&again).unwrap();
    let mut pictured = 0;
    for card in &cards {
        let Some(img) = card_img(card) else { continue };
        let id = card
            .split("<th>chip_id</th><td>")
            .nth(1)
            .and_then(|s| s.split('<').next())
            .unwrap();
        decode_data_uri(img)
            .save(again.join(format!("{id}.png")))
            .unwrap();
        pictured += 1;
    }
    assert_eq!(pictured, hits - 1);
    let again_out = tmp.path().join("again-index");
    let o = run(&mut run_cmd(&again, &again_out, &tiny_model()));
    assert_eq!(o.status.code(), Some(0), "the pictures embed");
    let rows = duckdb(&format!(
        "SELECT o.chip_id, list_cosine_similarity(o.embedding, t.embedding) \
         FROM '{}/chips/*.parquet' o JOIN '{}/chips/*.parquet' t \
         ON t.source_uri LIKE '%/' || o.chip_id || '.png'",
        out.display(),
        again_out.display()
    ));
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), hits - 1, "{rows:?}");
    for r in rows {
        assert!(
            r[1].as_f64().unwrap() > 0.99999,
            "the picture of {r} is not the model's input"
        );
    }
    // ... which says something: another chip's picture is far from it.
    let others = duckdb(&format!(
        "SELECT max(list_cosine_similarity(o.embedding, t.embedding)) \
         FROM '{}/chips/*.parquet' o JOIN '{}/chips/*.parquet' t \
         ON t.source_uri NOT LIKE '%/' || o.chip_id || '.png'",
        out.display(),
        again_out.display()
    ));
    let max_other = others[0][0].as_f64().unwrap();
    assert!(
        max_other < 0.999,
        "other chips' pictures: cosine up to {max_other}"
    );

    // The browser: every picture decodes, no injected markup ran, the
    // overview has a footprint per georeferenced chip.
    let profile = tempfile::tempdir().unwrap();
    let check = tmp.path().join("check.html");
    std::fs::write(&check, with_checker(&page)).unwrap();
    let o = run_timeout(
        browser(profile.path())
            .arg("--dump-dom")
            .arg(format!("file://{}", check.display())),
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "chromium --dump-dom");
    let dom = String::from_utf8_lossy(&o.stdout);
    let verdict = dom
        .split("<pre id=\"verdict\">VERDICT")
        .nth(1)
        .and_then(|s| s.split("END").next())
        .expect("the checker ran and wrote its verdict");
    let v: serde_json::Value = serde_json::from_str(verdict).unwrap();
    eprintln!("browser verdict: {v}");
    assert_eq!(v["imgs"], hits - 1);
    assert_eq!(v["decoded"], v["imgs"], "every thumbnail decodes");
    assert_eq!(v["figures"], hits);
    assert_eq!(v["missing"], 1);
    assert_eq!(v["scripts"], 1, "only the checker's script");
    assert_eq!(v["onerror"], 0);
    assert!(
        v["title"].as_str().unwrap().starts_with("rsembed search:"),
        "{v}"
    );
    assert_eq!(v["polygons"], 10, "the scenes' chips are georeferenced");
    assert!(v["svg"][0].as_f64().unwrap() > 100.0 && v["svg"][1].as_f64().unwrap() > 100.0);
    for s in v["sizes"].as_array().unwrap() {
        assert_eq!(s, &serde_json::json!([256, 256]), "model-size pictures");
    }

    // A screenshot of the page itself, for people.
    let artifacts = root().join("target/test-artifacts/search_html");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("search.png");
    let _ = std::fs::remove_file(&shot);
    let o = run_timeout(
        browser(profile.path())
            .arg(format!("--screenshot={}", shot.display()))
            .arg("--window-size=1280,2000")
            .arg(format!("file://{}", page_path.display())),
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "chromium --screenshot");
    let png = image::open(&shot)
        .expect("the screenshot is a PNG")
        .to_rgb8();
    assert_eq!(png.dimensions(), (1280, 2000));
    let distinct: std::collections::BTreeSet<[u8; 3]> = png.pixels().map(|p| p.0).collect();
    assert!(
        distinct.len() > 100,
        "the page rendered (not a blank screenshot)"
    );
    eprintln!("screenshot: {}", shot.display());
}

/// STAC items (no self link: named `<items file>#<id>`) read again through
/// their items file, their assets and `raster:scale`/`raster:offset`: with
/// `--scale 0:0.255` (reflectance) both baselines' band files give back the
/// 8-bit surface of `visual.tif`, so each picture is GDAL's window of it.
#[test]
fn search_html_pictures_of_stac_items_are_their_assets_windows() {
    use rsembed_integration_tests::stac;
    use rsembed_integration_tests::stac_scenes::{item, make_scene, ItemStyle};
    let tmp = tempfile::tempdir().unwrap();
    let scene = make_scene(&tmp.path().join("s1"), 512, (500_000.0, 5_000_000.0), 7);
    let abs = |f: &str| format!("file://{}", scene.path(f).display());
    let rel = |f: &str| format!("s1/{f}");
    let t = "2024-06-15T10:00:00Z";
    let items = [
        item(
            &scene,
            "<i>a</i>",
            "s2",
            t,
            serde_json::json!(2),
            ItemStyle::V11Offset,
            &abs,
        ),
        item(
            &scene,
            "b",
            "s2",
            t,
            serde_json::json!(2),
            ItemStyle::V10,
            &rel,
        ),
    ];
    let ndjson = tmp.path().join("items.ndjson");
    stac::write_ndjson(&ndjson, &items);
    let out = tmp.path().join("index");
    let o = run_timeout(
        run_cmd(&ndjson, &out, &tiny_model()).args(["--scale", "0:0.255"]),
        Duration::from_secs(300),
    );
    assert_eq!(o.status.code(), Some(0), "run succeeds");

    let (stdout, page) = search_page(&out, tmp.path());
    assert_eq!(stdout.lines().count(), 8, "--json still prints every hit");
    assert!(!page.contains("<i>a</i>") && page.contains("&lt;i&gt;a&lt;/i&gt;"));
    let cards = cards(&page);
    assert_eq!(cards.len(), 8, "four chips of each item");
    for card in &cards {
        assert!(card.contains("<th>datetime</th><td>2024-06-15T10:00:00Z</td>"));
    }
    assert_windows_of(&scene.path("visual.tif"), &cards, tmp.path());
}

/// `--band-files` scenes: named `<prefix>{B04,B03,B02}<rest>`, read again
/// from their three one-band files (DN = 10·v; `--scale 0:2550` gives v).
#[test]
fn search_html_pictures_of_band_file_scenes_are_their_windows() {
    use rsembed_integration_tests::stac_scenes::make_scene;
    let tmp = tempfile::tempdir().unwrap();
    let scene = make_scene(&tmp.path().join("s1"), 512, (500_000.0, 5_000_000.0), 11);
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    for b in ["B04", "B03", "B02"] {
        std::fs::copy(
            scene.path(&format!("{b}.tif")),
            data.join(format!("T33_{b}.tif")),
        )
        .unwrap();
    }
    let out = tmp.path().join("index");
    let o = run_timeout(
        run_cmd(&data, &out, &tiny_model()).args([
            "--band-files",
            "B04,B03,B02",
            "--scale",
            "0:2550",
        ]),
        Duration::from_secs(300),
    );
    assert_eq!(o.status.code(), Some(0), "run succeeds");
    let (_, page) = search_page(&out, tmp.path());
    let cards = cards(&page);
    assert_eq!(cards.len(), 4);
    assert!(cards[0].contains("T33_{B04,B03,B02}.tif"), "{}", cards[0]);
    assert_windows_of(&scene.path("visual.tif"), &cards, tmp.path());
}

/// `search --json --html` of `index` for one text; stdout and the page.
fn search_page(index: &Path, tmp: &Path) -> (String, String) {
    let page_path = tmp.join("page.html");
    let mut c = rsembed();
    c.arg("search")
        .arg("--model")
        .arg(tiny_model())
        .arg("--index")
        .arg(index)
        .args(["--top-k", "20", "--json", "--html"])
        .arg(&page_path)
        .arg("fields");
    let o = run_timeout(&mut c, Duration::from_secs(120));
    assert!(o.status.success(), "search --html succeeds");
    (
        String::from_utf8(o.stdout).unwrap(),
        std::fs::read_to_string(&page_path).unwrap(),
    )
}

/// Each card's picture is GDAL's 256² window of `visual` at the card's window.
fn assert_windows_of(visual: &Path, cards: &[&str], tmp: &Path) {
    for card in cards {
        let img = card_img(card).unwrap_or_else(|| panic!("a picture: {card}"));
        let window = card
            .split("<th>window</th><td>")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .unwrap();
        let (x, y) = window.split_once(',').unwrap();
        let reference = tmp.join(format!("ref_{x}_{y}.png"));
        gdal_translate(
            &["-of", "PNG", "-srcwin", x, y, "256", "256"],
            visual,
            &reference,
        );
        let want = image::open(&reference).unwrap().to_rgb8();
        let got = decode_data_uri(img);
        assert!(
            got.as_raw() == want.as_raw(),
            "the picture at {x},{y} is {}'s window",
            visual.display()
        );
    }
}
