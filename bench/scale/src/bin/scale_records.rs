//! `scale-records`: grows a finished job to `--tasks` done tasks without
//! running them, for sizes whose chip files do not fit the disk (10⁷).
//!
//! The job must have been planned by `rsembed submit` and its tasks done by
//! a worker (the benchmark submits one image and runs `scale-worker`): one of
//! its tasks is the template. For every generated task it
//!
//! - writes a done record through the worker's own writer
//!   ([`JobState::put_done`]): the template's record with the template's task
//!   id replaced by the new one wherever it appears and every SHA-256 derived
//!   anew, so the record has whatever shape the worker writes today;
//! - clears its running mark ([`JobState::clear_running`]), as the worker
//!   does after every task: the tombstone stays in the bucket at rest;
//! - creates each of the template's files (`chips/<task>.parquet`, ...) under
//!   the new id as a sparse file of the template's size: the listing that
//!   `finalize` checks is real, the disk holds no data. Nothing may read them.
//!
//! Then it appends the ids to `tasks.txt` and records the plan's new size in
//! the job record. Task ids are a hash of the job and the task's index, so a
//! run cut off resumes where `tasks.txt` ends.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Parser;
use futures::StreamExt;
use rsembed_worker::queue::state::JobState;
use rsembed_worker::queue::{NatsArgs, QueueConfig};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Loads generated done records into a job's state.
#[derive(Parser)]
#[command(name = "scale-records")]
struct Args {
    /// NATS connection.
    #[command(flatten)]
    nats: NatsArgs,
    /// The job's output folder (local).
    #[arg(long)]
    output: PathBuf,
    /// Tasks the job has at the end, the planned ones included.
    #[arg(long)]
    tasks: u64,
    /// Record writes awaited at once.
    #[arg(long, default_value_t = 512)]
    in_flight: usize,
    /// Tasks per step; `tasks.txt` grows after each step's records are written.
    #[arg(long, default_value_t = 50_000)]
    chunk: u64,
    /// The generated tasks' files: `sparse` (the template's size, no data;
    /// an inode each) or `none` (for a `finalize` that does not list the
    /// chip files).
    #[arg(long, value_enum, default_value_t = Placeholders::Sparse)]
    placeholders: Placeholders,
}

/// What stands in for a generated task's files.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Placeholders {
    /// Sparse files of the template's sizes.
    Sparse,
    /// No files.
    None,
}

const TASKS_FILE: &str = "tasks.txt";

fn main() -> anyhow::Result<()> {
    rsembed_bench_scale::init_logs();
    let args = Args::parse();
    rsembed_worker::queue::install_crypto_provider();
    tokio::runtime::Runtime::new()?.block_on(load(args))
}

/// The template's files, relative to the output: every file under `chips/`
/// and `errors/` whose name holds its task id.
fn template_files(output: &Path, task: &str) -> anyhow::Result<Vec<(String, u64)>> {
    let mut files = Vec::new();
    for dir in ["chips", "errors"] {
        let Ok(entries) = std::fs::read_dir(output.join(dir)) else {
            continue;
        };
        for e in entries {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.contains(task) {
                files.push((format!("{dir}/{name}"), e.metadata()?.len()));
            }
        }
    }
    if files.is_empty() {
        bail!("no file of the template task {task} under chips/ or errors/");
    }
    Ok(files)
}

/// The id of generated task `i`: 32 hex digits, like the planner's.
fn task_id(job: &str, i: u64) -> String {
    let h = Sha256::digest(format!("rsembed-bench-scale {job} {i}"));
    hex::encode(&h[..16])
}

/// `v` with `from` replaced by `to` in every string, and every SHA-256 (64
/// hex digits) replaced by one derived from `to`.
fn substitute(v: &Value, from: &str, to: &str) -> Value {
    match v {
        Value::String(s) if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Value::String(hex::encode(Sha256::digest(format!("{to} {s}"))))
        }
        Value::String(s) => Value::String(s.replace(from, to)),
        Value::Array(a) => Value::Array(a.iter().map(|x| substitute(x, from, to)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (k.clone(), substitute(x, from, to)))
                .collect(),
        ),
        other => other.clone(),
    }
}

async fn load(args: Args) -> anyhow::Result<()> {
    let out = &args.output;
    let spec: Value = serde_json::from_slice(
        &std::fs::read(out.join("job.json")).context("job.json of the output")?,
    )?;
    let job = spec["job_id"]
        .as_str()
        .context("job.json has no job_id")?
        .to_owned();
    let plan = std::fs::read_to_string(out.join(TASKS_FILE)).context(TASKS_FILE)?;
    let ids: Vec<&str> = plan.lines().filter(|l| !l.is_empty()).collect();
    // The planned tasks come first in tasks.txt; generated ones follow, in
    // index order, so the count of the planned ones finds where to resume.
    let planned = ids
        .iter()
        .position(|id| *id == task_id(&job, 0))
        .unwrap_or(ids.len()) as u64;
    let Some(template) = ids.first().map(|s| s.to_string()) else {
        bail!("{TASKS_FILE} is empty: submit the template job first");
    };
    let have = ids.len() as u64;
    if args.tasks < have {
        bail!(
            "the job has {have} tasks already, more than --tasks {}",
            args.tasks
        );
    }
    let client = args.nats.connect("scale-records").await?;
    let js = async_nats::jetstream::new(client);
    let state = JobState::open(&js, &QueueConfig::default()).await?;
    let done = state
        .done(&job, &template)
        .await?
        .with_context(|| format!("the template task {template} is not done"))?;
    let done = serde_json::to_value(&done)?;
    let files = template_files(out, &template)?;
    eprintln!(
        "job {job}: {have} tasks ({planned} planned), template {template} with {} files; generating {}",
        files.len(),
        args.tasks - have
    );

    let mut next = have - planned;
    let end = args.tasks - planned;
    let mut plan = std::fs::OpenOptions::new()
        .append(true)
        .open(out.join(TASKS_FILE))?;
    let started = std::time::Instant::now();
    while next < end {
        let upto = (next + args.chunk).min(end);
        let ids: Vec<String> = (next..upto).map(|i| task_id(&job, i)).collect();
        let dir = out.clone();
        let (ids_for_files, files_for) = (ids.clone(), files.clone());
        let template_id = template.clone();
        let sparse = args.placeholders == Placeholders::Sparse;
        let placeholders = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            for id in ids_for_files.iter().filter(|_| sparse) {
                for (path, len) in &files_for {
                    let f = std::fs::File::create(dir.join(path.replace(&template_id, id)))?;
                    f.set_len(*len)?;
                }
            }
            Ok(())
        });
        let mut writes = futures::stream::iter(ids.iter().map(|id| {
            let (state, job) = (&state, &job);
            let record = serde_json::from_value(substitute(&done, &template, id));
            async move {
                let record = record?;
                state.put_done(job, id, &record).await?;
                state.clear_running(job, id).await?;
                anyhow::Ok(())
            }
        }))
        .buffer_unordered(args.in_flight.max(1));
        while let Some(r) = writes.next().await {
            r?;
        }
        placeholders.await??;
        // As the workers do (every 2 s each): status then folds only what
        // came since, as it would behind a real fleet.
        state.totals(&job).await?;
        let mut lines = String::with_capacity(ids.len() * 33);
        for id in &ids {
            lines.push_str(id);
            lines.push('\n');
        }
        plan.write_all(lines.as_bytes())?;
        plan.sync_data()?;
        next = upto;
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "{} of {} tasks, {:.0} records/s",
            next + planned,
            args.tasks,
            (next + planned - have) as f64 / secs.max(1e-9)
        );
    }
    let mut record = state
        .record(&job)
        .await?
        .context("the job has no job record: did submit finish?")?;
    record.inputs += args.tasks - record.tasks;
    record.tasks = args.tasks;
    state.put_record(&record).await?;
    println!(
        "{}",
        serde_json::json!({"job_id": job, "tasks": args.tasks, "generated": end - (have - planned)})
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitute_renames_the_task_and_derives_new_digests() {
        let t = "a".repeat(32);
        let sha = "f".repeat(64);
        let v = serde_json::json!({
            "chips_file": {"path": format!("chips/{t}.parquet"), "sha256": sha, "rows": 1},
            "worker": "w",
        });
        let n = "b".repeat(32);
        let s = substitute(&v, &t, &n);
        assert_eq!(s["chips_file"]["path"], format!("chips/{n}.parquet"));
        assert_eq!(s["chips_file"]["rows"], 1);
        assert_eq!(s["worker"], "w");
        let new_sha = s["chips_file"]["sha256"].as_str().unwrap();
        assert_eq!(new_sha.len(), 64);
        assert_ne!(new_sha, sha);
    }
}
