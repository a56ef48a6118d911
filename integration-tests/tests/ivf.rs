//! `rsembed compact --lists` and `rsembed search --nprobe` on a finished job
//! of clustered embeddings: the layout (deterministic, every row once, each
//! row in its nearest list, row groups within one list, the manifest's
//! record), the search (exact with `--nprobe all`, recall@10 ≥ 0.95 by
//! default at a fraction of the bytes, `--bbox` still pruning, `--like`),
//! the documented DuckDB probe giving `search`'s answers, and the edges (more
//! lists than rows, lists left empty, compacting an IVF dataset again).
//!
//! The job is written by the workers' own writer (`chip_batch`,
//! `encode_chips`), so no model runs: `CENTRES` Gaussian clusters on the unit
//! sphere of dimension `DIM`, the chips scattered over a 20° × 10° area
//! independently of their cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Output;

use rsembed_integration_tests::*;
use rsembed_raster::geo::{polygon_wkb, Footprint};
use rsembed_schemas::ids::Window;
use rsembed_schemas::job::{GroupingSpec, JobSpec, Manifest, ModelRef, TilingSpec};
use rsembed_schemas::meta::FileMeta;
use rsembed_worker::sink::commit::put;
use rsembed_worker::sink::parquet::{chip_file_metadata, encode_chips};
use rsembed_worker::sink::rows::{chip_batch, extent, ChipRow};
use rsembed_worker::store::StoreCache;
use serde_json::Value;

const DIM: usize = 128;
const ROWS: usize = 8000;
const FILES: usize = 16;
const CENTRES: usize = 40;
const LISTS: &str = "64";
const QUERIES: usize = 50;

/// SplitMix64 and Box–Muller: deterministic test data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn gauss(&mut self) -> f64 {
        let (u1, u2) = (1.0 - self.unit(), self.unit());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

fn unit(v: Vec<f64>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    v.iter().map(|x| (x / n) as f32).collect()
}

/// `n` unit rows around `centres` random centres: per-dimension noise of
/// `spread` / √D, so a row's cosine with its centre is about 1/√(1+spread²).
fn clustered(seed: u64, n: usize, centres: usize, spread: f64) -> Vec<Vec<f32>> {
    let mut r = Rng(seed);
    let cs: Vec<Vec<f32>> = (0..centres)
        .map(|_| unit((0..DIM).map(|_| r.gauss()).collect()))
        .collect();
    let s = spread / (DIM as f64).sqrt();
    (0..n)
        .map(|_| {
            let c = &cs[(r.next() % centres as u64) as usize];
            unit(c.iter().map(|x| f64::from(*x) + s * r.gauss()).collect())
        })
        .collect()
}

/// A finished job at `root` with these embeddings in `files` chip files.
fn write_job(root: &Path, embeddings: &[Vec<f32>], files: usize) {
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
            embedding_type: Default::default(),
            align: Default::default(),
            windows: None,
            schema_version: rsembed_schemas::SCHEMA_VERSION,
            footprint_tolerance: Some(rsembed_schemas::job::DEFAULT_FOOTPRINT_TOLERANCE),
        };
        let model = ModelRef {
            name: "synthetic-clusters".into(),
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
                task_chips: 100_000,
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
        let mut place = Rng(99);
        let per = embeddings.len().div_ceil(files);
        let mut manifest_files = Vec::new();
        for (f, chunk) in embeddings.chunks(per).enumerate() {
            let rows: Vec<ChipRow> = chunk
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let (x0, y0) = (place.unit() * 20.0, 40.0 + place.unit() * 10.0);
                    let (x1, y1) = (x0 + 0.01, y0 + 0.01);
                    ChipRow {
                        chip_id: format!("{:032x}", ((f as u128 + 1) << 64) | (i as u128 * 7919)),
                        source_uri: format!("file:///scenes/{f:03}.tif"),
                        source_version: Some("1".into()),
                        window: Window {
                            x: i as i32 * 64,
                            y: 0,
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
                        embedding: e.clone(),
                        stac: Default::default(),
                    }
                })
                .collect();
            let batch = chip_batch(&rows, DIM, Default::default()).unwrap();
            let mut meta = FileMeta::of_job(&spec.job_id, &model, &tiling);
            meta.task_id = format!("task-{f:03}");
            let bytes =
                encode_chips(&batch, chip_file_metadata(&meta, extent(&rows)).unwrap()).unwrap();
            let rel = format!("chips/task-{f:03}.parquet");
            manifest_files.push(put(&out, &rel, bytes, rows.len() as u64).await.unwrap());
        }
        // A format 1 manifest (its lists in it), as older rsembed wrote:
        // readers still read it.
        let manifest = Manifest {
            format: 1,
            job_id: spec.job_id.clone(),
            fingerprint: spec.fingerprint.clone(),
            tasks: manifest_files.len() as u64,
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
}

/// Query vectors near rows of the data (another draw of noise), as files.
fn queries(dir: &Path, data: &[Vec<f32>], n: usize) -> Vec<PathBuf> {
    let mut r = Rng(4242);
    let s = 0.5 / (DIM as f64).sqrt();
    (0..n)
        .map(|i| {
            let row = &data[(r.next() % data.len() as u64) as usize];
            let q = unit(row.iter().map(|x| f64::from(*x) + s * r.gauss()).collect());
            let p = dir.join(format!("q{i:02}.json"));
            std::fs::write(&p, serde_json::to_vec(&q).unwrap()).unwrap();
            p
        })
        .collect()
}

fn compact(index: &Path, out: &Path, extra: &[&str]) -> Output {
    run(rsembed()
        .arg("compact")
        .arg("--json")
        .arg("--index")
        .arg(index)
        .arg("--output")
        .arg(out)
        .args(extra))
}

fn compact_ok(index: &Path, out: &Path, extra: &[&str]) -> Value {
    let o = compact(index, out, extra);
    assert_eq!(o.status.code(), Some(0), "compact succeeds");
    serde_json::from_slice(&o.stdout).expect("the summary is JSON")
}

/// What the closing line on stderr says.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Closing {
    scored: u64,
    rows: u64,
    read: u64,
    groups: u64,
    mib: f64,
}

/// Parses `rsembed search: scored R of N rows; read X of Y row groups[ (…)]; Z MiB fetched; T s`.
fn closing(stderr: &[u8]) -> Closing {
    let text = String::from_utf8_lossy(stderr);
    let line = text
        .lines()
        .rfind(|l| l.starts_with("rsembed search: scored "))
        .unwrap_or_else(|| panic!("no closing line in {text}"));
    let parts: Vec<&str> = line.split("; ").collect();
    let num = |s: &str, i: usize| -> f64 {
        s.split_whitespace()
            .nth(i)
            .unwrap_or_else(|| panic!("{line}"))
            .parse()
            .unwrap_or_else(|_| panic!("{line}"))
    };
    assert!(parts[0].ends_with(" rows"), "{line}");
    assert!(
        parts[1].starts_with("read ") && parts[1].contains(" row groups"),
        "{line}"
    );
    let last = parts.len() - 1;
    assert!(parts[last - 1].ends_with(" MiB fetched"), "{line}");
    assert!(parts[last].ends_with(" s"), "{line}");
    Closing {
        scored: num(parts[0], 3) as u64,
        rows: num(parts[0], 5) as u64,
        read: num(parts[1], 1) as u64,
        groups: num(parts[1], 3) as u64,
        mib: num(parts[last - 1], 0),
    }
}

/// `rsembed search --json` that must succeed: (chip id, cosine) best first, and its closing line.
fn search(index: &Path, extra: &[&str]) -> (Vec<(String, f64)>, Closing) {
    let o = run(rsembed()
        .args(["search", "--json", "--index"])
        .arg(index)
        .args(extra));
    assert_eq!(o.status.code(), Some(0), "search succeeds");
    let hits = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            (
                r["chip_id"].as_str().unwrap().to_owned(),
                r["cosine"].as_f64().unwrap(),
            )
        })
        .collect();
    (hits, closing(&o.stderr))
}

/// `rsembed search --json` of a batch: each query line's (chip id, cosine)
/// best first, and the closing line.
fn batch(index: &Path, extra: &[&str]) -> (BTreeMap<usize, Vec<(String, f64)>>, Closing) {
    let o = run(rsembed()
        .args(["search", "--json", "--index"])
        .arg(index)
        .args(extra));
    assert_eq!(o.status.code(), Some(0), "search succeeds");
    let mut by_query: BTreeMap<usize, Vec<(String, f64)>> = BTreeMap::new();
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        let r: Value = serde_json::from_str(l).unwrap();
        by_query
            .entry(r["query"].as_u64().unwrap() as usize)
            .or_default()
            .push((
                r["chip_id"].as_str().unwrap().to_owned(),
                r["cosine"].as_f64().unwrap(),
            ));
    }
    (by_query, closing(&o.stderr))
}

/// The query files `qs` as one `--vectors` file in `dir`, and its lines.
fn vectors_file(dir: &Path, qs: &[PathBuf]) -> (PathBuf, Vec<String>) {
    let vectors = dir.join("vectors.jsonl");
    let lines: Vec<String> = qs
        .iter()
        .map(|q| std::fs::read_to_string(q).unwrap())
        .collect();
    std::fs::write(&vectors, lines.join("\n")).unwrap();
    (vectors, lines)
}

/// A box of the chips' area.
const BBOX: &str = "0,40,5,42.5";

/// `--bbox` on `index` with `--nprobe all` finds the source's chips in the
/// box and prunes row groups: the source's hits, and the index's closing line.
fn boxed_as_the_source(index: &Path, src: &Path, q: &str) -> (Vec<(String, f64)>, Closing) {
    let (in_box, boxed) = search(index, &["--vector", q, "--nprobe", "all", "--bbox", BBOX]);
    let (want, _) = search(src, &["--vector", q, "--bbox", BBOX]);
    assert_eq!(ids(&in_box), ids(&want));
    assert!(boxed.read < boxed.groups, "{boxed:?}");
    (want, boxed)
}

fn ids(h: &[(String, f64)]) -> Vec<&str> {
    h.iter().map(|x| x.0.as_str()).collect()
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.join("chips"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.push((
        "centroids.parquet".into(),
        std::fs::read(dir.join("centroids.parquet")).unwrap(),
    ));
    v.sort();
    v
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn chips(d: &Path) -> String {
    format!("read_parquet('{}/chips/*.parquet')", d.display())
}

fn one(sql: &str) -> Value {
    duckdb(sql)[0][0].clone()
}

#[test]
fn lists_are_deterministic_complete_nearest_and_searched_by_probing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("job");
    let data = clustered(7, ROWS, CENTRES, 0.8);
    write_job(&src, &data, FILES);
    let qs = queries(tmp.path(), &data, QUERIES);
    let flags = [
        "--lists",
        LISTS,
        "--seed",
        "3",
        "--row-group-rows",
        "64",
        "--target-size",
        "1MB",
    ];
    let (a, b) = (tmp.path().join("ivf-a"), tmp.path().join("ivf-b"));
    let summary = compact_ok(&src, &a, &flags);
    compact_ok(&src, &b, &flags);

    // Deterministic: the same files, byte for byte.
    let fa = files(&a);
    assert!(
        fa.len() >= 3,
        "several parts and the centroids: {}",
        fa.len()
    );
    assert!(
        fa == files(&b),
        "two runs with one seed write the same bytes"
    );
    // Another seed, other centroids.
    let c = tmp.path().join("ivf-c");
    compact_ok(&src, &c, &["--lists", LISTS, "--seed", "4"]);
    assert_ne!(
        std::fs::read(c.join("centroids.parquet")).unwrap(),
        std::fs::read(a.join("centroids.parquet")).unwrap()
    );

    // The manifest records the centroids, with their digest.
    let manifest = read_json(&a.join("manifest.json"));
    let ivf = &manifest["ivf"];
    assert_eq!(ivf["lists"], 64);
    assert_eq!(ivf["seed"], 3);
    assert_eq!(ivf["metric"], "dot");
    assert_eq!(ivf["sample"], 64 * 64, "64 rows per list by default");
    assert_eq!(ivf["centroids"]["path"], "centroids.parquet");
    let bytes = std::fs::read(a.join("centroids.parquet")).unwrap();
    assert_eq!(ivf["centroids"]["bytes"], bytes.len() as u64);
    assert_eq!(summary["ivf"], *ivf);
    assert_eq!(manifest["rows"], ROWS as u64);

    // Every row once: the same chip ids, no more rows.
    assert_eq!(
        one(&format!("SELECT count(*) FROM {}", chips(&a))),
        ROWS as u64
    );
    let diff = format!(
        "SELECT count(*) FROM ((SELECT chip_id FROM {s} EXCEPT SELECT chip_id FROM {a}) \
         UNION ALL (SELECT chip_id FROM {a} EXCEPT SELECT chip_id FROM {s}))",
        s = chips(&src),
        a = chips(&a)
    );
    assert_eq!(one(&diff), 0);
    // The embeddings came through unchanged.
    let same = format!(
        "SELECT count(*) FROM {s} s JOIN {a} a USING (chip_id) WHERE s.embedding = a.embedding",
        s = chips(&src),
        a = chips(&a)
    );
    assert_eq!(one(&same), ROWS as u64);

    // Each row's list is its nearest centroid (up to float rounding), and
    // the centroids' `rows` count them.
    let worse = format!(
        "WITH k AS (SELECT list AS l, centroid FROM '{c}/centroids.parquet'), \
         d AS (SELECT chip_id, list, l, list_dot_product(embedding, centroid) AS d FROM {a}, k) \
         SELECT count(*) FROM (SELECT chip_id, max(d) AS best, max(d) FILTER (WHERE l = list) AS own \
         FROM d GROUP BY chip_id) WHERE own IS NULL OR own < best - 1e-5",
        c = a.display(),
        a = chips(&a)
    );
    assert_eq!(one(&worse), 0, "every row is in its nearest list");
    let counts = format!(
        "SELECT count(*) FROM '{c}/centroids.parquet' k FULL JOIN \
         (SELECT list, count(*) AS n FROM {a} GROUP BY list) r USING (list) \
         WHERE coalesce(k.rows, 0) <> coalesce(r.n, 0)",
        c = a.display(),
        a = chips(&a)
    );
    assert_eq!(one(&counts), 0);
    let unit = format!(
        "SELECT count(*) FROM '{}/centroids.parquet' WHERE abs(list_dot_product(centroid, centroid) - 1) > 1e-5",
        a.display()
    );
    assert_eq!(one(&unit), 0, "centroids are unit vectors");

    // Files sorted by list; no row group holds two lists; the cap holds.
    let groups = duckdb(&format!(
        "SELECT stats_min::INT, stats_max::INT, row_group_num_rows FROM parquet_metadata('{}/chips/*.parquet') \
         WHERE path_in_schema = 'list' ORDER BY file_name, row_group_id",
        a.display()
    ));
    let groups: Vec<(i64, i64, i64)> = groups
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g[0].as_i64().unwrap(),
                g[1].as_i64().unwrap(),
                g[2].as_i64().unwrap(),
            )
        })
        .collect();
    assert!(groups.len() > 64, "{}", groups.len());
    assert!(
        groups.iter().all(|g| g.0 == g.1),
        "a row group straddles lists"
    );
    assert!(
        groups.windows(2).all(|w| w[0].0 <= w[1].0),
        "files sorted by list"
    );
    assert!(groups.iter().all(|g| g.2 <= 64));
    // `list` is the last column, after the chip columns.
    let last = one(&format!(
        "SELECT path_in_schema FROM parquet_metadata('{}') WHERE row_group_id = 0 \
         ORDER BY column_id DESC LIMIT 1",
        a.join("chips/part-00000.parquet").display()
    ));
    assert_eq!(last, "list");

    // --nprobe all is the exact search of the source.
    for q in &qs[..5] {
        let q = q.to_str().unwrap();
        let (exact, _) = search(&src, &["--vector", q, "--top-k", "20"]);
        let (all, stats) = search(&a, &["--vector", q, "--top-k", "20", "--nprobe", "all"]);
        assert_eq!(ids(&exact), ids(&all));
        assert_eq!(stats.scored, ROWS as u64);
    }

    // The default probe: recall@10 ≥ 0.95 over the queries, reading a fraction.
    let (mut found, mut exact_mib, mut ivf_mib) = (0usize, 0.0, 0.0);
    for q in &qs {
        let q = q.to_str().unwrap();
        let (exact, e) = search(&src, &["--vector", q]);
        let (probed, p) = search(&a, &["--vector", q]);
        let want: BTreeSet<&str> = ids(&exact).into_iter().collect();
        found += ids(&probed).iter().filter(|i| want.contains(*i)).count();
        assert_eq!((p.rows, p.groups), (ROWS as u64, groups.len() as u64));
        assert!(p.read * 4 < p.groups, "{p:?}: default 8 of 64 lists");
        assert!(p.scored * 4 < p.rows, "{p:?}");
        exact_mib += e.mib;
        ivf_mib += p.mib;
    }
    let recall = found as f64 / (10 * QUERIES) as f64;
    eprintln!("recall@10 {recall:.3}; MiB fetched {ivf_mib:.1} against {exact_mib:.1}");
    assert!(recall >= 0.95, "recall@10 {recall}");
    // 8 of 64 lists are an eighth of the embeddings; every search also reads
    // its files' footers whole, which at 8,000 rows in 164 row groups of 24
    // chip columns (schema 3) are a third of what a probe fetches. At 10^6
    // rows a probe fetches a few per cent of the exact scan (docs/benchmarks.md).
    assert!(
        ivf_mib * 3.5 < exact_mib,
        "{ivf_mib} MiB against {exact_mib}"
    );

    // A batch answers each query as a search of it alone does: its own
    // lists, whatever the other queries probe; and reads their union once.
    let (vectors, _) = vectors_file(tmp.path(), &qs);
    let v = vectors.to_str().unwrap();
    for extra in [
        &[][..],
        &["--nprobe", "1"],
        &["--nprobe", "3", "--top-k", "4"],
    ] {
        let (got, union) = batch(&a, &[&["--vectors", v], extra].concat());
        assert_eq!(got.len(), QUERIES, "every query answers");
        let mut most = 0;
        for (i, q) in qs.iter().enumerate() {
            let (alone, c) = search(&a, &[&["--vector", q.to_str().unwrap()], extra].concat());
            assert_eq!(got[&(i + 1)], alone, "query {} {extra:?}", i + 1);
            most = most.max(c.read);
        }
        assert!(
            union.read >= most && union.read <= union.groups,
            "{union:?}"
        );
    }

    // --nprobe 1 reads fewer groups than the default; `--bbox` still prunes.
    let q0 = qs[0].to_str().unwrap();
    let (_, def) = search(&a, &["--vector", q0]);
    let (_, p1) = search(&a, &["--vector", q0, "--nprobe", "1"]);
    assert!(p1.read < def.read, "{p1:?} {def:?}");
    let bbox = ["--bbox", BBOX];
    let (_, boxed) = boxed_as_the_source(&a, &src, q0);
    let (_, both) = search(&a, &[&["--vector", q0], &bbox[..]].concat());
    assert!(
        both.read < def.read && both.read < boxed.read,
        "{both:?} {def:?} {boxed:?}"
    );

    // --like: a chip's own list is probed first.
    let (hits, _) = search(&src, &["--vector", q0, "--top-k", "1"]);
    let chip = hits[0].0.clone();
    let (like_all, _) = search(&a, &["--like", &chip, "--nprobe", "all"]);
    let (like_exact, _) = search(&src, &["--like", &chip]);
    assert_eq!(ids(&like_all), ids(&like_exact));
    let (like, lp) = search(&a, &["--like", &chip]);
    assert!(lp.read < lp.groups && !ids(&like).contains(&chip.as_str()));
    assert_eq!(like[0].0, like_exact[0].0);

    // The documented DuckDB probe gives `search --nprobe 8`'s top 10.
    let (probe8, _) = search(&a, &["--vector", q0, "--nprobe", "8"]);
    let sql = documented_probe(&a, &qs[0]);
    let rows = duckdb(&sql);
    let got: Vec<(String, f64)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_str().unwrap().to_owned(), r[3].as_f64().unwrap()))
        .collect();
    assert_eq!(ids(&got), ids(&probe8), "{sql}");
    for (g, p) in got.iter().zip(&probe8) {
        assert!((g.1 - p.1).abs() < 1e-5, "{g:?} {p:?}");
    }

    // `--nprobe N` on a dataset without lists is refused; `all` is what it does.
    let o = run(rsembed()
        .args(["search", "--index"])
        .arg(&src)
        .args(["--vector", q0, "--nprobe", "4"]));
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--nprobe") && err.contains("compact --lists"),
        "{err}"
    );
    search(&src, &["--vector", q0, "--nprobe", "all"]);
    let o = run(rsembed()
        .args(["search", "--index"])
        .arg(&a)
        .args(["--vector", q0, "--nprobe", "0"]));
    assert_eq!(o.status.code(), Some(2), "a usage error");

    // An IVF dataset compacts again: with other lists, or without any.
    let again = tmp.path().join("again");
    compact_ok(&a, &again, &["--lists", "16"]);
    assert_eq!(read_json(&again.join("manifest.json"))["ivf"]["lists"], 16);
    assert_eq!(one(&format!("SELECT max(list) FROM {}", chips(&again))), 15);
    let flat = tmp.path().join("flat");
    compact_ok(&a, &flat, &[]);
    assert!(!flat.join("centroids.parquet").exists());
    assert!(read_json(&flat.join("manifest.json")).get("ivf").is_none());
    let cols = one(&format!(
        "SELECT count(*) FROM parquet_metadata('{}') WHERE path_in_schema = 'list'",
        flat.join("chips/part-00000.parquet").display()
    ));
    assert_eq!(cols, 0, "no list column without --lists");
    // int8 lists: k-means and the lists on the dequantised rows, scored as
    // int8; `--nprobe all` is the exact int8 search, the default probes.
    let lists8 = tmp.path().join("ivf-int8");
    compact_ok(
        &src,
        &lists8,
        &["--lists", LISTS, "--seed", "3", "--embedding-type", "int8"],
    );
    let flat8 = tmp.path().join("flat-int8");
    compact_ok(&src, &flat8, &["--embedding-type", "int8"]);
    let (all8, _) = search(&lists8, &["--vector", q0, "--nprobe", "all"]);
    let (exact8, _) = search(&flat8, &["--vector", q0]);
    assert_eq!(ids(&all8), ids(&exact8));
    let (batch8, _) = batch(&lists8, &["--vectors", v]);
    for (i, q) in qs.iter().enumerate().step_by(7) {
        let (alone, _) = search(&lists8, &["--vector", q.to_str().unwrap()]);
        assert_eq!(batch8[&(i + 1)], alone, "int8 query {}", i + 1);
    }
    let (probed8, p8) = search(&lists8, &["--vector", q0]);
    assert!(p8.read < p8.groups, "{p8:?}");
    assert_eq!(probed8[0].0, exact8[0].0);
    assert_eq!(
        one(&format!(
            "SELECT DISTINCT typeof(embedding) FROM {}",
            chips(&lists8)
        )),
        "TINYINT[]"
    );

    // --overwrite of an IVF output by a plain compaction leaves no stale centroids.
    compact_ok(&src, &a, &["--overwrite"]);
    assert!(!a.join("centroids.parquet").exists());
}

/// The ```sql block of docs/querying.md that reads `centroids.parquet`,
/// for dataset `d` and query file `q`, as the page's conventions say.
fn documented_probe(d: &Path, q: &Path) -> String {
    let doc = std::fs::read_to_string(root().join("docs/querying.md")).unwrap();
    let block = doc
        .split("```sql\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.contains("centroids.parquet") && b.contains("LIMIT 8"))
        .expect("docs/querying.md shows the probe");
    block
        .replace("'out/", &format!("'{}/", d.display()))
        .replace("'q.json'", &format!("'{}'", q.display()))
}

#[test]
fn more_lists_than_rows_are_refused_and_lists_may_stay_empty() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("job");
    // Three distinct embeddings: k-means has three points to place five centroids on.
    let three = clustered(11, 3, 3, 0.5);
    assert!(three[0] != three[1] && three[1] != three[2] && three[0] != three[2]);
    let data: Vec<Vec<f32>> = (0..300).map(|i| three[i % 3].clone()).collect();
    write_job(&src, &data, 3);

    let out = tmp.path().join("too-many");
    let o = compact(&src, &out, &["--lists", "301"]);
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--lists 301") && err.contains("300 rows"),
        "{err}"
    );
    assert!(!out.join("manifest.json").exists());
    let o = compact(&src, &out, &["--lists", "20", "--sample", "10"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--sample 10"));
    let o = compact(&src, &out, &["--seed", "1"]);
    assert_eq!(o.status.code(), Some(2), "--seed needs --lists");

    let ivf = tmp.path().join("ivf");
    compact_ok(&src, &ivf, &["--lists", "5"]);
    let m = read_json(&ivf.join("manifest.json"));
    assert_eq!(m["ivf"]["lists"], 5);
    assert_eq!(m["ivf"]["empty_lists"], 2, "{m}");
    let rows = duckdb(&format!(
        "SELECT rows FROM '{}/centroids.parquet' ORDER BY list",
        ivf.display()
    ));
    let rows: Vec<u64> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_u64().unwrap())
        .collect();
    assert_eq!(rows.iter().sum::<u64>(), 300);
    assert_eq!(rows.iter().filter(|&&n| n == 0).count(), 2);
    assert_eq!(rows.iter().filter(|&&n| n == 100).count(), 3);
    // Empty lists have no row group, and a probe skips them: `--nprobe 1`
    // reads the best list that holds rows.
    let q = tmp.path().join("q.json");
    std::fs::write(&q, serde_json::to_vec(&three[1]).unwrap()).unwrap();
    let q = q.to_str().unwrap();
    let (hits, stats) = search(&ivf, &["--vector", q, "--nprobe", "1", "--top-k", "200"]);
    assert_eq!(
        hits.len(),
        100,
        "the best list holds the 100 copies of the query"
    );
    assert!(hits.iter().all(|h| (h.1 - 1.0).abs() < 1e-5));
    assert_eq!(stats.scored, 100);
    let (all, _) = search(&ivf, &["--vector", q, "--top-k", "300"]);
    assert_eq!(all.len(), 300, "the default probes all 5 lists");
}

/// An index of more row groups than the footers it holds
/// (`FOOTER_BUDGET_GROUPS`, 512) reads footers again as it reads their
/// parts, and answers as the source does: exact, probed, batched, boxed and
/// `--like`.
#[test]
fn an_index_beyond_the_footer_budget_answers_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("job");
    let data = clustered(11, 4000, CENTRES, 0.8);
    write_job(&src, &data, FILES);
    let qs = queries(tmp.path(), &data, 6);
    let many = tmp.path().join("many");
    compact_ok(
        &src,
        &many,
        &[
            "--lists",
            "16",
            "--row-group-rows",
            "4",
            "--target-size",
            "256KB",
        ],
    );
    let q0 = qs[0].to_str().unwrap();
    let (_, c) = search(&many, &["--vector", q0, "--nprobe", "all"]);
    assert!(c.groups >= 1000, "{c:?}: beyond the budget of 512 groups");

    // Footers are read again (and say so at debug level).
    let o = run(rsembed()
        .env("RSEMBED_LOG", "rsembed_coordinator=debug")
        .args(["search", "--json", "--nprobe", "all", "--index"])
        .arg(&many)
        .args(["--vector", q0]));
    assert_eq!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("footer read again"), "{err}");

    for q in &qs {
        let q = q.to_str().unwrap();
        let (exact, _) = search(&src, &["--vector", q, "--top-k", "20"]);
        let (all, c) = search(&many, &["--vector", q, "--top-k", "20", "--nprobe", "all"]);
        assert_eq!(ids(&exact), ids(&all));
        assert_eq!(c.scored, 4000);
    }
    let (vectors, lines) = vectors_file(tmp.path(), &qs);
    let (got, _) = batch(&many, &["--vectors", vectors.to_str().unwrap()]);
    for (i, q) in qs.iter().enumerate() {
        let (alone, c) = search(&many, &["--vector", q.to_str().unwrap()]);
        assert!(c.read < c.groups, "{c:?}");
        assert_eq!(got[&(i + 1)], alone, "query {}", i + 1);
    }
    let (want, _) = boxed_as_the_source(&many, &src, q0);
    let chip = want[0].0.clone();
    let (like, _) = search(&many, &["--like", &chip, "--nprobe", "all"]);
    let (like_src, _) = search(&src, &["--like", &chip]);
    assert_eq!(ids(&like), ids(&like_src));

    // `--vectors -`: the index stays open and each line is answered as it
    // arrives, as a search of it alone answers it; a bad line gets an error
    // and the rest go on.
    let mut session = LineSession::start(
        rsembed()
            .args(["search", "--index"])
            .arg(&many)
            .args(["--vectors", "-"]),
        std::time::Duration::from_secs(120),
    );
    let hits = |a: &Value| -> Vec<(String, f64)> {
        a["results"]
            .as_array()
            .unwrap_or_else(|| panic!("{a}"))
            .iter()
            .map(|r| {
                (
                    r["chip_id"].as_str().unwrap().to_owned(),
                    r["cosine"].as_f64().unwrap(),
                )
            })
            .collect()
    };
    // One line, answered before the next is written.
    session.send(&format!("{}\n", lines[0].trim()));
    let a = session.answer();
    assert_eq!(a["query"], 1);
    assert_eq!(hits(&a), search(&many, &["--vector", q0]).0);
    // Several at once, one of them bad, and a blank line that still counts.
    session.send(&format!(
        "[1, 2]\n\n{}\n{}\n",
        lines[1].trim(),
        lines[2].trim()
    ));
    let (bad, a3, a4) = (session.answer(), session.answer(), session.answer());
    assert_eq!(bad["query"], 2);
    assert!(
        bad["error"].as_str().unwrap().contains("2 numbers"),
        "{bad}"
    );
    assert_eq!(
        (a3["query"].as_u64(), a4["query"].as_u64()),
        (Some(4), Some(5))
    );
    assert_eq!(
        hits(&a3),
        search(&many, &["--vector", qs[1].to_str().unwrap()]).0
    );
    assert_eq!(
        hits(&a4),
        search(&many, &["--vector", qs[2].to_str().unwrap()]).0
    );
    let out = session.finish();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(out.stdout.is_empty(), "nothing after the answers");
    assert!(err.contains("(3 queries"), "{err}");
    closing(&out.stderr);

    // Chips a filter excludes for lacking its property are counted on the
    // session's closing line, as a search of a file counts them: these have
    // no datetime, and `--nprobe all` reads every group.
    let resident = |more: &[&str]| {
        LineSession::start(
            rsembed()
                .args(["search", "--index"])
                .arg(&many)
                .args(["--vectors", "-", "--nprobe", "all"])
                .args(more),
            std::time::Duration::from_secs(120),
        )
    };
    let mut session = resident(&["--datetime", "2024-01-01T00:00:00Z/.."]);
    session.send(&format!("{}\n", lines[0].trim()));
    let a = session.answer();
    assert_eq!(a["results"].as_array().map(Vec::len), Some(0), "{a}");
    let out = session.finish();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("; 4000 chips without a datetime excluded by --datetime"),
        "{err}"
    );

    // A resident search reads warm chunks through maps of the files. Files
    // cut short under it (a touch past the new end would be SIGBUS) fail
    // the query with an error naming a file: never a crash.
    let mut session = resident(&[]);
    session.send(&format!("{}\n", lines[0].trim()));
    assert_eq!(hits(&session.answer()), search(&many, &["--vector", q0]).0);
    for e in std::fs::read_dir(many.join("chips")).unwrap() {
        let path = e.unwrap().path();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(f.metadata().unwrap().len() / 2).unwrap();
    }
    session.send(&format!("{}\n", lines[0].trim()));
    let out = session.finish();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "an error, not a crash: {err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains("part-") && last.contains("shrank while it was being searched"),
        "{last}"
    );
}
