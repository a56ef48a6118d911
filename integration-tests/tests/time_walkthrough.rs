//! docs/time.md's walkthrough, run as written (issue 31): its `rsembed`
//! commands and its SQL, against `rustac serve` holding Earth Search-shaped
//! `sentinel-2-l2a` items over Berlin, with only the API URL, the model and
//! the output folder put in. Earth Search itself cannot be reached from the
//! test machines; the items have its asset keys, bands, units and
//! projection fields.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rsembed_integration_tests::stac::{collection, StacServer};
use rsembed_integration_tests::stac_scenes::{item, make_scene, ItemStyle};
use rsembed_integration_tests::*;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(300);
const EARTH_SEARCH: &str = "https://earth-search.aws.element84.com/v1";

/// The walkthrough's commands (continuation lines joined) and its SQL
/// statements.
fn walkthrough() -> (Vec<String>, Vec<String>) {
    let doc = std::fs::read_to_string(root().join("docs/time.md")).unwrap();
    let start = doc
        .find("## Walkthrough:")
        .expect("docs/time.md has the walkthrough");
    let section = &doc[start..];
    let block = |fence: &str| -> String {
        let from = section.find(fence).expect(fence) + fence.len();
        let len = section[from..].find("```").unwrap();
        section[from..from + len].to_owned()
    };
    let commands = block("```sh\n")
        .replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("rsembed "))
        .map(str::to_owned)
        .collect();
    let sql = block("```sql\n")
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    (commands, sql)
}

/// Words of a command line; the walkthrough quotes nothing.
fn words(line: &str) -> Vec<String> {
    assert!(!line.contains(['"', '\'']), "unquoted words only: {line}");
    line.split_whitespace().map(str::to_owned).collect()
}

/// Two overlapping tiles of one UTM zone over Berlin (their corners on the
/// 10 m lattice), a year of acquisitions, one cloudier.
fn serve(tmp: &Path) -> StacServer {
    // lonlat_bbox puts x 381000 near 13.3°E and y 5838600 near 52.6°N.
    let west = make_scene(&tmp.join("west"), 512, (381_000.0, 5_838_600.0), 3);
    let east = make_scene(&tmp.join("east"), 512, (383_560.0, 5_838_600.0), 4);
    let mut items = Vec::new();
    for (scene, tile) in [(&west, "33UUU"), (&east, "33UVU")] {
        let dir = scene.dir.clone();
        let href = move |n: &str| format!("file://{}", dir.join(n).display());
        for (k, day) in [
            "2024-02-10",
            "2024-05-03",
            "2024-05-20",
            "2024-08-14",
            "2024-11-02",
        ]
        .iter()
        .enumerate()
        {
            let cover = Value::from(if k == 2 { 40 } else { 3 });
            let id = format!("S2A_{tile}_{}_0_L2A", day.replace('-', ""));
            let t = format!("{day}T10:12:00Z");
            items.push(item(
                scene,
                &id,
                "sentinel-2-l2a",
                &t,
                cover,
                ItemStyle::EarthSearch,
                &href,
            ));
        }
    }
    let c = tmp.join("collection.json");
    std::fs::write(&c, collection("sentinel-2-l2a").to_string()).unwrap();
    let f = tmp.join("items.json");
    stac::write_feature_collection(&f, &items);
    StacServer::start(&[&c, &f])
}

#[test]
fn the_documented_quarterly_job_runs_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let server = serve(tmp.path());
    let (commands, sql) = walkthrough();
    assert_eq!(
        commands.len(),
        4,
        "plan, run, run again, change: {commands:?}"
    );
    assert_eq!(sql.len(), 2, "{sql:?}");
    let work: PathBuf = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let model = tiny_model().display().to_string();
    let mut outputs = Vec::new();
    for line in &commands {
        let args: Vec<String> = words(line)
            .into_iter()
            .skip(1)
            .map(|w| match w.as_str() {
                EARTH_SEARCH => server.url(),
                "models/git-rsclip" => model.clone(),
                _ => w,
            })
            .collect();
        let mut c = rsembed();
        c.current_dir(&work).args(&args);
        if args[0] == "run" {
            c.arg("--json");
        }
        let o = run_timeout(&mut c, LIMIT);
        assert!(
            o.status.success(),
            "{line}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        outputs.push(o);
    }
    // The plan: four quarters, the cloudy May scenes kept (under the cap).
    let plan = String::from_utf8_lossy(&outputs[0].stdout);
    assert!(plan.contains("4 of P3M, composite best"), "{plan}");
    let q2 = plan
        .lines()
        .find(|l| l.contains("2024-04-01T00:00:00Z/2024-07-01T00:00:00Z"))
        .unwrap_or_default();
    assert!(q2.contains(", 4 acquisitions, 0 dropped"), "{plan}");
    // The run, then the same command: nothing twice.
    let first: Value = serde_json::from_slice(&outputs[1].stdout).unwrap();
    let again: Value = serde_json::from_slice(&outputs[2].stdout).unwrap();
    assert!(first["chips"].as_u64().unwrap() > 0, "{first}");
    assert_eq!(again["chips_embedded"].as_u64().unwrap_or(0), 0, "{again}");
    let glob = work.join("berlin-2024/chips/*.parquet");
    let dup = duckdb(&format!(
        "SELECT count(*) - count(DISTINCT (cell, window_start)) FROM '{}'",
        glob.display()
    ));
    assert_eq!(dup[0][0], 0, "one row per (quarter, cell)");
    // The SQL, run from the walkthrough's folder.
    // As text: the test's Python has no time zone database for TIMESTAMPTZ.
    let at = |q: &str| {
        let dir = work.display();
        let q = q
            .replace("'berlin-2024/", &format!("'{dir}/berlin-2024/"))
            .replace("'berlin-change", &format!("'{dir}/berlin-change"));
        format!("SELECT COLUMNS(*)::VARCHAR FROM ({q})")
    };
    let quarters = duckdb(&at(&sql[0]));
    let names: Vec<&str> = quarters
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_str().unwrap())
        .collect();
    assert_eq!(names, ["2024-01", "2024-04", "2024-07", "2024-10"]);
    let changes = duckdb(&at(&sql[1]));
    assert!(
        !changes.as_array().unwrap().is_empty(),
        "change pairs: {changes}"
    );
    // Cells of the two tiles share a lattice: the overlap's cells are one
    // row a quarter, taken from either tile.
    let tiles = duckdb(&format!(
        "SELECT count(DISTINCT item_id) FROM '{}' WHERE strftime(window_start, '%m') = '01'",
        glob.display()
    ));
    assert_eq!(tiles[0][0], 2, "both tiles give cells: {tiles}");
}
