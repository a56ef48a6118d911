//! Tar archives of chips: streamed, members named `<archive>#<member>`, hostile
//! members recorded as errors.

use std::process::Command;

use rsembed_integration_tests::*;

/// Writes an archive with Python's tarfile, which (unlike most tools) lets a
/// test store the hostile entries as they are.
fn make_archive(path: &std::path::Path, gz: bool) {
    let script = r#"
import io, sys, tarfile, os
out, src, gz = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
with tarfile.open(out, "w:gz" if gz else "w") as t:
    for name in sorted(os.listdir(src)):
        t.add(os.path.join(src, name), arcname="chips/" + name)
    def add(name, data, **kw):
        ti = tarfile.TarInfo(name); ti.size = len(data)
        for k, v in kw.items(): setattr(ti, k, v)
        t.addfile(ti, io.BytesIO(data))
    add("../escape.png", b"x")
    add("/abs/path.png", b"x")
    add("notes.jpg", b"not a jpeg at all")
    link = tarfile.TarInfo("link.png"); link.type = tarfile.SYMTYPE; link.linkname = "/etc/passwd"
    t.addfile(link)
    add("README.txt", b"skipped: not an image")
"#;
    let st = Command::new(python())
        .args(["-c", script])
        .arg(path)
        .arg(fixture_images())
        .arg(if gz { "1" } else { "0" })
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn tar_and_tar_gz_members_become_chips_and_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    make_archive(&input.join("a.tar"), false);
    make_archive(&input.join("b.tar.gz"), true);
    let out = tmp.path().join("out");
    let o = run(&mut run_cmd(&input, &out, &tiny_model()));
    assert_eq!(o.status.code(), Some(3), "finished with failed members");
    let images = std::fs::read_dir(fixture_images()).unwrap().count() as u64;
    let glob = format!("{}/chips/*.parquet", out.display());
    let rows = duckdb(&format!(
        "SELECT count(*), count(DISTINCT source_uri), min(source_uri) FROM '{glob}'"
    ));
    assert_eq!(
        rows[0][0],
        2 * images,
        "every image member of both archives"
    );
    assert_eq!(rows[0][1], 2 * images);
    let first = rows[0][2].as_str().unwrap();
    assert!(first.ends_with("a.tar#chips/aerial_256.png"), "{first}");
    let errors = duckdb(&format!(
        "SELECT source_uri, error FROM '{}/errors/*.parquet' ORDER BY 1",
        out.display()
    ));
    let errs: Vec<String> = errors
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_str().unwrap().to_owned())
        .collect();
    for archive in ["a.tar", "b.tar.gz"] {
        for member in ["../escape.png", "/abs/path.png", "notes.jpg", "link.png"] {
            assert!(
                errs.iter()
                    .any(|e| e.ends_with(&format!("{archive}#{member}"))),
                "{archive}#{member} is an error row: {errs:?}"
            );
        }
    }
    assert_eq!(errs.len(), 8, "README.txt is skipped, not an error");
    // Embeddings of members equal those of the same files on disk.
    let same = duckdb(&format!(
        "SELECT count(DISTINCT embedding::FLOAT[]::VARCHAR) FROM '{glob}' \
         WHERE source_uri LIKE '%#chips/aerial_256.png'"
    ));
    assert_eq!(
        same[0][0], 1,
        "plain and gzip archives give the same embedding"
    );
}

/// Every column but those naming the input (`chip_id`, `source_uri`,
/// `source_version`), keyed by the file or member name, in a stable order.
fn rows_by_name(out: &std::path::Path) -> serde_json::Value {
    duckdb(&format!(
        "SELECT regexp_extract(source_uri, '[^/#]+$'), x, y, width, height, valid_fraction, crs, \
         hex(geometry::BLOB), bbox.xmin, bbox.ymin, bbox.xmax, bbox.ymax, centre_lon, centre_lat, \
         embedding::FLOAT[] FROM '{}/chips/*.parquet' ORDER BY 1, y, x",
        out.display()
    ))
}

/// GeoTIFFs in a tar are read by the same reader as GeoTIFF files: the same
/// chip grid, pixels (JPEG tiles, the 16-bit stretch), nodata and footprints.
#[test]
fn tiff_members_give_the_rows_of_the_same_files() {
    use rsembed_integration_tests::rasters::{make_geotiff16, make_jpeg_geotiff, Scene16};
    let tmp = tempfile::tempdir().unwrap();
    let files = tmp.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    make_jpeg_geotiff(&files.join("jpeg_600.tif"), 600);
    // 700 x 500 in 256 chips is a 3 x 2 grid; the bottom-right chip is all
    // nodata and dropped, the top-left one partly nodata.
    let scene = Scene16 {
        width: 700,
        height: 500,
        tile: 256,
        nodata: Some(((512, 256), (150, 100))),
    };
    make_geotiff16(&files.join("u16_nodata.tif"), scene);
    std::fs::copy(
        fixture_images().join("aerial_256_lzw.tif"),
        files.join("plain.tif"),
    )
    .unwrap();
    let tarred = tmp.path().join("tarred");
    std::fs::create_dir_all(&tarred).unwrap();
    let st = Command::new(python())
        .args([
            "-c",
            "import sys, tarfile, os\n\
             with tarfile.open(sys.argv[1], 'w') as t:\n\
             \x20   for n in sorted(os.listdir(sys.argv[2])):\n\
             \x20       t.add(os.path.join(sys.argv[2], n), arcname='scenes/' + n)\n",
        ])
        .arg(tarred.join("scenes.tar"))
        .arg(&files)
        .status()
        .unwrap();
    assert!(st.success());

    // One chip per call, so the embeddings do not depend on how chips were batched.
    let embed = |input: &std::path::Path, out: &std::path::Path| {
        let o = run(run_cmd(input, out, &tiny_model()).args(["--batch-size", "1"]));
        assert_eq!(o.status.code(), Some(0), "run on {}", input.display());
    };
    let (out_files, out_tar) = (tmp.path().join("out-files"), tmp.path().join("out-tar"));
    embed(&files, &out_files);
    embed(&tarred, &out_tar);
    let (want, got) = (rows_by_name(&out_files), rows_by_name(&out_tar));
    let count = |name: &str| {
        want.as_array()
            .unwrap()
            .iter()
            .filter(|r| r[0] == name)
            .count()
    };
    assert_eq!(count("jpeg_600.tif"), 9, "a 3 x 3 grid");
    assert_eq!(count("u16_nodata.tif"), 5, "the all-nodata chip is dropped");
    assert_eq!(
        count("plain.tif"),
        1,
        "a plain TIFF is one whole-image chip"
    );
    let partly = want
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r[0] == "u16_nodata.tif")
        .map(|r| r[5].as_f64().unwrap())
        .filter(|v| *v < 1.0)
        .count();
    assert!(partly >= 2, "nodata lowers valid_fraction: {want}");
    assert_eq!(got, want, "a tar member gives the rows of the same file");

    let uris = duckdb(&format!(
        "SELECT source_uri, count(geometry) > 0 FROM '{}/chips/*.parquet' GROUP BY 1 ORDER BY 1",
        out_tar.display()
    ));
    let archive = tarred.join("scenes.tar");
    for (row, (name, georeferenced)) in uris.as_array().unwrap().iter().zip([
        ("jpeg_600.tif", true),
        ("plain.tif", false),
        ("u16_nodata.tif", true),
    ]) {
        let uri = row[0].as_str().unwrap();
        assert!(
            uri.starts_with("file://")
                && uri.ends_with(&format!("{}#scenes/{name}", archive.display())),
            "{uri}"
        );
        assert_eq!(row[1], georeferenced, "{uri}");
    }

    // A TIFF member cut short, or TIFF magic followed by junk, is an error row
    // naming the member, as the same file would be.
    let bad = tmp.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    let st = Command::new(python())
        .args([
            "-c",
            "import sys, io, tarfile\n\
             data = open(sys.argv[2], 'rb').read()\n\
             with tarfile.open(sys.argv[1], 'w') as t:\n\
             \x20   for name, b in [('cut.tif', data[:3000]), ('junk.tif', b'II*\\0' + bytes(range(256)) * 4)]:\n\
             \x20       ti = tarfile.TarInfo(name); ti.size = len(b); t.addfile(ti, io.BytesIO(b))\n",
        ])
        .arg(bad.join("broken.tar"))
        .arg(files.join("u16_nodata.tif"))
        .status()
        .unwrap();
    assert!(st.success());
    let out_bad = tmp.path().join("out-bad");
    let o = run(&mut run_cmd(&bad, &out_bad, &tiny_model()));
    assert_eq!(o.status.code(), Some(3), "finished with failed members");
    let errors = duckdb(&format!(
        "SELECT regexp_extract(source_uri, '[^/]+$'), stage FROM '{}/errors/*.parquet' ORDER BY 1",
        out_bad.display()
    ));
    assert_eq!(
        errors,
        serde_json::json!([
            ["broken.tar#cut.tif", "decode"],
            ["broken.tar#junk.tif", "decode"]
        ])
    );
}
