//! GeoTIFF scenes through `rsembed run`: the chip grid, footprints checked
//! against GDAL (`gdaltransform`, both ways), identical results across encodings of the same
//! pixels, and every shared GeoTIFF processed or rejected.
//!
//! These tests read `../shared/data/geotiff`; each says SKIPPED when it is absent.

use std::path::{Path, PathBuf};
use std::process::Command;

use rsembed_integration_tests::*;
use serde_json::Value;

fn geotiff(rel: &str) -> Option<PathBuf> {
    let p = shared_data()?.join("geotiff").join(rel);
    p.is_file().then_some(p)
}

fn embed(input: &Path, out: &Path, extra: &[&str]) -> Value {
    let o = run(run_cmd(input, out, &tiny_model()).args(extra));
    assert_eq!(o.status.code(), Some(0), "run succeeds");
    duckdb(&format!(
        "SELECT x, y, width, height, valid_fraction, crs, hex(geometry::BLOB), centre_lon, centre_lat, \
         embedding::FLOAT[] FROM '{}/chips/*.parquet' ORDER BY y, x",
        out.display()
    ))
}

/// Polygon vertices of a little-endian 2D WKB polygon given as hex.
fn wkb_vertices(hex: &str) -> Vec<(f64, f64)> {
    let b: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    assert_eq!(b[0], 1, "little-endian WKB");
    assert_eq!(
        u32::from_le_bytes(b[1..5].try_into().unwrap()),
        3,
        "Polygon"
    );
    assert_eq!(
        u32::from_le_bytes(b[5..9].try_into().unwrap()),
        1,
        "one ring"
    );
    let n = u32::from_le_bytes(b[9..13].try_into().unwrap()) as usize;
    (0..n)
        .map(|i| {
            let o = 13 + i * 16;
            (
                f64::from_le_bytes(b[o..o + 8].try_into().unwrap()),
                f64::from_le_bytes(b[o + 8..o + 16].try_into().unwrap()),
            )
        })
        .collect()
}

/// GDAL's lon/lat for pixel/line positions of a file.
fn gdal_lonlat(file: &Path, points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    gdal_transform(file, points, false)
}

/// GDAL's pixel/line positions in a file of lon/lat points.
fn gdal_pixel(file: &Path, points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    gdal_transform(file, points, true)
}

/// `gdaltransform` between a file's pixel/line grid and lon/lat, from the
/// grid or (`inverse`) into it.
fn gdal_transform(file: &Path, points: &[(f64, f64)], inverse: bool) -> Vec<(f64, f64)> {
    gdal_transform_some(file, points, inverse)
        .into_iter()
        .map(|p| p.expect("GDAL transforms every point"))
        .collect()
}

/// `gdal_transform`, with `None` for a point GDAL cannot transform (outside
/// the projection's domain: in space, beside a GOES disk).
fn gdal_transform_some(
    file: &Path,
    points: &[(f64, f64)],
    inverse: bool,
) -> Vec<Option<(f64, f64)>> {
    let input: String = points.iter().map(|(x, y)| format!("{x} {y}\n")).collect();
    let mut child = Command::new("gdaltransform")
        .args(inverse.then_some("-i"))
        .args(["-t_srs", "OGC:CRS84", "-output_xy"])
        .arg(file)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("gdaltransform runs: GDAL is the reference (scripts/setup-test-env.sh installs gdal-bin)");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            if l.starts_with("transformation failed") {
                return None;
            }
            let v: Vec<f64> = l.split_whitespace().map(|t| t.parse().unwrap()).collect();
            Some((v[0], v[1]))
        })
        .collect()
}

#[test]
fn three_encodings_give_identical_chips_and_embeddings() {
    let files = [
        "rasterio/RGB.byte.tif",
        "rasterio/rgb_lzw.tif",
        "rasterio/rgb_deflate.tif",
    ];
    let Some(paths) = files.iter().map(|f| geotiff(f)).collect::<Option<Vec<_>>>() else {
        skipped("../shared/data is not in this checkout");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let results: Vec<Value> = paths
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let rows = embed(p, &tmp.path().join(format!("out{i}")), &[]);
            // Everything but the URI-dependent columns.
            Value::Array(
                rows.as_array()
                    .unwrap()
                    .iter()
                    .map(|r| {
                        Value::Array(vec![
                            r[0].clone(),
                            r[1].clone(),
                            r[4].clone(),
                            r[6].clone(),
                            r[9].clone(),
                        ])
                    })
                    .collect(),
            )
        })
        .collect();
    assert!(!results[0].as_array().unwrap().is_empty());
    assert_eq!(results[0], results[1], "LZW tiled = uncompressed strips");
    assert_eq!(
        results[0], results[2],
        "Deflate planar = uncompressed strips"
    );
}

/// The chip grid, corners and centres as GDAL has them, and footprints
/// within a hundredth of a pixel (the default `--footprint-tolerance`) of
/// their chips as GDAL maps them back into the grid.
#[test]
fn rgb_byte_grid_and_footprints_match_gdal() {
    let Some(file) = geotiff("rasterio/RGB.byte.tif") else {
        skipped("../shared/data is not in this checkout");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let rows = embed(&file, &tmp.path().join("out"), &[]);
    let rows = rows.as_array().unwrap();
    // 791 x 718 at 256: a 4 x 3 grid; chips with no valid pixel (nodata 0) are dropped.
    assert!((9..=12).contains(&rows.len()), "{} chips", rows.len());
    let mut worst = 0.0f64;
    for r in rows {
        let (x, y) = (r[0].as_f64().unwrap(), r[1].as_f64().unwrap());
        assert_eq!((x % 256.0, y % 256.0), (0.0, 0.0));
        assert!(x < 791.0 && y < 718.0);
        assert_eq!(
            (r[2].as_i64(), r[3].as_i64()),
            (Some(256), Some(256)),
            "padding included"
        );
        let vf = r[4].as_f64().unwrap();
        assert!(vf > 0.0 && vf <= 1.0);
        assert_eq!(r[5], "EPSG:32618");
        let ring = wkb_vertices(r[6].as_str().unwrap());
        assert_eq!(ring.first(), ring.last(), "closed ring");
        let corners = [
            (x, y),
            (x + 256.0, y),
            (x + 256.0, y + 256.0),
            (x, y + 256.0),
            (x + 128.0, y + 128.0),
        ];
        let gdal = gdal_lonlat(&file, &corners);
        for g in &gdal[..4] {
            let best = ring
                .iter()
                .map(|v| (v.0 - g.0).abs().max((v.1 - g.1).abs()))
                .fold(f64::INFINITY, f64::min);
            assert!(best < 1e-7, "corner {g:?} is {best} deg from the footprint");
        }
        let (lon, lat) = (r[7].as_f64().unwrap(), r[8].as_f64().unwrap());
        assert!(
            (lon - gdal[4].0).abs() < 1e-7 && (lat - gdal[4].1).abs() < 1e-7,
            "centre"
        );
        let off = pixels_off_outline(&file, &ring, (x, y), 256.0);
        worst = worst.max(off);
        assert!(
            off <= FOOTPRINT_PX,
            "chip {x},{y}: the footprint strays {off} px from the chip"
        );
    }
    println!("footprints within {worst:.2e} px of their chips (GDAL)");
    // The measure can fail: footprints to a whole pixel do here.
    let coarse = embed(
        &file,
        &tmp.path().join("coarse"),
        &["--footprint-tolerance", "1"],
    );
    let coarse_worst = coarse
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let xy = (r[0].as_f64().unwrap(), r[1].as_f64().unwrap());
            pixels_off_outline(&file, &wkb_vertices(r[6].as_str().unwrap()), xy, 256.0)
        })
        .fold(0.0, f64::max);
    assert!(
        coarse_worst > FOOTPRINT_PX && coarse_worst <= 1.0 + 2e-3,
        "{coarse_worst} px at --footprint-tolerance 1"
    );
}

/// The default `--footprint-tolerance`, and room for GDAL's and proj4rs's
/// lon/lat differing by up to 3e-9 degrees (about 1e-3 of a 300 m pixel).
const FOOTPRINT_PX: f64 = 0.01 + 2e-3;

/// How far a footprint strays from its chip, in the chip's pixels, by GDAL:
/// points along every edge of the ring (straight in lon/lat, where the
/// chip's edges are not) are mapped into the grid by `gdaltransform -i` and
/// measured against the chip's outline.
fn pixels_off_outline(file: &Path, ring: &[(f64, f64)], (x, y): (f64, f64), size: f64) -> f64 {
    let along: Vec<(f64, f64)> = ring
        .windows(2)
        .flat_map(|s| {
            (1..8).map(move |k| {
                let t = k as f64 / 8.0;
                (
                    s[0].0 + (s[1].0 - s[0].0) * t,
                    s[0].1 + (s[1].1 - s[0].1) * t,
                )
            })
        })
        .collect();
    gdal_pixel(file, &along)
        .into_iter()
        .map(|(c, r)| {
            // Distance to the nearest side of the square [x, x+size]×[y, y+size].
            let dx = (c - x).abs().min((c - x - size).abs());
            let dy = (r - y).abs().min((r - y - size).abs());
            let inside_x = (x..=x + size).contains(&c);
            let inside_y = (y..=y + size).contains(&r);
            match (inside_x, inside_y) {
                (true, true) => dx.min(dy),
                (true, false) => dy,
                (false, true) => dx,
                (false, false) => dx.hypot(dy),
            }
        })
        .fold(0.0, f64::max)
}

#[test]
fn every_shared_geotiff_is_processed_or_rejected() {
    let Some(data) = shared_data() else {
        skipped("../shared/data is not in this checkout");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = run(&mut run_cmd(&data.join("geotiff"), &out, &tiny_model()));
    assert_eq!(o.status.code(), Some(0), "no shared GeoTIFF fails");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("read "), "bytes read are reported");
    let per_file = duckdb(&format!(
        "SELECT regexp_extract(source_uri, '[^/]+$'), count(*), count(geometry), count(crs) \
         FROM '{}/chips/*.parquet' GROUP BY 1 ORDER BY 1",
        out.display()
    ));
    let get = |name: &str| {
        per_file
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r[0] == name)
            .cloned()
    };
    assert!(
        get("all-nodata.tif").is_none(),
        "an all-nodata scene yields no chip"
    );
    let goes = get("goes.tif").expect("goes.tif has chips");
    assert_eq!(
        goes[2], 0,
        "256-pixel GOES chips all have off-disk corners: null geometry"
    );
    assert_eq!(goes[3], goes[1], "but the geostationary CRS is known");
    for name in [
        "RGB.byte.tif",
        "cogeo.tif",
        "rgb16.tif",
        "m_4709963_se_14_1_20200831.tif",
    ] {
        let r = get(name).unwrap_or_else(|| panic!("{name} has chips"));
        assert_eq!(r[1], r[2], "{name}: every chip has a footprint");
    }
}

#[test]
fn goes_interior_chips_get_footprints() {
    let Some(file) = geotiff("rasterio/goes.tif") else {
        skipped("../shared/data is not in this checkout");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let rows = embed(&file, &tmp.path().join("out"), &["--chip-size", "128"]);
    let rows = rows.as_array().unwrap();
    let with = rows.iter().filter(|r| !r[6].is_null()).count();
    assert!(
        with > 0 && with < rows.len(),
        "{with} of {} chips have footprints",
        rows.len()
    );
    // Every chip whose centre is on the disk has centre_lon/centre_lat as
    // GDAL puts it, footprint or not (a corner in space loses the footprint
    // only); a centre in space has none.
    let px = |v: &Value| v.as_f64().unwrap();
    let centres: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (px(&r[0]) + px(&r[2]) / 2.0, px(&r[1]) + px(&r[3]) / 2.0))
        .collect();
    let gdal = gdal_transform_some(&file, &centres, false);
    let mut edge = 0;
    for (r, g) in rows.iter().zip(&gdal) {
        let ours = r[7].as_f64().zip(r[8].as_f64());
        match (ours, g) {
            (Some(o), Some(g)) => assert!(
                (o.0 - g.0).abs() < 1e-6 && (o.1 - g.1).abs() < 1e-6,
                "{r}: ours {o:?}, GDAL {g:?}"
            ),
            (None, None) => {}
            _ => panic!("chip at {}, {}: ours {ours:?}, GDAL {g:?}", r[0], r[1]),
        }
        edge += usize::from(r[6].is_null() && ours.is_some());
    }
    assert!(
        edge > 0,
        "some chips at the disk's edge have a centre and no footprint"
    );
}

#[test]
fn a_scene_split_into_chip_blocks_gives_the_same_rows() {
    let Some(file) = geotiff("rasterio/RGB.byte.tif") else {
        skipped("../shared/data is not in this checkout");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let whole = embed(&file, &tmp.path().join("whole"), &[]);
    let split_out = tmp.path().join("split");
    let split = embed(
        &file,
        &split_out,
        &["--shard-bytes", "0", "--task-size", "4"],
    );
    // Same chips and footprints exactly; embeddings to float rounding, because
    // ONNX Runtime's kernels block differently for another batch size.
    let (w, s) = (whole.as_array().unwrap(), split.as_array().unwrap());
    assert_eq!(w.len(), s.len());
    for (a, b) in w.iter().zip(s) {
        assert_eq!(a.as_array().unwrap()[..9], b.as_array().unwrap()[..9]);
        let f = |v: &Value| -> Vec<f64> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        };
        assert!(cosine(&f(&a[9]), &f(&b[9])) > 0.99999);
    }
    let files = std::fs::read_dir(split_out.join("chips")).unwrap().count();
    assert_eq!(files, 4, "a 4 x 3 grid in 2 x 2 blocks is four tasks");
    // Rerunning the split job resumes every block.
    let o = run(run_cmd(&file, &split_out, &tiny_model()).args([
        "--shard-bytes",
        "0",
        "--task-size",
        "4",
        "--json",
    ]));
    let s: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["tasks_resumed"], 4);
}

/// A 16-bit scene split into one-chip tasks computes its `--scale auto`
/// stretch from a bounded sample, once per process: the run reads the file
/// about once (each task used to read it whole for the percentiles), and
/// every task stretches as the unsplit scene does.
#[test]
fn sharded_16_bit_scene_reads_its_file_about_once() {
    use rsembed_integration_tests::rasters::{make_geotiff16, Scene16};
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    let file = input.join("scene16.tif");
    let scene = Scene16 {
        width: 1024,
        height: 1024,
        tile: 256,
        nodata: None,
    };
    make_geotiff16(&file, scene);
    let size = std::fs::metadata(&file).unwrap().len();
    let summary = |out: &Path, extra: &[&str]| -> Value {
        // One chip per inference call: embeddings independent of batching.
        let o = run(run_cmd(&input, out, &tiny_model())
            .args(["--batch-size", "1", "--json"])
            .args(extra));
        assert_eq!(o.status.code(), Some(0));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let (whole_out, split_out) = (tmp.path().join("whole"), tmp.path().join("split"));
    let whole = summary(&whole_out, &[]);
    let split = summary(&split_out, &["--shard-bytes", "0", "--task-chips", "1"]);
    assert_eq!(whole["tasks"], 1);
    assert_eq!(split["tasks"], 16, "a 4 x 4 grid of one-chip tasks");
    let read = split["bytes_read"].as_u64().unwrap();
    assert!(
        read < 2 * size,
        "16 tasks read {read} bytes of a {size}-byte scene"
    );
    let rows = |out: &Path| {
        duckdb(&format!(
            "SELECT x, y, valid_fraction, embedding::FLOAT[] FROM '{}/chips/*.parquet' ORDER BY y, x",
            out.display()
        ))
    };
    let want = rows(&whole_out);
    assert_eq!(want.as_array().unwrap().len(), 16);
    assert_eq!(
        rows(&split_out),
        want,
        "every task used the scene's stretch"
    );
}
