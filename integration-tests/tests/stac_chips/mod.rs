//! Finished jobs whose chip files are of both chip schema versions, written
//! by the workers' own writer (`chip_batch_version`, `encode_chips`): version 1 files
//! (the 14 columns of files written before STAC, `schema_version: 1`),
//! version 2 files with STAC values (item, collection, acquisition time,
//! some ranges, cloud fractions, and some rows without them), and version 2
//! files of plain inputs (the new columns all null). Real Parquet, read back
//! by `rsembed` and DuckDB.

use std::path::Path;

use rsembed_raster::geo::{polygon_wkb, Footprint};
use rsembed_schemas::ids::Window;
use rsembed_schemas::job::{GroupingSpec, JobSpec, Manifest, ModelRef, TilingSpec};
use rsembed_schemas::meta::FileMeta;
use rsembed_worker::sink::commit::put;
use rsembed_worker::sink::parquet::{chip_file_metadata, encode_chips};
use rsembed_worker::sink::rows::{chip_batch_version, extent, ChipRow, StacColumns};
use rsembed_worker::store::StoreCache;

/// Embedding dimension of the fixtures.
pub const DIM: usize = 64;
/// Seconds in a day.
const DAY: i64 = 86_400;
/// 2024-05-01T00:00:00Z, seconds.
pub const MAY_2024: i64 = 1_714_521_600;
/// 2023-05-01T00:00:00Z, seconds.
pub const MAY_2023: i64 = 1_682_899_200;

/// What a chip file holds.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// Schema version 1: 14 columns.
    V1,
    /// Schema version 2, inputs that were not STAC items: the new columns null.
    Plain,
    /// Schema version 2, STAC items from `base` (seconds) on, one every 6 days,
    /// four chips each; every 7th row lacks item and time, every 5th cloud.
    Stac { base: i64 },
}

/// One chip file of a fixture job.
#[derive(Debug, Clone, Copy)]
pub struct FileSpec {
    /// Task id, the file's name.
    pub name: &'static str,
    pub kind: Kind,
    pub rows: usize,
    /// West edge of its chips' grid, degrees.
    pub lon: f64,
}

/// The STAC values of row `i` of a `Kind::Stac` file.
pub fn stac_of(base: i64, i: usize) -> StacColumns {
    if i % 7 == 6 {
        return StacColumns {
            cloud_fraction: (i % 5 != 4).then_some(0.0),
            ..StacColumns::default()
        };
    }
    let item = (i / 4) as i64;
    let start = (base + item * 6 * DAY + 37_800) * 1_000_000;
    StacColumns {
        item_id: Some(format!("S2B_14TNT_{}_{item:02}", base / DAY + item * 6)),
        collection: Some(
            if item % 2 == 0 {
                "sentinel-2-l2a"
            } else {
                "landsat-c2-l2"
            }
            .into(),
        ),
        datetime: Some(start),
        end_datetime: (item % 3 == 2).then_some(start + 10 * DAY * 1_000_000),
        cloud_fraction: (i % 5 != 4).then(|| ((i * 37) % 101) as f32 / 100.0),
    }
}

fn embedding(seed: usize) -> Vec<f32> {
    let v: Vec<f64> = (0..DIM)
        .map(|j| ((seed as f64) * 1.7 + j as f64 * 0.9).sin() + 0.1 * j as f64)
        .collect();
    let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    v.iter().map(|x| (x / n) as f32).collect()
}

fn rows_of(f: usize, spec: &FileSpec) -> Vec<ChipRow> {
    (0..spec.rows)
        .map(|i| {
            let (x0, y0) = (
                spec.lon + (i % 10) as f64 * 0.01,
                40.0 + (i / 10) as f64 * 0.01,
            );
            let (x1, y1) = (x0 + 0.01, y0 + 0.01);
            ChipRow {
                chip_id: format!("{:032x}", ((f as u128 + 1) << 32) | i as u128),
                source_uri: format!("file:///scenes/{}.tif", spec.name),
                source_version: Some("1".into()),
                window: Window {
                    x: (i % 10) as i32 * 64,
                    y: (i / 10) as i32 * 64,
                    width: 64,
                    height: 64,
                },
                valid_fraction: 1.0,
                crs: Some("EPSG:4326".into()),
                footprint: Some(Footprint {
                    wkb: polygon_wkb(&[(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)]),
                    bbox: [x0, y0, x1, y1],
                }),
                centre: Some([(x0 + x1) / 2.0, (y0 + y1) / 2.0]),
                embedding: embedding(f * 1000 + i),
                stac: match spec.kind {
                    Kind::Stac { base } => stac_of(base, i),
                    Kind::V1 | Kind::Plain => StacColumns::default(),
                },
            }
        })
        .collect()
}

/// Writes a finished job at `root`: `job.json`, `chips/<name>.parquet` for
/// each of `files`, `manifest.json`; and `root/q.json`, the embedding of the
/// first file's row 3 as a query vector.
pub fn write_job(root: &Path, files: &[FileSpec]) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let out = StoreCache::default()
            .location(root.to_str().unwrap())
            .unwrap();
        let tiling = TilingSpec {
            chip_size: 64,
            stride: 64,
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
            // A job of version 2, as rsembed wrote before schema 3.
            schema_version: 2,
        };
        let model = ModelRef {
            // The committed test model's name and dimension, so `classify` takes it.
            name: "tiny-siglip".into(),
            embed_dim: DIM,
            sha256: "0".repeat(64),
            files: Vec::new(),
            preprocessor_sha256: "1".repeat(64),
            fp16: false,
        };
        let spec = JobSpec::new(
            "file:///scenes/".into(),
            out.url.to_string(),
            model.clone(),
            tiling.clone(),
            GroupingSpec {
                task_files: 1,
                task_bytes: u64::MAX,
                task_chips: 10_000,
                shard_bytes: u64::MAX,
            },
            rsembed_worker::now_rfc3339(),
        );
        std::fs::create_dir_all(root).unwrap();
        std::fs::write(
            root.join("job.json"),
            serde_json::to_vec_pretty(&spec).unwrap(),
        )
        .unwrap();
        let mut manifest_files = Vec::new();
        for (f, s) in files.iter().enumerate() {
            let rows = rows_of(f, s);
            let mut batch = chip_batch_version(&rows, 2, DIM, Default::default()).unwrap();
            let mut meta = FileMeta::of_job(&spec.job_id, &model, &tiling);
            meta.task_id = s.name.to_owned();
            if let Kind::V1 = s.kind {
                // The columns of schema version 1, as older rsembed wrote them.
                batch = batch.project(&(0..14).collect::<Vec<_>>()).unwrap();
                meta.schema_version = 1;
            }
            let bytes =
                encode_chips(&batch, chip_file_metadata(&meta, extent(&rows)).unwrap()).unwrap();
            let rel = format!("chips/{}.parquet", s.name);
            manifest_files.push(put(&out, &rel, bytes, rows.len() as u64).await.unwrap());
        }
        // A format 1 manifest (its lists in it), as older rsembed wrote:
        // readers still read it.
        let manifest = Manifest {
            format: 1,
            job_id: spec.job_id.clone(),
            fingerprint: spec.fingerprint.clone(),
            tasks: files.len() as u64,
            rows: manifest_files.iter().map(|f| f.rows).sum(),
            failed_inputs: 0,
            chip_file_count: 0,
            error_file_count: 0,
            failed_task_count: 0,
            lists: None,
            files: manifest_files,
            error_files: Vec::new(),
            failures: Vec::new(),
            failed_tasks: Vec::new(),
            inputs_without_chips: 0,
            without_chips: Vec::new(),
            finalized_at: rsembed_worker::now_rfc3339(),
            software_version: rsembed_schemas::SOFTWARE_VERSION.to_owned(),
        };
        std::fs::write(
            root.join("manifest.json"),
            serde_json::to_vec_pretty(&manifest).unwrap(),
        )
        .unwrap();
    });
    std::fs::write(
        root.join("q.json"),
        serde_json::to_vec(&embedding(3)).unwrap(),
    )
    .unwrap();
}
