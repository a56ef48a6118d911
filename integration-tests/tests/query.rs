//! `rsembed search` and `rsembed classify` on a real dataset: rankings, scores
//! and labels checked against numpy over the Parquet files and the Hugging
//! Face text embeddings of the test model (python/check_query.py).

use std::path::{Path, PathBuf};

use rsembed_integration_tests::*;
use serde_json::{json, Value};

fn reference_texts() -> Vec<(String, Vec<f64>)> {
    let r: Value =
        serde_json::from_slice(&std::fs::read(tiny_model().join("reference.json")).unwrap())
            .unwrap();
    r["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["text"].as_str().unwrap().to_owned(),
                t["text_embeds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect(),
            )
        })
        .collect()
}

fn model_arg() -> String {
    tiny_model().to_str().unwrap().to_owned()
}

/// Runs `rsembed search` with `args`; returns stdout and stderr.
fn search(index: &Path, args: &[&str]) -> (String, String) {
    let mut c = rsembed();
    c.arg("search").arg("--index").arg(index).args(args);
    let o = run(&mut c);
    assert!(o.status.success(), "search {args:?} succeeds");
    (
        String::from_utf8(o.stdout).unwrap(),
        String::from_utf8(o.stderr).unwrap(),
    )
}

/// `rsembed classify` of `index` with the test model, ready for more flags.
fn classify_cmd(
    index: &Path,
    labels: &Path,
    template: &str,
    output: &Path,
) -> std::process::Command {
    let mut c = rsembed();
    c.args([
        "classify",
        "--model",
        &model_arg(),
        "--template",
        template,
        "--labels",
    ])
    .arg(labels)
    .arg("--index")
    .arg(index)
    .arg("--output")
    .arg(output);
    c
}

fn search_fails(index: &Path, args: &[&str]) -> String {
    let mut c = rsembed();
    c.arg("search").arg("--index").arg(index).args(args);
    let o = run(&mut c);
    assert!(!o.status.success(), "search {args:?} fails");
    String::from_utf8(o.stderr).unwrap()
}

/// `(kept, total)` row groups from search's closing line.
fn groups_read(stderr: &str) -> (u64, u64) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("rsembed search:"))
        .expect("closing line");
    let after = line.split("; read ").nth(1).unwrap();
    let mut it = after.split_whitespace();
    let kept = it.next().unwrap().parse().unwrap();
    assert_eq!(it.next(), Some("of"));
    (kept, it.next().unwrap().parse().unwrap())
}

fn build_dataset(data: &Path, out: &Path) {
    // One input per task: many files and row groups, so that pruning shows.
    let o = run(run_cmd(&data.join("geotiff"), out, &tiny_model()).args(["--task-files", "1"]));
    assert_eq!(o.status.code(), Some(0), "run succeeds");
}

#[test]
fn search_and_classify_agree_with_numpy_on_shared_geotiffs() {
    let Some(data) = shared_data() else {
        eprintln!("SKIPPED: ../shared/data is not in this checkout");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("index");
    build_dataset(&data, &out);
    let res = tmp.path().join("results");
    std::fs::create_dir_all(&res).unwrap();
    let glob = format!("{}/chips/*.parquet", out.display());
    let refs = reference_texts();
    let t0 = refs[0].0.clone();
    let t5 = refs[5].0.clone();
    let model = model_arg();
    let mut cases = json!({"search": [], "classify": []});
    let mut add = |name: &str, stdout: &str, case: Value| {
        std::fs::write(res.join(name), stdout).unwrap();
        let mut c = case;
        c["file"] = json!(name);
        cases["search"].as_array_mut().unwrap().push(c);
    };

    // One text.
    let (o, _) = search(&out, &["--model", &model, "--top-k", "10", "--json", &t0]);
    add("text.jsonl", &o, json!({"texts": [t0], "k": 10}));
    // Two texts: prompt ensembling.
    let (o, _) = search(
        &out,
        &["--model", &model, "--top-k", "10", "--json", &t0, &t5],
    );
    add("ensemble.jsonl", &o, json!({"texts": [t0, t5], "k": 10}));
    // More results than rows: every chip, ranked.
    let (o, _) = search(
        &out,
        &["--model", &model, "--top-k", "100000", "--json", &t5],
    );
    add("all.jsonl", &o, json!({"texts": [t5], "k": 100000}));

    // --bbox over the western half of the NAIP scene: row groups of the
    // other scenes are pruned from their statistics, rows of the eastern
    // half by the row-level test.
    let ext = duckdb(&format!(
        "SELECT min(bbox.xmin), min(bbox.ymin), max(bbox.xmax), max(bbox.ymax) FROM '{glob}' \
         WHERE source_uri LIKE '%m_4709963_se_14%'"
    ));
    let e: Vec<f64> = ext[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let bbox = [e[0], e[1], (e[0] + e[2]) / 2.0, e[3]];
    let bbox_arg = format!("--bbox={},{},{},{}", bbox[0], bbox[1], bbox[2], bbox[3]);
    let (o, err) = search(
        &out,
        &["--model", &model, "--top-k", "10", "--json", &bbox_arg, &t0],
    );
    let (kept, total) = groups_read(&err);
    assert!(total >= 5, "the dataset has several row groups ({total})");
    assert!(
        kept < total,
        "--bbox pruned row groups: read {kept} of {total}"
    );
    let (_, unfiltered) = search(&out, &["--model", &model, "--top-k", "10", &t0]);
    assert_eq!(groups_read(&unfiltered), (total, total));
    add(
        "bbox.jsonl",
        &o,
        json!({"texts": [t0], "k": 10, "bbox": bbox}),
    );

    // --like: an example chip instead of a text; without --model, no score.
    let like = duckdb(&format!(
        "SELECT chip_id FROM '{glob}' WHERE geometry IS NOT NULL ORDER BY chip_id LIMIT 1"
    ))[0][0]
        .as_str()
        .unwrap()
        .to_owned();
    let (o, _) = search(&out, &["--like", &like, "--top-k", "7", "--json"]);
    add("like.jsonl", &o, json!({"like": like, "k": 7}));
    let (o, _) = search(
        &out,
        &["--like", &like, "--top-k", "7", "--json", "--model", &model],
    );
    add(
        "like_scored.jsonl",
        &o,
        json!({"like": like, "k": 7, "scored": true}),
    );

    // --vector: a raw query vector (here the HF embedding of a text).
    let vpath = res.join("vector.json");
    std::fs::write(&vpath, serde_json::to_string(&refs[1].1).unwrap()).unwrap();
    let (o, _) = search(
        &out,
        &[
            "--vector",
            vpath.to_str().unwrap(),
            "--top-k",
            "10",
            "--json",
        ],
    );
    add(
        "vector.jsonl",
        &o,
        json!({"vector": "vector.json", "k": 10}),
    );

    // GeoJSON footprints.
    let (o, _) = search(&out, &["--model", &model, "--top-k", "5", "--geojson", &t0]);
    std::fs::write(res.join("results.geojson"), &o).unwrap();
    cases["geojson"] = json!({"file": "results.geojson", "k": 5});

    // The default table has a header, one line per result and the chip ids.
    let (table, _) = search(&out, &["--model", &model, "--top-k", "3", &t0]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "header and three results:\n{table}");
    assert!(lines[0].contains("score") && lines[0].contains("source_uri"));
    assert!(lines[1].trim_start().starts_with("1 "));

    // classify: four reference texts as labels, no template.
    let labels = [
        refs[0].0.clone(),
        refs[1].0.clone(),
        refs[5].0.clone(),
        refs[7].0.clone(),
    ];
    let lfile = res.join("labels.txt");
    std::fs::write(
        &lfile,
        format!("# reference captions\n{}\n", labels.join("\n")),
    )
    .unwrap();
    let l1 = res.join("labels1.parquet");
    assert!(run(&mut classify_cmd(&out, &lfile, "{}", &l1))
        .status
        .success());
    // A template: the label `river` becomes the first reference caption.
    let l2file = res.join("river.txt");
    std::fs::write(&l2file, "river\n").unwrap();
    let l2 = res.join("labels2.parquet");
    let template = "an aerial image of a {} next to farmland";
    assert_eq!(template.replace("{}", "river"), refs[0].0);
    let o = run(classify_cmd(&out, &l2file, template, &l2).arg("--json"));
    assert!(o.status.success());
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = duckdb(&format!("SELECT count(*) FROM '{glob}'"))[0][0]
        .as_u64()
        .unwrap();
    assert_eq!(summary["rows"], rows);
    cases["classify"] = json!([
        {"file": "labels1.parquet", "labels": labels, "template": "{}", "top": 3},
        {"file": "labels2.parquet", "labels": ["river"], "template": template, "top": 3},
    ]);
    // Keyed by chip_id: a join back to the chips finds every one.
    let joined = duckdb(&format!(
        "SELECT count(*) FROM '{}' l JOIN '{glob}' c USING (chip_id)",
        l1.display()
    ));
    assert_eq!(joined[0][0].as_u64(), Some(rows));

    std::fs::write(res.join("cases.json"), cases.to_string()).unwrap();
    check_with_numpy(&out, &res);
}

fn check_with_numpy(index: &Path, results: &Path) {
    let script = root().join("integration-tests/python/check_query.py");
    let o = std::process::Command::new(python())
        .arg(script)
        .arg(index)
        .arg(tiny_model())
        .arg(results)
        .output()
        .expect("python starts");
    eprintln!("{}", String::from_utf8_lossy(&o.stdout));
    assert!(
        o.status.success(),
        "numpy check failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn fixture_index(tmp: &Path) -> PathBuf {
    let out = tmp.join("index");
    let o = run(&mut run_cmd(&fixture_images(), &out, &tiny_model()));
    assert!(matches!(o.status.code(), Some(0) | Some(3)), "run finishes");
    out
}

#[test]
fn search_without_footprints_and_bad_queries() {
    let tmp = tempfile::tempdir().unwrap();
    let out = fixture_index(tmp.path());
    let model = model_arg();
    let rows = duckdb(&format!(
        "SELECT count(*) FROM '{}/chips/*.parquet'",
        out.display()
    ))[0][0]
        .as_u64()
        .unwrap() as usize;
    let (o, _) = search(
        &out,
        &["--model", &model, "--top-k", "3", "--json", "fields"],
    );
    let got: Vec<Value> = o
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(got.len(), 3.min(rows));
    for w in got.windows(2) {
        assert!(
            w[0]["cosine"].as_f64() >= w[1]["cosine"].as_f64(),
            "best first"
        );
    }
    // No chip has a footprint: a bbox keeps nothing, from the statistics alone.
    let (o, err) = search(
        &out,
        &[
            "--model",
            &model,
            "--json",
            "--bbox=-180,-90,180,90",
            "fields",
        ],
    );
    assert!(o.trim().is_empty(), "no results: {o}");
    assert_eq!(groups_read(&err).0, 0, "every row group pruned: {err}");
    // One Parquet file is an index too.
    let one = std::fs::read_dir(out.join("chips"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let (o, _) = search(
        &one,
        &["--model", &model, "--top-k", "1", "--json", "fields"],
    );
    assert_eq!(o.lines().count(), 1);

    let err = search_fails(&out, &["fields"]);
    assert!(err.contains("needs --model"), "{err}");
    let err = search_fails(&out, &["--model", &model]);
    assert!(err.contains("give the query"), "{err}");
    let err = search_fails(&out, &["--like", "00000000000000000000000000000000"]);
    assert!(err.contains("no chip with this id"), "{err}");
    let err = search_fails(&out, &["--model", &model, "--bbox=10,0,5,1", "x"]);
    assert!(err.contains("W <= E"), "{err}");
    let short = tmp.path().join("short.json");
    std::fs::write(&short, "[1, 2, 3]").unwrap();
    let err = search_fails(&out, &["--vector", short.to_str().unwrap()]);
    assert!(err.contains("3 numbers"), "{err}");
    let err = search_fails(&tmp.path().join("nothing-here"), &["--model", &model, "x"]);
    assert!(err.contains("no chip files"), "{err}");
    // A file that is not Parquet is named in the error, not a crash.
    let bad = tmp.path().join("bad");
    std::fs::create_dir_all(bad.join("chips")).unwrap();
    std::fs::write(bad.join("chips/broken.parquet"), b"PAR1 not really").unwrap();
    let err = search_fails(&bad, &["--model", &model, "x"]);
    assert!(err.contains("broken.parquet"), "{err}");
}

#[test]
fn classify_refuses_bad_labels_and_templates() {
    let tmp = tempfile::tempdir().unwrap();
    let out = fixture_index(tmp.path());
    let classify = |labels: &str, template: &str| {
        let f = tmp.path().join("labels.txt");
        std::fs::write(&f, labels).unwrap();
        run(&mut classify_cmd(
            &out,
            &f,
            template,
            &tmp.path().join("l.parquet"),
        ))
    };
    let o = classify("forest\nforest\n", "{}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("twice"));
    let o = classify("forest\n", "no placeholder");
    assert!(String::from_utf8_lossy(&o.stderr).contains("has no `{}`"));
    let o = classify("# only a comment\n", "{}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("no labels"));
    assert!(
        !tmp.path().join("l.parquet").exists(),
        "no output on refusal"
    );
    let o = classify("forest\nriver\n", "a satellite image of {}");
    assert!(o.status.success());
    let n = duckdb(&format!(
        "SELECT count(*), min(len(top_labels)), max(len(top_labels)) FROM '{}'",
        tmp.path().join("l.parquet").display()
    ));
    assert_eq!(
        n[0][1].as_u64(),
        Some(2),
        "two labels, so two kept per chip"
    );
    assert_eq!(n[0][2].as_u64(), Some(2));
}

/// `rsembed search` with its stdout a pipe whose reader is already gone, as
/// in `rsembed search … | head -1` once `head` has its line.
fn search_into_closed_pipe(index: &Path, args: &[&str]) -> std::process::Output {
    use std::process::Stdio;
    let mut child = rsembed()
        .arg("search")
        .arg("--index")
        .arg(index)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("search starts");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("search ends");
    eprintln!(
        "search {args:?} into a closed pipe: exit {:?}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn search_chips_folder_closed_pipe_and_bbox_range() {
    let tmp = tempfile::tempdir().unwrap();
    let out = fixture_index(tmp.path());
    let model = model_arg();
    let q = [
        "--model",
        model.as_str(),
        "--top-k",
        "5",
        "--json",
        "fields",
    ];
    let (want, _) = search(&out, &q);
    assert_eq!(want.lines().count(), 5);

    // The chips/ folder, as GeoPandas and PyArrow take it, with or without
    // its slash: the dataset's manifest names the files.
    for index in [
        format!("{}/chips/", out.display()),
        format!("{}/chips", out.display()),
    ] {
        let (got, _) = search(Path::new(&index), &q);
        assert_eq!(got, want, "--index {index}");
    }
    // A copy of the folder alone, without a manifest: the Parquet files in it.
    let bare = tmp.path().join("copy/chips");
    copy_dir(&out.join("chips"), &bare);
    let (got, _) = search(&bare, &q);
    assert_eq!(got, want, "--index {}", bare.display());

    // A reader that went away ends the output quietly: exit 0, nothing on stderr.
    for extra in [&[][..], &["--geojson"][..]] {
        let args: Vec<&str> = ["--model", model.as_str(), "--top-k", "5"]
            .into_iter()
            .chain(extra.iter().copied())
            .chain(["fields"])
            .collect();
        let o = search_into_closed_pipe(&out, &args);
        assert_eq!(o.status.code(), Some(0), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&o.stderr), "", "{args:?}");
    }

    // Boxes outside lon/lat ranges are refused, not an empty result.
    for bbox in [
        "--bbox=-181,0,10,10",
        "--bbox=0,0,180.5,10",
        "--bbox=0,-91,10,10",
        "--bbox=0,0,10,90.01",
        "--bbox=500000,4190000,510000,4200000",
    ] {
        let err = search_fails(&out, &["--model", &model, bbox, "x"]);
        assert!(err.contains("lon/lat range"), "{bbox}: {err}");
    }
    let (o, _) = search(&out, &["--model", &model, "--bbox=-180,-90,180,90", "x"]);
    assert!(o.contains("rank"), "the whole globe is a valid box: {o}");
}

#[test]
fn classify_refuses_existing_and_unwritable_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let out = fixture_index(tmp.path());
    let labels = tmp.path().join("labels.txt");
    std::fs::write(&labels, "forest\nriver\n").unwrap();
    let limit = std::time::Duration::from_secs(120);
    let classify = |output: &Path, extra: &[&str]| {
        run_timeout(classify_cmd(&out, &labels, "{}", output).args(extra), limit)
    };

    let target = tmp.path().join("labels.parquet");
    assert!(classify(&target, &[]).status.success());
    let first = std::fs::read(&target).unwrap();
    // An existing output is refused and left as it was; --overwrite replaces it.
    std::fs::write(&target, b"someone's file").unwrap();
    let o = classify(&target, &[]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("already exists")
            && err.contains("--overwrite")
            && err.contains("labels.parquet"),
        "{err}"
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"someone's file");
    assert!(classify(&target, &["--overwrite"]).status.success());
    assert_eq!(std::fs::read(&target).unwrap(), first);

    // Outputs that cannot be written: a clear error naming them, no hang.
    let file = tmp.path().join("afile");
    std::fs::write(&file, b"a file, not a folder").unwrap();
    for (output, cause) in [
        (
            Path::new("/proc/rsembed-test-labels.parquet").to_path_buf(),
            "/proc",
        ),
        (file.join("out.parquet"), "afile"),
        (tmp.path().to_path_buf(), "is a folder"),
    ] {
        let o = classify(&output, &[]);
        assert_eq!(o.status.code(), Some(1), "{}", output.display());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&*output.to_string_lossy()),
            "names the output: {err}"
        );
        assert!(err.contains(cause), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
