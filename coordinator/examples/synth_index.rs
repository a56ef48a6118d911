//! A synthetic finished job for the search benchmarks (`bench/search.py`):
//! N chips of random unit embeddings of dimension D, in task-sized chip files
//! written by the workers' own writer, with `job.json`, `manifest.json` and a
//! query vector whose nearest chips are planted.
//!
//! ```text
//! cargo run --release -p rsembed-coordinator --example synth_index -- \
//!     --output /tmp/idx [--rows 100000] [--dim 1024] [--rows-per-file 2000] [--seed 1]
//! ```
//!
//! Each file is one task of one "scene": a square of chips at a random place
//! in lon -10..30, lat 35..60, tiled row by row (the order a worker writes),
//! each chip a `--chip-deg` square with its WKB polygon, bbox and centre. A
//! bbox over one area therefore prunes most files, as on a real job. The
//! embeddings are Gaussian vectors normalised to unit length; `--planted`
//! chips get cosines 0.9, 0.8, … with the query written to `--query`
//! (default `OUTPUT/query.json`), so a top-K has known winners and a tail of
//! background chips. Output is deterministic for a given seed and arguments;
//! one JSON summary line goes to stdout.
//!
//! `--clusters C --spread S` makes clustered embeddings instead (the IVF
//! benchmark's data, `bench/ivf.py`, as `bench/quant.py` defines it): C
//! random unit centres, each row `normalise(centre + N(0, S²/D))` of a
//! random centre; `--queries Q` then writes `OUTPUT/queries.json`, Q query
//! vectors, each a random row perturbed by the same noise. Rows are made
//! file by file, so memory does not grow with `--rows`.

use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use futures::StreamExt;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use rsembed_raster::geo::{polygon_wkb, Footprint};
use rsembed_schemas::ids::{chip_id, IdHasher, Window};
use rsembed_schemas::job::{
    GroupingSpec, JobSpec, Manifest, ManifestFile, ManifestLists, ModelRef, TilingSpec, JOB_FILE,
    MANIFEST_FILE, MANIFEST_FORMAT,
};
use rsembed_schemas::manifest::{
    FailuresWriter, FileKind, FilesWriter, ListedFile, FAILURES_LIST, FILES_LIST,
};
use rsembed_schemas::meta::FileMeta;
use rsembed_worker::sink::commit::put;
use rsembed_worker::sink::parquet::{chip_file_metadata, encode_chips};
use rsembed_worker::sink::rows::{chip_batch, extent, ChipRow};
use rsembed_worker::store::{Location, StoreCache};
use serde_json::json;

/// The region scenes are placed in: W, S, E, N.
const REGION: [f64; 4] = [-10.0, 35.0, 30.0, 60.0];
/// Chip size in source pixels, as recorded in the windows and the tiling.
const CHIP_PX: i32 = 256;

#[derive(Debug, Parser)]
struct Args {
    /// Output folder (or URL) of the synthetic job.
    #[arg(long)]
    output: String,
    /// Chips in the index.
    #[arg(long, default_value_t = 100_000)]
    rows: usize,
    /// Embedding dimension.
    #[arg(long, default_value_t = 1024)]
    dim: usize,
    /// Chips per file (one task).
    #[arg(long, default_value_t = 2000)]
    rows_per_file: usize,
    /// Scenes per file, each at its own random place: 1 is a spatially
    /// compact task (a split scene); more is a task of unrelated inputs
    /// (listing order), whose files have wide extents.
    #[arg(long, default_value_t = 1)]
    scenes_per_file: usize,
    /// Side of a chip's footprint in degrees (0.025° ≈ a 256-pixel chip at 10 m).
    #[arg(long, default_value_t = 0.025)]
    chip_deg: f64,
    /// Chips whose embedding is planted near the query (cosines 0.9, 0.8, …).
    #[arg(long, default_value_t = 5)]
    planted: usize,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the query vector goes (one JSON array). Default: OUTPUT/query.json.
    #[arg(long)]
    query: Option<std::path::PathBuf>,
    /// Files generated at once.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Clustered embeddings around this many random unit centres (0: uniform on the sphere).
    #[arg(long, default_value_t = 0)]
    clusters: usize,
    /// Noise of a clustered row: N(0, spread²/D) per dimension before normalising.
    #[arg(long, default_value_t = 0.2)]
    spread: f64,
    /// With --clusters: query vectors near random rows, written to OUTPUT/queries.json.
    #[arg(long, default_value_t = 0)]
    queries: usize,
    /// Stored type of `embedding`: `f32`, `f16` or `int8`, as `rsembed run --embedding-type`
    /// writes it (int8: 1/4 of the bytes, for the 10^7-row benchmarks on a small disk).
    #[arg(long, default_value = "f32")]
    embedding_type: rsembed_schemas::embedding::EmbeddingType,
}

/// SplitMix64: small, seedable, good enough for synthetic data.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Rng {
        let mut r = Rng(seed ^ stream.wrapping_mul(0xA076_1D64_78BD_642F));
        r.next();
        r
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// A unit vector uniform on the sphere (normalised Gaussian, Box–Muller).
    fn sphere(&mut self, dim: usize) -> Vec<f32> {
        let mut v = Vec::with_capacity(dim + 1);
        while v.len() < dim {
            let (u1, u2) = (1.0 - self.unit(), self.unit());
            let r = (-2.0 * u1.ln()).sqrt();
            let t = std::f64::consts::TAU * u2;
            v.push(r * t.cos());
            v.push(r * t.sin());
        }
        v.truncate(dim);
        let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        v.iter().map(|x| (x / n) as f32).collect()
    }
}

/// A unit vector at cosine `c` from the unit vector `q`.
fn at_cosine(q: &[f32], c: f64, rng: &mut Rng) -> Vec<f32> {
    let g = rng.sphere(q.len());
    let gq: f64 = g
        .iter()
        .zip(q)
        .map(|(a, b)| f64::from(*a) * f64::from(*b))
        .sum();
    let perp: Vec<f64> = g
        .iter()
        .zip(q)
        .map(|(a, b)| f64::from(*a) - gq * f64::from(*b))
        .collect();
    let pn = perp.iter().map(|x| x * x).sum::<f64>().sqrt();
    let s = (1.0 - c * c).sqrt();
    let v: Vec<f64> = q
        .iter()
        .zip(&perp)
        .map(|(a, p)| c * f64::from(*a) + s * p / pn)
        .collect();
    let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    v.iter().map(|x| (x / n) as f32).collect()
}

/// What every file of the job shares.
struct Job {
    args: Args,
    tiling: TilingSpec,
    meta: FileMeta,
    query: Vec<f32>,
    /// (file, row within the file, cosine) of each planted chip.
    planted: Vec<(usize, usize, f64)>,
    /// `--clusters` centres, each `dim` floats.
    centres: Vec<Vec<f32>>,
    /// (file, row within the file, query index) of the rows queries perturb.
    query_rows: Vec<(usize, usize, usize)>,
}

impl Rng {
    /// A standard normal draw (Box–Muller, one of the pair).
    fn gauss(&mut self) -> f64 {
        let (u1, u2) = (1.0 - self.unit(), self.unit());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// `normalise(v + N(0, spread²/D))`.
    fn perturb(&mut self, v: &[f32], spread: f64) -> Vec<f32> {
        let s = spread / (v.len() as f64).sqrt();
        let w: Vec<f64> = v.iter().map(|x| f64::from(*x) + s * self.gauss()).collect();
        let n = w.iter().map(|x| x * x).sum::<f64>().sqrt();
        w.iter().map(|x| (x / n) as f32).collect()
    }
}

/// Rows of file `f`: `--scenes-per-file` scenes, each's chips tiled row by
/// row from its north-west corner; and the queries made from its rows.
fn scene_rows(job: &Job, f: usize) -> (Vec<ChipRow>, Vec<(usize, Vec<f32>)>) {
    let a = &job.args;
    let n = a.rows_per_file.min(a.rows - f * a.rows_per_file);
    let k = a.scenes_per_file.max(1);
    let per = a.rows_per_file.div_ceil(k);
    let cols = (per as f64).sqrt().ceil() as usize;
    let side = cols as f64 * a.chip_deg;
    let scenes: Vec<(f64, f64, String, String)> = (0..k)
        .map(|s| {
            // Scene 0 of file f is placed as when every file was one scene.
            let mut place = Rng::new(a.seed, 2 * (f * k + s) as u64 + 1);
            let west = REGION[0] + place.unit() * (REGION[2] - REGION[0] - side);
            let north = REGION[1] + side + place.unit() * (REGION[3] - REGION[1] - side);
            let uri = if k == 1 {
                format!("s3://synthetic/scenes/{f:06}.tif")
            } else {
                format!("s3://synthetic/scenes/{f:06}-{s:02}.tif")
            };
            (west, north, uri, format!("\"{:032x}\"", place.next()))
        })
        .collect();
    let tiling_fp = job.tiling.fingerprint();
    let mut emb = Rng::new(a.seed, 2 * f as u64 + 2);
    let mut queries = Vec::new();
    let rows = (0..n)
        .map(|i| {
            let (west, north, uri, version) = &scenes[i / per];
            let (west, north, uri, version) = (*west, *north, uri.clone(), version.clone());
            let j = i % per;
            let (r, c) = (j / cols, j % cols);
            let x0 = west + c as f64 * a.chip_deg;
            let y1 = north - r as f64 * a.chip_deg;
            let (x1, y0) = (x0 + a.chip_deg, y1 - a.chip_deg);
            let window = Window {
                x: c as i32 * CHIP_PX,
                y: r as i32 * CHIP_PX,
                width: CHIP_PX,
                height: CHIP_PX,
            };
            let embedding = match job.planted.iter().find(|p| p.0 == f && p.1 == i) {
                Some(&(_, _, cos)) => at_cosine(&job.query, cos, &mut emb),
                None if !job.centres.is_empty() => {
                    let c = &job.centres[(emb.next() % job.centres.len() as u64) as usize];
                    emb.perturb(c, a.spread)
                }
                None => emb.sphere(a.dim),
            };
            for &(_, _, q) in job.query_rows.iter().filter(|r| r.0 == f && r.1 == i) {
                let mut noise = Rng::new(a.seed, u64::MAX - q as u64);
                queries.push((q, noise.perturb(&embedding, a.spread)));
            }
            ChipRow {
                chip_id: chip_id(&uri, Some(&version), window, &tiling_fp),
                source_uri: uri.clone(),
                source_version: Some(version.clone()),
                window,
                valid_fraction: 1.0,
                crs: Some("EPSG:4326".into()),
                footprint: Some(Footprint {
                    wkb: polygon_wkb(&[(x0, y1), (x1, y1), (x1, y0), (x0, y0), (x0, y1)]),
                    bbox: [x0, y0, x1, y1],
                }),
                centre: Some([(x0 + x1) / 2.0, (y0 + y1) / 2.0]),
                embedding,
                stac: Default::default(),
            }
        })
        .collect();
    (rows, queries)
}

/// A planted chip as the summary shows it: id, cosine with the query, centre.
type Planted = (String, f64, [f64; 2]);

/// One encoded chip file.
struct File {
    task_id: String,
    bytes: Vec<u8>,
    rows: u64,
    /// Its planted chips, by their index in [`Job::planted`].
    planted: Vec<(usize, Planted)>,
    /// Queries made from its rows, by query index.
    queries: Vec<(usize, Vec<f32>)>,
}

/// Chip file `f`, encoded as a worker encodes a task's output.
fn encode_file(job: &Job, f: usize) -> anyhow::Result<File> {
    let (rows, queries) = scene_rows(job, f);
    let task_id = IdHasher::new("rsembed.synth.task")
        .str(&job.meta.job_id)
        .i64(f as i64)
        .hex128();
    let meta = FileMeta {
        task_id: task_id.clone(),
        ..job.meta.clone()
    };
    let batch = chip_batch(&rows, job.args.dim, job.args.embedding_type)?;
    let bytes = encode_chips(&batch, chip_file_metadata(&meta, extent(&rows))?)?;
    let planted = job
        .planted
        .iter()
        .enumerate()
        // The first planting of a row is the one written (see `scene_rows`).
        .filter(|(j, p)| {
            p.0 == f && job.planted.iter().position(|q| (q.0, q.1) == (p.0, p.1)) == Some(*j)
        })
        .map(|(j, p)| {
            let r = &rows[p.1];
            let centre = r.centre.unwrap_or([0.0; 2]);
            (j, (r.chip_id.clone(), p.2, centre))
        })
        .collect();
    Ok(File {
        task_id,
        bytes,
        rows: rows.len() as u64,
        planted,
        queries,
    })
}

async fn put_json<T: serde::Serialize>(out: &Location, rel: &str, v: &T) -> anyhow::Result<()> {
    let store: &Arc<dyn ObjectStore> = &out.store;
    store
        .put(
            &out.child(rel),
            PutPayload::from(serde_json::to_vec_pretty(v)?),
        )
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.rows > 0 && args.rows_per_file > 0 && args.dim > 0,
        "--rows, --rows-per-file and --dim must be positive"
    );
    let t0 = Instant::now();
    let out = StoreCache::default().location(&args.output)?;
    let tiling = TilingSpec {
        chip_size: CHIP_PX as u32,
        stride: CHIP_PX as u32,
        bands: vec![1, 2, 3],
        scale: "auto".into(),
        min_valid: None,
        band_files: None,
        assets: None,
        cloud_mask: None,
        max_cloud: None,
        footprint_tolerance: Some(rsembed_schemas::job::DEFAULT_FOOTPRINT_TOLERANCE),
        embedding_type: args.embedding_type,
        align: Default::default(),
        windows: None,
        schema_version: rsembed_schemas::SCHEMA_VERSION,
    };
    let model = ModelRef {
        name: "synthetic".into(),
        embed_dim: args.dim,
        sha256: IdHasher::new("rsembed.synth.model").hex256(),
        files: Vec::new(),
        preprocessor_sha256: IdHasher::new("rsembed.synth.preprocessor").hex256(),
        fp16: false,
    };
    let spec = JobSpec::new(
        "s3://synthetic/scenes/".to_owned(),
        out.url.to_string(),
        model.clone(),
        tiling.clone(),
        GroupingSpec {
            task_files: args.rows_per_file as u64,
            task_bytes: u64::MAX,
            task_chips: args.rows_per_file as u64,
            shard_bytes: u64::MAX,
        },
        rsembed_worker::now_rfc3339(),
    );
    let (job_id, fingerprint) = (spec.job_id.clone(), spec.fingerprint.clone());
    put_json(&out, JOB_FILE, &spec).await?;

    let mut rng = Rng::new(args.seed, 0);
    let query = rng.sphere(args.dim);
    let planted = (0..args.planted)
        .map(|j| {
            let row = (rng.next() % args.rows as u64) as usize;
            let cos = (0.9 - 0.1 * j as f64).max(0.2);
            (row / args.rows_per_file, row % args.rows_per_file, cos)
        })
        .collect();
    let files = args.rows.div_ceil(args.rows_per_file);
    let query_path = args.query.clone().unwrap_or_else(|| {
        out.local_dir()
            .expect("a local --output, or give --query")
            .join("query.json")
    });
    std::fs::write(&query_path, serde_json::to_vec(&query)?)?;
    let threads = args.threads.max(1);
    let mut centre_rng = Rng::new(args.seed, u64::MAX / 2);
    let centres: Vec<Vec<f32>> = (0..args.clusters)
        .map(|_| centre_rng.sphere(args.dim))
        .collect();
    let query_rows: Vec<(usize, usize, usize)> = if args.clusters > 0 {
        (0..args.queries)
            .map(|q| {
                let row = (centre_rng.next() % args.rows as u64) as usize;
                (row / args.rows_per_file, row % args.rows_per_file, q)
            })
            .collect()
    } else {
        Vec::new()
    };
    let job = Arc::new(Job {
        centres,
        query_rows,
        meta: FileMeta::of_job(&job_id, &model, &tiling),
        args,
        tiling,
        query,
        planted,
    });

    let mut written = futures::stream::iter(0..files)
        .map(|f| {
            let job = job.clone();
            tokio::task::spawn_blocking(move || encode_file(&job, f))
        })
        .buffered(threads);
    // The file list streams to `manifest/files.parquet` as files are written.
    let list =
        |rel: &str| object_store::buffered::BufWriter::new(out.store.clone(), out.child(rel));
    let mut listed = FilesWriter::new(list(FILES_LIST))?;
    let (mut rows, mut bytes) = (0u64, 0u64);
    let mut planted: Vec<Option<Planted>> = vec![None; job.planted.len()];
    let mut queries: Vec<Option<Vec<f32>>> = vec![None; job.query_rows.len()];
    while let Some(r) = written.next().await {
        let file = r??;
        let path = format!("chips/{}.parquet", file.task_id);
        let f: ManifestFile = put(&out, &path, file.bytes, file.rows).await?;
        rows += f.rows;
        bytes += f.bytes;
        listed
            .push(ListedFile {
                kind: FileKind::Chips,
                task_id: file.task_id.clone(),
                file: f,
            })
            .await?;
        for (j, p) in file.planted {
            planted[j] = Some(p);
        }
        for (q, v) in file.queries {
            queries[q] = Some(v);
        }
    }
    let files_list = listed.finish().await?.file;
    let failures_list = FailuresWriter::new(list(FAILURES_LIST))?
        .finish()
        .await?
        .file;
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        job_id,
        fingerprint,
        tasks: files as u64,
        rows,
        failed_inputs: 0,
        chip_file_count: files as u64,
        error_file_count: 0,
        failed_task_count: 0,
        lists: Some(ManifestLists {
            files: files_list,
            failures: failures_list,
        }),
        files: Vec::new(),
        error_files: Vec::new(),
        failures: Vec::new(),
        failed_tasks: Vec::new(),
        inputs_without_chips: 0,
        without_chips: Vec::new(),
        finalized_at: rsembed_worker::now_rfc3339(),
        software_version: rsembed_schemas::SOFTWARE_VERSION.to_owned(),
    };
    put_json(&out, MANIFEST_FILE, &manifest).await?;
    if !queries.is_empty() {
        let queries: Vec<Vec<f32>> = queries.into_iter().flatten().collect();
        put_json(&out, "queries.json", &queries).await?;
    }
    // Two plantings on one row leave the later one unwritten: not listed.
    let planted: Vec<_> = planted
        .into_iter()
        .flatten()
        .map(|(id, cos, c)| json!({"chip_id": id, "cosine": cos, "centre": c}))
        .collect();
    println!(
        "{}",
        json!({
            "output": out.url.to_string(),
            "rows": rows,
            "files": files,
            "bytes": bytes,
            "dim": job.args.dim,
            "query": query_path,
            "planted": planted,
            "seconds": t0.elapsed().as_secs_f64(),
        })
    );
    Ok(())
}
