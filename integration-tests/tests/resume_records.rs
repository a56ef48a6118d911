//! An embedded `run` resumes from the done records it leaves in `state/`,
//! not from its chip files read whole (issue 29, item 5).

use std::path::{Path, PathBuf};

use rsembed_integration_tests::*;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// One task per image, so a job has several tasks to find done or not.
fn run_json(output: &Path) -> Value {
    let o = run(run_cmd(&fixture_images(), output, &tiny_model())
        .args(["--task-files", "1"])
        .arg("--json"));
    assert_eq!(o.status.code(), Some(0));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The listed sha256 of each chip file, by path.
fn listed(out: &Path) -> Vec<(String, String)> {
    manifest_list(out, "files", "kind = 'chips' ORDER BY path")
        .iter()
        .map(|r| {
            (
                r["path"].as_str().unwrap().to_owned(),
                r["sha256"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn sha256_of(p: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(p).unwrap()))
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

#[test]
fn a_resume_reads_the_done_records_not_the_chip_files() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let first = run_json(&out);
    let tasks = first["tasks"].as_u64().unwrap();
    assert!(tasks >= 3, "{first}");
    let chips = files_in(&out.join("chips"));
    let records = files_in(&out.join("state"));
    assert_eq!(records.len() as u64, tasks, "one done record a task");
    assert!(records
        .iter()
        .all(|p| p.to_string_lossy().ends_with(".done")));
    let before = listed(&out);

    // A chip file rewritten at the same size: a resume that hashed the file
    // would list the new digest; one that reads the record lists the old.
    let victim = &chips[0];
    let len = std::fs::metadata(victim).unwrap().len() as usize;
    std::fs::write(victim, vec![0xAA; len]).unwrap();
    let second = run_json(&out);
    assert_eq!(second["tasks_resumed"], tasks, "{second}");
    assert_eq!(second["chips_embedded"], 0);
    assert_eq!(listed(&out), before, "the records' digests, not re-hashed");
    assert_ne!(sha256_of(victim), before[0].1);
}

#[test]
fn a_chip_file_gone_or_cut_short_runs_its_task_again() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let first = run_json(&out);
    let tasks = first["tasks"].as_u64().unwrap();
    let chips = files_in(&out.join("chips"));
    std::fs::remove_file(&chips[0]).unwrap();
    let len = std::fs::metadata(&chips[1]).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&chips[1])
        .unwrap()
        .set_len(len / 2)
        .unwrap();

    let second = run_json(&out);
    assert_eq!(second["tasks_resumed"], tasks - 2, "{second}");
    assert!(second["chips_embedded"].as_u64().unwrap() > 0);
    assert_eq!(second["chips"], first["chips"]);
    // Every listed digest is the file's own, and no chip is there twice.
    for (path, sha) in listed(&out) {
        assert_eq!(sha256_of(&out.join(&path)), sha, "{path}");
    }
    let dup = duckdb(&format!(
        "SELECT count(*) - count(DISTINCT chip_id) FROM '{}/chips/*.parquet'",
        out.display()
    ));
    assert_eq!(dup[0][0], 0);
}

#[test]
fn chip_files_without_records_are_read_whole_once() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let first = run_json(&out);
    let tasks = first["tasks"].as_u64().unwrap();
    let before = listed(&out);
    // An output of a version before the records, or a run cut off between
    // a task's files and its record.
    std::fs::remove_dir_all(out.join("state")).unwrap();

    let second = run_json(&out);
    assert_eq!(second["tasks_resumed"], tasks, "{second}");
    assert_eq!(listed(&out), before);
    assert_eq!(files_in(&out.join("state")).len() as u64, tasks);
}
