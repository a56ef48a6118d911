//! `rsembed plan`: a dry run that counts inputs and tasks and writes nothing.

use rsembed_integration_tests::*;
use serde_json::Value;

#[test]
fn plan_counts_inputs_and_tasks_without_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    copy_dir(&fixture_images(), &input);
    std::fs::write(input.join("README.txt"), b"not an image").unwrap();
    let before: Vec<_> = std::fs::read_dir(&input).unwrap().collect();
    let o = run(rsembed().args([
        "plan",
        "--json",
        "--task-size",
        "2",
        "--input",
        input.to_str().unwrap(),
    ]));
    assert!(o.status.success());
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let images = std::fs::read_dir(fixture_images()).unwrap().count() as u64;
    assert_eq!(v["inputs"], images);
    assert_eq!(v["skipped"], 1);
    assert!(v["tasks"].as_u64().unwrap() >= 1);
    assert!(
        v["largest_task"].as_u64().unwrap() <= 4,
        "groups are capped at 2 x task size"
    );
    assert_eq!(std::fs::read_dir(&input).unwrap().count(), before.len());
}

#[test]
fn task_bytes_caps_a_group_and_task_files_is_the_count() {
    let images = std::fs::read_dir(fixture_images()).unwrap().count() as u64;
    let plan = |extra: &[&str]| -> Value {
        let o = run(rsembed()
            .args(["plan", "--json", "--input"])
            .arg(fixture_images())
            .args(extra));
        assert!(o.status.success());
        serde_json::from_slice(&o.stdout).unwrap()
    };
    // Every fixture is at least a byte: a one-byte cap ends every group.
    let one_byte = plan(&["--task-files", "1000000", "--task-bytes", "1"]);
    assert_eq!(one_byte["tasks"], images);
    assert_eq!(one_byte["largest_task"], 1);
    let unbounded = plan(&["--task-files", "1000000", "--task-bytes", "1GiB"]);
    assert_eq!(unbounded["tasks"], 1, "all inputs in one group");
    // The old name still works.
    assert_eq!(plan(&["--task-size", "1000000"])["tasks"], 1);
}
