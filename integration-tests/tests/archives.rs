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
