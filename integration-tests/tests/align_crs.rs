//! `--align crs` through `rsembed run`: two GeoTIFFs of the same ground on
//! one UTM lattice, the second cropped at a pixel offset that is not a
//! multiple of the chip size, cut identical chips for identical cells (same
//! cell, footprint and embedding); scenes that cannot be placed on the
//! lattice (another sub-pixel phase, a CRS without an EPSG code) are error
//! records naming why; every chip has its Major TOM `grid_cell`;
//! `--align scene`, the default, keeps the chip ids of before; and a job
//! started with chip schema 2 keeps writing schema 2 when resumed.

use std::collections::HashMap;
use std::path::Path;

use rsembed_integration_tests::rasters::gdal_translate;
use rsembed_integration_tests::stac_scenes::make_scene;
use rsembed_integration_tests::{cosine, duckdb, run, run_cmd, tiny_model};
use rsembed_schemas::ids::{chip_id, Window};
use rsembed_schemas::job::JobSpec;
use serde_json::Value;

/// Chip size of these runs: chips are resized to the tiny model's 256².
const CHIP: u32 = 64;
/// The first scene's upper-left corner, UTM 33N (EPSG:32633): lattice pixel
/// (60013, −500004) of 10 m, 45 columns into a lattice chip of 64.
const X0: f64 = 600_130.0;
const Y0: f64 = 5_000_040.0;
/// Where the crop starts in the first scene: not a multiple of the chip size.
const CROP: (u32, u32) = (37, 53);

/// Writes the test scenes into `dir/input`: `a.tif` (320² 8-bit RGB),
/// `b.tif` (a 200 × 210 crop of it at [`CROP`]), and, with `bad`,
/// `phase.tif` (a half pixel east of the lattice) and `noepsg.tif` (a
/// transverse Mercator without an EPSG code).
fn scenes(dir: &Path, bad: bool) -> std::path::PathBuf {
    let src = make_scene(&dir.join("src"), 320, (X0, Y0), 7);
    let input = dir.join("input");
    std::fs::create_dir_all(&input).unwrap();
    let visual = src.path("visual.tif");
    std::fs::copy(&visual, input.join("a.tif")).unwrap();
    let (cx, cy) = CROP;
    let crop: Vec<String> = ["-of", "GTiff", "-srcwin"]
        .map(String::from)
        .into_iter()
        .chain([cx, cy, 200, 210].map(|v| v.to_string()))
        .collect();
    gdal_translate(&crop, &visual, &input.join("b.tif"));
    if bad {
        // The same pixels, a half pixel east: off the lattice.
        let shifted: Vec<String> = ["-of", "GTiff", "-a_ullr"]
            .map(String::from)
            .into_iter()
            .chain([X0 + 5.0, Y0, X0 + 5.0 + 3200.0, Y0 - 3200.0].map(|v| v.to_string()))
            .collect();
        gdal_translate(&shifted, &visual, &input.join("phase.tif"));
        let custom = [
            "-of",
            "GTiff",
            "-a_srs",
            "+proj=tmerc +lat_0=0 +lon_0=15.3 +k=0.9996 +x_0=500000 +y_0=0 +datum=WGS84 \
             +units=m +no_defs",
        ];
        gdal_translate(&custom, &visual, &input.join("noepsg.tif"));
    }
    input
}

/// One chip row of a run.
#[derive(Debug, Clone)]
struct Chip {
    source: String,
    version: String,
    chip_id: String,
    cell: Option<String>,
    grid_cell: Option<String>,
    x: i64,
    y: i64,
    valid: f64,
    geometry: String,
    embedding: Vec<f64>,
}

fn chips(out: &Path) -> Vec<Chip> {
    let rows = duckdb(&format!(
        "SELECT source_uri, source_version, chip_id, cell, grid_cell, x, y, valid_fraction, \
         hex(geometry::BLOB), embedding::FLOAT[] FROM '{}/chips/*.parquet' ORDER BY source_uri, y, x",
        out.display()
    ));
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| Chip {
            source: r[0].as_str().unwrap().to_owned(),
            version: r[1].as_str().unwrap().to_owned(),
            chip_id: r[2].as_str().unwrap().to_owned(),
            cell: r[3].as_str().map(str::to_owned),
            grid_cell: r[4].as_str().map(str::to_owned),
            x: r[5].as_i64().unwrap(),
            y: r[6].as_i64().unwrap(),
            valid: r[7].as_f64().unwrap(),
            geometry: r[8].as_str().unwrap().to_owned(),
            embedding: r[9]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect(),
        })
        .collect()
}

fn errors(out: &Path) -> Vec<(String, String)> {
    let glob = out.join("errors");
    if !glob.exists() {
        return vec![];
    }
    let rows = duckdb(&format!(
        "SELECT source_uri, error FROM '{}/*.parquet' ORDER BY source_uri",
        glob.display()
    ));
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_str().unwrap().to_owned(),
                r[1].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Each chip file's `rsembed` schema version and column names.
fn file_schemas(out: &Path) -> Vec<(u64, Vec<String>)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(out.join("chips")).unwrap() {
        let p = e.unwrap().path();
        let meta = duckdb(&format!(
            "SELECT decode(value) FROM parquet_kv_metadata('{}') WHERE decode(key) = 'rsembed'",
            p.display()
        ));
        let meta: Value = serde_json::from_str(meta[0][0].as_str().unwrap()).unwrap();
        let cols = duckdb(&format!(
            "SELECT name FROM parquet_schema('{}') WHERE name <> 'schema'",
            p.display()
        ));
        let cols = cols
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r[0].as_str().unwrap().to_owned())
            .collect();
        v.push((meta["schema_version"].as_u64().unwrap(), cols));
    }
    v
}

fn embed(input: &Path, out: &Path, extra: &[&str]) -> Option<i32> {
    let chip = CHIP.to_string();
    run(run_cmd(input, out, &tiny_model())
        .args(["--chip-size", &chip])
        .args(extra))
    .status
    .code()
}

fn name(c: &Chip) -> &str {
    c.source.rsplit('/').next().unwrap()
}

#[test]
fn scenes_on_one_lattice_cut_identical_chips_and_others_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let input = scenes(tmp.path(), true);
    let out = tmp.path().join("out");
    assert_eq!(
        embed(&input, &out, &["--align", "crs"]),
        Some(3),
        "finished, with failed inputs"
    );

    // The two scenes off the lattice are error records that say why; the
    // others gave no error.
    let errs = errors(&out);
    let by_name: HashMap<&str, &str> = errs
        .iter()
        .map(|(u, e)| (u.rsplit('/').next().unwrap(), e.as_str()))
        .collect();
    assert_eq!(by_name.len(), 2, "{errs:?}");
    let phase = by_name["phase.tif"];
    assert!(
        phase.contains("--align crs") && phase.contains("sub-pixel phase"),
        "{phase}"
    );
    let noepsg = by_name["noepsg.tif"];
    assert!(
        noepsg.contains("--align crs") && noepsg.contains("EPSG"),
        "{noepsg}"
    );

    let all = chips(&out);
    assert!(all.iter().all(|c| name(c) == "a.tif" || name(c) == "b.tif"));
    // Every chip has its cell on the 10 m lattice of 64-pixel strides and its
    // Major TOM cell, and starts where its cell says: column·64 − col0.
    for c in &all {
        let cell = c.cell.as_deref().expect("a cell under --align crs");
        let parts: Vec<&str> = cell.split('/').collect();
        assert_eq!(&parts[..3], ["EPSG:32633", "10", "64"], "{cell}");
        let (col, row): (i64, i64) = (parts[3].parse().unwrap(), parts[4].parse().unwrap());
        let (col0, row0) = match name(c) {
            "a.tif" => (60_013, -500_004),
            _ => (60_013 + i64::from(CROP.0), -500_004 + i64::from(CROP.1)),
        };
        assert_eq!((c.x, c.y), (col * 64 - col0, row * 64 - row0), "{cell}");
        let g = c
            .grid_cell
            .as_deref()
            .expect("a grid_cell for a chip with a centre");
        assert!(
            g.split_once('_')
                .is_some_and(|(r, k)| (r.ends_with('U') || r.ends_with('D'))
                    && (k.ends_with('L') || k.ends_with('R'))),
            "{g}"
        );
    }
    // The crop's first chips start left of and above it, padded.
    let b: Vec<&Chip> = all.iter().filter(|c| name(c) == "b.tif").collect();
    assert!(b.iter().any(|c| c.x < 0) && b.iter().any(|c| c.y < 0));

    // Same cell, same ground: where both scenes cover a whole chip, the two
    // chips have one footprint and one embedding.
    let a: HashMap<&str, &Chip> = all
        .iter()
        .filter(|c| name(c) == "a.tif")
        .map(|c| (c.cell.as_deref().unwrap(), c))
        .collect();
    let mut shared = 0;
    for cb in b.iter().filter(|c| c.valid == 1.0) {
        let ca = a[cb.cell.as_deref().unwrap()];
        assert_eq!(ca.valid, 1.0);
        assert_eq!(ca.geometry, cb.geometry, "{:?}", cb.cell);
        assert_eq!(ca.grid_cell, cb.grid_cell);
        let cos = cosine(&ca.embedding, &cb.embedding);
        assert!((cos - 1.0).abs() < 1e-6, "{:?}: cosine {cos}", cb.cell);
        assert_ne!(ca.chip_id, cb.chip_id, "chip ids name their scene");
        shared += 1;
    }
    assert_eq!(shared, 4, "a 2 × 2 block of whole chips in both scenes");
    // Cut from each scene's own corner instead, no chip of the crop lines up.
    let scene_out = tmp.path().join("scene");
    std::fs::remove_file(input.join("phase.tif")).unwrap();
    std::fs::remove_file(input.join("noepsg.tif")).unwrap();
    assert_eq!(embed(&input, &scene_out, &[]), Some(0));
    let plain = chips(&scene_out);
    assert!(plain
        .iter()
        .all(|c| c.cell.is_none() && c.grid_cell.is_some()));
    let ga: Vec<&String> = plain
        .iter()
        .filter(|c| name(c) == "a.tif")
        .map(|c| &c.geometry)
        .collect();
    assert!(plain
        .iter()
        .filter(|c| name(c) == "b.tif")
        .all(|c| !ga.contains(&&c.geometry)));
}

#[test]
fn scene_alignment_keeps_its_chip_ids_and_a_schema_2_job_stays_schema_2() {
    let tmp = tempfile::tempdir().unwrap();
    let input = scenes(tmp.path(), false);
    let default = tmp.path().join("default");
    let scene = tmp.path().join("scene");
    assert_eq!(embed(&input, &default, &[]), Some(0));
    assert_eq!(embed(&input, &scene, &["--align", "scene"]), Some(0));
    let (d, s) = (chips(&default), chips(&scene));
    assert_eq!(d.len(), s.len());
    // The tiling fingerprint of 64-pixel chips every 64, bands 1,2,3, scale
    // auto, as rsembed computed it before --align existed.
    const BEFORE: &str = "b67db4494dcfde6d380ad631c8ac5f38";
    for (d, s) in d.iter().zip(&s) {
        assert_eq!((&d.chip_id, d.x, d.y), (&s.chip_id, s.x, s.y));
        let w = Window {
            x: d.x as i32,
            y: d.y as i32,
            width: CHIP as i32,
            height: CHIP as i32,
        };
        assert_eq!(d.chip_id, chip_id(&d.source, Some(&d.version), w, BEFORE));
        assert!(d.cell.is_none() && d.grid_cell.is_some());
        assert!(d.x >= 0 && d.y >= 0 && d.x % 64 == 0 && d.y % 64 == 0);
    }
    // New jobs write schema 3.
    assert!(file_schemas(&default).iter().all(|(v, cols)| *v == 3
        && cols.iter().any(|c| c == "cell")
        && cols.iter().any(|c| c == "grid_cell")));

    // A job an older rsembed started: its job.json records no schema
    // version, and its ids are those of schema 2.
    let mut new: JobSpec =
        serde_json::from_slice(&std::fs::read(default.join("job.json")).unwrap()).unwrap();
    let v2 = tmp.path().join("v2");
    std::fs::create_dir_all(&v2).unwrap();
    let base = new
        .output
        .strip_suffix("/default")
        .expect("the output's URL");
    new.output = format!("{base}/v2");
    let old = new.clone().with_schema_version(2);
    assert_ne!(old.job_id, new.job_id);
    let text = serde_json::to_string_pretty(&old).unwrap();
    assert!(!text.contains("schema_version"), "{text}");
    std::fs::write(v2.join("job.json"), &text).unwrap();
    assert_eq!(embed(&input, &v2, &[]), Some(0), "the same job, resumed");
    let check_v2 = |what: &str| {
        let files = file_schemas(&v2);
        assert!(!files.is_empty());
        for (v, cols) in files {
            assert_eq!(v, 2, "{what}");
            assert!(
                !cols.iter().any(|c| c == "cell" || c == "grid_cell"),
                "{what}: {cols:?}"
            );
            assert!(cols.iter().any(|c| c == "end_datetime"), "{what}: {cols:?}");
        }
        let spec: JobSpec =
            serde_json::from_slice(&std::fs::read(v2.join("job.json")).unwrap()).unwrap();
        assert_eq!(spec.job_id, old.job_id, "{what}");
        assert_eq!(spec.tiling.schema_version, 2, "{what}");
    };
    check_v2("first run");
    // A chip file lost (and its record): the rerun writes it again, in schema 2.
    let lost = std::fs::read_dir(v2.join("chips"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let task = lost.file_stem().unwrap().to_str().unwrap().to_owned();
    std::fs::remove_file(&lost).unwrap();
    let _ = std::fs::remove_file(v2.join("state").join(format!("{task}.done")));
    assert_eq!(embed(&input, &v2, &[]), Some(0), "resumed again");
    assert!(lost.exists(), "the lost task ran again");
    check_v2("resumed");
    let rows = duckdb(&format!(
        "SELECT count(*) FROM '{}/chips/*.parquet'",
        v2.display()
    ));
    assert_eq!(rows[0][0].as_u64(), Some(d.len() as u64));
}

#[test]
fn a_scene_split_into_blocks_gives_each_lattice_chip_once() {
    let tmp = tempfile::tempdir().unwrap();
    let input = scenes(tmp.path(), false);
    // The planner does not read where a scene lies on the lattice, and
    // splits the largest grid any place gives: a.tif (320², 45 and 28 pixels
    // in from its first lattice chip) has 6 × 6 chips, one more each way than
    // cut from its corner, as many as the bound; the crop (200 × 210, 5 and
    // 17 in) 4 × 4, where the bound has 5 × 5.
    let whole = tmp.path().join("whole");
    let split = tmp.path().join("split");
    assert_eq!(embed(&input, &whole, &["--align", "crs"]), Some(0));
    // Blocks of about 4 chips of the bound: the worker's grid, a column and
    // a row smaller, is split exactly (the blocks past it are empty).
    assert_eq!(
        embed(
            &input,
            &split,
            &["--align", "crs", "--shard-bytes", "1", "--task-chips", "4"]
        ),
        Some(0)
    );
    let files = std::fs::read_dir(split.join("chips")).unwrap().count();
    assert!(files >= 8, "the scenes were split into {files} tasks");
    let key = |c: &Chip| (c.cell.clone().unwrap(), c.chip_id.clone(), c.x, c.y);
    let (mut w, mut s): (Vec<_>, Vec<_>) = (
        chips(&whole).iter().map(key).collect(),
        chips(&split).iter().map(key).collect(),
    );
    w.sort();
    s.sort();
    assert_eq!(w.len(), 36 + 16);
    assert_eq!(s, w, "each chip once, none lost");
}
