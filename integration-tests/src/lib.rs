//! Helpers for the end-to-end tests in `tests/`: the real binaries, the
//! committed fixtures, the shared sample data and DuckDB through Python.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub mod azure;
pub mod cluster;
pub mod helm;
pub mod nats;
pub mod proxy;
pub mod rasters;
pub mod s3;
pub mod stac;
pub mod stac_scenes;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("integration-tests lives in the workspace")
        .to_path_buf()
}

/// The committed tiny test model.
pub fn tiny_model() -> PathBuf {
    root().join("fixtures/models/tiny-siglip")
}

/// The committed sample images.
pub fn fixture_images() -> PathBuf {
    root().join("fixtures/images")
}

/// `../shared/data`, when this checkout has it. Tests that use it print that
/// they skipped when it is absent.
pub fn shared_data() -> Option<PathBuf> {
    let p = root().join("../shared/data");
    p.join("MANIFEST.txt").is_file().then_some(p)
}

/// Says that the calling test skips, and why: `SKIPPED: <reason>` on stderr,
/// and a line `<test>: <reason>` appended to the file `RSEMBED_SKIP_LOG`
/// names, so the suite's closing line counts the test as skipped rather than
/// passed (`scripts/test.sh`). The caller returns after it.
pub fn skipped(reason: &str) {
    eprintln!("SKIPPED: {reason}");
    let Some(log) = std::env::var_os("RSEMBED_SKIP_LOG") else {
        return;
    };
    // libtest names each test's thread after the test.
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    let line = format!(
        "{test}: {}\n",
        reason.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .unwrap_or_else(|e| panic!("RSEMBED_SKIP_LOG {}: {e}", Path::new(&log).display()));
}

/// The ONNX Runtime library the tests use: ORT_DYLIB_PATH, or `.cache/ort`.
pub fn ort_lib() -> PathBuf {
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        return PathBuf::from(p);
    }
    let p = root().join(".cache/ort/libonnxruntime.so.1.31.1");
    assert!(
        p.is_file(),
        "ONNX Runtime library missing: run scripts/setup-ort.sh (or scripts/test.sh), or set ORT_DYLIB_PATH"
    );
    p
}

/// Builds (once) and returns a binary of the workspace.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        // The variables cargo sets for this test would reach the build
        // scripts: ring's reruns when CARGO_MANIFEST_DIR changes, which
        // rebuilt the whole tree (minutes) on every alternating run.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k == "OUT_DIR"
                || k.starts_with("CARGO_PKG_")
                || k.starts_with("CARGO_BIN_")
                || [
                    "CARGO_MANIFEST_DIR",
                    "CARGO_MANIFEST_PATH",
                    "CARGO_CRATE_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                    "CARGO_RUSTC_CURRENT_DIR",
                ]
                .contains(&k.as_ref())
            {
                build.env_remove(k.as_ref());
            }
        }
        let st = build
            .current_dir(root())
            .args([
                "build",
                "--quiet",
                "-p",
                "rsembed-coordinator",
                "-p",
                "rsembed-worker",
                "--bins",
            ])
            .status()
            .expect("cargo runs");
        assert!(st.success(), "building the binaries failed");
    });
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    target.join("debug").join(name)
}

/// A `rsembed` command with the test ORT library and quiet logs.
pub fn rsembed() -> Command {
    let mut c = Command::new(binary("rsembed"));
    c.env("ORT_DYLIB_PATH", ort_lib())
        .env("RSEMBED_LOG", "warn");
    c
}

/// `rsembed run --input <input> --output <output> --model <model>`, ready for more flags.
///
/// The batch size is fixed at 16: `--batch-size auto` picks its bucket by
/// timing, and ONNX Runtime's CPU kernels round differently for other batch
/// sizes, so tests that compare bytes across runs would depend on the
/// machine's load. `auto` has tests of its own (append `--batch-size auto`;
/// the last value of a flag wins).
pub fn run_cmd(input: &Path, output: &Path, model: &Path) -> Command {
    let mut c = rsembed();
    c.arg("run")
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(output)
        .arg("--model")
        .arg(model)
        .args(["--batch-size", "16"]);
    c
}

/// Runs a command and returns its output, printing it for failed tests to show.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("command starts");
    eprintln!("$ {cmd:?}\nexit: {:?}", out.status.code());
    eprintln!("stdout:\n{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("stderr:\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

/// A command answering its stdin line by line on stdout (`search --vectors
/// -`): a test writes lines and reads the answers as they come, and a hung
/// command is killed after its limit, failing the test instead of holding it.
pub struct LineSession {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl LineSession {
    /// Starts `cmd` with piped stdin, stdout and stderr.
    pub fn start(cmd: &mut Command, limit: Duration) -> LineSession {
        use std::sync::atomic::Ordering;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("command starts");
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, pid, started) = (done.clone(), child.id(), Instant::now());
        std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                if started.elapsed() > limit {
                    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        LineSession {
            stdin: child.stdin.take(),
            stdout: std::io::BufReader::new(child.stdout.take().expect("stdout is piped")),
            child,
            done,
        }
    }

    /// Writes `text` (whole lines) and flushes it.
    pub fn send(&mut self, text: &str) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(text.as_bytes())
            .expect("write to the command");
        stdin.flush().expect("flush to the command");
    }

    /// The next line of stdout, as JSON.
    pub fn answer(&mut self) -> serde_json::Value {
        use std::io::BufRead;
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("read from the command");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    /// Closes stdin and waits for the command: the rest of its output.
    pub fn finish(mut self) -> Output {
        drop(self.stdin.take());
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut self.stdout, &mut rest).expect("read the rest");
        let mut out = self.child.wait_with_output().expect("wait on the command");
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        rest.extend(out.stdout);
        out.stdout = rest;
        out
    }
}

/// Runs a command like [`run`], but kills it and fails the test when it takes
/// longer than `limit`: for failures that must be reported, not waited out.
pub fn run_timeout(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("command starts");
    let drain = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("stdout is piped")));
    let stderr = drain(Box::new(child.stderr.take().expect("stderr is piped")));
    let started = Instant::now();
    let (status, timed_out) = loop {
        if let Some(st) = child.try_wait().expect("wait on the command") {
            break (st, false);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            break (child.wait().expect("killed command is reaped"), true);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    };
    eprintln!("$ {cmd:?}\nexit: {:?}", out.status.code());
    eprintln!("stdout:\n{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("stderr:\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        !timed_out,
        "command still running after {limit:?}, killed: {cmd:?}"
    );
    out
}

/// The Python with the test packages (duckdb): RSEMBED_TEST_PYTHON or `.cache/venv`.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("RSEMBED_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    let p = root().join(".cache/venv/bin/python");
    assert!(
        p.is_file(),
        "test Python missing: run scripts/setup-test-env.sh (or scripts/test.sh), or set RSEMBED_TEST_PYTHON"
    );
    p
}

/// Runs a DuckDB query through the Python package and returns its rows as JSON.
pub fn duckdb(sql: &str) -> serde_json::Value {
    let script = r#"
import sys, json, duckdb
rows = duckdb.sql(sys.argv[1]).fetchall()
print(json.dumps([[v if isinstance(v, (int, float, str, type(None))) else (list(v) if isinstance(v, (list, tuple)) else str(v)) for v in r] for r in rows]))
"#;
    let out = Command::new(python())
        .args(["-c", script, sql])
        .output()
        .expect("python starts");
    assert!(
        out.status.success(),
        "duckdb query failed: {sql}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("duckdb output is JSON")
}

/// The rows of a manifest list of a local output (`files` or `failures`:
/// `manifest/<list>.parquet`) that match `filter` (SQL over its columns,
/// `true` for all), read by DuckDB, each a JSON object by column, in the
/// list's order.
pub fn manifest_list(output: &Path, list: &str, filter: &str) -> Vec<serde_json::Value> {
    let path = output.join("manifest").join(format!("{list}.parquet"));
    let sql = format!(
        "SELECT to_json(t)::VARCHAR FROM read_parquet('{}') t WHERE {filter}",
        path.display()
    );
    duckdb(&sql)
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| serde_json::from_str(r[0].as_str().expect("JSON text")).expect("JSON"))
        .collect()
}

/// Copies a directory tree (files only), for tests that damage a copy.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// A local TCP port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP GET on 127.0.0.1: the status line and the body; `None` when
/// nothing listens (yet, or any more).
pub fn http_get(port: u16, path: &str) -> Option<(String, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // Servers that keep connections alive (nats-server's monitoring port)
    // would otherwise hold the read open until the timeout.
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let chunked = head
        .lines()
        .any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked"));
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Some((head.lines().next()?.to_owned(), body))
}

/// The payload of a `Transfer-Encoding: chunked` body (Go's HTTP servers
/// answer HTTP/1.1 requests this way).
fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let n = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if n == 0 {
            return Some(out);
        }
        out.push_str(after.get(..n)?);
        rest = after.get(n..)?.strip_prefix("\r\n")?;
    }
}

/// Cosine similarity.
pub fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// `<bin> <args> --help`, which must succeed.
pub fn cli_help(bin: &Path, args: &[&str]) -> String {
    let out = run(Command::new(bin).args(args).arg("--help"));
    assert!(
        out.status.success(),
        "{} {args:?} --help failed",
        bin.display()
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// `--flag` appears in a help text as a whole word.
pub fn help_has_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(at, _)| {
        help[at + flag.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-'))
    })
}

/// A help text documents a flag read from the environment variable `var`
/// (`[env: VAR=...]`, or `[env: VAR]` for hidden values such as passwords).
pub fn help_reads_env(help: &str, var: &str) -> bool {
    help.contains(&format!("[env: {var}=")) || help.contains(&format!("[env: {var}]"))
}
