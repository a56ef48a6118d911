//! `--windows` through `rsembed plan` against `rustac serve` (issue 31):
//! each item goes to the quarter holding its datetime, a window past
//! `--max-scenes` drops its cloudiest items, and the flags are refused
//! where they mean nothing.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use rsembed_integration_tests::stac::{collection, item, StacServer};
use rsembed_integration_tests::*;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(300);

/// Items `i`: datetime 2024-01-01 plus `i` days, `eo:cloud_cover` `i % 101`.
const DAYS: [usize; 10] = [0, 10, 20, 100, 130, 300, 310, 320, 330, 340];

fn serve(dir: &Path) -> StacServer {
    let c = dir.join("c.json");
    let items = dir.join("items.json");
    std::fs::write(&c, collection("c").to_string()).unwrap();
    let items_json: Vec<Value> = DAYS.iter().map(|&i| item(i, "1.1.0", "c")).collect();
    stac::write_feature_collection(&items, &items_json);
    StacServer::start(&[&c, &items])
}

fn plan(input: &str, flags: &[&str]) -> Output {
    let mut c = rsembed();
    c.args(["plan", "--input", input]).args(flags);
    run_timeout(&mut c, LIMIT)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn plan_puts_each_item_in_its_quarter_and_caps_each_quarter() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path());
    let quarters = ["--windows", "P3M", "--datetime", "2024-01-01/2024-12-31"];
    let mut flags = quarters.to_vec();
    flags.extend(["--max-scenes", "3", "--json"]);
    let o = plan(&server.url(), &flags);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let w = &v["windows"];
    assert_eq!(w["duration"], "P3M");
    assert_eq!(w["composite"], "best");
    assert_eq!(w["max_scenes"], 3);
    let got: Vec<(String, u64, u64, u64)> = w["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["window"].as_str().unwrap()[..10].to_owned(),
                x["tasks"].as_u64().unwrap(),
                x["acquisitions"].as_u64().unwrap(),
                x["dropped_past_max_scenes"].as_u64().unwrap(),
            )
        })
        .collect();
    // Days 0-90 are the first quarter of 2024, 91-181 the second; the third
    // has no item and no task; the fourth keeps the 3 clearest of 5 (it
    // drops the 98 % and the 37 % ones).
    assert_eq!(
        got,
        [
            ("2024-01-01".into(), 1, 3, 0),
            ("2024-04-01".into(), 1, 2, 0),
            ("2024-07-01".into(), 0, 0, 0),
            ("2024-10-01".into(), 1, 3, 2),
        ],
        "{v}"
    );
    assert_eq!(
        w["windows"][0]["window"],
        "2024-01-01T00:00:00Z/2024-04-01T00:00:00Z"
    );
    assert_eq!(v["tasks"], 3, "one task a window with an item: {v}");
    assert_eq!(v["inputs"], 10);
    // The text form lists the windows too.
    let o = plan(&server.url(), &quarters);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("4 of P3M, composite best, at most 64"),
        "{text}"
    );
    assert!(
        text.contains("2024-07-01T00:00:00Z/2024-10-01T00:00:00Z  0 tasks, 0 acquisitions"),
        "{text}"
    );
}

#[test]
fn windows_are_refused_without_an_interval_on_scene_alignment_and_on_other_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path());
    for (flags, says) in [
        (&["--windows", "P3M"][..], "give --datetime with both ends"),
        (
            &["--windows", "P3M", "--datetime", "2024-01-01/.."][..],
            "both ends",
        ),
        (
            &[
                "--windows",
                "P3M",
                "--datetime",
                "2024-01-01/2024-12-31",
                "--align",
                "scene",
            ][..],
            "--align crs",
        ),
        (
            &[
                "--windows",
                "P3M",
                "--datetime",
                "2024-01-01/2024-12-31",
                "--composite",
                "median",
            ][..],
            "needs a fixed --scale",
        ),
        (&["--max-scenes", "3"][..], "need --windows"),
    ] {
        let o = plan(&server.url(), flags);
        assert!(!o.status.success(), "{flags:?} is refused");
        assert!(stderr(&o).contains(says), "{flags:?}: {}", stderr(&o));
    }
    // A folder of images is no search to split.
    let o = plan(
        &dir.path().display().to_string(),
        &["--windows", "P3M", "--datetime", "2024-01-01/2024-12-31"],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--windows) do not apply"),
        "{}",
        stderr(&o)
    );
}
