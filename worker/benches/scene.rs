//! GeoTIFF scene throughput and COG read economy, on one core.
//!
//! (1) For every shared GeoTIFF (`../shared/data/geotiff/**/*.tif`, relative to
//! the repository root; the per-band Landsat files are each a one-band scene,
//! band 1 replicated to RGB) it times what a worker does per task short of
//! inference: `Scene::open` (header, IFDs, georeferencing, the scene-level
//! `--scale auto` stretch), then for every 256×256 window of the grid the
//! windowed read, decode, scaling to 8 bits, the empty-chip check and the
//! preprocess to float32 CHW. Each file is repeated for at least 2 s
//! (`RSEMBED_BENCH_SECS` overrides) on a tokio current-thread runtime, so the
//! figure is chips/s per core. Files are read through object_store's
//! `LocalFileSystem` (the page cache, after a warm-up pass), as a worker reads
//! a local or mounted bucket.
//!
//! (2) When `RSEMBED_BENCH_COG` names one or more tiled COGs (comma-separated),
//! it opens each and reads the 4×4-chip block at column 8, row 8 (a 1024×1024
//! window) as a sharded task would, and reports the bytes fetched, counted by
//! `StoreRange`, against the object size. The count includes everything the
//! task fetches: the header and IFDs, the tiles the window needs, and for
//! non-8-bit data the overview (or decimated) reads of the scene stretch.
//!
//! Output is one `RESULT key=value …` line per measurement, for
//! `bench/geotiff.py`, which also generates the COG, times the rasterio
//! baseline in the same run and prints the table. Run alone with
//! `cargo bench -p rsembed-worker --bench scene`.

use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::ObjectStore;
use rsembed_raster::scale::ScaleSpec;
use rsembed_raster::scene::Scene;
use rsembed_raster::tiff::{RangeRead, TiffLimits};
use rsembed_schemas::job::TilingSpec;
use rsembed_schemas::task::ChipBlock;
use rsembed_worker::model::ModelDir;
use rsembed_worker::preprocess::Preprocessor;
use rsembed_worker::store::StoreRange;

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
        footprint_tolerance: Some(rsembed_schemas::job::DEFAULT_FOOTPRINT_TOLERANCE),
        embedding_type: Default::default(),
        align: Default::default(),
        windows: None,
        schema_version: rsembed_schemas::SCHEMA_VERSION,
    }
}

/// Every `.tif` under `dir`, sorted.
fn tiffs(dir: &FsPath) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x.eq_ignore_ascii_case("tif")) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn reader(
    store: &Arc<dyn ObjectStore>,
    file: &FsPath,
    counter: &Arc<AtomicU64>,
) -> Arc<dyn RangeRead> {
    let abs = std::fs::canonicalize(file).expect("file exists");
    let abs = abs.to_str().expect("UTF-8 path");
    let size = std::fs::metadata(abs).expect("file exists").len();
    Arc::new(StoreRange::new(
        store.clone(),
        Path::from(abs.trim_start_matches('/')),
        size,
        counter.clone(),
    ))
}

/// One task over the whole scene: open, every chip, preprocess.
/// Returns (windows, chips kept).
async fn one_pass(
    r: Arc<dyn RangeRead>,
    uri: &str,
    pre: &Preprocessor,
    out: &mut [f32],
) -> (usize, usize) {
    let tiling = tiling();
    let scene = Scene::open(
        r,
        &tiling,
        ScaleSpec::Auto,
        TiffLimits::default(),
        uri,
        None,
    )
    .await
    .unwrap_or_else(|e| panic!("{uri}: {e}"));
    let windows = scene.windows(None);
    let mut kept = 0;
    for w in &windows {
        if let Some(c) = scene
            .chip(*w, tiling.min_valid)
            .await
            .unwrap_or_else(|e| panic!("{uri}: {e}"))
        {
            pre.run_into(&c.rgb, out).expect("preprocess");
            std::hint::black_box(&out[..]);
            kept += 1;
        }
    }
    (windows.len(), kept)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let root = FsPath::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let model = ModelDir::open(root.join("fixtures/models/tiny-siglip")).expect("tiny model");
    let pre = Preprocessor::new(&model.preprocessor);
    let mut out = vec![0f32; pre.len()];
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new());
    let counter = Arc::new(AtomicU64::new(0));
    let min_secs: f64 = std::env::var("RSEMBED_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);

    let data = std::env::var_os("RSEMBED_BENCH_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("../shared/data/geotiff"));
    if !data.is_dir() {
        println!("SKIPPED scenes: {} is absent", data.display());
    } else {
        let (mut all_chips, mut all_secs) = (0usize, 0f64);
        for f in tiffs(&data) {
            let name = f.strip_prefix(&data).unwrap_or(&f).display().to_string();
            let uri = format!("file://{}", f.display());
            // Warm-up: page cache, allocator, lazy statics.
            rt.block_on(one_pass(reader(&store, &f, &counter), &uri, &pre, &mut out));
            let (mut passes, mut chips, mut windows) = (0usize, 0usize, 0usize);
            let t0 = Instant::now();
            while passes == 0 || t0.elapsed() < Duration::from_secs_f64(min_secs) {
                let (w, k) =
                    rt.block_on(one_pass(reader(&store, &f, &counter), &uri, &pre, &mut out));
                windows = w;
                chips += k;
                passes += 1;
            }
            let secs = t0.elapsed().as_secs_f64();
            all_chips += chips;
            all_secs += secs;
            println!(
                "RESULT file={name} windows={windows} chips_per_pass={} passes={passes} chips={chips} seconds={secs:.4} chips_per_s={:.1} ms_per_pass={:.3}",
                chips / passes,
                chips as f64 / secs,
                secs * 1e3 / passes as f64,
            );
        }
        println!(
            "RESULT file=ALL chips={all_chips} seconds={all_secs:.4} chips_per_s={:.1}",
            all_chips as f64 / all_secs.max(1e-9)
        );
    }

    match std::env::var("RSEMBED_BENCH_COG") {
        Err(_) => println!("SKIPPED cog: set RSEMBED_BENCH_COG to a tiled COG"),
        Ok(list) => {
            for cog in list.split(',').filter(|s| !s.is_empty()) {
                let f = FsPath::new(cog);
                let size = std::fs::metadata(f).expect("COG exists").len();
                let name = f.file_name().unwrap_or_default().to_string_lossy();
                let uri = format!("file://{cog}");
                let tiling = tiling();
                let block = ChipBlock {
                    col: 8,
                    row: 8,
                    cols: 4,
                    rows: 4,
                };
                let bytes = Arc::new(AtomicU64::new(0));
                let r = reader(&store, f, &bytes);
                let (open_bytes, chips) = rt.block_on(async {
                    let scene = Scene::open(
                        r,
                        &tiling,
                        ScaleSpec::Auto,
                        TiffLimits::default(),
                        &uri,
                        None,
                    )
                    .await
                    .unwrap_or_else(|e| panic!("{cog}: {e}"));
                    let open_bytes = bytes.load(Ordering::Relaxed);
                    let mut chips = 0;
                    for w in scene.windows(Some(block)) {
                        if let Some(c) = scene.chip(w, tiling.min_valid).await.expect("chip") {
                            pre.run_into(&c.rgb, &mut out).expect("preprocess");
                            chips += 1;
                        }
                    }
                    (open_bytes, chips)
                });
                let n = bytes.load(Ordering::Relaxed);
                println!(
                    "RESULT cog={name} chips={chips} cog_bytes_read={n} open_bytes={open_bytes} cog_size={size} fraction={:.5}",
                    n as f64 / size as f64
                );
            }
        }
    }
}
