//! The job side's typed errors print what their `format!` strings printed
//! and keep their causes as sources.

use std::error::Error as _;

use rsembed_worker::error::chain;

use crate::error::Error;

fn io(kind: std::io::ErrorKind, msg: &str) -> std::io::Error {
    std::io::Error::new(kind, msg.to_owned())
}

/// Each typed variant prints what its `format!` string printed, and
/// keeps the cause as a source of its own type.
#[test]
fn typed_variants_keep_wording_and_source() {
    let denied = io(std::io::ErrorKind::PermissionDenied, "permission denied");
    let e = Error::CreateOutputDir {
        dir: "/ro/out".into(),
        source: io(std::io::ErrorKind::PermissionDenied, "permission denied"),
    };
    assert_eq!(
        chain(&e),
        format!("output: cannot create output folder /ro/out: {denied}")
    );
    assert!(e.source().unwrap().is::<std::io::Error>());

    let e = Error::OutputNotWritable {
        url: "file:///ro/out/".into(),
        source: Box::new(io(std::io::ErrorKind::Other, "read-only file system")),
    };
    assert_eq!(
        chain(&e),
        "output: cannot write to file:///ro/out/: read-only file system"
    );
    assert!(e.source().unwrap().is::<std::io::Error>());

    let missing = || object_store::Error::NotFound {
        path: "job.json".into(),
        source: "gone".into(),
    };
    let e = Error::ReadOutput {
        path: "s3://b/out/job.json".into(),
        source: missing(),
    };
    assert_eq!(
        chain(&e),
        format!("output: cannot read s3://b/out/job.json: {}", missing())
    );
    assert!(e.source().unwrap().is::<object_store::Error>());

    let e = Error::InputStore {
        url: "https://h/x.tif".into(),
        source: missing(),
    };
    assert_eq!(chain(&e), format!("input: https://h/x.tif: {}", missing()));

    let e = Error::WriteOutput {
        path: "out/tasks.txt".into(),
        source: io(std::io::ErrorKind::Other, "disk full"),
    };
    assert_eq!(chain(&e), "output: out/tasks.txt: disk full");

    let e = Error::MetricsListen {
        addr: "127.0.0.1:1".into(),
        source: io(std::io::ErrorKind::AddrInUse, "address in use"),
    };
    assert_eq!(
        chain(&e),
        "--metrics-addr 127.0.0.1:1: cannot listen: address in use"
    );
    assert!(e.source().unwrap().is::<std::io::Error>());
}

#[tokio::test]
async fn a_panicked_planner_names_itself_and_keeps_the_join_error() {
    let join = tokio::spawn(async { panic!("boom") }).await.unwrap_err();
    let shown = join.to_string();
    let e = Error::Panicked {
        what: "planner",
        source: join,
    };
    assert_eq!(chain(&e), format!("input: planner panicked: {shown}"));
    assert!(e.source().unwrap().is::<tokio::task::JoinError>());
}

#[test]
fn an_unwalkable_input_names_the_folder_and_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("gone");
    let walk_err = walkdir::WalkDir::new(&gone)
        .into_iter()
        .next()
        .unwrap()
        .unwrap_err();
    let shown = walk_err.to_string();
    let e = Error::ListInput {
        url: "file:///in/".into(),
        source: walk_err,
    };
    assert_eq!(chain(&e), format!("input: listing file:///in/: {shown}"));
    assert!(chain(&e).contains(&gone.display().to_string()));
}
