//! Distributed-mode processes for the fault tests: `rsembed-worker`s that can
//! be SIGKILLed or SIGTERMed, the coordinator commands, and a generated
//! dataset of small distinct images.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{binary, ort_lib, rsembed, run, tiny_model};

/// One `rsembed-worker` process, logging to a file.
pub struct Worker {
    child: Option<Child>,
    log: tempfile::NamedTempFile,
    /// Its `--name`.
    pub name: String,
}

impl Worker {
    /// Starts a worker on `nats` with the tiny model, a fixed batch of 4 (see
    /// [`crate::run_cmd`] on why not `auto`) and `extra` flags.
    pub fn start(nats: &str, name: &str, extra: &[&str], env: &[(&str, String)]) -> Worker {
        let log = tempfile::NamedTempFile::new().expect("a temporary log file");
        let mut cmd = Command::new(binary("rsembed-worker"));
        cmd.arg("--nats")
            .arg(nats)
            .arg("--model")
            .arg(tiny_model())
            .args(["--batch-size", "4", "--name", name])
            .args(extra)
            .env("ORT_DYLIB_PATH", ort_lib())
            .env("RSEMBED_LOG", "info,ort=warn,async_nats=warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.reopen().expect("log file"))
            .stderr(log.reopen().expect("log file"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("rsembed-worker starts");
        Worker {
            child: Some(child),
            log,
            name: name.into(),
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Waits until its log contains `needle`; panics with the log after `limit`.
    pub fn wait_for_log(&self, needle: &str, limit: Duration) {
        let started = Instant::now();
        while !self.log().contains(needle) {
            if let Some(status) = self.exited() {
                panic!(
                    "worker {} exited ({status}) before logging `{needle}`:\n{}",
                    self.name,
                    self.log()
                );
            }
            assert!(
                started.elapsed() < limit,
                "worker {} did not log `{needle}` within {limit:?}:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn exited(&self) -> Option<ExitStatus> {
        // `try_wait` needs `&mut`; a shared check goes through /proc instead.
        let pid = self.pid()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
        match stat {
            None => Some(ExitStatus::default()),
            Some(s) if s.split_whitespace().nth(2) == Some("Z") => Some(ExitStatus::default()),
            Some(_) => None,
        }
    }

    /// SIGKILL, as a crash or an OOM kill: no drain, no nak.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, as Kubernetes stops a pod; returns how it exited, or panics
    /// with the log when it takes longer than `limit`.
    pub fn terminate(&mut self, limit: Duration) -> ExitStatus {
        let mut c = self.child.take().expect("worker is running");
        let st = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(st.success());
        wait_child(&mut c, limit, &self.name, || self.log())
    }

    /// Waits for the worker to exit by itself (`--max-tasks`).
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let mut c = self.child.take().expect("worker is running");
        wait_child(&mut c, limit, &self.name, || self.log())
    }
}

fn wait_child(c: &mut Child, limit: Duration, name: &str, log: impl Fn() -> String) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(st) = c.try_wait().expect("wait works") {
            return st;
        }
        if started.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            panic!("worker {name} did not exit within {limit:?}:\n{}", log());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `rsembed submit` of `input` to `output` on `nats`, with `extra` flags.
pub fn submit(nats: &str, input: &Path, output: &Path, extra: &[&str]) -> Output {
    run(rsembed()
        .arg("submit")
        .arg("--nats")
        .arg(nats)
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(output)
        .arg("--model")
        .arg(tiny_model())
        .args(["--json"])
        .args(extra))
}

/// `rsembed submit ... --json`, which must succeed; returns its summary.
pub fn submit_ok(nats: &str, input: &Path, output: &Path, extra: &[&str]) -> serde_json::Value {
    let out = submit(nats, input, output, extra);
    assert!(out.status.success(), "submit failed");
    serde_json::from_slice(&out.stdout).expect("submit --json prints JSON")
}

/// `rsembed status --json`; its stderr when it fails.
pub fn try_status(nats: &str, output: &Path) -> Result<serde_json::Value, String> {
    let out = rsembed()
        .arg("status")
        .arg("--nats")
        .arg(nats)
        .arg("--output")
        .arg(output)
        .arg("--json")
        .output()
        .expect("rsembed starts");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
}

/// `rsembed status --json`, which must succeed.
pub fn status(nats: &str, output: &Path) -> serde_json::Value {
    try_status(nats, output).unwrap_or_else(|e| panic!("status failed: {e}"))
}

/// Polls `status` until the job is finished; panics after `limit`. A status
/// that fails (the server is restarting) is tried again.
pub fn wait_finished(nats: &str, output: &Path, limit: Duration) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let last = match try_status(nats, output) {
            Ok(s) if s["finished"] == true => return s,
            Ok(s) => s.to_string(),
            Err(e) => e,
        };
        assert!(
            started.elapsed() < limit,
            "job not finished within {limit:?}: {last}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `rsembed finalize --json`: its exit code and report.
pub fn finalize(nats: &str, output: &Path) -> (Option<i32>, serde_json::Value) {
    let out = run(rsembed()
        .arg("finalize")
        .arg("--nats")
        .arg(nats)
        .arg("--output")
        .arg(output)
        .arg("--json"));
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code(), v)
}

/// Writes `n` distinct 48×40 PNGs named `img_000.png`... into `dir`.
pub fn make_images(dir: &Path, n: usize) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    (0..n)
        .map(|i| {
            let img = image::RgbImage::from_fn(48, 40, |x, y| {
                let v = (x * 7 + y * 13 + i as u32 * 29) as u8;
                image::Rgb([v, (x * 5) as u8 ^ i as u8, (y * 3) as u8])
            });
            let p = dir.join(format!("img_{i:03}.png"));
            img.save(&p).unwrap();
            p
        })
        .collect()
}

/// `(rows, distinct chip ids, distinct sources)` over every chip file of `output`.
pub fn chip_counts(output: &Path) -> (u64, u64, u64) {
    let rows = crate::duckdb(&format!(
        "SELECT count(*), count(DISTINCT chip_id), count(DISTINCT source_uri) FROM read_parquet('{}/chips/*.parquet')",
        output.display()
    ));
    let r = &rows[0];
    (
        r[0].as_u64().unwrap(),
        r[1].as_u64().unwrap(),
        r[2].as_u64().unwrap(),
    )
}
