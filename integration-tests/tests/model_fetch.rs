//! `rsembed fetch-model` against a real S3-API server (moto) and the local file
//! system: the fetched directory is byte-identical to the source and gives the
//! same text embeddings through ONNX Runtime; a second fetch skips everything
//! and rewrites nothing; a partial copy resumes; a prefix without a manifest, a
//! malformed manifest and a manifest naming a missing graph fail clearly;
//! the empty `dir/` objects that consoles make for folders are not copied;
//! a file that differs from the digest `rsembed-model.json` records is refused
//! (or, kept from an earlier run, copied again), and a graph ONNX Runtime
//! cannot load is refused even when the model records no digests.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use rsembed_integration_tests::s3::S3Server;
use rsembed_integration_tests::*;
use serde_json::Value;

/// Bound on one command: generous for a loaded two-core machine.
const LIMIT: Duration = Duration::from_secs(120);

/// `rsembed fetch-model --from <from> --to <to> --json`.
fn fetch_cmd(from: &str, to: &Path) -> Command {
    let mut c = rsembed();
    c.args(["fetch-model", "--json", "--from", from, "--to"])
        .arg(to);
    c
}

fn fetch_s3(s3: &S3Server, from: &str, to: &Path) -> Output {
    let mut c = fetch_cmd(from, to);
    s3.configure(&mut c);
    run_timeout(&mut c, LIMIT)
}

fn summary(o: &Output) -> Value {
    assert_eq!(o.status.code(), Some(0), "fetch-model succeeds");
    serde_json::from_slice(&o.stdout).expect("--json prints the summary as JSON")
}

/// Every file under `dir`, by `/`-separated relative path, with its bytes.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                let rel = p.strip_prefix(base).unwrap().to_str().unwrap();
                out.insert(rel.replace('\\', "/"), std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn assert_same_tree(got: &Path, want: &Path) {
    let (g, w) = (tree(got), tree(want));
    assert_eq!(
        g.keys().collect::<Vec<_>>(),
        w.keys().collect::<Vec<_>>(),
        "same files (and no temporary ones)"
    );
    for (k, bytes) in &w {
        assert!(g[k] == *bytes, "{k} differs from the source");
    }
}

/// The committed test model plus a nested file, as a model with ONNX external
/// data has next to its graphs: relative paths below the prefix must survive.
fn model_source(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("src");
    copy_dir(&tiny_model(), &src);
    std::fs::create_dir_all(src.join("weights")).unwrap();
    std::fs::write(src.join("weights/onnx__MatMul_1234"), [7u8; 4096]).unwrap();
    src
}

/// `rsembed text --model <model> "a river"`: one embedding.
fn text_embedding(model: &Path) -> Vec<f64> {
    let o = run_timeout(
        rsembed()
            .args(["text", "--model"])
            .arg(model)
            .arg("a river"),
        LIMIT,
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "rsembed text on {}",
        model.display()
    );
    let line = String::from_utf8(o.stdout).unwrap();
    serde_json::from_str(line.trim()).expect("one JSON array")
}

/// Size, inode and modification time of every file: a rewrite or a rename over
/// a file changes at least one of them.
fn stamps(dir: &Path) -> BTreeMap<String, (u64, u64, i64, i64)> {
    tree(dir)
        .into_keys()
        .map(|k| {
            let m = std::fs::metadata(dir.join(&k)).unwrap();
            (k, (m.len(), m.ino(), m.mtime(), m.mtime_nsec()))
        })
        .collect()
}

#[test]
fn s3_fetch_is_identical_works_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = model_source(tmp.path());
    let files = tree(&src);
    let total: u64 = files.values().map(|b| b.len() as u64).sum();
    let s3 = S3Server::start();
    s3.create_bucket("models");
    s3.upload(&src, "s3://models/siglip/tiny");
    // Folders made in a console leave empty `dir/` objects: not files.
    s3.put_folder_marker("s3://models/siglip/tiny");
    s3.put_folder_marker("s3://models/siglip/tiny/weights");
    let listed = s3.list("s3://models/siglip/tiny");
    assert!(listed.contains(&("weights/".into(), 0)), "{listed:?}");

    // 1. A fresh fetch copies every object, byte for byte, and the copy works.
    let dst = tmp.path().join("emptydir/model");
    let s = summary(&fetch_s3(&s3, "s3://models/siglip/tiny/", &dst));
    assert_eq!(s["files_copied"], files.len() as u64);
    assert_eq!(s["files_skipped"], 0);
    assert_eq!(s["bytes_copied"], total);
    assert_eq!(s["model"], "tiny-siglip");
    assert_same_tree(&dst, &src);
    let ours = text_embedding(&dst);
    let theirs = text_embedding(&tiny_model());
    assert_eq!(ours.len(), 64, "embed_dim of the tiny model");
    let diff = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(diff <= 1e-6, "fetched model embeds differently: {diff}");

    // 2. The same fetch again (a restarted init container): all skipped,
    //    nothing rewritten.
    let before = stamps(&dst);
    let s = summary(&fetch_s3(&s3, "s3://models/siglip/tiny", &dst));
    assert_eq!(s["files_copied"], 0);
    assert_eq!(s["files_skipped"], files.len() as u64);
    assert_eq!(s["bytes_copied"], 0);
    assert_eq!(s["bytes_skipped"], total);
    assert_eq!(stamps(&dst), before, "no file was rewritten");

    // A partial copy: one file gone, one cut short. Only those two are copied.
    std::fs::remove_file(dst.join("text_model.onnx")).unwrap();
    let graph = std::fs::read(dst.join("vision_model.onnx")).unwrap();
    std::fs::write(dst.join("vision_model.onnx"), &graph[..graph.len() / 2]).unwrap();
    let s = summary(&fetch_s3(&s3, "s3://models/siglip/tiny", &dst));
    assert_eq!(s["files_copied"], 2);
    assert_eq!(s["files_skipped"], files.len() as u64 - 2);
    assert_same_tree(&dst, &src);

    // A kept file of the right size whose bytes changed (a disk error, a
    // half-written copy padded by a tool): its digest is checked again, and it
    // alone is copied again.
    let mut graph = std::fs::read(dst.join("text_model.onnx")).unwrap();
    let mid = graph.len() / 2;
    graph[mid] ^= 0x55;
    std::fs::write(dst.join("text_model.onnx"), &graph).unwrap();
    let s = summary(&fetch_s3(&s3, "s3://models/siglip/tiny", &dst));
    assert_eq!(s["files_copied"], 1, "{s}");
    assert_eq!(s["files_skipped"], files.len() as u64 - 1, "{s}");
    assert_eq!(s["files_verified"], recorded(&src), "{s}");
    assert_eq!(s["graphs_parsed"], 3, "{s}");
    assert_same_tree(&dst, &src);
}

/// How many files the model's `rsembed-model.json` records digests for.
fn recorded(model: &Path) -> u64 {
    let m: Value =
        serde_json::from_slice(&std::fs::read(model.join("rsembed-model.json")).unwrap()).unwrap();
    m["files"].as_object().map_or(0, |f| f.len() as u64)
}

/// Drops the `files` record from a model's manifest, as a model exported
/// before the record existed has none.
fn strip_digests(model: &Path) {
    let p = model.join("rsembed-model.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    m.as_object_mut().unwrap().remove("files");
    std::fs::write(&p, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}

/// Hex SHA-256 of a file, by Python's hashlib (not rsembed's own code).
fn sha256_of(path: &Path) -> String {
    let o = run(std::process::Command::new(python())
        .args([
            "-c",
            "import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())",
        ])
        .arg(path));
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap().trim().to_owned()
}

#[test]
fn s3_fetch_refuses_a_graph_corrupted_at_the_right_size() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    copy_dir(&tiny_model(), &src);
    assert!(recorded(&src) >= 3, "the test model records its digests");
    let recorded_sha = sha256_of(&src.join("vision_model.onnx"));
    // One byte changed in the middle of the graph (its weights): same size,
    // a graph ONNX Runtime may well load, different embeddings.
    let mut graph = std::fs::read(src.join("vision_model.onnx")).unwrap();
    let mid = graph.len() / 2;
    graph[mid] ^= 0x01;
    std::fs::write(src.join("vision_model.onnx"), &graph).unwrap();
    let corrupted_sha = sha256_of(&src.join("vision_model.onnx"));
    let s3 = S3Server::start();
    s3.create_bucket("models");
    s3.upload(&src, "s3://models/corrupt");

    let dst = tmp.path().join("dst");
    let o = fetch_s3(&s3, "s3://models/corrupt", &dst);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("s3://models/corrupt/vision_model.onnx: sha256 digest mismatch")
            && stderr.contains(&corrupted_sha)
            && stderr.contains(&format!("rsembed-model.json records {recorded_sha}")),
        "{stderr}"
    );
    assert!(
        !dst.join("vision_model.onnx").exists(),
        "the corrupted graph is not left in place"
    );
    let left: Vec<String> = tree(&dst).into_keys().collect();
    assert!(
        left.iter().all(|k| !k.ends_with(".rsembed-partial")),
        "no temporary file is left: {left:?}"
    );
}

#[test]
fn s3_fetch_without_digests_lets_onnx_runtime_parse_the_graphs() {
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    s3.create_bucket("models");

    // A model without the record, intact: every graph is parsed.
    let plain = tmp.path().join("plain");
    copy_dir(&tiny_model(), &plain);
    strip_digests(&plain);
    s3.upload(&plain, "s3://models/plain");
    let dst = tmp.path().join("dst-plain");
    let s = summary(&fetch_s3(&s3, "s3://models/plain", &dst));
    assert_eq!(s["files_verified"], 0, "{s}");
    assert_eq!(s["graphs_parsed"], 3, "{s}");

    // Truncated text graph, garbled fp16 graph: ONNX Runtime's parse fails,
    // naming the file.
    for (name, damage) in [
        ("text_model.onnx", "truncated"),
        ("vision_model_fp16.onnx", "garbled"),
    ] {
        let src = tmp.path().join(damage);
        copy_dir(&tiny_model(), &src);
        strip_digests(&src);
        let mut graph = std::fs::read(src.join(name)).unwrap();
        if damage == "truncated" {
            graph.truncate(graph.len() / 3);
        } else {
            graph[..4096].iter_mut().for_each(|b| *b = !*b);
        }
        std::fs::write(src.join(name), &graph).unwrap();
        let url = format!("s3://models/{damage}");
        s3.upload(&src, &url);
        let dst = tmp.path().join(format!("dst-{damage}"));
        let o = fetch_s3(&s3, &url, &dst);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{damage}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "{}: ONNX Runtime cannot load this graph (fetched from {url}/{name})",
                dst.join(name).display()
            )),
            "{damage}: {stderr}"
        );
        assert!(!stderr.contains("ready"), "{stderr}");

        // `--check-graphs never` skips the parse, and says so.
        let mut c = fetch_cmd(&url, &dst);
        c.args(["--check-graphs", "never"]);
        s3.configure(&mut c);
        let s = summary(&run_timeout(&mut c, LIMIT));
        assert_eq!(s["graphs_parsed"], 0, "{s}");
        assert_eq!(s["graphs_not_parsed"], "--check-graphs never", "{s}");
    }
}

#[test]
fn s3_fetch_refuses_what_is_not_a_model() {
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    s3.create_bucket("models");

    // No manifest: nothing is copied, and the message says why.
    let no_manifest = tmp.path().join("no-manifest");
    copy_dir(&tiny_model(), &no_manifest);
    std::fs::remove_file(no_manifest.join("rsembed-model.json")).unwrap();
    s3.upload(&no_manifest, "s3://models/no-manifest");
    let dst = tmp.path().join("dst-a");
    let o = fetch_s3(&s3, "s3://models/no-manifest", &dst);
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(
            "s3://models/no-manifest is not an rsembed model directory: \
             rsembed-model.json not found"
        ),
        "{stderr}"
    );
    assert!(!dst.exists(), "nothing was copied");

    // A malformed manifest is refused before any graph is copied.
    let malformed = tmp.path().join("malformed");
    copy_dir(&tiny_model(), &malformed);
    std::fs::write(malformed.join("rsembed-model.json"), r#"{"format": 1}"#).unwrap();
    s3.upload(&malformed, "s3://models/malformed");
    let dst = tmp.path().join("dst-b");
    let o = fetch_s3(&s3, "s3://models/malformed", &dst);
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("s3://models/malformed/rsembed-model.json") && stderr.contains("parse"),
        "{stderr}"
    );
    assert!(!dst.exists(), "nothing was copied");

    // A manifest recording a file that is not there: refused before the copy.
    let unlisted = tmp.path().join("unlisted");
    copy_dir(&tiny_model(), &unlisted);
    std::fs::remove_file(unlisted.join("vision_model_fp16.onnx")).unwrap();
    s3.upload(&unlisted, "s3://models/unlisted");
    let dst = tmp.path().join("dst-u");
    let o = fetch_s3(&s3, "s3://models/unlisted", &dst);
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(
            "s3://models/unlisted/rsembed-model.json records vision_model_fp16.onnx, \
             but s3://models/unlisted/vision_model_fp16.onnx does not exist"
        ),
        "{stderr}"
    );
    assert!(!dst.exists(), "nothing was copied");

    // A manifest (without digests) naming a graph that is not there: the copy
    // runs, then the check names the missing file.
    let missing = tmp.path().join("missing-graph");
    copy_dir(&tiny_model(), &missing);
    strip_digests(&missing);
    std::fs::remove_file(missing.join("vision_model_fp16.onnx")).unwrap();
    s3.upload(&missing, "s3://models/missing-graph");
    let dst = tmp.path().join("dst-c");
    let o = fetch_s3(&s3, "s3://models/missing-graph", &dst);
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("is not valid"), "{stderr}");
    assert!(
        stderr.contains(&dst.join("vision_model_fp16.onnx").display().to_string())
            && stderr.contains("missing"),
        "{stderr}"
    );
    assert_same_tree(&dst, &missing);
}

#[test]
fn local_path_and_env_vars_work_too() {
    let tmp = tempfile::tempdir().unwrap();
    let src = model_source(tmp.path());

    // A plain path, with the flags given through the environment.
    let dst = tmp.path().join("plain");
    let mut c = rsembed();
    c.args(["fetch-model", "--json"])
        .env("RSEMBED_FETCH_FROM", &src)
        .env("RSEMBED_FETCH_TO", &dst);
    let s = summary(&run_timeout(&mut c, LIMIT));
    assert_eq!(s["files_copied"], tree(&src).len() as u64);
    assert_same_tree(&dst, &src);

    // A file:// URL, and the text summary.
    let dst = tmp.path().join("url");
    let url = format!("file://{}", src.display());
    let o = run_timeout(
        rsembed()
            .args(["fetch-model", "--from", &url, "--to"])
            .arg(&dst),
        LIMIT,
    );
    assert_eq!(o.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("tiny-siglip ready"), "{stdout}");
    assert!(stdout.contains(&dst.display().to_string()), "{stdout}");
    assert_same_tree(&dst, &src);
}
