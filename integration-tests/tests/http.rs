//! `rsembed run --input http://…` against a real HTTP server with Range
//! support: moto's S3 server, whose public objects answer anonymous GET and
//! HEAD requests at `http://127.0.0.1:<port>/<bucket>/<key>`, as a static
//! web server does. A single file over HTTP gives the rows the same file
//! gives on local disk, read by ranges as on S3; a folder URL, which HTTP
//! cannot list, and a missing file fail clearly and quickly.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use rsembed_integration_tests::s3::S3Server;
use rsembed_integration_tests::*;
use serde_json::Value;

/// Bound on one `rsembed` run: generous for a loaded two-core machine.
const RUN_LIMIT: Duration = Duration::from_secs(180);
/// Bound on a run that must fail: an error must come quickly, not after a hang.
const FAIL_LIMIT: Duration = Duration::from_secs(60);

/// `rsembed run` from `input` (a URL or a path) into the local `output`.
fn run_from(input: &str, output: &Path, extra: &[&str], limit: Duration) -> Output {
    let mut c = run_cmd(Path::new(input), output, &tiny_model());
    c.args(extra);
    // No AWS_* settings: the HTTP store must not need any.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("AWS_") {
            c.env_remove(k);
        }
    }
    run_timeout(&mut c, limit)
}

/// A georeferenced, tiled (256 x 256), Deflate COG of `size` x `size` pixels,
/// upsampled from a committed image by GDAL.
fn make_cog(size: u32, dst: &Path) {
    let (x0, y0) = (500_000.0, 4_200_000.0);
    let extent = 10.0 * f64::from(size);
    let st = Command::new("gdal_translate")
        .args(["-q", "-of", "COG", "-co", "BLOCKSIZE=256"])
        .args(["-co", "COMPRESS=DEFLATE", "-r", "cubic"])
        .args(["-a_srs", "EPSG:32618", "-outsize"])
        .args([size.to_string(), size.to_string()])
        .arg("-a_ullr")
        .args([x0, y0, x0 + extent, y0 - extent].map(|v| v.to_string()))
        .arg(fixture_images().join("aerial_256.png"))
        .arg(dst)
        .status()
        .expect("gdal_translate runs (scripts/setup-test-env.sh installs gdal-bin)");
    assert!(st.success(), "gdal_translate made {}", dst.display());
}

/// Chip rows in a stable order: every column but `chip_id`, `source_uri` and
/// `source_version`, which depend on where the input lives.
fn chips(dataset: &Path) -> Vec<Value> {
    let rows = duckdb(&format!(
        "SELECT x, y, width, height, valid_fraction, crs, hex(geometry::BLOB), \
         bbox.xmin, bbox.ymin, bbox.xmax, bbox.ymax, centre_lon, centre_lat, \
         embedding::FLOAT[] FROM '{}/chips/*.parquet' ORDER BY y, x",
        dataset.display()
    ));
    rows.as_array().unwrap().clone()
}

fn summary(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).expect("--json prints the summary as JSON")
}

/// A moto server holding `local` at `s3://input/<key>`, readable anonymously;
/// returns the object's plain-HTTP URL.
fn serve(s3: &S3Server, local: &Path, key: &str) -> String {
    s3.create_bucket("input");
    let url = format!("s3://input/{key}");
    s3.upload(local, &url);
    s3.make_public(&format!("s3://input/{}", key.rsplit_once('/').unwrap().0));
    s3.http_url(&url)
}

#[test]
fn http_scene_equals_local_and_is_read_by_ranges() {
    let tmp = tempfile::tempdir().unwrap();
    let cog = tmp.path().join("scene.tif");
    make_cog(2048, &cog);
    let size = std::fs::metadata(&cog).unwrap().len();
    assert!(size > 4_000_000, "a few MB: {size}");
    let s3 = S3Server::start();
    let url = serve(&s3, &cog, "cog/scene.tif");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    // The 8 x 8 chip grid in 16 tasks of 2 x 2 chips, as on S3.
    let flags = ["--shard-bytes", "1000000", "--task-size", "4", "--json"];
    let local = tmp.path().join("local");
    let o = run_from(cog.to_str().unwrap(), &local, &flags, RUN_LIMIT);
    assert_eq!(o.status.code(), Some(0), "local run succeeds");
    let out = tmp.path().join("http");
    let o = run_from(&url, &out, &flags, RUN_LIMIT);
    assert_eq!(o.status.code(), Some(0), "run from {url} succeeds");
    let whole = summary(&o);
    assert_eq!(whole["tasks"], 16);
    assert_eq!(whole["chips"], 64);
    let read = whole["bytes_read"].as_u64().unwrap();
    // Each full-resolution tile once (the overviews are not read), plus headers.
    assert!(
        read <= size * 6 / 5 && read >= size / 2,
        "whole run read {read} of a {size}-byte file"
    );

    let (ours, theirs) = (chips(&out), chips(&local));
    assert_eq!(ours.len(), 64);
    assert_eq!(ours, theirs, "the same rows as the local file");
    let uris = duckdb(&format!(
        "SELECT source_uri, count(source_version) = count(*) FROM '{}/chips/*.parquet' GROUP BY 1",
        out.display()
    ));
    assert_eq!(uris[0][0], url, "source_uri is the URL");
    assert_eq!(uris[0][1], true, "source_version is the server's ETag");
    assert_eq!(uris.as_array().unwrap().len(), 1);

    // With one task's file gone, the rerun reads only that block's ranges.
    let mut files: Vec<_> = std::fs::read_dir(out.join("chips"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 16);
    std::fs::remove_file(&files[5]).unwrap();
    let o = run_from(&url, &out, &flags, RUN_LIMIT);
    assert_eq!(o.status.code(), Some(0));
    let one = summary(&o);
    assert_eq!(one["tasks_resumed"], 15);
    assert_eq!(one["chips_embedded"], 4);
    let read = one["bytes_read"].as_u64().unwrap();
    assert!(
        read > 0 && read <= size / 10,
        "one block of 4 of 64 chips read {read} of a {size}-byte file"
    );
    assert_eq!(chips(&out), theirs);
}

#[test]
fn http_folders_and_missing_files_fail_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let img = fixture_images().join("aerial_256.png");
    let s3 = S3Server::start();
    let url = serve(&s3, &img, "imgs/aerial_256.png");

    // A plain image over HTTP is one input too.
    let out = tmp.path().join("one");
    let o = run_from(&url, &out, &["--json"], RUN_LIMIT);
    assert_eq!(o.status.code(), Some(0), "run from {url} succeeds");
    assert_eq!(summary(&o)["chips"], 1);

    let folder = format!("{}/input/imgs/", s3.endpoint());
    for (i, (input, want)) in [
        (folder.as_str(), "HTTP has no listing"),
        (&format!("{}/", s3.endpoint()), "HTTP has no listing"),
        (
            &format!("{}/input/imgs/missing.tif", s3.endpoint()),
            "not found",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let o = run_from(input, &tmp.path().join(format!("fail{i}")), &[], FAIL_LIMIT);
        assert_eq!(o.status.code(), Some(1), "{input} is refused");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{input}: {err}");
        assert!(
            err.contains(input.trim_end_matches('/')),
            "names {input}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert!(!err.contains("scheme is not allowed"), "{err}");
    }
}
