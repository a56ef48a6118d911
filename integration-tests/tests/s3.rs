//! `rsembed run` against a real S3-API server (moto, `python -m moto.server`):
//! input and output on S3 give the same chips as the same files on local disk,
//! a COG task reads only its own tiles through range requests, a rerun resumes,
//! and missing objects, bad credentials and a dead endpoint fail clearly and
//! quickly.
//!
//! Each test starts its own server on its own port, so tests do not share state.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rsembed_integration_tests::s3::S3Server;
use rsembed_integration_tests::*;
use serde_json::Value;

/// Bound on one `rsembed` run: generous for a loaded two-core machine.
const RUN_LIMIT: Duration = Duration::from_secs(180);
/// Bound on a run that must fail: an error must come quickly, not after a hang.
const FAIL_LIMIT: Duration = Duration::from_secs(60);

/// `rsembed run` pointed at the server, bounded by `limit`.
fn run_s3(s3: &S3Server, input: &str, output: &str, extra: &[&str], limit: Duration) -> Output {
    let mut c = run_cmd(Path::new(input), Path::new(output), &tiny_model());
    c.args(extra);
    s3.configure(&mut c);
    run_timeout(&mut c, limit)
}

fn run_local(input: &Path, output: &Path, extra: &[&str]) -> Output {
    run_timeout(run_cmd(input, output, &tiny_model()).args(extra), RUN_LIMIT)
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

/// A georeferenced, tiled (256 x 256), Deflate COG of `size` x `size` pixels,
/// upsampled from a committed image by GDAL.
fn make_cog(size: u32, dst: &Path) {
    let (x0, y0) = (500_000.0, 4_200_000.0);
    let extent = 10.0 * f64::from(size);
    let st = Command::new("gdal_translate")
        .args([
            "-q",
            "-of",
            "COG",
            "-co",
            "BLOCKSIZE=256",
            "-co",
            "COMPRESS=DEFLATE",
        ])
        .args(["-r", "cubic", "-a_srs", "EPSG:32618", "-outsize"])
        .args([size.to_string(), size.to_string()])
        .arg("-a_ullr")
        .args([x0, y0, x0 + extent, y0 - extent].map(|v| v.to_string()))
        .arg(fixture_images().join("aerial_256.png"))
        .arg(dst)
        .status()
        .expect("gdal_translate runs (scripts/setup-test-env.sh installs gdal-bin)");
    assert!(st.success(), "gdal_translate made {}", dst.display());
}

/// The test input: the committed images, two committed georeferenced TIFFs
/// (45 x 37, one with nodata) and a generated 600 x 600 COG (a 3 x 3 chip grid).
fn fixture_set(dir: &Path) -> PathBuf {
    let set = dir.join("set");
    copy_dir(&fixture_images(), &set.join("images"));
    let geo = set.join("geo");
    std::fs::create_dir_all(&geo).unwrap();
    for f in ["u8_deflate_tp.tif", "u8_nodata_deflate_tb.tif"] {
        std::fs::copy(root().join("fixtures/tiff").join(f), geo.join(f)).unwrap();
    }
    make_cog(600, &geo.join("scene_600.tif"));
    set
}

/// Chip rows of a dataset, with `source_uri` relative to `input_root`, in a
/// stable order: every column but `chip_id` and `source_version`, which depend on
/// where the input lives.
fn chips(dataset: &Path, input_root: &str) -> Vec<Value> {
    let rows = duckdb(&format!(
        "SELECT replace(source_uri, '{input_root}', ''), x, y, width, height, valid_fraction, \
         crs, hex(geometry::BLOB), bbox.xmin, bbox.ymin, bbox.xmax, bbox.ymax, \
         centre_lon, centre_lat, embedding::FLOAT[] \
         FROM '{}/chips/*.parquet' ORDER BY 1, y, x",
        dataset.display()
    ));
    rows.as_array().unwrap().clone()
}

/// Same windows, footprints and metadata exactly; embeddings within 1e-6.
fn assert_same_chips(ours: &[Value], theirs: &[Value]) {
    assert_eq!(ours.len(), theirs.len(), "chip count");
    for (a, b) in ours.iter().zip(theirs) {
        let (a, b) = (a.as_array().unwrap(), b.as_array().unwrap());
        assert_eq!(a[..14], b[..14], "chip window, footprint and metadata");
        let (ea, eb) = (a[14].as_array().unwrap(), b[14].as_array().unwrap());
        assert_eq!(ea.len(), eb.len());
        let diff = ea
            .iter()
            .zip(eb)
            .map(|(x, y)| (x.as_f64().unwrap() - y.as_f64().unwrap()).abs())
            .fold(0.0, f64::max);
        assert!(diff <= 1e-6, "{}: embedding max abs diff {diff}", a[0]);
    }
}

/// The `file://` URL rsembed gives a local path: absolute, `.` and `..` removed
/// without resolving links.
fn file_url(p: &Path) -> String {
    let mut abs = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                abs.pop();
            }
            std::path::Component::CurDir => {}
            other => abs.push(other),
        }
    }
    format!("file://{}", abs.display())
}

fn summary(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).expect("--json prints the summary as JSON")
}

/// Fresh server with `input` and `output` buckets.
fn server() -> S3Server {
    let s3 = S3Server::start();
    s3.create_bucket("input");
    s3.create_bucket("output");
    s3
}

#[test]
fn s3_input_and_output_equal_local_run() {
    let tmp = tempfile::tempdir().unwrap();
    let set = fixture_set(tmp.path());
    let s3 = server();
    s3.upload(&set, "s3://input/set");

    let local = tmp.path().join("local");
    assert_eq!(run_local(&set, &local, &[]).status.code(), Some(0));
    let o = run_s3(&s3, "s3://input/set", "s3://output/job", &[], RUN_LIMIT);
    assert_eq!(o.status.code(), Some(0), "run on S3 succeeds");
    assert!(String::from_utf8_lossy(&o.stdout).contains("s3://output/job/chips/*.parquet"));

    // The dataset is on S3: job.json, manifest.json and the chip files it lists.
    let objects = s3.list("s3://output/job");
    let names: Vec<&str> = objects.iter().map(|(k, _)| k.as_str()).collect();
    assert!(names.contains(&"job.json"), "{names:?}");
    assert!(names.contains(&"manifest.json"), "{names:?}");
    assert!(
        !names.iter().any(|n| n.contains("write-probe")),
        "the write probe is removed: {names:?}"
    );
    let dl = tmp.path().join("dl");
    s3.download("s3://output/job", &dl);
    let manifest = read_json(&dl.join("manifest.json"));
    let job = read_json(&dl.join("job.json"));
    assert_eq!(job["input"], "s3://input/set");
    assert_eq!(job["output"], "s3://output/job");
    assert_eq!(job["job_id"], manifest["job_id"]);
    assert_eq!(manifest["failed_inputs"], 0);
    let mut listed: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| n.starts_with("chips/"))
        .collect();
    let files = manifest_list(&dl, "files", "kind = 'chips'");
    let mut in_manifest: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
    listed.sort_unstable();
    in_manifest.sort_unstable();
    assert_eq!(listed, in_manifest, "the manifest lists the chip objects");

    let ours = chips(&dl, "s3://input/set");
    let theirs = chips(&local, &file_url(&set));
    assert_eq!(manifest["rows"], ours.len() as u64);
    let scene_chips = ours.iter().filter(|r| r[0] == "/geo/scene_600.tif").count();
    assert_eq!(scene_chips, 9, "the 600 x 600 COG is a 3 x 3 grid");
    assert!(
        ours.iter().filter(|r| !r[7].is_null()).count() >= 11,
        "georeferenced chips have footprints"
    );
    assert_same_chips(&ours, &theirs);

    let uris = duckdb(&format!(
        "SELECT count(*) FILTER (WHERE starts_with(source_uri, 's3://input/set/')), \
         count(source_version), count(*) FROM '{}/chips/*.parquet'",
        dl.display()
    ));
    assert_eq!(uris[0][0], uris[0][2], "every source_uri is an s3:// URL");
    assert_eq!(
        uris[0][1], uris[0][2],
        "every chip has a source_version (ETag)"
    );
}

#[test]
fn cog_task_reads_only_its_tiles() {
    let tmp = tempfile::tempdir().unwrap();
    let cog = tmp.path().join("scene.tif");
    make_cog(2048, &cog);
    let size = std::fs::metadata(&cog).unwrap().len();
    assert!(size > 4_000_000, "a few MB: {size}");
    let s3 = server();
    s3.upload(&cog, "s3://input/cog/scene.tif");

    // Split the 8 x 8 chip grid into 16 tasks of 2 x 2 chips.
    let flags = ["--shard-bytes", "1000000", "--task-size", "4", "--json"];
    let o = run_s3(&s3, "s3://input/cog", "s3://output/cog", &flags, RUN_LIMIT);
    assert_eq!(o.status.code(), Some(0));
    let whole = summary(&o);
    assert_eq!(whole["tasks"], 16);
    assert_eq!(whole["chips"], 64);
    let read = whole["bytes_read"].as_u64().unwrap();
    // Each full-resolution tile once (the overviews are not read), plus headers.
    assert!(
        read <= size * 6 / 5 && read >= size / 2,
        "whole run read {read} of a {size}-byte object"
    );

    // Rerunning with one task's file gone runs that task alone: its bytes are
    // what one 2 x 2 block of chips fetches.
    let files = s3.list("s3://output/cog/chips");
    assert_eq!(files.len(), 16);
    s3.delete(&format!("s3://output/cog/chips/{}", files[5].0));
    let o = run_s3(&s3, "s3://input/cog", "s3://output/cog", &flags, RUN_LIMIT);
    assert_eq!(o.status.code(), Some(0));
    let one = summary(&o);
    assert_eq!(one["tasks_resumed"], 15);
    assert_eq!(one["chips_embedded"], 4);
    let read = one["bytes_read"].as_u64().unwrap();
    assert!(
        read > 0 && read <= size / 10,
        "one block of 4 of 64 chips read {read} of a {size}-byte object"
    );
}

#[test]
fn rerun_on_s3_redoes_only_the_missing_task() {
    let tmp = tempfile::tempdir().unwrap();
    let set = fixture_set(tmp.path());
    let s3 = server();
    s3.upload(&set, "s3://input/set");
    let flags = ["--task-size", "2", "--json"];

    let o = run_s3(&s3, "s3://input/set", "s3://output/job", &flags, RUN_LIMIT);
    assert_eq!(o.status.code(), Some(0));
    let first = summary(&o);
    let tasks = first["tasks"].as_u64().unwrap();
    assert!(tasks >= 3, "several tasks: {tasks}");
    let before = tmp.path().join("before");
    s3.download("s3://output/job", &before);
    let files = manifest_list(&before, "files", "true ORDER BY path");

    let victim = &files[1];
    s3.delete(&format!(
        "s3://output/job/{}",
        victim["path"].as_str().unwrap()
    ));
    let o = run_s3(&s3, "s3://input/set", "s3://output/job", &flags, RUN_LIMIT);
    assert_eq!(o.status.code(), Some(0));
    let second = summary(&o);
    assert_eq!(second["tasks"], tasks);
    assert_eq!(
        second["tasks_resumed"],
        tasks - 1,
        "only the missing task ran"
    );
    assert_eq!(second["chips_embedded"], victim["rows"]);
    assert_eq!(second["chips"], first["chips"]);

    let after = tmp.path().join("after");
    s3.download("s3://output/job", &after);
    assert_eq!(
        files,
        manifest_list(&after, "files", "true ORDER BY path"),
        "the redone task wrote the same bytes"
    );
    assert_eq!(
        chips(&before, "s3://input/set"),
        chips(&after, "s3://input/set")
    );
}

#[test]
fn missing_bucket_fails_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let s3 = server();
    let started = Instant::now();
    let o = run_s3(
        &s3,
        "s3://no-such-bucket/scenes",
        tmp.path().join("out").to_str().unwrap(),
        &[],
        FAIL_LIMIT,
    );
    assert_eq!(o.status.code(), Some(1), "a fatal error, not exit 0 or 3");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("NoSuchBucket"), "{stderr}");
    assert!(stderr.contains("no-such-bucket"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(30), "no retry loop");
}

#[test]
fn missing_prefix_fails_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let s3 = server();
    s3.upload(&fixture_images(), "s3://input/images");
    let o = run_s3(
        &s3,
        "s3://input/no/such/prefix",
        tmp.path().join("out").to_str().unwrap(),
        &[],
        FAIL_LIMIT,
    );
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("s3://input/no/such/prefix"), "{stderr}");
}

#[test]
fn bad_credentials_fail_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::start_with_auth();
    s3.create_bucket("input");
    s3.create_bucket("output");
    s3.upload(&fixture_images(), "s3://input/images");
    let out = |n: &str| tmp.path().join(n).to_str().unwrap().to_owned();

    // The right keys work, so the failures below are the keys' doing.
    let o = run_s3(&s3, "s3://input/images", &out("good"), &[], RUN_LIMIT);
    assert_eq!(o.status.code(), Some(0));

    let cases = [
        (
            "AWS_SECRET_ACCESS_KEY",
            "wrong-secret",
            "SignatureDoesNotMatch",
        ),
        (
            "AWS_ACCESS_KEY_ID",
            "AKIAUNKNOWNKEY000000",
            "InvalidAccessKeyId",
        ),
    ];
    for (var, value, code) in cases {
        for (input, output, says) in [
            ("s3://input/images", out(var), "list"),
            (
                "s3://input/images",
                "s3://output/job".to_owned(),
                // The first access to an output reads its job.json.
                "cannot read s3://output/job/job.json",
            ),
        ] {
            let mut c = run_cmd(Path::new(input), Path::new(&output), &tiny_model());
            s3.configure(&mut c).env(var, value);
            let started = Instant::now();
            let o = run_timeout(&mut c, FAIL_LIMIT);
            assert_eq!(o.status.code(), Some(1), "{var} wrong: a fatal error");
            let stderr = String::from_utf8_lossy(&o.stderr);
            assert!(stderr.contains(code), "{var} wrong: {stderr}");
            assert!(stderr.contains(says), "{var} wrong: {stderr}");
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "a 403 is not retried"
            );
        }
    }
}

#[test]
fn dead_endpoint_fails_within_bounded_retries() {
    let tmp = tempfile::tempdir().unwrap();
    let s3 = server();
    let endpoint = s3.endpoint();
    let mut c = run_cmd(
        Path::new("s3://input/images"),
        &tmp.path().join("out"),
        &tiny_model(),
    );
    s3.configure(&mut c);
    drop(s3);
    let o = run_timeout(&mut c, FAIL_LIMIT);
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(endpoint.trim_start_matches("http://")),
        "the error names the endpoint: {stderr}"
    );
}

#[test]
#[allow(clippy::print_stderr)]
fn shared_rgb_byte_via_s3_equals_local() {
    let Some(file) = shared_data()
        .map(|d| d.join("geotiff/rasterio/RGB.byte.tif"))
        .filter(|p| p.is_file())
    else {
        skipped("../shared/data/geotiff/rasterio/RGB.byte.tif is not in this checkout");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let s3 = server();
    // A single object as the input, not a prefix.
    s3.upload(&file, "s3://input/rasterio/RGB.byte.tif");
    let local = tmp.path().join("local");
    assert_eq!(run_local(&file, &local, &[]).status.code(), Some(0));
    let o = run_s3(
        &s3,
        "s3://input/rasterio/RGB.byte.tif",
        "s3://output/rgb",
        &[],
        RUN_LIMIT,
    );
    assert_eq!(o.status.code(), Some(0));
    let dl = tmp.path().join("dl");
    s3.download("s3://output/rgb", &dl);
    let ours = chips(&dl, "s3://input/rasterio/RGB.byte.tif");
    let theirs = chips(&local, &file_url(&file));
    assert!((9..=12).contains(&ours.len()), "{} chips", ours.len());
    assert_same_chips(&ours, &theirs);
}
