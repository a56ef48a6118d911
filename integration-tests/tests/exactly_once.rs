//! Exactly once, whatever the user does: reruns with other flags, a second
//! output, resubmits, partial runs, crashes between the files and the done
//! record, `--overwrite` and `--force-new-job`, in embedded mode and against a
//! real nats-server with real workers. After every scenario the chip files
//! hold every expected chip once (rows = distinct chip ids = expected), the
//! manifest and `status` agree with the files, and a refused command changed
//! nothing in the output.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use rsembed_integration_tests::cluster::{
    chip_counts, finalize, make_images, status, submit, submit_ok, wait_finished, Worker,
};
use rsembed_integration_tests::nats::NatsServer;
use rsembed_integration_tests::{duckdb, manifest_list, run, run_cmd, tiny_model};
use serde_json::Value;

const FINISH: Duration = Duration::from_secs(120);

/// Chips of one 48×40 test PNG: a whole image is one chip.
const CHIPS_PER_IMAGE: u64 = 1;

/// Chips of one 48×40 GeoTIFF at `--chip-size 16`: 3 columns × 3 rows.
const CHIPS_PER_SCENE: u64 = 9;

/// `n` georeferenced 48×40 GeoTIFFs (GDAL writes them from the test PNGs),
/// cut on the chip grid.
fn make_scenes(dir: &Path, n: usize) {
    let pngs = dir.with_extension("png-src");
    std::fs::create_dir_all(dir).unwrap();
    for (i, png) in make_images(&pngs, n).into_iter().enumerate() {
        let x0 = 500_000 + 1000 * i;
        let st = Command::new("gdal_translate")
            .args(["-q", "-of", "GTiff", "-a_srs", "EPSG:32618", "-a_ullr"])
            .args([
                x0.to_string(),
                "4000400".into(),
                (x0 + 480).to_string(),
                "4000000".into(),
            ])
            .arg(&png)
            .arg(dir.join(format!("scene_{i:03}.tif")))
            .status()
            .expect("gdal_translate runs (scripts/setup-test-env.sh installs gdal-bin)");
        assert!(st.success());
    }
    std::fs::remove_dir_all(pngs).unwrap();
}

/// `rsembed run` of `input` to `output` with 16-pixel chips and `extra` flags.
fn run_job(input: &Path, output: &Path, extra: &[&str]) -> Output {
    run(run_cmd(input, output, &tiny_model())
        .args(["--chip-size", "16", "--json"])
        .args(extra))
}

fn run_ok(input: &Path, output: &Path, extra: &[&str]) -> Value {
    let out = run_job(input, output, extra);
    assert!(out.status.success(), "run failed");
    serde_json::from_slice(&out.stdout).expect("run --json prints JSON")
}

/// Every file under `dir` with its bytes: what a refused command must leave
/// exactly as it was.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    if !dir.exists() {
        return out;
    }
    for e in walk(dir) {
        out.insert(
            e.strip_prefix(dir).unwrap().to_owned(),
            std::fs::read(&e).unwrap(),
        );
    }
    out
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            v.extend(walk(&p));
        } else {
            v.push(p);
        }
    }
    v.sort();
    v
}

fn manifest(output: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(output.join("manifest.json")).unwrap()).unwrap()
}

/// The failures list names one input without chips, `name`, with its task.
fn assert_without_chips(output: &Path, name: &str) {
    let rows = manifest_list(output, "failures", "kind = 'without_chips'");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(
        rows[0]["source_uri"].as_str().unwrap().ends_with(name),
        "{rows:?}"
    );
    assert_eq!(rows[0]["task_id"].as_str().unwrap().len(), 32, "{rows:?}");
}

/// Rows = distinct chip ids = `chips`, the manifest agrees, and every chip
/// file of the output is in the manifest.
fn assert_exact(output: &Path, chips: u64) {
    let (rows, ids, _) = chip_counts(output);
    assert_eq!((rows, ids), (chips, chips), "rows, distinct chip ids");
    let m = manifest(output);
    assert_eq!(m["rows"], chips, "manifest rows");
    let listed: Vec<String> = manifest_list(output, "files", "kind = 'chips'")
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_owned())
        .collect();
    let on_disk: Vec<String> = walk(&output.join("chips"))
        .iter()
        .map(|p| format!("chips/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    let mut listed_sorted = listed.clone();
    listed_sorted.sort();
    assert_eq!(listed_sorted, on_disk, "chip files = manifest files");
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A refused command: exit 1, an error naming `flag`, and the output as it was.
fn assert_refused(before: &BTreeMap<PathBuf, Vec<u8>>, output: &Path, o: &Output, flag: &str) {
    assert_eq!(o.status.code(), Some(1), "refused");
    let err = stderr(o);
    assert!(
        err.contains(&format!("{flag}:")),
        "the refusal names {flag}: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        snapshot(output) == *before,
        "a refused command changed the output"
    );
}

#[test]
fn every_identity_flag_changed_on_a_rerun_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 4);
    run_ok(&input, &output, &[]);
    assert_exact(&output, 4 * CHIPS_PER_IMAGE);
    let before = snapshot(&output);
    let other_input = dir.path().join("in2");
    make_images(&other_input, 1);
    for (flag, extra) in [
        ("--min-valid", vec!["--min-valid", "0.5"]),
        ("--task-files", vec!["--task-files", "2"]),
        ("--task-chips", vec!["--task-chips", "5"]),
        ("--task-bytes", vec!["--task-bytes", "1KiB"]),
        ("--shard-bytes", vec!["--shard-bytes", "1000"]),
        ("--chip-size", vec!["--chip-size", "24"]),
        ("--stride", vec!["--stride", "8"]),
        ("--bands", vec!["--bands", "3,2,1"]),
        ("--scale", vec!["--scale", "0:200"]),
        ("--fp16", vec!["--fp16"]),
        ("--band-files", vec!["--band-files", "B4,B3,B2"]),
        (
            "--footprint-tolerance",
            vec!["--footprint-tolerance", "0.5"],
        ),
    ] {
        let o = run_job(&input, &output, &extra);
        assert_refused(&before, &output, &o, flag);
    }
    // Another input into the same output: the input is named too.
    let o = run_job(&other_input, &output, &[]);
    assert_refused(&before, &output, &o, "--input");
    // The same flags resume: nothing is embedded again.
    let s = run_ok(&input, &output, &[]);
    assert_eq!(s["chips_embedded"], 0, "{s}");
    assert_exact(&output, 4 * CHIPS_PER_IMAGE);
}

#[test]
fn min_valid_on_a_rerun_needs_overwrite_and_then_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_scenes(&input, 3);
    run_ok(&input, &output, &[]);
    assert_exact(&output, 3 * CHIPS_PER_SCENE);
    let before = snapshot(&output);
    let o = run_job(&input, &output, &["--min-valid", "0.5"]);
    assert_refused(&before, &output, &o, "--min-valid");
    let s = run_ok(&input, &output, &["--min-valid", "0.5", "--overwrite"]);
    assert!(s["replaced_job"].as_str().is_some(), "{s}");
    // 48×40 at 16: the bottom row of chips has 8 of 16 rows real (0.5), so
    // every chip stays at 0.5; at 0.6 the bottom row goes.
    assert_exact(&output, 3 * CHIPS_PER_SCENE);
    run_ok(&input, &output, &["--min-valid", "0.6", "--overwrite"]);
    assert_exact(&output, 3 * 6);
    let low = duckdb(&format!(
        "SELECT count(*) FROM read_parquet('{}/chips/*.parquet') WHERE valid_fraction < 0.6",
        output.display()
    ));
    assert_eq!(low[0][0], 0, "no chip below --min-valid");
}

#[test]
fn a_second_output_is_a_second_job() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    make_images(&input, 3);
    let sa = run_ok(&input, &a, &[]);
    let sb = run_ok(&input, &b, &[]);
    assert_ne!(sa["job_id"], sb["job_id"], "the output is part of the job");
    assert_exact(&a, 3 * CHIPS_PER_IMAGE);
    assert_exact(&b, 3 * CHIPS_PER_IMAGE);
}

/// `rsembed run` with 16-pixel chips, one input per task and one task at a
/// time, started in the background, so a test can interrupt it between tasks.
fn start_task_by_task(input: &Path, output: &Path, stderr: std::process::Stdio) -> Child {
    run_cmd(input, output, &tiny_model())
        .args([
            "--chip-size",
            "16",
            "--task-files",
            "1",
            "--tasks-in-flight",
            "1",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// Waits until `output` holds `n` chip files, or the run has ended.
fn wait_for_chip_files(output: &Path, n: usize, child: &mut Child) {
    let started = Instant::now();
    while !output.join("chips").exists()
        || std::fs::read_dir(output.join("chips")).unwrap().count() < n
    {
        assert!(started.elapsed() < FINISH, "no task finished");
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_interrupted_run_then_other_grouping_then_resume_then_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 24);
    // SIGKILL mid-run, as a crash: some tasks are done, some not.
    let mut child = start_task_by_task(&input, &output, std::process::Stdio::null());
    wait_for_chip_files(&output, 2, &mut child);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        !output.join("manifest.json").exists(),
        "an interrupted run has no manifest"
    );
    let before = snapshot(&output);
    let o = run_job(&input, &output, &["--task-files", "2"]);
    assert_refused(&before, &output, &o, "--task-files");
    // The same flags resume and finish with every chip once.
    let s = run_ok(
        &input,
        &output,
        &["--task-files", "1", "--tasks-in-flight", "1"],
    );
    assert!(s["tasks_resumed"].as_u64().unwrap() >= 1, "{s}");
    assert_exact(&output, 24 * CHIPS_PER_IMAGE);
    // --overwrite with the other grouping replaces the job whole.
    let s = run_ok(&input, &output, &["--task-files", "2", "--overwrite"]);
    assert_eq!(s["tasks_resumed"], 0);
    assert_exact(&output, 24 * CHIPS_PER_IMAGE);
    assert_eq!(
        manifest(&output)["tasks"].as_u64().unwrap(),
        walk(&output.join("chips")).len() as u64
    );
}

#[test]
fn an_input_that_changed_between_runs_leaves_no_chip_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 12);
    run_ok(&input, &output, &["--task-files", "3"]);
    assert_exact(&output, 12 * CHIPS_PER_IMAGE);
    // New files change the tasks around them (content-defined boundaries):
    // the old tasks' files hold chips the new tasks' files hold too.
    let more = dir.path().join("more");
    make_images(&more, 20);
    // Between the old names, so groups in the middle of the plan change.
    for i in 12..20 {
        std::fs::copy(
            more.join(format!("img_{i:03}.png")),
            input.join(format!("img_{:03}b.png", i - 12)),
        )
        .unwrap();
    }
    let s = run_ok(&input, &output, &["--task-files", "3"]);
    assert_exact(&output, 20 * CHIPS_PER_IMAGE);
    assert!(s["superseded_files"].as_u64().unwrap() >= 1, "{s}");
}

#[test]
fn a_mistyped_input_changes_nothing_and_the_corrected_command_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 2);
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    // Into a new output: an error, and no output folder left behind.
    let o = run_job(&empty, &output, &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("holds no inputs"), "{}", stderr(&o));
    assert!(!output.exists(), "a failed first run leaves no folder");
    let o = run_job(&dir.path().join("no-such-dir"), &output, &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(!output.exists());
    // Rejected arguments leave nothing either.
    let o = run_job(&input, &output, &["--bands", "1,2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(!output.exists(), "rejected arguments leave no folder");
    // The corrected command runs.
    run_ok(&input, &output, &[]);
    assert_exact(&output, 2 * CHIPS_PER_IMAGE);
    // A mistyped input with --overwrite deletes nothing.
    let before = snapshot(&output);
    let o = run_job(&empty, &output, &["--overwrite"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(snapshot(&output) == before, "the job is still there");
}

/// An all-nodata GeoTIFF (GDAL writes it from a black PNG with nodata 0).
fn all_nodata_tif(path: &Path) {
    let png = path.with_extension("png");
    image::RgbImage::from_pixel(64, 64, image::Rgb([0, 0, 0]))
        .save(&png)
        .unwrap();
    let st = Command::new("gdal_translate")
        .args([
            "-q",
            "-a_srs",
            "EPSG:32618",
            "-a_ullr",
            "500000",
            "4000640",
            "500640",
            "4000000",
        ])
        .args(["-a_nodata", "0"])
        .arg(&png)
        .arg(path)
        .status()
        .expect("gdal_translate runs (scripts/setup-test-env.sh installs gdal-bin)");
    assert!(st.success());
    std::fs::remove_file(png).unwrap();
}

#[test]
fn an_input_that_yields_nothing_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 1);
    all_nodata_tif(&input.join("zz_all_nodata.tif"));
    let out = run(run_cmd(&input, &output, &tiny_model()).args(["--chip-size", "16"]));
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("without chips   1") && text.contains("zz_all_nodata.tif"),
        "{text}"
    );
    let m = manifest(&output);
    assert_eq!(m["inputs_without_chips"], 1, "{m}");
    assert_without_chips(&output, "zz_all_nodata.tif");
    // A resumed run still knows it: the chip file lists its empty inputs.
    let again = run(run_cmd(&input, &output, &tiny_model()).args(["--chip-size", "16"]));
    assert!(String::from_utf8_lossy(&again.stdout).contains("without chips   1"));
    assert_eq!(manifest(&output)["inputs_without_chips"], 1);
    // Only the nodata scene: no chips at all, and no query printed.
    let (input2, output2) = (dir.path().join("in2"), dir.path().join("out2"));
    std::fs::create_dir_all(&input2).unwrap();
    all_nodata_tif(&input2.join("all_nodata.tif"));
    let out = run(run_cmd(&input2, &output2, &tiny_model()).args(["--chip-size", "16"]));
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no chips: nothing to query"), "{text}");
    assert!(!text.contains("duckdb -c"), "{text}");
}

#[test]
fn a_run_without_a_terminal_logs_progress() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 6);
    let out = run(run_cmd(&input, &output, &tiny_model()).args([
        "--task-files",
        "1",
        "--tasks-in-flight",
        "1",
        "--progress-interval",
        "50ms",
    ]));
    assert!(out.status.success());
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.starts_with("rsembed run: ["))
        .unwrap_or_else(|| panic!("a progress line: {err}"));
    for part in ["inputs", "chips", "chips/s", "ETA"] {
        assert!(line.contains(part), "{line}");
    }
}

// ---- distributed mode --------------------------------------------------

fn tasks_txt(output: &Path) -> String {
    std::fs::read_to_string(output.join("tasks.txt")).unwrap()
}

#[test]
fn distributed_second_output_resubmit_and_grouping() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    make_images(&input, 6);
    let worker = Worker::start(&url, "w", &[], &[]);

    let sa = submit_ok(&url, &input, &a, &["--task-files", "2"]);
    wait_finished(&url, &a, FINISH);
    let (code, report) = finalize(&url, &a);
    assert_eq!(code, Some(0), "{report}");
    let manifest_a = std::fs::read(a.join("manifest.json")).unwrap();

    // The same input and model to a second output: a second job, published.
    let sb = submit_ok(&url, &input, &b, &["--task-files", "2"]);
    assert_ne!(sa["job_id"], sb["job_id"]);
    assert_eq!(sb["published"], sb["tasks"], "{sb}");
    assert_eq!(sb["done"], 0, "{sb}");
    let st = wait_finished(&url, &b, FINISH);
    assert_eq!(st["done"], st["tasks"], "{st}");
    let (code, report) = finalize(&url, &b);
    assert_eq!(code, Some(0), "{report}");
    let (rows, ids, sources) = chip_counts(&b);
    assert_eq!((rows, ids, sources), (6, 6, 6));
    assert_eq!(chip_counts(&a), (6, 6, 6));

    // A resubmit of a finished job publishes nothing and keeps its manifest.
    let again = submit_ok(&url, &input, &a, &["--task-files", "2"]);
    assert_eq!(again["published"], 0, "{again}");
    assert_eq!(
        std::fs::read(a.join("manifest.json")).unwrap(),
        manifest_a,
        "the manifest of a finished job is kept"
    );
    let st = status(&url, &a);
    assert_eq!(
        (st["done"].clone(), st["tasks"].clone()),
        (sa["tasks"].clone(), sa["tasks"].clone()),
        "{st}"
    );
    assert_eq!(st["finished"], true);

    // Another grouping into the same output: refused, nothing changed.
    let before = snapshot(&a);
    let o = submit(&url, &input, &a, &["--task-files", "4"]);
    assert_refused(&before, &a, &o, "--task-files");
    assert_eq!(
        tasks_txt(&a),
        String::from_utf8_lossy(&before[Path::new("tasks.txt")])
    );
    for (flag, extra) in [
        (
            "--min-valid",
            vec!["--task-files", "2", "--min-valid", "0.5"],
        ),
        ("--fp16", vec!["--task-files", "2", "--fp16"]),
        ("--stride", vec!["--task-files", "2", "--stride", "128"]),
        (
            "--footprint-tolerance",
            vec!["--task-files", "2", "--footprint-tolerance", "0.5"],
        ),
    ] {
        let o = submit(&url, &input, &a, &extra);
        assert_refused(&before, &a, &o, flag);
    }
    // status counts each task once.
    let st = status(&url, &a);
    assert_eq!(st["done"], sa["tasks"], "{st}");
    assert_eq!(st["chips"], 6, "{st}");
    drop(worker);
}

#[test]
fn distributed_force_new_job_replaces_the_other_job() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 4);
    // The first job is queued but never run: no worker yet.
    let first = submit_ok(&url, &input, &output, &["--task-files", "1"]);
    assert_eq!(first["published"], 4);
    let o = submit(&url, &input, &output, &["--task-files", "2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--force-new-job"), "{}", stderr(&o));
    let second = submit_ok(
        &url,
        &input,
        &output,
        &["--task-files", "2", "--force-new-job"],
    );
    assert_ne!(first["job_id"], second["job_id"]);
    let worker = Worker::start(&url, "w", &[], &[]);
    let st = wait_finished(&url, &output, FINISH);
    assert_eq!(st["done"], second["tasks"], "{st}");
    let (code, report) = finalize(&url, &output);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(chip_counts(&output), (4, 4, 4));
    // The first job's tasks were purged: the worker never ran one.
    assert!(
        !worker.log().contains(first["job_id"].as_str().unwrap()),
        "{}",
        worker.log()
    );
}

#[test]
fn distributed_crash_between_the_files_and_the_done_record() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 3);
    submit_ok(
        &url,
        &input,
        &output,
        &["--task-files", "1", "--ack-wait", "2s"],
    );
    let mut crashing = Worker::start(
        &url,
        "crashing",
        &["--tasks-in-flight", "1"],
        &[("RSEMBED_FAULT_CRASH_AFTER_FILES", "true".into())],
    );
    crashing.wait_for_log("aborting after the task's files", FINISH);
    crashing.wait(Duration::from_secs(30));
    let files_before = walk(&output.join("chips")).len();
    assert_eq!(files_before, 1, "the crash came after one chip file");
    // The files are there, the done record is not: status must not count it.
    let st = status(&url, &output);
    assert_eq!(st["done"], 0, "{st}");

    let w = Worker::start(&url, "w", &[], &[]);
    wait_finished(&url, &output, FINISH);
    let (code, report) = finalize(&url, &output);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(chip_counts(&output), (3, 3, 3));
    assert_eq!(walk(&output.join("chips")).len(), 3);
    drop(w);
}

#[test]
fn status_says_when_no_worker_holds_the_tasks() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 3);
    submit_ok(
        &url,
        &input,
        &output,
        &["--task-files", "1", "--ack-wait", "2s"],
    );
    let st = status(&url, &output);
    assert!(
        st["note"]
            .as_str()
            .unwrap_or_default()
            .contains("no worker"),
        "{st}"
    );
    let mut w = Worker::start(
        &url,
        "holder",
        &["--tasks-in-flight", "1"],
        &[("RSEMBED_FAULT_TASK_DELAY", "120s".into())],
    );
    w.wait_for_log("holding the task", FINISH);
    let started = Instant::now();
    loop {
        let st = status(&url, &output);
        if st["in_flight"] == 1 {
            assert!(st["note"].is_null(), "a live holder: {st}");
            break;
        }
        assert!(started.elapsed() < FINISH, "{st}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The only worker dies holding a task.
    w.kill();
    let started = Instant::now();
    loop {
        let st = status(&url, &output);
        let note = st["note"].as_str().unwrap_or_default().to_owned();
        if st["in_flight"] == 0 && note.contains("no worker") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "status still shows the dead worker's task: {st}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn ctrl_c_on_run_says_that_a_rerun_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 40);
    let mut child = start_task_by_task(&input, &output, std::process::Stdio::piped());
    wait_for_chip_files(&output, 1, &mut child);
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains("run the same command again to resume"),
        "{err}"
    );
    // The batch in flight is cancelled on purpose: no error is logged for it
    // (ONNX Runtime's "Non-zero status code ... GetElementType" came from
    // its destructors running under the inference thread).
    assert!(
        !err.contains("ERROR") && !err.contains("Non-zero status"),
        "{err}"
    );
    let s = run_ok(&input, &output, &["--task-files", "1"]);
    assert!(s["tasks_resumed"].as_u64().unwrap() >= 1, "{s}");
    assert_exact(&output, 40);
}

#[test]
fn an_output_that_refuses_files_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    make_images(&input, 1);
    let out = rsembed_integration_tests::run_timeout(
        run_cmd(&input, Path::new("/proc"), &tiny_model()).args(["--chip-size", "16"]),
        Duration::from_secs(60),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("/proc"), "{}", stderr(&out));
}

#[test]
fn distributed_an_input_that_yields_nothing_is_reported_by_finalize() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    make_images(&input, 2);
    all_nodata_tif(&input.join("zz_all_nodata.tif"));
    submit_ok(
        &url,
        &input,
        &output,
        &["--task-files", "1", "--chip-size", "16"],
    );
    let w = Worker::start(&url, "w", &[], &[]);
    wait_finished(&url, &output, FINISH);
    let (code, report) = finalize(&url, &output);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["inputs_without_chips"], 1, "{report}");
    assert_without_chips(&output, "zz_all_nodata.tif");
    drop(w);
}

#[test]
fn a_job_planned_under_the_old_default_grouping_resumes_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    // Past twice 64 inputs a group always ends: the old grouping makes at
    // least two tasks of these.
    make_images(&input, 130);
    // The grouping versions before issue 29 recorded when no flag was given.
    let old = [
        "--task-files",
        "64",
        "--task-chips",
        "64",
        "--task-bytes",
        "1GiB",
        "--shard-bytes",
        "16MiB",
    ];
    let first = run_ok(&input, &output, &old);
    let spec = |o: &Path| -> Value {
        serde_json::from_slice(&std::fs::read(o.join("job.json")).unwrap()).unwrap()
    };
    assert_eq!(spec(&output)["grouping"]["task_files"], 64);
    // Today's defaults differ; without a grouping flag the job resumes with
    // the grouping it recorded instead of being refused as another job.
    let again = run_ok(&input, &output, &[]);
    assert_eq!(again["job_id"], first["job_id"], "{again}");
    assert_eq!(again["chips_embedded"], 0, "{again}");
    assert_eq!(again["tasks_resumed"], first["tasks"], "{again}");
    assert_eq!(spec(&output)["grouping"]["task_files"], 64);
    // A grouping flag given is compared as always.
    let before = snapshot(&output);
    let o = run_job(&input, &output, &["--task-files", "8192"]);
    assert_refused(&before, &output, &o, "--task-files");

    // A new job takes the new defaults: 130 one-chip images are a task (two
    // when one of them happens to end a group, a chance of 130 in 8192),
    // where 64 files a task made several.
    let fresh = dir.path().join("fresh");
    let s = run_ok(&input, &fresh, &[]);
    assert!(s["tasks"].as_u64().unwrap() <= 2, "{s}");
    assert!(first["tasks"].as_u64().unwrap() >= 2, "{first}");
    assert_eq!(spec(&fresh)["grouping"]["task_files"], 8192);
    assert_eq!(spec(&fresh)["grouping"]["task_chips"], 8192);
}
