//! What the deploy docs say is what exists: the chart's README lists every
//! value of `values.yaml`, and the walk-through of `docs/deploy.md` uses only
//! values the chart accepts (its values file and `helm --set`s render) and
//! flags the binaries have (every `rsembed`/`rsembed-worker` command, also as
//! a `docker run` of the images).

use std::collections::BTreeMap;

use rsembed_integration_tests::helm::{parse, python_yaml, render, CHART};
use rsembed_integration_tests::{binary, cli_help, help_has_flag, root};
use serde_json::Value;

/// Dotted paths of the chart's values, down to leaves (whole objects for
/// resources, security contexts, probes and tolerations); `nats.*` belongs
/// to the NATS chart, except `nats.enabled`.
fn value_paths(v: &Value, prefix: &str, out: &mut Vec<String>) {
    const WHOLE: [&str; 7] = [
        "resources",
        "podSecurityContext",
        "securityContext",
        "startupProbe",
        "livenessProbe",
        "readinessProbe",
        "tolerations",
    ];
    match v {
        Value::Object(m) if !m.is_empty() && !WHOLE.iter().any(|w| prefix.ends_with(w)) => {
            for (k, v) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                if prefix == "nats" && k != "enabled" {
                    continue;
                }
                value_paths(v, &p, out);
            }
        }
        _ => out.push(prefix.to_owned()),
    }
}

#[test]
fn chart_readme_lists_every_value() {
    let values = python_yaml(&root().join(CHART).join("values.yaml"));
    let readme = std::fs::read_to_string(root().join(CHART).join("README.md")).unwrap();
    let mut paths = Vec::new();
    value_paths(&values, "", &mut paths);
    assert!(paths.len() > 50, "{paths:?}");
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| !readme.contains(&format!("| `{p}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "deploy/helm/rsembed/README.md lacks {missing:?}"
    );
}

/// The fenced blocks of a Markdown text with their info string, and the line
/// before each block.
fn fenced(text: &str) -> Vec<(String, String, String)> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().peekable();
    let mut before = String::new();
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```") {
            let mut body = String::new();
            for l in lines.by_ref() {
                if l.starts_with("```") {
                    break;
                }
                body.push_str(l);
                body.push('\n');
            }
            blocks.push((lang.to_owned(), before.clone(), body));
        } else if !line.trim().is_empty() {
            before = line.to_owned();
        }
    }
    blocks
}

/// Shell commands of a block, continuation lines joined, comments dropped.
fn commands(body: &str) -> Vec<Vec<String>> {
    let joined = body.replace("\\\n", " ");
    joined
        .lines()
        .map(|l| l.split(" #").next().unwrap_or_default().trim())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .flat_map(|l| {
            l.split("&&")
                .map(str::trim)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .map(|l| {
            l.split_whitespace()
                .map(|w| w.trim_matches('\'').to_owned())
                .collect()
        })
        .collect()
}

/// `--set k=v` pairs of a helm command as JSON values (Helm's `{a,b}` lists,
/// with `\,` for a comma inside an item).
fn helm_sets(cmd: &[String]) -> Value {
    let mut set = serde_json::json!({});
    for w in cmd.windows(2).filter(|w| w[0] == "--set") {
        let (key, raw) = w[1].split_once('=').expect("--set k=v");
        let value = match raw.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
            Some(items) => Value::Array(
                items
                    .replace("\\,", "\u{0}")
                    .split(',')
                    .map(|i| Value::String(i.replace('\u{0}', ",")))
                    .collect(),
            ),
            None if raw == "true" || raw == "false" => Value::Bool(raw == "true"),
            None => Value::String(raw.to_owned()),
        };
        let mut at = &mut set;
        let parts: Vec<&str> = key.split('.').collect();
        for p in &parts[..parts.len() - 1] {
            at = at
                .as_object_mut()
                .unwrap()
                .entry(p.to_string())
                .or_insert_with(|| serde_json::json!({}));
        }
        at[parts[parts.len() - 1]] = value;
    }
    set
}

/// The rsembed binary a shell command runs and its arguments: directly, or
/// as the image's entrypoint in `docker run ... <image>:<tag> ARGS`.
fn rsembed_command(cmd: &[String]) -> Option<(&'static str, &[String])> {
    let bin = |w: &str| match w {
        "rsembed" => Some("rsembed"),
        "rsembed-worker" => Some("rsembed-worker"),
        _ => None,
    };
    if let Some(b) = cmd.first().and_then(|w| bin(w)) {
        return Some((b, &cmd[1..]));
    }
    if cmd.len() > 2 && cmd[0] == "docker" && cmd[1] == "run" {
        let at = cmd.iter().position(|w| {
            w.split(':')
                .next()
                .and_then(|n| n.rsplit('/').next())
                .and_then(bin)
                .is_some()
                && w.contains(':')
        })?;
        let image = cmd[at].split(':').next()?.rsplit('/').next()?;
        return Some((bin(image)?, &cmd[at + 1..]));
    }
    None
}

/// docs/deploy.md's walk-through only uses what exists: its values file and
/// its `helm --set`s render with the chart's schema and templates, and every
/// `rsembed`/`rsembed-worker` command in it has the flags it passes.
#[test]
fn walkthrough_is_consistent() {
    let doc = std::fs::read_to_string(root().join("docs/deploy.md")).unwrap();
    let blocks = fenced(&doc);
    let (_, _, values) = blocks
        .iter()
        .find(|(lang, before, _)| lang == "yaml" && before.contains("values-s2.yaml"))
        .expect("the walk-through's values file");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values-s2.yaml");
    std::fs::write(&file, values).unwrap();

    let mut checked = 0;
    let mut rendered = 0;
    let mut helps: BTreeMap<Vec<String>, String> = BTreeMap::new();
    for (_, _, body) in blocks.iter().filter(|(l, _, _)| l == "sh") {
        for cmd in commands(body) {
            match cmd.first().map(String::as_str) {
                Some("helm") if cmd.iter().any(|w| w == "-f") => {
                    // Our values file plus the command's --sets must render.
                    let set = helm_sets(&cmd);
                    let r = render(std::slice::from_ref(&file), &set, true).unwrap_or_else(|e| {
                        panic!("docs/deploy.md: {cmd:?} does not render:\n{e}")
                    });
                    for m in r["manifests"].as_array().unwrap() {
                        parse("docs/deploy.md", m["template"].as_str().unwrap(), &m["doc"]);
                    }
                    rendered += 1;
                }
                _ => {
                    let Some((bin, args)) = rsembed_command(&cmd) else {
                        continue;
                    };
                    let mut key = vec![bin.to_owned()];
                    if let Some(sub) = args.iter().find(|w| !w.starts_with('-')) {
                        if bin == "rsembed" || sub == "check" {
                            key.push(sub.clone());
                        }
                    }
                    let help = helps.entry(key.clone()).or_insert_with(|| {
                        let args: Vec<&str> = key[1..].iter().map(String::as_str).collect();
                        cli_help(&binary(bin), &args)
                    });
                    for flag in args.iter().filter(|w| w.starts_with("--")) {
                        let flag = flag.split('=').next().unwrap();
                        assert!(
                            help_has_flag(help, flag),
                            "docs/deploy.md: {key:?} has no {flag}"
                        );
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(
        rendered >= 2,
        "the install and the job's upgrade render ({rendered})"
    );
    assert!(checked >= 3, "rsembed commands checked: {checked}");
}
