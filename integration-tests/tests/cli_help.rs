//! The help texts a new user reads first: `rsembed --help` introduces every
//! command, and each command's `--help` lists only flags that apply to it,
//! with the defaults it really uses and the `RSEMBED_*` variable of each flag.
//! `plan` prints its chip estimate and human-readable sizes.

use rsembed_integration_tests::*;

/// Every subcommand of `rsembed`.
const COMMANDS: [&str; 11] = [
    "run",
    "plan",
    "submit",
    "status",
    "finalize",
    "text",
    "search",
    "classify",
    "compact",
    "change",
    "fetch-model",
];

/// Flags of the image inference group that have no meaning for the text graph.
const IMAGE_ONLY: [&str; 12] = [
    "--batch-size",
    "--max-batch",
    "--gpu-mem-limit",
    "--arena-extend-strategy",
    "--cudnn-conv-algo-search",
    "--tf32",
    "--tensorrt",
    "--fp16",
    "--inter-threads",
    "--graph-opt-level",
    "--ort-profile",
    "--arena-shrink",
];

#[test]
fn top_level_help_introduces_every_command_on_one_line() {
    let help = cli_help(&binary("rsembed"), &[]);
    let (about, rest) = help.split_once("Usage:").expect("a Usage: line");
    for c in COMMANDS {
        assert!(
            about.contains(&format!("`{c}`")),
            "the description does not name `{c}`:\n{about}"
        );
    }
    let commands = rest
        .split_once("Commands:\n")
        .expect("a Commands: section")
        .1
        .split("\n\n")
        .next()
        .unwrap();
    let listed: Vec<(&str, &str)> = commands
        .lines()
        .map(|l| {
            let l = l.trim_start();
            let (name, text) = l.split_once(' ').unwrap_or((l, ""));
            (name, text.trim())
        })
        .filter(|(name, _)| *name != "help")
        .collect();
    let names: Vec<&str> = listed.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, COMMANDS, "one line per command:\n{commands}");
    for (name, text) in listed {
        assert!(
            !text.is_empty() && text.len() <= 90,
            "`{name}`: one short line, not {:?}",
            text
        );
    }
}

#[test]
fn plan_help_says_which_chip_size_it_defaults_to() {
    let help = cli_help(&binary("rsembed"), &["plan"]);
    let line = help
        .lines()
        .skip_while(|l| !l.contains("--chip-size"))
        .take_while(|l| !l.trim_start().starts_with("--stride"))
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        !line.contains("the model's input size"),
        "plan takes no model: {line}"
    );
    assert!(line.contains("Default: 256"), "{line}");
    assert!(!help_has_flag(&help, "--model"), "{help}");
}

#[test]
fn text_commands_list_only_text_inference_flags() {
    for cmd in ["text", "search", "classify"] {
        let help = cli_help(&binary("rsembed"), &[cmd]);
        for flag in IMAGE_ONLY {
            assert!(
                !help_has_flag(&help, flag),
                "`rsembed {cmd} --help` lists the image-only {flag}"
            );
        }
        for (flag, var) in [
            ("--device", "RSEMBED_DEVICE"),
            ("--intra-threads", "RSEMBED_INTRA_THREADS"),
            ("--ort-lib", "RSEMBED_ORT_LIB"),
        ] {
            assert!(help_has_flag(&help, flag), "{cmd} lacks {flag}");
            assert!(help_reads_env(&help, var), "{cmd}: {flag} reads no {var}");
        }
    }
    // The image commands keep the whole group.
    let run = cli_help(&binary("rsembed"), &["run"]);
    for flag in IMAGE_ONLY {
        assert!(help_has_flag(&run, flag), "run lacks {flag}");
    }
}

#[test]
fn every_status_flag_reads_an_environment_variable() {
    let help = cli_help(&binary("rsembed"), &["status"]);
    for (flag, var) in [
        ("--watch", "RSEMBED_WATCH"),
        ("--interval", "RSEMBED_INTERVAL"),
        ("--outage-grace", "RSEMBED_OUTAGE_GRACE"),
        ("--json", "RSEMBED_JSON"),
    ] {
        assert!(help_has_flag(&help, flag), "status lacks {flag}");
        assert!(help_reads_env(&help, var), "status: {flag} reads no {var}");
    }
    assert!(help.contains("chips/s"), "--watch says what a line holds");
}

#[test]
fn fetch_model_help_documents_the_checks() {
    let help = cli_help(&binary("rsembed"), &["fetch-model"]);
    assert!(help_has_flag(&help, "--check-graphs"), "{help}");
    assert!(help_reads_env(&help, "RSEMBED_CHECK_GRAPHS"), "{help}");
    assert!(help_reads_env(&help, "RSEMBED_ORT_LIB"), "{help}");
}

#[test]
fn plan_prints_a_chip_estimate_and_human_sizes() {
    let o = run(rsembed().arg("plan").arg("--input").arg(fixture_images()));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8(o.stdout).unwrap();
    let inputs = std::fs::read_dir(fixture_images()).unwrap().count();
    // Every committed image is a whole image: one chip each.
    assert!(
        text.lines().any(|l| {
            let l = l.trim_start();
            l.starts_with("chips") && l.contains(&format!("about {inputs} "))
        }),
        "{text}"
    );
    let bytes = text
        .lines()
        .find(|l| l.trim_start().starts_with("bytes"))
        .expect("a bytes line");
    assert!(
        bytes.ends_with(" KiB") || bytes.ends_with(" MiB"),
        "human-formatted: {bytes}"
    );

    let o = run(rsembed()
        .args(["plan", "--json", "--input"])
        .arg(fixture_images()));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["chips_estimate"], inputs as u64, "{v}");
}

/// The flags under each heading of a help text, by heading (`Options` for
/// the unheaded ones).
fn sections(help: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in help.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            out.push((line.trim_end_matches(':').to_owned(), Vec::new()));
        } else if let (Some(flag), Some(last)) = (
            line.trim_start()
                .split([' ', ','])
                .find(|w| w.starts_with("--")),
            out.last_mut(),
        ) {
            // A flag's own line starts with it (`-h, --help` or `--input <..>`),
            // never a line of help text that names one.
            if line.trim_start().starts_with('-') {
                last.1.push(flag.trim_end_matches(['=', '<']).to_owned());
            }
        }
    }
    out
}

#[test]
fn the_stac_search_heading_holds_only_the_stac_search_flags() {
    let stac = [
        "--collections",
        "--bbox",
        "--datetime",
        "--ids",
        "--filter",
        "--max-items",
        "--cloud-cover-max",
    ];
    for cmd in ["run", "plan", "submit"] {
        let help = cli_help(&binary("rsembed"), &[cmd]);
        let secs = sections(&help);
        let (heading, flags) = secs
            .iter()
            .find(|(h, _)| h.starts_with("STAC search"))
            .unwrap_or_else(|| panic!("`{cmd} --help` has a STAC search heading:\n{help}"));
        assert_eq!(flags, &stac, "`{cmd} --help`, under {heading}:\n{help}");
        // The flags declared after the STAC group are headed elsewhere.
        let later = ["--json", "--overwrite", "--device", "--tasks-in-flight"];
        for (h, flags) in &secs {
            for f in later {
                assert!(
                    !h.starts_with("STAC") || !flags.iter().any(|x| x == f),
                    "`{cmd} --help` lists {f} under {h}"
                );
            }
        }
        assert!(help_has_flag(&help, "--json"), "{help}");
    }
}

#[test]
fn every_byte_sized_flag_takes_units() {
    use rsembed_integration_tests::rasters::{make_geotiff16, Scene16};
    // A scene of a few MiB: one task input under the default --shard-bytes
    // (16 MiB), split into chip blocks under 1 MiB.
    let tmp = tempfile::tempdir().unwrap();
    let scene = tmp.path().join("scene.tif");
    make_geotiff16(
        &scene,
        Scene16 {
            width: 1024,
            height: 1024,
            tile: 256,
            nodata: None,
        },
    );
    let size = std::fs::metadata(&scene).unwrap().len();
    assert!((1 << 20..16 << 20).contains(&size), "{size} bytes");
    let plan = |flags: &[&str]| {
        let o = run(rsembed()
            .args(["plan", "--json", "--task-chips", "4", "--input"])
            .arg(&scene)
            .args(flags));
        assert!(
            o.status.success(),
            "{flags:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    assert_eq!(plan(&[])["sharded_scenes"], 0);
    for value in ["1MiB", "1 MiB", "1048576", "1M"] {
        let p = plan(&["--shard-bytes", value]);
        assert_eq!(p["sharded_scenes"], 1, "--shard-bytes {value}: {p}");
    }
    assert_eq!(
        plan(&["--shard-bytes", "1GiB", "--task-bytes", "1GiB"])["sharded_scenes"],
        0
    );
    let o = run(rsembed()
        .args(["plan", "--input"])
        .arg(&scene)
        .args(["--shard-bytes", "1 parsec"]));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown unit"));
}

#[test]
fn a_result_count_of_zero_is_refused() {
    for args in [
        &["search", "--index", "x", "--top-k", "0", "a"][..],
        &[
            "classify", "--index", "x", "--model", "m", "--labels", "l", "--output", "o", "--top",
            "0",
        ][..],
    ] {
        let o = run(rsembed().args(args));
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("0") && err.contains("1.."), "{args:?}: {err}");
    }
}
