//! `--windows`, `--composite` and `--max-scenes` as `run`, `plan` and
//! `submit` parse and check them.

use clap::Parser;

use super::*;
use crate::cli::{Cli, Command};

/// The tiling flags of `command` given `flags`.
fn tiling_of(command: &str, flags: &[&str]) -> TilingArgs {
    let mut argv = vec!["rsembed", command, "--input", "https://stac.example/"];
    if command != "plan" {
        argv.extend(["--output", "/tmp/out", "--model", "/m"]);
    }
    if command == "submit" {
        argv.extend(["--nats", "nats://localhost:4222"]);
    }
    argv.extend(flags);
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    match cli.command {
        Command::Run(a) => a.tiling,
        Command::Submit(a) => a.tiling,
        Command::Plan(a) => a.tiling,
        _ => panic!("{command}"),
    }
}

fn refused(command: &str, flags: &[&str]) -> String {
    match window_spec(&tiling_of(command, flags)) {
        Err(Error::Usage(m)) => m,
        other => panic!("{flags:?} is not refused: {:?}", other.map(|(w, _)| w)),
    }
}

const QUARTERS: [&str; 4] = ["--windows", "P3M", "--datetime", "2024-01-01/2024-12-31"];

#[test]
fn windows_imply_crs_and_record_the_defaults_on_every_command() {
    for command in ["run", "plan", "submit"] {
        let (w, align) = window_spec(&tiling_of(command, &QUARTERS)).unwrap();
        assert_eq!(align, Align::Crs, "{command}");
        let w = w.expect("windows");
        assert_eq!(w.duration, "P3M");
        assert_eq!(w.composite, Composite::Best);
        assert_eq!(w.max_scenes, DEFAULT_MAX_SCENES);
    }
    // The canonical duration: P12M and P1Y are one job.
    let flags = ["--windows", "P12M", "--datetime", "2024-01-01/2024-12-31"];
    let (w, _) = window_spec(&tiling_of("run", &flags)).unwrap();
    assert_eq!(w.unwrap().duration, "P1Y");
    let mut flags = QUARTERS.to_vec();
    flags.extend(["--align", "crs", "--composite", "best", "--max-scenes", "8"]);
    let (w, align) = window_spec(&tiling_of("run", &flags)).unwrap();
    assert_eq!((w.unwrap().max_scenes, align), (8, Align::Crs));
    // Without windows the default alignment is as it was.
    assert_eq!(
        window_spec(&tiling_of("run", &[])).unwrap(),
        (None, Align::Scene)
    );
}

#[test]
fn windows_need_a_closed_datetime_interval() {
    let m = refused("run", &["--windows", "P3M"]);
    assert!(m.contains("--datetime"), "{m}");
    for open in ["2024-01-01/..", "../2024-12-31", "2024-06-01"] {
        let m = refused("plan", &["--windows", "P3M", "--datetime", open]);
        assert!(m.contains("--datetime") && m.contains("A/B"), "{open}: {m}");
    }
    let m = refused(
        "run",
        &[
            "--windows",
            "3 months",
            "--datetime",
            "2024-01-01/2024-12-31",
        ],
    );
    assert!(m.contains("--windows `3 months`"), "{m}");
}

#[test]
fn scene_alignment_median_and_stray_flags_are_refused() {
    let mut flags = QUARTERS.to_vec();
    flags.extend(["--align", "scene"]);
    let m = refused("submit", &flags);
    assert!(m.contains("--align crs"), "{m}");
    // A median needs one fixed scale for every scene: `auto` (the default) is refused.
    for scale in [&[][..], &["--scale", "auto"][..]] {
        let mut flags = QUARTERS.to_vec();
        flags.extend(["--composite", "median"]);
        flags.extend(scale);
        let m = refused("run", &flags);
        assert!(m.contains("needs a fixed --scale"), "{m}");
    }
    for scale in ["0:3000", "none"] {
        let mut flags = QUARTERS.to_vec();
        flags.extend(["--composite", "median", "--scale", scale]);
        let (w, _) = window_spec(&tiling_of("submit", &flags)).unwrap();
        assert_eq!(w.unwrap().composite, Composite::Median, "{scale}");
    }
    let mut flags = QUARTERS.to_vec();
    flags.extend(["--max-scenes", "0"]);
    assert!(refused("run", &flags).contains("--max-scenes must be positive"));
    for stray in [["--composite", "best"], ["--max-scenes", "3"]] {
        let m = refused("run", &stray);
        assert!(m.contains("need --windows"), "{m}");
    }
    let e = Cli::try_parse_from([
        "rsembed",
        "plan",
        "--input",
        "x",
        "--windows",
        "P1M",
        "--composite",
        "mean",
    ])
    .unwrap_err();
    assert!(e.to_string().contains("`best` or `median`"), "{e}");
}
