//! STAC items as the worker reads them (`TaskInput::item`), through the real
//! task runner with the tiny SigLIP model, on GeoTIFFs written by GDAL, the
//! chip files read back by DuckDB:
//!
//! - physical units: a scene stored as DN = 10·v (scale 1e-4) and the same
//!   stored as DN = 10·v + 1000 (offset −0.1, Sentinel-2 baseline 04.00), read
//!   with `--scale 0:0.255`, embed exactly as the 8-bit original v read with
//!   `--scale none`, chip for chip;
//! - an SCL mask on a 2× coarser grid gives each chip its `cloud_fraction`,
//!   and `--max-cloud` drops the chips over it and counts them;
//! - the item's id, collection and times reach the Parquet file;
//! - assets without a size are asked of the store (HEAD); a planned error, an
//!   asset that is gone and a scene not on its planned grid are error rows.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rsembed_integration_tests::{duckdb, tiny_model};
use rsembed_raster::image::DecodeLimits;
use rsembed_raster::scale::ScaleSpec;
use rsembed_raster::tiff::TiffLimits;
use rsembed_schemas::chip::ErrorStage;
use rsembed_schemas::job::TilingSpec;
use rsembed_schemas::meta::FileMeta;
use rsembed_schemas::task::{BandFile, CloudMask, ItemInfo, MaskKind, Task, TaskInput, Units};
use rsembed_worker::engine::handle::EngineHandle;
use rsembed_worker::engine::session::SessionConfig;
use rsembed_worker::engine::vision::OrtVision;
use rsembed_worker::model::ModelDir;
use rsembed_worker::preprocess::Preprocessor;
use rsembed_worker::sink::commit::Commit;
use rsembed_worker::store::StoreCache;
use rsembed_worker::task::{Counters, JobContext, StoreErrors, TaskRunner};
use serde_json::Value;

/// Scene side (10 m pixels) and chip side: a 2×2 chip grid.
const SIDE: u32 = 64;
const CHIP: u32 = 32;
const X0: f64 = 600_000.0;
const Y0: f64 = 5_100_000.0;

/// The 8-bit original of band `b` at (x, y).
fn v(b: u32, x: u32, y: u32) -> u32 {
    (x * 4 + y * 3 + b * 85) % 256
}

/// A GeoTIFF (EPSG:32633, `pixel` m) written by `gdal_translate` from raw
/// band-sequential little-endian samples.
fn gdal_tiff(
    dst: &Path,
    side: u32,
    pixel: f64,
    u16_data: Option<&[u16]>,
    u8_data: Option<&[u8]>,
    bands: u32,
) {
    let raw = dst.with_extension("raw");
    let (bytes, dtype): (Vec<u8>, u32) = match (u16_data, u8_data) {
        (Some(d), _) => (d.iter().flat_map(|v| v.to_le_bytes()).collect(), 12),
        (_, Some(d)) => (d.to_vec(), 1),
        _ => unreachable!("one of them"),
    };
    std::fs::write(&raw, bytes).unwrap();
    std::fs::write(
        raw.with_extension("hdr"),
        format!(
            "ENVI\nsamples = {side}\nlines = {side}\nbands = {bands}\nheader offset = 0\n\
             file type = ENVI Standard\ndata type = {dtype}\ninterleave = bsq\nbyte order = 0\n"
        ),
    )
    .unwrap();
    let extent = pixel * f64::from(side);
    let st = Command::new("gdal_translate")
        .args([
            "-q",
            "-of",
            "GTiff",
            "-co",
            "TILED=YES",
            "-co",
            "BLOCKXSIZE=32",
        ])
        .args([
            "-co",
            "BLOCKYSIZE=32",
            "-co",
            "COMPRESS=DEFLATE",
            "-a_srs",
            "EPSG:32633",
            "-a_ullr",
        ])
        .args([X0, Y0, X0 + extent, Y0 - extent].map(|v| v.to_string()))
        .arg(&raw)
        .arg(dst)
        .status()
        .expect("gdal_translate runs (scripts/setup-test-env.sh installs gdal-bin)");
    assert!(st.success(), "gdal_translate made {}", dst.display());
    let _ = std::fs::remove_file(&raw);
    let _ = std::fs::remove_file(raw.with_extension("hdr"));
}

/// Band-sequential samples of `bands` through `dn`.
fn planes(bands: &[u32], dn: impl Fn(u32) -> u32) -> Vec<u32> {
    bands
        .iter()
        .flat_map(|&b| (0..SIDE).flat_map(move |y| (0..SIDE).map(move |x| (b, x, y))))
        .map(|(b, x, y)| dn(v(b, x, y)))
        .collect()
}

fn u16s(v: Vec<u32>) -> Vec<u16> {
    v.into_iter().map(|x| u16::try_from(x).unwrap()).collect()
}

fn url(p: &Path) -> String {
    format!("file://{}", p.display())
}

fn file(p: &Path, suffix: &str, known_size: bool, bands: &[u32]) -> BandFile {
    BandFile {
        suffix: suffix.into(),
        uri: url(p),
        size: if known_size {
            std::fs::metadata(p).map_or(1, |m| m.len())
        } else {
            0
        },
        version: Some("v1".into()),
        bands: bands.to_vec(),
    }
}

fn item(id: &str, parts: Vec<BandFile>, units: Vec<Option<Units>>) -> TaskInput {
    TaskInput {
        uri: format!("https://stac.example/collections/s2/items/{id}"),
        size: 0,
        version: Some("2024-07-01T00:00:00Z".into()),
        chips: None,
        parts,
        item: Some(Box::new(ItemInfo {
            id: id.into(),
            collection: Some("sentinel-2-l2a".into()),
            // 2024-07-01T10:30:00Z
            datetime: Some(1_719_829_800_000_000),
            end_datetime: None,
            cloud_cover: None,
            units,
            mask: None,
            grid: Some([SIDE, SIDE]),
            proj: None,
            error: None,
        })),
    }
}

/// The SCL at 20 m (32×32 pixels, 16×16 under each chip): chip (0, 0) clear,
/// chip (1, 0) half cloud (9), chip (0, 1) a quarter shadow (3), chip (1, 1)
/// all cirrus (10); no data (0) under part of chip (0, 0).
fn scl() -> (Vec<u8>, [f32; 4]) {
    let mut m = vec![4u8; 32 * 32];
    for y in 0..32 {
        for x in 0..32 {
            let c = match (x / 16, y / 16) {
                (0, 0) if y < 2 => 0,
                (1, 0) if x < 24 => 9,
                (0, 1) if y < 20 => 3,
                (1, 1) => 10,
                _ => 4,
            };
            m[y * 32 + x] = c;
        }
    }
    (m, [0.0, 0.5, 0.25, 1.0])
}

fn runner(out: &Path, scale: ScaleSpec, max_cloud: Option<f32>) -> (TaskRunner, JobContext) {
    let model = ModelDir::open(tiny_model()).unwrap();
    let lib = std::env::var_os("ORT_DYLIB_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| tiny_model().join("../../../.cache/ort/libonnxruntime.so.1.31.1"));
    let cfg = SessionConfig {
        ort_lib: Some(lib),
        ..Default::default()
    };
    let m = model.clone();
    let engine =
        EngineHandle::spawn("stac-test", 2, move || OrtVision::open(&m, false, &cfg)).unwrap();
    let model_ref = model.model_ref(false).unwrap();
    let tiling = TilingSpec {
        chip_size: CHIP,
        stride: CHIP,
        bands: vec![1, 2, 3],
        scale: "x".into(),
        min_valid: None,
        band_files: None,
        assets: None,
        cloud_mask: max_cloud.map(|_| "scl".into()),
        max_cloud,
        footprint_tolerance: Some(rsembed_schemas::job::DEFAULT_FOOTPRINT_TOLERANCE),
        embedding_type: Default::default(),
        align: Default::default(),
        windows: None,
        schema_version: rsembed_schemas::SCHEMA_VERSION,
    };
    let stores = StoreCache::default();
    let job = JobContext {
        output: stores.location(out.to_str().unwrap()).unwrap(),
        scale,
        file_meta: FileMeta::of_job("job", &model_ref, &tiling),
    };
    let runner = TaskRunner {
        stores,
        preprocessor: Arc::new(Preprocessor::new(&model.preprocessor)),
        engine,
        batch_size: 4,
        decode_concurrency: 2,
        limits: DecodeLimits::default(),
        tiff_limits: TiffLimits::default(),
        store_errors: StoreErrors::Record,
        commit: Commit::Overwrite,
        counters: Arc::new(Counters::default()),
    };
    (runner, job)
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stac_items_embed_in_physical_units_with_cloud_fractions_and_error_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let rgb: Vec<u8> = planes(&[0, 1, 2], |v| v)
        .into_iter()
        .map(|v| v as u8)
        .collect();
    gdal_tiff(&d.join("orig.tif"), SIDE, 10.0, None, Some(&rgb), 3);
    gdal_tiff(
        &d.join("before.tif"),
        SIDE,
        10.0,
        Some(&u16s(planes(&[0, 1, 2], |v| 10 * v))),
        None,
        3,
    );
    for (b, name) in ["B04", "B03", "B02"].iter().enumerate() {
        let dn = u16s(planes(&[b as u32], |v| 10 * v + 1000));
        gdal_tiff(
            &d.join(format!("after_{name}.tif")),
            SIDE,
            10.0,
            Some(&dn),
            None,
            1,
        );
    }
    let (scl, cloud) = scl();
    gdal_tiff(&d.join("scl.tif"), 32, 20.0, None, Some(&scl), 1);

    // The 8-bit original, read as it is stored.
    let (r, job) = runner(&d.join("orig-out"), ScaleSpec::None, None);
    let orig = TaskInput {
        uri: url(&d.join("orig.tif")),
        size: std::fs::metadata(d.join("orig.tif")).unwrap().len(),
        version: None,
        chips: None,
        parts: vec![],
        item: None,
    };
    let orig_task = Task::new("job", vec![orig]);
    let rep = r.run(&job, &orig_task).await.unwrap();
    assert_eq!(rep.chips_file.rows, 4);
    assert_eq!(rep.cloudy_chips_dropped, 0);
    r.engine.shutdown().await;

    // The same surface as STAC items, in physical units, --max-cloud 0.5.
    let range: ScaleSpec = "0:0.255".parse().unwrap();
    let (r, job) = runner(&d.join("out"), range, Some(0.5));
    let before = item(
        "before",
        vec![file(&d.join("before.tif"), "visual", true, &[1, 2, 3])],
        vec![
            Some(Units {
                scale: 1e-4,
                offset: 0.0
            });
            3
        ],
    );
    // Sizes unknown (no file:size): the worker asks the store.
    let after_parts = ["B04", "B03", "B02"]
        .iter()
        .map(|n| file(&d.join(format!("after_{n}.tif")), n, false, &[]))
        .collect();
    let mut after = item(
        "after",
        after_parts,
        vec![
            Some(Units {
                scale: 1e-4,
                offset: -0.1
            });
            3
        ],
    );
    {
        let info = after.item.as_mut().unwrap();
        info.end_datetime = Some(1_719_829_900_000_000);
        info.mask = Some(CloudMask {
            kind: MaskKind::Scl,
            file: file(&d.join("scl.tif"), "scl", false, &[]),
        });
    }
    let mut planned_error = item("no-red", vec![], vec![]);
    planned_error.item.as_mut().unwrap().error =
        Some("STAC item no-red: it has no asset `red`".into());
    let gone = item(
        "gone",
        vec![file(&d.join("gone.tif"), "visual", false, &[1, 2, 3])],
        vec![],
    );
    let mut wrong_grid = item(
        "wrong-grid",
        vec![file(&d.join("before.tif"), "visual", true, &[1, 2, 3])],
        vec![],
    );
    wrong_grid.item.as_mut().unwrap().grid = Some([2 * SIDE, SIDE]);
    let task = Task::new("job", vec![before, after, planned_error, gone, wrong_grid]);
    let rep = r.run(&job, &task).await.unwrap();

    // Chip (1, 1) of `after` is all cirrus: over 0.5, dropped and counted;
    // chip (1, 0) is at 0.5 exactly, and kept.
    assert_eq!(rep.cloudy_chips_dropped, 1);
    assert_eq!(r.counters.cloudy_dropped.load(Ordering::Relaxed), 1);
    assert_eq!(rep.chips_file.rows, 4 + 3);

    let mut failures: Vec<(String, ErrorStage, String)> = rep
        .failures
        .iter()
        .map(|f| {
            (
                f.source_uri.rsplit('/').next().unwrap().to_owned(),
                f.stage,
                f.error.clone(),
            )
        })
        .collect();
    failures.sort_by(|a, b| a.0.cmp(&b.0));
    let names: Vec<&str> = failures.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(names, ["gone", "no-red", "wrong-grid"]);
    assert_eq!(failures[0].1, ErrorStage::Fetch, "{:?}", failures[0]);
    assert!(failures[0].2.contains("gone.tif"), "{:?}", failures[0]);
    assert_eq!(failures[1].1, ErrorStage::Fetch);
    assert!(
        failures[1].2.contains("no asset `red`"),
        "{:?}",
        failures[1]
    );
    assert!(
        failures[2].2.contains("[64, 64]") && failures[2].2.contains("[128, 64]"),
        "both grids named: {:?}",
        failures[2]
    );

    // What the Parquet file holds, as DuckDB reads it.
    let rows = |path: &Path| {
        duckdb(&format!(
            "SELECT item_id, collection, epoch_us(datetime), epoch_us(end_datetime), \
             cloud_fraction, x, y, embedding::FLOAT[] FROM '{}' ORDER BY item_id, y, x",
            path.display()
        ))
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().clone())
        .collect::<Vec<Vec<Value>>>()
    };
    let want = rows(&d.join("orig-out").join(orig_task.chips_path()));
    let got = rows(&d.join("out").join(task.chips_path()));
    assert_eq!(want.len(), 4);
    for w in &want {
        assert_eq!(
            w[..5],
            [
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null
            ]
        );
    }
    let (after_rows, before_rows) = got.split_at(3);
    for (i, r) in before_rows.iter().enumerate() {
        assert_eq!(r[0], "before");
        assert_eq!(r[1], "sentinel-2-l2a");
        assert_eq!(r[2], 1_719_829_800_000_000i64);
        assert_eq!(r[3], Value::Null);
        assert_eq!(r[4], Value::Null, "no mask, no cloud fraction");
        assert_eq!(r[5..7], want[i][5..7]);
    }
    let kept = [0, 1, 2]; // chip (1, 1) was dropped
    for (r, &i) in after_rows.iter().zip(&kept) {
        assert_eq!(r[0], "after");
        assert_eq!(r[3], 1_719_829_900_000_000i64);
        assert_eq!(r[4].as_f64(), Some(f64::from(cloud[i])), "chip {i}");
        assert_eq!(r[5..7], want[i][5..7]);
    }
    // The same bytes give the same embedding, chip for chip (one model, one
    // input; only the batch it ran in may differ).
    for (r, i) in before_rows
        .iter()
        .zip(0..)
        .chain(after_rows.iter().zip(kept))
    {
        let (a, b) = (floats(&r[7]), floats(&want[i][7]));
        let diff = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(diff < 1e-5, "{} chip {i}: max difference {diff}", r[0]);
    }
    r.engine.shutdown().await;
}
