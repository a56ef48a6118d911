//! `rsembed search` and `rsembed classify` on a real dataset: rankings, scores
//! and labels checked against numpy over the Parquet files and the Hugging
//! Face text embeddings of the test model (python/check_query.py).

use std::path::{Path, PathBuf};

use rsembed_integration_tests::*;
use serde_json::{json, Value};
use stac_chips::{FileSpec, Kind, MAY_2023, MAY_2024};

mod stac_chips;

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
        skipped("../shared/data is not in this checkout");
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

/// Issue 28.14: `search` over the output of an interrupted job scored what
/// was there and said nothing. It still does, with a warning on stderr
/// giving the job's progress; a finished job gets none.
#[test]
fn search_warns_when_the_job_is_not_finished() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("index");
    let o = run(run_cmd(&fixture_images(), &out, &tiny_model()).args(["--task-files", "1"]));
    assert!(matches!(o.status.code(), Some(0) | Some(3)), "run finishes");
    let model = model_arg();
    let args = ["--model", model.as_str(), "--top-k", "3", "fields"];
    let (_, err) = search(&out, &args);
    assert!(!err.contains("not finished"), "{err}");

    // As an interrupted run leaves it: no manifest, some tasks' files only.
    std::fs::remove_file(out.join("manifest.json")).unwrap();
    let mut chips: Vec<_> = std::fs::read_dir(out.join("chips"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    chips.sort();
    assert!(chips.len() >= 3, "{chips:?}");
    for c in &chips[..2] {
        std::fs::remove_file(c).unwrap();
    }
    let left = chips.len() - 2;
    for index in [out.clone(), out.join("chips")] {
        let (_, err) = search(&index, &args);
        assert!(
            err.contains(&format!(
                "warning: this job is not finished (no manifest.json): {left} tasks have chip files"
            )),
            "{err}"
        );
        assert!(err.contains("results cover those only"), "{err}");
    }
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

// ---- Schema versions 1 and 2 in one index: --datetime and --max-cloud ----

/// A finished job of four chip files, one row group each: schema version 1
/// (no STAC columns), STAC items of summer 2024, plain inputs in version 2
/// (the columns null) and STAC items of 2023.
fn mixed_index(tmp: &Path) -> PathBuf {
    let root = tmp.join("mixed");
    stac_chips::write_job(
        &root,
        &[
            FileSpec {
                name: "a-v1",
                kind: Kind::V1,
                rows: 50,
                lon: -100.0,
            },
            FileSpec {
                name: "b-stac-2024",
                kind: Kind::Stac { base: MAY_2024 },
                rows: 60,
                lon: -99.0,
            },
            FileSpec {
                name: "c-plain",
                kind: Kind::Plain,
                rows: 40,
                lon: -98.0,
            },
            FileSpec {
                name: "d-stac-2023",
                kind: Kind::Stac { base: MAY_2023 },
                rows: 30,
                lon: -97.0,
            },
        ],
    );
    root
}

/// The number before `label` in search's closing line.
fn closing_count(stderr: &str, label: &str) -> Option<u64> {
    let line = stderr.lines().find(|l| l.starts_with("rsembed search:"))?;
    let before = line.split(label).next().filter(|b| b.len() < line.len())?;
    before.split_whitespace().last()?.parse().ok()
}

/// `search --vector q.json` over every chip that passes `filter`: the chip
/// ids it returns, sorted, with its stderr.
fn filtered(index: &Path, filter: &[&str]) -> (Vec<String>, Vec<Value>, String) {
    let q = index.join("q.json");
    let args: Vec<&str> = [
        "--vector",
        q.to_str().unwrap(),
        "--top-k",
        "100000",
        "--json",
    ]
    .into_iter()
    .chain(filter.iter().copied())
    .collect();
    let (o, err) = search(index, &args);
    let rows: Vec<Value> = o
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut ids: Vec<String> = rows
        .iter()
        .map(|r| r["chip_id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    (ids, rows, err)
}

/// DuckDB over the same files (every schema version, by name).
fn duck_ids(index: &Path, wheres: &str) -> Vec<String> {
    let v = duckdb(&format!(
        "SELECT chip_id FROM read_parquet('{}/chips/*.parquet', union_by_name=true) \
         WHERE {wheres} ORDER BY chip_id",
        index.display()
    ));
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_str().unwrap().to_owned())
        .collect()
}

fn duck_count(index: &Path, wheres: &str) -> u64 {
    duckdb(&format!(
        "SELECT count(*) FROM read_parquet('{}/chips/*.parquet', union_by_name=true) WHERE {wheres}",
        index.display()
    ))[0][0]
        .as_u64()
        .unwrap()
}

/// The overlap of a chip's [datetime, end_datetime] with [from, to], in SQL.
fn overlaps(from: Option<&str>, to: Option<&str>) -> String {
    let mut w = vec!["datetime IS NOT NULL".to_owned()];
    if let Some(to) = to {
        w.push(format!("datetime <= TIMESTAMPTZ '{to}'"));
    }
    if let Some(from) = from {
        w.push(format!(
            "greatest(datetime, coalesce(end_datetime, datetime)) >= TIMESTAMPTZ '{from}'"
        ));
    }
    w.join(" AND ")
}

#[test]
fn datetime_and_max_cloud_select_what_duckdb_selects_over_both_schema_versions() {
    let tmp = tempfile::tempdir().unwrap();
    let index = mixed_index(tmp.path());
    let (summer_from, summer_to) = ("2024-06-01T00:00:00Z", "2024-08-31T23:59:59Z");
    let summer = format!("{summer_from}/{summer_to}");
    let in_summer = overlaps(Some(summer_from), Some(summer_to));

    // --datetime: the chips whose acquisition overlaps summer 2024; those
    // without a datetime (the v1 file, the plain inputs, rows of STAC files
    // without an item) are excluded and counted. Only the 2024 file is read:
    // the others are ruled out, and their missing counted, from statistics.
    let (ids, rows, err) = filtered(&index, &["--datetime", &summer]);
    let want = duck_ids(&index, &in_summer);
    assert!(!want.is_empty() && want.len() < 60, "{}", want.len());
    assert_eq!(ids, want, "{err}");
    let no_dt = duck_count(&index, "datetime IS NULL");
    assert_eq!(
        no_dt,
        50 + 40 + 8 + 4,
        "the fixture's rows without a datetime"
    );
    assert_eq!(
        closing_count(&err, "chips without a datetime"),
        Some(no_dt),
        "{err}"
    );
    assert_eq!(groups_read(&err), (1, 4), "{err}");
    assert_eq!(
        closing_count(&err, "of"),
        Some(want.len() as u64),
        "scored: {err}"
    );
    // A range that starts before the interval and ends in it overlaps it.
    let spanning = duck_ids(
        &index,
        &format!("{in_summer} AND datetime < TIMESTAMPTZ '{summer_from}'"),
    );
    assert!(
        !spanning.is_empty(),
        "the fixture has a range across June 1st"
    );
    assert!(spanning.iter().all(|id| ids.contains(id)));

    // The results carry the item, collection, time (RFC 3339) and cloud,
    // as DuckDB reads them.
    let stac = duckdb(&format!(
        "SELECT chip_id, item_id, collection, strftime(datetime, '%Y-%m-%dT%H:%M:%SZ'), \
         strftime(end_datetime, '%Y-%m-%dT%H:%M:%SZ'), cloud_fraction \
         FROM read_parquet('{}/chips/*.parquet', union_by_name=true)",
        index.display()
    ));
    let by_id: std::collections::HashMap<&str, &Value> = stac
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_str().unwrap(), r))
        .collect();
    for r in &rows {
        let d = by_id[r["chip_id"].as_str().unwrap()];
        assert_eq!(r["item_id"], d[1]);
        assert_eq!(r["collection"], d[2]);
        assert_eq!(r["datetime"], d[3]);
        assert_eq!(r.get("end_datetime").unwrap_or(&Value::Null), &d[4]);
        match d[5].as_f64() {
            Some(c) => assert!((r["cloud_fraction"].as_f64().unwrap() - c).abs() < 1e-6),
            None => assert!(r.get("cloud_fraction").is_none(), "{r}"),
        }
    }

    // --max-cloud: at most 0.1 cloud; without a cloud fraction, excluded and counted.
    let (ids, _, err) = filtered(&index, &["--max-cloud", "0.1"]);
    assert_eq!(ids, duck_ids(&index, "cloud_fraction <= 0.1"), "{err}");
    let no_cloud = duck_count(&index, "cloud_fraction IS NULL");
    assert_eq!(
        closing_count(&err, "chips without a cloud_fraction"),
        Some(no_cloud),
        "{err}"
    );
    assert_eq!(
        groups_read(&err),
        (2, 4),
        "v1 and plain files skipped: {err}"
    );

    // Both: a chip is counted under the first filter whose property it lacks.
    let (ids, _, err) = filtered(&index, &["--datetime", &summer, "--max-cloud", "0.3"]);
    assert_eq!(
        ids,
        duck_ids(&index, &format!("{in_summer} AND cloud_fraction <= 0.3")),
        "{err}"
    );
    assert_eq!(closing_count(&err, "chips without a datetime"), Some(no_dt));
    assert_eq!(
        closing_count(&err, "chips without a cloud_fraction"),
        Some(duck_count(
            &index,
            &format!("{in_summer} AND cloud_fraction IS NULL")
        )),
        "{err}"
    );

    // With --bbox (over the v1 file and the 2024 one): the counts are of the
    // chips in the box; the v1 file's are counted from its bbox column alone.
    let box_sql =
        "bbox.xmax >= -99.95 AND bbox.xmin <= -98.95 AND bbox.ymax >= 40.0 AND bbox.ymin <= 40.02";
    let (ids, _, err) = filtered(
        &index,
        &["--bbox=-99.95,40.0,-98.95,40.02", "--datetime", &summer],
    );
    assert_eq!(
        ids,
        duck_ids(&index, &format!("{box_sql} AND {in_summer}")),
        "{err}"
    );
    let in_box_no_dt = duck_count(&index, &format!("{box_sql} AND datetime IS NULL"));
    assert!(in_box_no_dt > 0 && in_box_no_dt < no_dt);
    assert_eq!(
        closing_count(&err, "chips without a datetime"),
        Some(in_box_no_dt),
        "{err}"
    );
    assert_eq!(groups_read(&err), (2, 4), "{err}");

    // Open ends, and an instant (the start of a range, and a time inside one).
    let (ids, _, _) = filtered(&index, &["--datetime", "../2023-12-31T00:00:00Z"]);
    assert_eq!(
        ids,
        duck_ids(&index, &overlaps(None, Some("2023-12-31T00:00:00Z")))
    );
    assert!(!ids.is_empty());
    let (ids, _, _) = filtered(&index, &["--datetime", "2024-07-01T00:00:00Z/.."]);
    assert_eq!(
        ids,
        duck_ids(&index, &overlaps(Some("2024-07-01T00:00:00Z"), None))
    );
    let inside = "2024-05-14T00:00:00Z";
    let (ids, _, _) = filtered(&index, &["--datetime", inside]);
    assert_eq!(ids, duck_ids(&index, &overlaps(Some(inside), Some(inside))));
    assert!(!ids.is_empty(), "an item's range covers {inside}");

    // Without filters, every chip of both versions is scored; v1 rows show
    // no STAC fields.
    let (ids, rows, _) = filtered(&index, &[]);
    assert_eq!(ids.len(), 180);
    let v1 = rows
        .iter()
        .find(|r| r["source_uri"].as_str().unwrap().ends_with("a-v1.tif"))
        .unwrap();
    assert!(
        v1.get("item_id").is_none() && v1.get("datetime").is_none(),
        "{v1}"
    );
    // The table shows the STAC columns when a result has them.
    let (table, _) = search(
        &index,
        &[
            "--vector",
            index.join("q.json").to_str().unwrap(),
            "--datetime",
            &summer,
        ],
    );
    let header = table.lines().next().unwrap();
    assert!(
        header.contains("datetime") && header.contains("item_id"),
        "{table}"
    );
    assert!(table.contains("2024-0"), "{table}");

    // Bad values are refused before any work.
    for (flag, value, says) in [
        ("--max-cloud", "1.5", "fraction"),
        ("--max-cloud", "cloudy", "not a number"),
        ("--datetime", "June 2024", "RFC 3339"),
        (
            "--datetime",
            "2024-09-01T00:00:00Z/2024-08-01T00:00:00Z",
            "after the end",
        ),
    ] {
        let err = search_fails(&index, &["--like", "x", flag, value]);
        assert!(err.contains(says), "{flag} {value}: {err}");
    }
}

#[test]
fn classify_labels_every_chip_of_both_schema_versions() {
    let tmp = tempfile::tempdir().unwrap();
    let index = mixed_index(tmp.path());
    let labels = tmp.path().join("labels.txt");
    std::fs::write(&labels, "forest\nriver\nclouds\n").unwrap();
    let out = tmp.path().join("labels.parquet");
    let o = run(classify_cmd(&index, &labels, "{}", &out).arg("--json"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Keyed by chip_id (it copies no other chip column): every chip of both
    // versions once, and a join brings the STAC columns back.
    let n = duckdb(&format!(
        "SELECT count(*), count(DISTINCT l.chip_id), count(c.datetime) FROM '{}' l \
         JOIN read_parquet('{}/chips/*.parquet', union_by_name=true) c USING (chip_id)",
        out.display(),
        index.display()
    ));
    assert_eq!(n[0][0].as_u64(), Some(180));
    assert_eq!(n[0][1].as_u64(), Some(180));
    assert_eq!(
        n[0][2].as_u64(),
        Some(duck_count(&index, "datetime IS NOT NULL"))
    );
}

/// A chip file with a page header that parquet-rs 60 panics on when it skips
/// rows (a dictionary page retyped as a data page, which a mutation run of
/// `search` produced) fails the search with an error naming the file: never
/// a crash. The in-place answer reader refuses the page and hands the group
/// to the arrow reader, whose `peek_next_page` unwraps the missing header.
#[test]
fn a_page_header_the_parquet_reader_panics_on_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = fixture_index(tmp.path());
    let file = std::fs::read_dir(out.join("chips"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .min()
        .expect("a chip file");
    // The query is row 1's own embedding, so its one hit is row 1 and the
    // arrow reader skips row 0 to reach it.
    let row1 = duckdb(&format!(
        "SELECT embedding::FLOAT[] FROM read_parquet('{}') LIMIT 1 OFFSET 1",
        file.display()
    ));
    let query = tmp.path().join("query.json");
    std::fs::write(&query, row1[0][0].to_string()).unwrap();
    let at = duckdb(&format!(
        "SELECT dictionary_page_offset FROM parquet_metadata('{}') \
         WHERE path_in_schema = 'chip_id' AND row_group_id = 0",
        file.display()
    ))[0][0]
        .as_u64()
        .expect("chip_id has a dictionary page") as usize;
    let mut bytes = std::fs::read(&file).unwrap();
    // Thrift compact: field 1 (i32) = zigzag(2), DICTIONARY_PAGE; 0 is DATA_PAGE.
    assert_eq!(
        &bytes[at..at + 2],
        &[0x15, 0x04],
        "a dictionary page header"
    );
    bytes[at + 1] = 0x00;
    std::fs::write(&file, &bytes).unwrap();

    let mut c = rsembed();
    c.arg("search")
        .arg("--index")
        .arg(&out)
        .arg("--vector")
        .arg(&query)
        .args(["--top-k", "1", "--json"]);
    let o = run(&mut c);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "an error, not a crash: {err}");
    let name = file.file_name().unwrap().to_string_lossy();
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains(name.as_ref()) && last.contains("corrupt pages"),
        "the error names the file and what is wrong with it: {last}"
    );
}
