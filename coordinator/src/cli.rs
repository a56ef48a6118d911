//! Command-line flags, grouped as the contract groups them. Every flag also
//! reads an `RSEMBED_*` environment variable.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use rsembed_schemas::align::Align;
use rsembed_schemas::embedding::EmbeddingType;
use rsembed_worker::engine::flags::EngineArgs;
use rsembed_worker::engine::session::{parse_byte_size, Device, SessionConfig};

use rsembed_worker::queue::{parse_duration, NatsArgs, QueueConfig};
use rsembed_worker::task::PipelineArgs;

/// rsembed: remote-sensing archives to searchable Git-RSCLIP embeddings, as GeoParquet.
///
/// `plan` shows what a job would process. Embedded mode (`run`) does a whole
/// job in one process; distributed mode
/// (`submit`, `status`, `finalize`) spreads it over `rsembed-worker`s through
/// NATS JetStream. `text`, `search`, `classify`, `compact` and `change` work
/// on finished datasets; `fetch-model` copies a model directory for deployments. Every
/// flag also reads an `RSEMBED_*` environment variable. See `rsembed <COMMAND>
/// --help`.
// The doc comment, not Cargo's package description, is the `about`: a
// description names what the crate is, and once named only 3 of 10 commands.
#[derive(Debug, Parser)]
#[command(name = "rsembed", version, args_override_self = true)]
pub struct Cli {
    /// Log format: `text` for terminals, `json` for clusters.
    #[arg(
        long,
        env = "RSEMBED_LOG_FORMAT",
        default_value = "text",
        global = true
    )]
    pub log_format: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Embedded mode: plan, embed and write the whole job in this process.
    Run(RunArgs),
    /// Dry run: the inputs, tasks, chips (about) and bytes of a job; writes nothing.
    Plan(PlanArgs),
    /// Distributed mode: publish the job's tasks to NATS JetStream for `rsembed-worker`s.
    Submit(SubmitArgs),
    /// Distributed mode: tasks done, in flight, pending and failed; chips, rate, ETA.
    Status(StatusArgs),
    /// Distributed mode: verify that every task has its files, then write manifest.json.
    ///
    /// Without --nats: rewrite an older output's manifest.json (format 1) into the
    /// current format, its lists in manifest/*.parquet.
    Finalize(FinalizeArgs),
    /// Text embeddings, one JSON array per line.
    Text(TextArgs),
    /// Query side: the chips of a dataset that best match texts (or an example chip).
    Search(SearchCommand),
    /// Query side: zero-shot labels for every chip of a dataset, as a Parquet file.
    Classify(ClassifyCommand),
    /// Query side: merge a finished job's files into large, Hilbert-sorted files.
    ///
    /// The compacted dataset gets its own job.json and manifest.json; the
    /// source is left as it is.
    Compact(rsembed_query::compact::CompactArgs),
    /// Query side: how far each cell moved between time windows, ranked, as GeoParquet.
    Change(rsembed_query::change::ChangeArgs),
    /// Deployment: copy a model directory from object storage and check it.
    ///
    /// For init containers: a partial copy resumes, every file is checked
    /// against the digests rsembed-model.json records, and ONNX Runtime
    /// parses each graph when its library is found.
    FetchModel(FetchModelArgs),
}

/// The work queue's settings, applied by `submit` to the shared stream and consumer.
#[derive(Debug, Clone, Args)]
pub struct QueueArgs {
    /// Replicas of the task stream and the state bucket (1 on one server, 3 on a cluster).
    #[arg(long, env = "RSEMBED_STREAM_REPLICAS", default_value_t = 1)]
    pub(crate) stream_replicas: usize,
    /// How long a worker may hold a task without an ack or an in-progress ack
    /// before JetStream redelivers it (workers send progress every third of it).
    #[arg(long, env = "RSEMBED_ACK_WAIT", default_value = "60s", value_parser = parse_duration)]
    pub(crate) ack_wait: Duration,
    /// Deliveries before a task is dead-lettered.
    #[arg(long, env = "RSEMBED_MAX_DELIVER", default_value_t = 5)]
    pub(crate) max_deliver: i64,
    /// Redelivery delays after missed acks, comma-separated (e.g. `10s,1m,5m`);
    /// their count must be below `--max-deliver`. Default: `--ack-wait` each time.
    #[arg(long, env = "RSEMBED_BACKOFF", value_delimiter = ',', value_parser = parse_duration)]
    pub(crate) backoff: Vec<Duration>,
    /// Tasks delivered and not yet acked, over all workers: the fleet's prefetch cap.
    #[arg(long, env = "RSEMBED_MAX_ACK_PENDING", default_value_t = 1000)]
    pub(crate) max_ack_pending: i64,
}

impl QueueArgs {
    /// The queue configuration these flags ask for.
    pub(crate) fn config(&self) -> Result<QueueConfig, String> {
        if self.max_deliver < 1 {
            return Err(format!(
                "--max-deliver must be at least 1, not {}",
                self.max_deliver
            ));
        }
        if !self.backoff.is_empty() && self.backoff.len() as i64 >= self.max_deliver {
            return Err(format!(
                "--backoff has {} delays; JetStream needs fewer than --max-deliver ({})",
                self.backoff.len(),
                self.max_deliver
            ));
        }
        Ok(QueueConfig {
            replicas: self.stream_replicas.max(1),
            ack_wait: self.ack_wait,
            max_deliver: self.max_deliver,
            backoff: self.backoff.clone(),
            max_ack_pending: self.max_ack_pending,
            ..QueueConfig::default()
        })
    }
}

/// `rsembed submit`.
#[derive(Debug, Clone, Args)]
pub struct SubmitArgs {
    /// NATS connection.
    #[command(flatten)]
    pub(crate) nats: NatsArgs,
    /// Input: a local folder or file, or an object store URL. Workers must be
    /// able to read it by the same URL.
    #[arg(long, env = "RSEMBED_INPUT")]
    pub(crate) input: String,
    /// Output: an object store URL (or a folder every worker mounts at the same path).
    #[arg(long, env = "RSEMBED_OUTPUT")]
    pub(crate) output: String,
    /// Model directory: its JSON files are read and its graphs hashed for the
    /// job fingerprint; ONNX Runtime is not loaded.
    #[arg(long, env = "RSEMBED_MODEL")]
    pub(crate) model: PathBuf,
    /// The job runs the model's float16 vision graph (workers need `--fp16` too).
    #[arg(long, env = "RSEMBED_FP16")]
    pub(crate) fp16: bool,
    /// Tiling.
    #[command(flatten)]
    pub(crate) tiling: TilingArgs,
    /// Queue settings.
    #[command(flatten)]
    pub(crate) queue: QueueArgs,
    /// Replace another job at this output: its queued tasks, job state and
    /// files (manifest.json first, then chips/, errors/, stac/, job.json) are deleted
    /// once the plan has found an input. This same job is resumed, not
    /// restarted, so a retried Kubernetes Job keeps its progress.
    #[arg(long, visible_alias = "overwrite", env = "RSEMBED_FORCE_NEW_JOB")]
    pub(crate) force_new_job: bool,
    /// Run again every task of this job that did not finish cleanly: tasks
    /// recorded as failed (dead-lettered), and done tasks with failed inputs
    /// (an errors/ file), whose files are replaced. Not part of the job's identity.
    #[arg(long, env = "RSEMBED_RETRY_FAILED")]
    pub(crate) retry_failed: bool,
    /// Print the summary as JSON.
    #[arg(long, env = "RSEMBED_JSON")]
    pub json: bool,
}

/// `rsembed status`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// NATS connection.
    #[command(flatten)]
    pub(crate) nats: NatsArgs,
    /// The job's output (its job.json names the job).
    #[arg(long, env = "RSEMBED_OUTPUT")]
    pub(crate) output: String,
    /// Keep showing progress until the job is finished: one line per refresh
    /// (done, in flight, pending, failed, chips, chips/s, ETA), or a progress
    /// bar on a terminal.
    #[arg(long, env = "RSEMBED_WATCH")]
    pub watch: bool,
    /// Refresh interval of `--watch`.
    #[arg(long, env = "RSEMBED_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub(crate) interval: Duration,
    /// How long `--watch` keeps trying while NATS or the object store fails
    /// (a NATS restart, a rolling upgrade) before it gives up with the error.
    #[arg(long, env = "RSEMBED_OUTAGE_GRACE", default_value = "10m", value_parser = parse_duration)]
    pub(crate) outage_grace: Duration,
    /// Print JSON (one object; one per line with `--watch`).
    #[arg(long, env = "RSEMBED_JSON")]
    pub json: bool,
}

/// `rsembed finalize`.
#[derive(Debug, Clone, Args)]
// `--nats` is what the other NATS flags need; here it may be left out.
#[command(mut_arg("nats", |a| a.required(false)))]
pub struct FinalizeArgs {
    /// NATS connection. Without `--nats`, the output must hold a finished
    /// job: a `manifest.json` of format 1 (rsembed before its Parquet
    /// lists) is rewritten into `manifest/*.parquet` and a small
    /// `manifest.json`; one of the current format is left as it is.
    #[command(flatten)]
    pub(crate) nats: Option<NatsArgs>,
    /// The job's output.
    #[arg(long, env = "RSEMBED_OUTPUT")]
    pub(crate) output: String,
    /// Print the result as JSON.
    #[arg(long, env = "RSEMBED_JSON")]
    pub json: bool,
}

/// How inputs are cut into chips.
#[derive(Debug, Clone, Args)]
pub struct TilingArgs {
    /// Chip size in source pixels. Default: the model's input size, so chips need no resize.
    #[arg(long, env = "RSEMBED_CHIP_SIZE")]
    pub chip_size: Option<u32>,
    /// Stride in source pixels. Default: the chip size (no overlap).
    #[arg(long, env = "RSEMBED_STRIDE")]
    pub stride: Option<u32>,
    /// 1-based band indexes in R,G,B order, e.g. `4,3,2`. Default: 1,2,3 (1 replicated for one-band rasters).
    #[arg(long, env = "RSEMBED_BANDS", value_delimiter = ',')]
    pub bands: Option<Vec<u32>>,
    /// `auto`, `none`, or `MIN:MAX` linear to 0-255. `auto` keeps 8-bit data as it is and
    /// stretches other data by scene-level 2nd-98th percentiles.
    #[arg(long, env = "RSEMBED_SCALE", default_value = "auto")]
    pub scale: String,
    /// Drop chips whose valid fraction is below this. Default: drop only chips with no valid pixel.
    #[arg(long, env = "RSEMBED_MIN_VALID")]
    pub min_valid: Option<f32>,
    /// Inputs per task, on average (`--task-size` is the old name). Task boundaries
    /// are content-defined, so adding a file to an archive changes one task, not
    /// all the tasks after it.
    /// Default 8192: a task is seconds of a GPU's work, not milliseconds
    /// (`docs/decisions.md`, "Task sizes"). A job resumed without grouping
    /// flags keeps the grouping it recorded.
    #[arg(
        long = "task-files",
        visible_alias = "task-size",
        env = "RSEMBED_TASK_FILES"
    )]
    pub task_size: Option<usize>,
    /// A task also ends once its inputs reach this many bytes (`1GiB`, `256MiB`,
    /// bytes), so a run of large files does not make one huge task. Default 1GiB.
    #[arg(long, env = "RSEMBED_TASK_BYTES", value_parser = parse_byte_size)]
    pub task_bytes: Option<u64>,
    /// Chips per task of a split scene, about (blocks follow the scene's internal
    /// tiles). Default: `--task-files`, or 8192.
    #[arg(long, env = "RSEMBED_TASK_CHIPS")]
    pub task_chips: Option<usize>,
    /// Scenes stored one file per band: group files whose names differ only in
    /// these suffixes, in R,G,B order (Landsat `B4,B3,B2`, Sentinel-2 `B04,B03,B02`).
    /// Other files are skipped. Bands on a coarser grid are resampled onto the finest.
    #[arg(long, env = "RSEMBED_BAND_FILES", value_delimiter = ',')]
    pub band_files: Option<Vec<String>>,
    /// GeoTIFFs at least this large (`16MiB`, `1GB`, bytes) are split into tasks of chip blocks
    /// of about `--task-chips` chips each, so one scene spreads over many workers and
    /// a task reads only its region. Smaller TIFFs are one task input.
    /// Default 16MiB.
    #[arg(long, env = "RSEMBED_SHARD_BYTES", value_parser = parse_byte_size)]
    pub shard_bytes: Option<u64>,
    /// STAC inputs: asset keys or band common names in R,G,B order
    /// (`B04,B03,B02`, `red,green,blue`), or one 3-band asset (`visual`).
    /// Default: `visual` when the item has it, else red, green, blue by common name.
    #[arg(long, env = "RSEMBED_ASSETS", value_delimiter = ',')]
    pub assets: Option<Vec<String>>,
    /// STAC inputs: the asset that gives each chip's `cloud_fraction`:
    /// `ASSET` for a Sentinel-2 SCL (classes 3, 8, 9, 10 are cloud), or
    /// `ASSET:qa_pixel` for a Landsat Collection 2 QA_PIXEL (bits 1-4).
    #[arg(long, env = "RSEMBED_CLOUD_MASK")]
    pub cloud_mask: Option<String>,
    /// Drop chips whose `cloud_fraction` exceeds this (0-1); needs `--cloud-mask`.
    #[arg(long, env = "RSEMBED_MAX_CLOUD")]
    pub max_cloud: Option<f32>,
    /// How far, in source pixels, a chip's lon/lat `geometry` may stray from
    /// the chip's true outline (above 0, at most 1). Edges are densified
    /// until they are that close. Default: 0.01, a hundredth of a pixel,
    /// below anything a footprint is used for and a few vertices per edge; a
    /// job written before this flag existed keeps its 5e-8 degrees when
    /// resumed without it.
    #[arg(long, env = "RSEMBED_FOOTPRINT_TOLERANCE")]
    pub footprint_tolerance: Option<f64>,
    /// How the `embedding` column stores vectors (`run`, `submit`): `f32`
    /// (the model's output), `f16` (half the bytes), or `int8` (a quarter,
    /// with a per-row `embedding_scale`: value = `embedding[i] * embedding_scale`).
    #[arg(long, env = "RSEMBED_EMBEDDING_TYPE", default_value = "f32")]
    pub embedding_type: EmbeddingType,
    /// Where chips start: `scene` (each scene's own corner) or `crs` (the
    /// CRS's pixel lattice, counted from the CRS origin, so scenes on one
    /// lattice cut identical chips; each chip gets a `cell`). A scene off the
    /// lattice (a sub-pixel phase, no EPSG code, rotated) is an error record.
    /// Default: `scene`, or `crs` with `--windows`.
    #[arg(long, env = "RSEMBED_ALIGN")]
    pub align: Option<Align>,
    /// Time windows.
    #[command(flatten)]
    pub window: WindowArgs,
    /// STAC search.
    #[command(flatten)]
    pub stac: StacArgs,
}

/// Time windows of a STAC search: one row per window and cell.
#[derive(Debug, Clone, Default, Args)]
pub struct WindowArgs {
    /// STAC inputs: split `--datetime A/B` into consecutive windows of this
    /// ISO 8601 duration (`P16D`, `P1M`, `P3M`, `P1Y`; window k starts k
    /// durations after A, the last is cut at B) and write one row per window
    /// and cell. Implies `--align crs`.
    #[arg(long, env = "RSEMBED_WINDOWS")]
    pub windows: Option<String>,
    /// With `--windows`: how a window's acquisitions of a cell become its
    /// row. `best` (the default): the chip of the clearest acquisition
    /// (lowest `cloud_fraction`, then highest `valid_fraction`, then the
    /// latest). `median`: per pixel and band, the median of the clear, valid
    /// samples of the window's acquisitions in physical units (the mean of
    /// the two middle ones for an even count); needs a fixed `--scale`
    /// (`MIN:MAX` or `none`).
    #[arg(long, env = "RSEMBED_COMPOSITE")]
    pub composite: Option<rsembed_schemas::window::Composite>,
    /// With `--windows`: acquisitions kept per window and block of cells
    /// (default 64). Past it the cloudiest by `eo:cloud_cover`, then the
    /// earliest, are dropped and counted in the summary.
    #[arg(long, env = "RSEMBED_MAX_SCENES")]
    pub max_scenes: Option<u32>,
}

/// The help heading of the STAC search flags.
const STAC_SEARCH: &str = "STAC search (STAC API, catalog or item collection inputs)";

/// The search of a STAC input: sent to a STAC API, applied on the client to
/// static catalogs and item collections.
// Each flag names its heading: a `next_help_heading`, on this struct or on
// the `flatten` field, would head every flag declared after these too
// (`--device`, `--json`, ...).
#[derive(Debug, Clone, Default, Args)]
pub struct StacArgs {
    /// Collection ids, comma-separated.
    #[arg(long, help_heading = STAC_SEARCH, env = "RSEMBED_COLLECTIONS", value_delimiter = ',')]
    pub collections: Vec<String>,
    /// W,S,E,N in degrees (write `--bbox=-122.5,37.5,-122,38` when W is negative).
    #[arg(long, help_heading = STAC_SEARCH, env = "RSEMBED_BBOX", value_parser = parse_stac_bbox, allow_hyphen_values = true)]
    pub bbox: Option<[f64; 4]>,
    /// An RFC 3339 instant or interval: `2024-06-01T00:00:00Z/2024-08-31T23:59:59Z`,
    /// open ends as `..`. Dates work too: `2024-06-01/2024-08-31` is from the
    /// first day's start to the last day's end, inclusive (UTC).
    #[arg(long, help_heading = STAC_SEARCH, env = "RSEMBED_DATETIME")]
    pub datetime: Option<String>,
    /// Item ids, comma-separated.
    #[arg(long, help_heading = STAC_SEARCH, env = "RSEMBED_IDS", value_delimiter = ',')]
    pub ids: Vec<String>,
    /// A CQL2 text filter (`"eo:cloud_cover < 10 AND platform = 'sentinel-2a'"`);
    /// a STAC API must conform to the filter extension.
    #[arg(long, help_heading = STAC_SEARCH, env = "RSEMBED_FILTER")]
    pub filter: Option<String>,
    /// At most this many items.
    #[arg(long, help_heading = STAC_SEARCH, env = "RSEMBED_MAX_ITEMS")]
    pub max_items: Option<u64>,
    /// Scenes whose `eo:cloud_cover` is at most this percentage.
    #[arg(long, help_heading = STAC_SEARCH, env = "RSEMBED_CLOUD_COVER_MAX")]
    pub cloud_cover_max: Option<f64>,
}

impl StacArgs {
    /// Whether any search flag is given.
    pub fn any(&self) -> bool {
        !self.collections.is_empty()
            || self.bbox.is_some()
            || self.datetime.is_some()
            || !self.ids.is_empty()
            || self.filter.is_some()
            || self.max_items.is_some()
            || self.cloud_cover_max.is_some()
    }

    /// The search these flags ask for, checked.
    pub fn search(&self) -> Result<rsembed_schemas::job::StacSearch, String> {
        // Dates become the RFC 3339 interval a STAC client sends for them, so
        // a server, the client filter and the job spec read one text.
        let datetime = self
            .datetime
            .as_deref()
            .map(crate::stac::search::normalize_datetime)
            .transpose()?;
        if let Some(c) = self.cloud_cover_max {
            if !(0.0..=100.0).contains(&c) {
                return Err(format!(
                    "--cloud-cover-max is a percentage (0-100), not {c}"
                ));
            }
        }
        if self.max_items == Some(0) {
            return Err("--max-items must be positive".into());
        }
        Ok(rsembed_schemas::job::StacSearch {
            collections: self.collections.clone(),
            bbox: self.bbox,
            datetime,
            ids: self.ids.clone(),
            filter: self.filter.clone(),
            max_items: self.max_items,
            cloud_cover_max: self.cloud_cover_max,
            // Known once the input is: crate::stac::resolve.
            cloud_cover_by: None,
        })
    }
}

/// `W,S,E,N` in degrees. W > E crosses the antimeridian, as STAC allows.
fn parse_stac_bbox(s: &str) -> Result<[f64; 4], String> {
    let v: Vec<f64> = s
        .split(',')
        .map(|p| p.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("--bbox `{s}`: four numbers W,S,E,N"))?;
    let [w, so, e, n] = v[..] else {
        return Err(format!(
            "--bbox `{s}`: four numbers W,S,E,N, not {}",
            v.len()
        ));
    };
    let lon = -180.0..=180.0;
    let lat = -90.0..=90.0;
    if !(lon.contains(&w) && lon.contains(&e) && lat.contains(&so) && lat.contains(&n) && so <= n) {
        return Err(format!(
            "--bbox `{s}`: W,S,E,N in degrees, longitudes within ±180, latitudes within ±90, S <= N"
        ));
    }
    Ok([w, so, e, n])
}

/// `--task-files` when not given: a task of one-chip images is 8192 chips,
/// about 4.5 s of Git-RSCLIP-L on an H200 and a 24 MiB chip file of 768-d
/// float32 (`docs/decisions.md`, "Task sizes").
pub const DEFAULT_TASK_FILES: usize = 8192;
/// `--task-chips` when neither it nor `--task-files` is given: a Sentinel-2
/// scene (1,764 chips of 256 px) or a Landsat scene is one block.
pub const DEFAULT_TASK_CHIPS: usize = 8192;
/// `--task-bytes` when not given.
pub const DEFAULT_TASK_BYTES: u64 = 1 << 30;
/// `--shard-bytes` when not given.
pub const DEFAULT_SHARD_BYTES: u64 = 16 << 20;

impl TilingArgs {
    /// The grouping as the job spec records it (part of the job's identity),
    /// with the defaults for what was not given.
    pub fn grouping_spec(&self) -> rsembed_schemas::job::GroupingSpec {
        let files = self.task_size.unwrap_or(DEFAULT_TASK_FILES);
        rsembed_schemas::job::GroupingSpec {
            task_files: files as u64,
            task_bytes: self.task_bytes.unwrap_or(DEFAULT_TASK_BYTES),
            task_chips: self
                .task_chips
                .or(self.task_size)
                .unwrap_or(DEFAULT_TASK_CHIPS) as u64,
            shard_bytes: self.shard_bytes.unwrap_or(DEFAULT_SHARD_BYTES),
        }
    }

    /// Whether a grouping flag was given: without one, a resumed job keeps
    /// the grouping it recorded (an older version's defaults among them).
    pub(crate) fn grouping_given(&self) -> bool {
        self.task_size.is_some()
            || self.task_bytes.is_some()
            || self.task_chips.is_some()
            || self.shard_bytes.is_some()
    }
}

/// `rsembed run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Input: a local folder or file, or an object store URL (s3://, gs://, az://, http(s)://).
    #[arg(long, env = "RSEMBED_INPUT")]
    pub input: String,
    /// Output: a local folder or an object store URL; gets job.json, chips/, errors/, manifest.json.
    #[arg(long, env = "RSEMBED_OUTPUT")]
    pub output: String,
    /// Model directory (see tools/export_onnx.py).
    #[arg(long, env = "RSEMBED_MODEL")]
    pub model: PathBuf,
    /// Tiling.
    #[command(flatten)]
    pub tiling: TilingArgs,
    /// Inference.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Start over: delete whatever job the output holds (its manifest.json
    /// first, then chips/, errors/, stac/ and job.json), even this same job, once
    /// the plan has found an input. Default: resume this job, and refuse
    /// another one, naming the flags that differ.
    #[arg(long, env = "RSEMBED_OVERWRITE")]
    pub overwrite: bool,
    /// Run again every task of this job that did not finish cleanly: tasks
    /// with failed inputs (an errors/ file). Their files are replaced; the
    /// other finished tasks are kept. Not part of the job's identity.
    #[arg(long, env = "RSEMBED_RETRY_FAILED", conflicts_with = "overwrite")]
    pub retry_failed: bool,
    /// Tasks and decoding.
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// Serve Prometheus metrics at `http://<HOST:PORT>/metrics` while the job runs
    /// (chips, failed inputs, batch size and ceiling, out-of-memory count, inference
    /// time, queue depths, GPU memory). Default: off.
    #[arg(long, env = "RSEMBED_METRICS_ADDR", value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// Without a terminal (logs, CI), a progress line (inputs, chips, chips/s,
    /// ETA) goes to stderr this often; a terminal gets a progress bar instead.
    #[arg(long, env = "RSEMBED_PROGRESS_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub progress_interval: Duration,
    /// Print the summary as JSON instead of text.
    #[arg(long, env = "RSEMBED_JSON")]
    pub json: bool,
}

/// `rsembed plan`.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("chip_size", |a| a.help(
    "Chip size in source pixels. Default: 256, Git-RSCLIP's input size (plan takes no model; \
     pass the chip size the run will use)"
)))]
pub struct PlanArgs {
    /// Input: a local folder or file, or an object store URL.
    #[arg(long, env = "RSEMBED_INPUT")]
    pub input: String,
    /// Tiling.
    #[command(flatten)]
    pub tiling: TilingArgs,
    /// Print the plan as JSON.
    #[arg(long, env = "RSEMBED_JSON")]
    pub json: bool,
}

/// How the text graph runs, for `text`, `search` and `classify`: only what
/// one small graph run per batch of texts needs, none of the image batching,
/// arena or fp16 settings of [`EngineArgs`].
#[derive(Debug, Clone, Args)]
pub struct TextEngineArgs {
    /// `cpu`, `cuda` or `cuda:N`. CUDA that cannot be used is an error with ONNX
    /// Runtime's reason, never a silent fall back to the CPU.
    #[arg(long, env = "RSEMBED_DEVICE", default_value = "cpu")]
    pub(crate) device: Device,
    /// Threads inside one ONNX Runtime operator. Default: ONNX Runtime's choice (one per core).
    #[arg(long, env = "RSEMBED_INTRA_THREADS")]
    pub(crate) intra_threads: Option<usize>,
    /// Path of libonnxruntime.so. Default: ORT_DYLIB_PATH, then next to the executable, then the system.
    #[arg(long, env = "RSEMBED_ORT_LIB")]
    pub(crate) ort_lib: Option<PathBuf>,
}

impl TextEngineArgs {
    /// The ONNX Runtime session settings for the text graph.
    pub(crate) fn session_config(&self) -> SessionConfig {
        SessionConfig {
            device: self.device,
            intra_threads: self.intra_threads,
            ort_lib: self.ort_lib.clone(),
            ..SessionConfig::default()
        }
    }
}

/// `rsembed text`.
#[derive(Debug, Clone, Args)]
pub struct TextArgs {
    /// Model directory.
    #[arg(long, env = "RSEMBED_MODEL")]
    pub(crate) model: PathBuf,
    /// Inference for the text graph.
    #[command(flatten)]
    pub(crate) engine: TextEngineArgs,
    /// Texts to embed; each gets one output line.
    #[arg(required = true)]
    pub(crate) texts: Vec<String>,
}

/// `rsembed search`: the query crate's flags, and the model that embeds
/// the texts.
#[derive(Debug, Clone, Args)]
pub struct SearchCommand {
    /// Model directory: embeds the texts, and its logit scale and bias turn
    /// cosines into scores. Optional with `--like` or `--vector`.
    #[arg(long, env = "RSEMBED_MODEL")]
    pub(crate) model: Option<PathBuf>,
    /// The search.
    #[command(flatten)]
    pub(crate) search: rsembed_query::search::SearchArgs,
    /// Inference for the text graph.
    #[command(flatten)]
    pub(crate) engine: TextEngineArgs,
}

/// `rsembed classify`: the query crate's flags, and the model that embeds
/// the labels.
#[derive(Debug, Clone, Args)]
pub struct ClassifyCommand {
    /// Model directory.
    #[arg(long, env = "RSEMBED_MODEL")]
    pub(crate) model: PathBuf,
    /// The classification.
    #[command(flatten)]
    pub classify: rsembed_query::classify::ClassifyArgs,
    /// Inference for the text graph.
    #[command(flatten)]
    pub(crate) engine: TextEngineArgs,
}

/// `--check-graphs`: whether ONNX Runtime loads the fetched graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GraphCheck {
    /// Parse them when an ONNX Runtime library is found; when none is (and
    /// neither `--ort-lib` nor `ORT_DYLIB_PATH` names one), warn and go on.
    Auto,
    /// Parse them; no ONNX Runtime library is an error.
    Always,
    /// Do not load ONNX Runtime (digests are still checked).
    Never,
}

/// `rsembed fetch-model`.
#[derive(Debug, Clone, Args)]
pub struct FetchModelArgs {
    /// The model directory to copy: an object store prefix (s3://, gs://, az://,
    /// http(s)://) or a local folder, holding `rsembed-model.json`. Credentials
    /// come from the usual environment variables (`AWS_*`, ...).
    #[arg(long, env = "RSEMBED_FETCH_FROM", value_name = "URL")]
    pub(crate) from: String,
    /// Local folder to copy it into (created if missing). Files already there
    /// with the same size as their object (and the digest rsembed-model.json
    /// records, if it records one) are kept, so a restarted copy resumes.
    #[arg(long, env = "RSEMBED_FETCH_TO", value_name = "DIR")]
    pub(crate) to: PathBuf,
    /// Load each graph with ONNX Runtime (CPU, unoptimised) once copied, so a
    /// truncated or garbled graph fails here: `auto` when a library is found
    /// (a warning otherwise), `always`, or `never`.
    #[arg(long, env = "RSEMBED_CHECK_GRAPHS", value_enum, default_value = "auto")]
    pub(crate) check_graphs: GraphCheck,
    /// Path of libonnxruntime.so for `--check-graphs`. Default: ORT_DYLIB_PATH,
    /// then next to the executable, then the system.
    #[arg(long, env = "RSEMBED_ORT_LIB")]
    pub(crate) ort_lib: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long, env = "RSEMBED_JSON")]
    pub json: bool,
}
