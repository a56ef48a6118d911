//! `rsembed change` on a window job's output: three quarterly windows of 40
//! cells, written by the workers' own writer (`chip_batch`, `encode_chips`,
//! schema 3 rows with `cell` and `window_*`), each cell's embedding nudged
//! a little from window to window and one cell's replaced from the third
//! window on. The planted cell must rank first, in f32, f16 and int8 alike,
//! and the GeoParquet must read back in DuckDB, ranked.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use rsembed_integration_tests::*;
use rsembed_raster::geo::{polygon_wkb, Footprint};
use rsembed_schemas::chip_file::rows::{chip_batch, extent, CellColumns, CellRow, ChipRow};
use rsembed_schemas::embedding::EmbeddingType;
use rsembed_schemas::ids::Window;
use rsembed_schemas::job::{ModelRef, TilingSpec};
use rsembed_schemas::meta::FileMeta;
use rsembed_worker::sink::parquet::{chip_file_metadata, encode_chips};

const DIM: usize = 32;
const CELLS: usize = 40;
const PLANTED: usize = 17;
/// A cell all cloud in the second window: it has no row there.
const CLOUDY: usize = 5;
/// 2024-01-01, 2024-04-01, 2024-07-01 and 2024-10-01, µs since the epoch.
const QUARTERS: [i64; 4] = [
    1_704_067_200_000_000,
    1_711_929_600_000_000,
    1_719_792_000_000_000,
    1_727_740_800_000_000,
];

/// SplitMix64: deterministic test data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
    fn unit(&mut self) -> Vec<f32> {
        let v: Vec<f32> = (0..DIM).map(|_| self.next()).collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / n).collect()
    }
}

fn cell(i: usize) -> String {
    format!(
        "EPSG:32633/10/256/{}/{}",
        100 + i % 8,
        -500 - (i / 8) as i64
    )
}

/// Writes the windows' chip files (one a window) under `root/chips/`.
fn write_output(root: &Path, ty: EmbeddingType) {
    let chips = root.join("chips");
    std::fs::create_dir_all(&chips).unwrap();
    let mut rng = Rng(7);
    let base: Vec<Vec<f32>> = (0..CELLS).map(|_| rng.unit()).collect();
    let planted = rng.unit();
    for w in 0..3 {
        let rows: Vec<CellRow> = (0..CELLS)
            .filter(|&i| !(w == 1 && i == CLOUDY))
            .map(|i| {
                let e: Vec<f32> = if w >= 2 && i == PLANTED {
                    planted.clone()
                } else {
                    let noisy: Vec<f32> = base[i].iter().map(|x| x + 0.02 * rng.next()).collect();
                    let n = noisy.iter().map(|x| x * x).sum::<f32>().sqrt();
                    noisy.into_iter().map(|x| x / n).collect()
                };
                let (x0, y0) = (15.0 + (i % 8) as f64 * 0.03, 45.0 - (i / 8) as f64 * 0.03);
                let (x1, y1) = (x0 + 0.03, y0 + 0.03);
                CellRow {
                    chip: ChipRow {
                        chip_id: format!("{:032x}", (w as u128) << 64 | i as u128),
                        source_uri: format!("s3://b/scene-q{w}.tif"),
                        source_version: Some("1".into()),
                        window: Window {
                            x: (i % 8) as i32 * 256,
                            y: (i / 8) as i32 * 256,
                            width: 256,
                            height: 256,
                        },
                        valid_fraction: 1.0,
                        crs: Some("EPSG:32633".into()),
                        footprint: Some(Footprint {
                            wkb: polygon_wkb(&[(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)]),
                            bbox: [x0, y0, x1, y1],
                        }),
                        centre: Some([(x0 + x1) / 2.0, (y0 + y1) / 2.0]),
                        embedding: e,
                        stac: Default::default(),
                    },
                    cells: CellColumns {
                        cell: Some(cell(i)),
                        window_start: Some(QUARTERS[w]),
                        window_end: Some(QUARTERS[w + 1]),
                        scenes: Some(3),
                    },
                }
            })
            .collect();
        let batch = chip_batch(&rows, DIM, ty).unwrap();
        let mut meta = FileMeta::of_job("job-change", &model(), &tiling()).with_embedding_type(ty);
        meta.task_id = format!("w{w}");
        let bytes =
            encode_chips(&batch, chip_file_metadata(&meta, extent(&rows)).unwrap()).unwrap();
        std::fs::write(chips.join(format!("w{w}.parquet")), bytes).unwrap();
    }
}

fn model() -> ModelRef {
    ModelRef {
        name: "synthetic".into(),
        embed_dim: DIM,
        sha256: "0".repeat(64),
        files: Vec::new(),
        preprocessor_sha256: "1".repeat(64),
        fp16: false,
    }
}

fn tiling() -> TilingSpec {
    TilingSpec {
        chip_size: 256,
        stride: 256,
        bands: vec![1, 2, 3],
        scale: "auto".into(),
        min_valid: None,
        band_files: None,
        assets: None,
        cloud_mask: None,
        max_cloud: None,
        embedding_type: Default::default(),
        align: Default::default(),
        windows: None,
        schema_version: rsembed_schemas::SCHEMA_VERSION,
        footprint_tolerance: Some(rsembed_schemas::job::DEFAULT_FOOTPRINT_TOLERANCE),
    }
}

fn change(index: &Path, output: &Path, extra: &[&str]) -> Output {
    run_timeout(
        Command::new(binary("rsembed"))
            .args(["change", "--index"])
            .arg(index)
            .arg("--output")
            .arg(output)
            .args(extra),
        Duration::from_secs(120),
    )
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn rows(file: &Path, sql_tail: &str) -> serde_json::Value {
    duckdb(&format!(
        "SELECT cell, epoch_us(window_a), epoch_us(window_b), distance FROM '{}' {sql_tail}",
        file.display()
    ))
}

#[test]
fn the_planted_change_ranks_first_whatever_the_stored_type() {
    for ty in [EmbeddingType::F32, EmbeddingType::F16, EmbeddingType::Int8] {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("out");
        write_output(&root, ty);
        let file = tmp.path().join("change.parquet");
        let printed = ok(&change(&root, &file, &["--top", "3"]));
        // The closing table: the planted cell first, between Q2 and Q3.
        let first = printed
            .lines()
            .find(|l| l.trim_start().starts_with("1 "))
            .unwrap_or_else(|| panic!("{ty}: no ranked line in\n{printed}"));
        assert!(first.contains(&cell(PLANTED)), "{ty}: {printed}");
        assert!(
            first.contains("2024-04-01") && first.contains("2024-07-01"),
            "{ty}: {first}"
        );

        let all = rows(&file, "");
        // Two pairs of windows; the cloudy cell has neither (no row in Q2).
        assert_eq!(all.as_array().unwrap().len(), 2 * (CELLS - 1), "{ty}");
        assert!(all
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r[0] != cell(CLOUDY).as_str()));
        // Ranked: largest distance first, the file's own order.
        let d: Vec<f64> = all
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r[3].as_f64().unwrap())
            .collect();
        assert!(d.windows(2).all(|w| w[0] >= w[1]), "{ty}: not ranked");
        assert_eq!(all[0][0], cell(PLANTED).as_str(), "{ty}");
        assert_eq!(all[0][1], QUARTERS[1]);
        assert_eq!(all[0][2], QUARTERS[2]);
        assert!(d[0] > 0.5 && d[1] < 0.1, "{ty}: {} then {}", d[0], d[1]);

        // GeoParquet: DuckDB reads the footprints and the covering bbox.
        let geo = duckdb(&format!(
            "SELECT count(*) FROM '{}' WHERE bbox.xmin >= 15 AND geometry IS NOT NULL \
             AND grid_cell IS NOT NULL AND chip_id_a <> chip_id_b",
            file.display()
        ));
        assert_eq!(geo[0][0], 2 * (CELLS - 1) as i64, "{ty}");
        let kv = duckdb(&format!(
            "SELECT decode(value) FROM parquet_kv_metadata('{}') WHERE decode(key) = 'geo'",
            file.display()
        ));
        assert!(
            kv[0][0].as_str().unwrap().contains("\"primary_column\""),
            "{kv}"
        );
    }
}

#[test]
fn from_and_to_compare_two_windows_and_bad_inputs_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("out");
    write_output(&root, EmbeddingType::F32);
    let file = tmp.path().join("q1-q3.parquet");
    ok(&change(
        &root,
        &file,
        &["--from", "2024-02-15", "--to", "2024-08-01", "--json"],
    ));
    let all = rows(&file, "");
    // Q1 against Q3: the cloudy cell is in both.
    assert_eq!(all.as_array().unwrap().len(), CELLS);
    assert_eq!(all[0][0], cell(PLANTED).as_str());
    assert_eq!(
        (all[0][1].clone(), all[0][2].clone()),
        (QUARTERS[0].into(), QUARTERS[2].into())
    );

    // The file exists: refused without --overwrite, nothing changed.
    let again = change(&root, &file, &[]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--overwrite"));
    assert_eq!(rows(&file, "").as_array().unwrap().len(), CELLS);

    // Both dates in one window: nothing to compare.
    let same = change(
        &root,
        &tmp.path().join("x.parquet"),
        &["--from", "2024-01-02", "--to", "2024-02-01"],
    );
    assert!(!same.status.success());
    assert!(String::from_utf8_lossy(&same.stderr).contains("same window"));

    // An output without windows (no `cell`, `window_*` columns): refused,
    // naming why.
    let plain = tmp.path().join("plain/chips");
    std::fs::create_dir_all(&plain).unwrap();
    let row = ChipRow {
        chip_id: "0".repeat(32),
        source_uri: "file:///a.tif".into(),
        source_version: None,
        window: Window {
            x: 0,
            y: 0,
            width: 8,
            height: 8,
        },
        valid_fraction: 1.0,
        crs: None,
        footprint: None,
        centre: None,
        embedding: Rng(1).unit(),
        stac: Default::default(),
    };
    let batch =
        rsembed_schemas::chip_file::rows::chip_batch_version(&[row], 2, DIM, EmbeddingType::F32)
            .unwrap();
    let bytes = encode_chips(&batch, Vec::new()).unwrap();
    std::fs::write(plain.join("t.parquet"), bytes).unwrap();
    let refused = change(
        &tmp.path().join("plain"),
        &tmp.path().join("y.parquet"),
        &[],
    );
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("not the output of a window job"), "{err}");
    assert!(!tmp.path().join("y.parquet").exists());
}
