//! `rsembed search --vectors FILE` and `--queries FILE`: many queries in one
//! pass, each answered exactly as the same query alone, with its line number.

use std::path::{Path, PathBuf};

use rsembed_integration_tests::rasters::gdal_translate;
use rsembed_integration_tests::*;
use serde_json::Value;

const TEXTS: [&str; 4] = [
    "a river next to farmland",
    "dense forest",
    "an airport runway",
    "buildings in a city",
];

/// A georeferenced copy of the aerial fixture cut into 64 chips of 32 pixels.
fn dataset(dir: &Path) -> PathBuf {
    let input = dir.join("in");
    std::fs::create_dir_all(&input).unwrap();
    gdal_translate(
        &[
            "-of",
            "GTiff",
            "-a_srs",
            "EPSG:32618",
            "-a_ullr",
            "500000",
            "4000256",
            "500256",
            "4000000",
        ],
        &fixture_images().join("aerial_256.png"),
        &input.join("aerial.tif"),
    );
    let out = dir.join("out");
    let o = run(run_cmd(&input, &out, &tiny_model()).args(["--chip-size", "32"]));
    assert_eq!(o.status.code(), Some(0));
    out
}

/// `rsembed text` of one text: its JSON array line.
fn text_vector(text: &str) -> String {
    let o = run(rsembed()
        .args(["text", "--model"])
        .arg(tiny_model())
        .arg(text));
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap().trim().to_owned()
}

fn search(index: &Path, args: &[&str]) -> (Vec<Value>, String) {
    let o = run(rsembed().arg("search").arg("--index").arg(index).args(args));
    assert!(o.status.success(), "search {args:?}");
    let lines = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (lines, String::from_utf8(o.stderr).unwrap())
}

fn ids_and_cosines(rows: &[&Value]) -> Vec<(String, f64)> {
    rows.iter()
        .map(|r| {
            (
                r["chip_id"].as_str().unwrap().to_owned(),
                r["cosine"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_batch_answers_each_query_as_alone_with_its_line_number() {
    let tmp = tempfile::tempdir().unwrap();
    let index = dataset(tmp.path());
    let vectors: Vec<String> = TEXTS.iter().map(|t| text_vector(t)).collect();
    // A blank line keeps the numbering: queries are lines 1, 2, 4 and 5.
    let file = tmp.path().join("q.jsonl");
    std::fs::write(
        &file,
        format!(
            "{}\n{}\n\n{}\n{}\n",
            vectors[0], vectors[1], vectors[2], vectors[3]
        ),
    )
    .unwrap();
    let lines = [1, 2, 4, 5];
    let (batch, stderr) = search(
        &index,
        &[
            "--vectors",
            file.to_str().unwrap(),
            "--json",
            "--top-k",
            "5",
        ],
    );
    assert_eq!(batch.len(), 4 * 5);
    // One pass: the closing line counts each row once, not once per query.
    assert!(
        stderr.contains("scored 64 of 64 rows; read 1 of 1 row groups"),
        "{stderr}"
    );
    for (i, (v, line)) in vectors.iter().zip(lines).enumerate() {
        let one = tmp.path().join(format!("v{i}.json"));
        std::fs::write(&one, v).unwrap();
        let (alone, _) = search(
            &index,
            &["--vector", one.to_str().unwrap(), "--json", "--top-k", "5"],
        );
        let mine: Vec<&Value> = batch
            .iter()
            .filter(|r| r["query"].as_u64() == Some(line))
            .collect();
        assert_eq!(
            mine.iter()
                .map(|r| r["rank"].as_u64().unwrap())
                .collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
        assert_eq!(
            ids_and_cosines(&mine),
            ids_and_cosines(&alone.iter().collect::<Vec<_>>()),
            "query on line {line}"
        );
        assert!(alone.iter().all(|r| r.get("query").is_none()));
    }

    // --queries: the same texts embedded in one go give the same answers.
    let texts = tmp.path().join("q.txt");
    std::fs::write(
        &texts,
        format!("{}\n{}\n\n{}\n{}\n", TEXTS[0], TEXTS[1], TEXTS[2], TEXTS[3]),
    )
    .unwrap();
    let model = tiny_model();
    let (by_text, _) = search(
        &index,
        &[
            "--model",
            model.to_str().unwrap(),
            "--queries",
            texts.to_str().unwrap(),
            "--json",
            "--top-k",
            "5",
        ],
    );
    assert_eq!(by_text.len(), 20);
    for (a, b) in by_text.iter().zip(&batch) {
        assert_eq!(a["query"], b["query"]);
        assert_eq!(a["chip_id"], b["chip_id"]);
        assert!((a["cosine"].as_f64().unwrap() - b["cosine"].as_f64().unwrap()).abs() < 1e-5);
        // With the model, scores too.
        assert!(a["score"].is_number());
    }

    // --queries -: the same texts from stdin, the first answered before the
    // rest are written, give the same answers with the same line numbers.
    let mut session = LineSession::start(
        rsembed().arg("search").arg("--index").arg(&index).args([
            "--model",
            model.to_str().unwrap(),
            "--queries",
            "-",
            "--top-k",
            "5",
        ]),
        std::time::Duration::from_secs(120),
    );
    session.send(&format!("{}\n", TEXTS[0]));
    let mut answers = vec![session.answer()];
    session.send(&format!("{}\n\n{}\n{}\n", TEXTS[1], TEXTS[2], TEXTS[3]));
    answers.extend([session.answer(), session.answer(), session.answer()]);
    let out = session.finish();
    assert_eq!(out.status.code(), Some(0));
    for a in &answers {
        let q = a["query"].as_u64().unwrap();
        let want: Vec<&Value> = by_text.iter().filter(|r| r["query"] == q).collect();
        let got: Vec<&Value> = a["results"].as_array().unwrap().iter().collect();
        assert_eq!(got.len(), 5, "{a}");
        // Embedded one at a time here, four at once there: ids equal, cosines
        // to ONNX Runtime's rounding across batch sizes.
        let (g, w) = (ids_and_cosines(&got), ids_and_cosines(&want));
        assert_eq!(
            g.iter().map(|x| &x.0).collect::<Vec<_>>(),
            w.iter().map(|x| &x.0).collect::<Vec<_>>(),
            "query {q}"
        );
        for (a, b) in g.iter().zip(&w) {
            assert!((a.1 - b.1).abs() < 1e-5, "query {q}: {a:?} {b:?}");
        }
        assert!(got.iter().all(|r| r["score"].is_number()));
    }
    let lines: Vec<u64> = answers
        .iter()
        .map(|a| a["query"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, [1, 2, 4, 5]);

    // Filters hold for every query of a batch.
    let (boxed, _) = search(
        &index,
        &[
            "--vectors",
            file.to_str().unwrap(),
            "--json",
            "--top-k",
            "100",
            "--bbox=-75.0,36.0,-74.9996,36.2",
        ],
    );
    let (boxed_one, _) = search(
        &index,
        &[
            "--vector",
            tmp.path().join("v0.json").to_str().unwrap(),
            "--json",
            "--top-k",
            "100",
            "--bbox=-75.0,36.0,-74.9996,36.2",
        ],
    );
    assert!(
        !boxed_one.is_empty() && boxed_one.len() < 64,
        "{}",
        boxed_one.len()
    );
    assert_eq!(boxed.len(), 4 * boxed_one.len());

    // The table shows the query's line first.
    let o = run(rsembed().arg("search").arg("--index").arg(&index).args([
        "--vectors",
        file.to_str().unwrap(),
        "--top-k",
        "2",
    ]));
    let table = String::from_utf8(o.stdout).unwrap();
    let mut rows = table.lines();
    assert!(
        rows.next().unwrap().trim_start().starts_with("query  rank"),
        "{table}"
    );
    assert!(
        rows.next().unwrap().trim_start().starts_with("1     1"),
        "{table}"
    );
    assert_eq!(table.lines().count(), 1 + 8);
}

#[test]
fn batch_files_are_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let index = dataset(tmp.path());
    let fails = |args: &[&str]| -> String {
        let o = run(rsembed()
            .arg("search")
            .arg("--index")
            .arg(&index)
            .args(args));
        assert!(!o.status.success(), "{args:?} must fail");
        String::from_utf8(o.stderr).unwrap()
    };
    let f = tmp.path().join("bad.jsonl");
    std::fs::write(&f, "[1, 2]\n").unwrap();
    let e = fails(&["--vectors", f.to_str().unwrap()]);
    assert!(
        e.contains("--vectors") && e.contains("line 1") && e.contains("2 numbers"),
        "{e}"
    );
    // One source of queries at a time; texts in a file need the model.
    let e = fails(&["--vectors", f.to_str().unwrap(), "some text"]);
    assert!(e.contains("one of them"), "{e}");
    let t = tmp.path().join("q.txt");
    std::fs::write(&t, "rivers\n").unwrap();
    let e = fails(&["--queries", t.to_str().unwrap()]);
    assert!(e.contains("--queries needs --model"), "{e}");
}
