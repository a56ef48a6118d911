//! What `run` and `submit` both do before a job's first task: every flag
//! checked, the model directory opened and fingerprinted, the input resolved,
//! the job compared with the one at the output (resumed, replaced as asked,
//! or refused), the output found writable, and the plan's first task found.
//! Written once, so the two commands refuse the same things with the same
//! words; what each then does with the job (run it here, or publish it) is
//! its own.

use std::path::Path;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use rsembed_raster::scale::ScaleSpec;
use rsembed_schemas::align::Align;
use rsembed_schemas::job::{
    check_footprint_tolerance, GroupingSpec, JobSpec, ModelRef, TilingSpec,
    DEFAULT_FOOTPRINT_TOLERANCE,
};
use rsembed_schemas::task::Task;
use rsembed_schemas::window::{
    CalendarDuration, Composite, WindowError, WindowSpec, Windows, DEFAULT_MAX_SCENES,
};
use rsembed_worker::input::InputKind;
use rsembed_worker::model::ModelDir;
use rsembed_worker::now_rfc3339;
use rsembed_worker::store::{Location, StoreCache};

use crate::cli::TilingArgs;
use crate::error::{Error, Result};
use crate::job::output::{self, Claim, JobOutput, Replace};
use crate::job::plan::{ListStats, Planner, Source};

/// The flags of a job's command that its setup reads.
pub(crate) struct JobFlags<'a> {
    /// `--input`.
    pub(crate) input: &'a str,
    /// `--output`.
    pub(crate) output: &'a str,
    /// `--model`.
    pub(crate) model: &'a Path,
    /// Whether the job runs the model's float16 vision graph.
    pub(crate) fp16: bool,
    /// The tiling flags.
    pub(crate) tiling: &'a TilingArgs,
    /// What the command may replace at the output.
    pub(crate) replace: Replace,
    /// The flag that asks for a replacement, as a refusal names it.
    pub(crate) replace_flag: &'static str,
}

/// A job, set up: compared with the output's, which may now be written.
pub(crate) struct JobSetup {
    /// The stores the job's locations were opened through.
    pub(crate) stores: StoreCache,
    /// The input, resolved.
    pub(crate) input: Location,
    /// What the planner reads.
    pub(crate) source: Source,
    /// The output.
    pub(crate) output: Location,
    /// The model directory.
    pub(crate) model: ModelDir,
    /// The model as the job records it.
    pub(crate) model_ref: ModelRef,
    /// The job's `--scale`, parsed.
    pub(crate) scale: ScaleSpec,
    /// The output's job.
    pub(crate) out: JobOutput,
    /// The job: a resumed job's own record where it has one.
    pub(crate) spec: JobSpec,
    /// The job's tiling (its spec's).
    pub(crate) tiling: TilingSpec,
    /// The job's task grouping.
    pub(crate) grouping: GroupingSpec,
    /// What the command found at the output.
    pub(crate) claim: Claim,
    /// The output folder this command created, removed unless kept.
    pub(crate) created_dir: CreatedDir,
}

/// Sets a job up as `flags` ask. Nothing is written but an empty output
/// folder, which goes again unless the caller keeps it.
pub(crate) async fn setup(flags: JobFlags<'_>) -> Result<JobSetup> {
    let stores = StoreCache::default();
    let output = stores.location(flags.output)?;
    // Every flag is checked, and the job compared with the one at the output,
    // before anything is created or written.
    let model = ModelDir::open(flags.model)?;
    let tiling = tiling_spec(flags.tiling, &model)?;
    let resolved = crate::stac::resolve(&stores, flags.input, &tiling, &flags.tiling.stac).await?;
    let input = resolved.location.clone();
    // Refused here rather than by every worker.
    let scale: ScaleSpec = tiling.scale.parse().map_err(Error::Usage)?;
    let model_ref = model.model_ref(flags.fp16)?;
    let out = JobOutput::new(output.clone());
    let spec = JobSpec::new(
        input.url.to_string(),
        output.url.to_string(),
        model_ref.clone(),
        tiling,
        flags.tiling.grouping_spec(),
        now_rfc3339(),
    )
    .with_search(resolved.search.clone());
    let given = output::Given {
        footprint_tolerance: flags.tiling.footprint_tolerance.is_some(),
        grouping: flags.tiling.grouping_given(),
    };
    let mut spec = out.as_resumed(spec, given, flags.replace).await?;
    let grouping = spec
        .grouping
        .unwrap_or_else(|| flags.tiling.grouping_spec());
    let tiling = spec.tiling.clone();
    // A mistyped --input is named as such, not as another job.
    check_input_exists(&stores, flags.input).await?;
    let claim = out.check(&spec, flags.replace, flags.replace_flag).await?;
    if let Some(t) = claim.created_at() {
        spec.created_at = t.to_owned();
    }
    let created_dir = check_output(&output).await?;
    Ok(JobSetup {
        stores,
        input,
        source: resolved.source,
        output,
        model,
        model_ref,
        scale,
        out,
        spec,
        tiling,
        grouping,
        claim,
        created_dir,
    })
}

/// The plan's first task. The job exists once its plan has found an input:
/// a mistyped --input must leave the output (and the job it holds) as it
/// was, so a plan that ends without a task fails here, before anything is
/// written.
pub(crate) async fn first_task(planner: &mut Planner, input: &url::Url) -> Result<Task> {
    if let Some(first) = planner.tasks.recv().await {
        return Ok(first);
    }
    (&mut planner.done)
        .await
        .map_err(|source| Error::Panicked {
            what: "planner",
            source,
        })??;
    Err(no_inputs(input, &planner.stats))
}

/// The tiling a job records, with defaults filled from the model.
pub fn tiling_spec(t: &TilingArgs, model: &ModelDir) -> Result<TilingSpec> {
    let chip_size = t.chip_size.unwrap_or(model.preprocessor.size.width);
    if chip_size == 0 || t.stride == Some(0) {
        return Err(Error::Usage(
            "--chip-size and --stride must be positive".into(),
        ));
    }
    if let Some(v) = t.min_valid {
        if !(0.0..=1.0).contains(&v) {
            return Err(Error::Usage(format!(
                "--min-valid must be within 0..=1, not {v}"
            )));
        }
    }
    let bands = t.bands.clone().unwrap_or_else(|| vec![1, 2, 3]);
    if bands.len() != 3 || bands.contains(&0) {
        return Err(Error::Usage(format!(
            "--bands needs three 1-based band indexes (R,G,B), not {bands:?}"
        )));
    }
    if let Some(files) = &t.band_files {
        if files.len() != 3 || files.iter().any(|f| f.is_empty()) {
            return Err(Error::Usage(format!(
                "--band-files needs three name suffixes in R,G,B order (e.g. B4,B3,B2), not {files:?}"
            )));
        }
    }
    check_stac_tiling(t)?;
    let (windows, align) = window_spec(t)?;
    if t.task_size == Some(0) || t.task_chips == Some(0) || t.task_bytes == Some(0) {
        return Err(Error::Usage(
            "--task-files, --task-chips and --task-bytes must be positive".into(),
        ));
    }
    Ok(TilingSpec {
        chip_size,
        stride: t.stride.unwrap_or(chip_size),
        bands,
        scale: t.scale.clone(),
        min_valid: t.min_valid,
        band_files: t.band_files.clone(),
        assets: t.assets.clone(),
        cloud_mask: t.cloud_mask.clone(),
        max_cloud: t.max_cloud,
        footprint_tolerance: Some(footprint_tolerance(t)?),
        embedding_type: t.embedding_type,
        align,
        schema_version: rsembed_schemas::SCHEMA_VERSION,
        windows,
    })
}

/// `--windows`, `--composite` and `--max-scenes`, checked with `--datetime`
/// and `--align`: the job's windows, and its alignment (`crs` with windows:
/// a cell is only the same place across acquisitions on the CRS lattice).
pub fn window_spec(t: &TilingArgs) -> Result<(Option<WindowSpec>, Align)> {
    let w = &t.window;
    let Some(text) = &w.windows else {
        if w.composite.is_some() || w.max_scenes.is_some() {
            return Err(Error::Usage(
                "--composite and --max-scenes choose among a window's acquisitions: \
                 they need --windows"
                    .into(),
            ));
        }
        return Ok((None, t.align.unwrap_or_default()));
    };
    let duration: CalendarDuration = text
        .parse()
        .map_err(|e: WindowError| Error::Usage(e.to_string()))?;
    let Some(datetime) = &t.stac.datetime else {
        return Err(Error::Usage(format!(
            "--windows {text} splits a STAC search's --datetime A/B into windows: \
             give --datetime with both ends (e.g. 2024-01-01/2024-12-31)"
        )));
    };
    // A date alone is a day's interval to a search, but no interval to split.
    if !datetime.contains('/') {
        return Err(Error::Usage(format!(
            "--windows {text} splits --datetime A/B into windows: `{datetime}` is one time, \
             not an interval A/B with both ends"
        )));
    }
    let datetime = crate::stac::search::normalize_datetime(datetime).map_err(Error::Usage)?;
    Windows::of_interval(&datetime, duration).map_err(|e| Error::Usage(e.to_string()))?;
    if t.align == Some(Align::Scene) {
        return Err(Error::Usage(
            "--windows compares cells across acquisitions, which only --align crs cuts \
             identically: leave --align out or give --align crs"
                .into(),
        ));
    }
    let composite = w.composite.unwrap_or_default();
    // A median mixes the samples of several scenes before scaling: only a
    // scale that is one map for every scene gives them a common 8 bits.
    if composite == Composite::Median && t.scale.parse::<ScaleSpec>() == Ok(ScaleSpec::Auto) {
        return Err(Error::Usage(
            "--composite median needs a fixed --scale (MIN:MAX, e.g. 0:0.3 in physical units, \
             or none): --scale auto stretches each scene by its own percentiles, which have no \
             common meaning across the acquisitions a median mixes"
                .into(),
        ));
    }
    let max_scenes = w.max_scenes.unwrap_or(DEFAULT_MAX_SCENES);
    if max_scenes == 0 {
        return Err(Error::Usage("--max-scenes must be positive".into()));
    }
    Ok((
        Some(WindowSpec {
            duration: duration.to_string(),
            composite,
            max_scenes,
            cell_blocks: true,
        }),
        Align::Crs,
    ))
}

/// `--footprint-tolerance`, checked, or its default.
pub fn footprint_tolerance(t: &TilingArgs) -> Result<f64> {
    t.footprint_tolerance
        .map_or(Ok(DEFAULT_FOOTPRINT_TOLERANCE), check_footprint_tolerance)
        .map_err(Error::Usage)
}

/// `--assets`, `--cloud-mask` and `--max-cloud`, checked.
pub fn check_stac_tiling(t: &TilingArgs) -> Result<()> {
    if let Some(a) = &t.assets {
        if !(a.len() == 1 || a.len() == 3) || a.iter().any(|a| a.trim().is_empty()) {
            return Err(Error::Usage(format!(
                "--assets needs three asset keys or band common names in R,G,B order \
                 (red,green,blue), or one 3-band asset (visual), not {a:?}"
            )));
        }
    }
    if let Some(m) = &t.cloud_mask {
        rsembed_schemas::task::parse_cloud_mask(m).map_err(Error::Usage)?;
    }
    if let Some(v) = t.max_cloud {
        if !(0.0..=1.0).contains(&v) {
            return Err(Error::Usage(format!(
                "--max-cloud is a fraction of a chip's valid pixels (0-1), not {v}"
            )));
        }
        if t.cloud_mask.is_none() {
            return Err(Error::Usage(
                "--max-cloud needs --cloud-mask: which asset says where the clouds are".into(),
            ));
        }
    }
    Ok(())
}

/// A local output folder this command created, removed again (when still
/// empty) unless [`CreatedDir::keep`] is called: a refused or failed command
/// must not leave an empty folder behind.
#[derive(Default)]
pub(crate) struct CreatedDir(Option<std::path::PathBuf>);

impl CreatedDir {
    /// The folder stays.
    pub(crate) fn keep(&mut self) {
        self.0 = None;
    }
}

impl Drop for CreatedDir {
    fn drop(&mut self) {
        if let Some(d) = &self.0 {
            // Only an empty folder goes; anything in it is someone's.
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Makes sure the output can be written, before any work starts. The folder
/// it creates (locally) is removed on drop of the guard unless kept.
async fn check_output(out: &Location) -> Result<CreatedDir> {
    let mut created = CreatedDir::default();
    if let Some(dir) = out.local_dir() {
        if !dir.exists() {
            // The topmost missing ancestor is what this command creates.
            let mut top = dir.clone();
            while let Some(p) = top.parent() {
                if p.exists() {
                    break;
                }
                top = p.to_path_buf();
            }
            std::fs::create_dir_all(&dir).map_err(|source| Error::CreateOutputDir {
                dir: dir.clone(),
                source,
            })?;
            if top == dir {
                created.0 = Some(dir.clone());
            }
        }
    }
    if out.is_local() {
        // object_store's local put retries forever where a folder refuses new
        // files (`/proc`): the probe goes through std::fs, which fails.
        out.probe_local_write(".rsembed-write-probe")
            .map_err(|e| not_writable(out, e))?;
        return Ok(created);
    }
    let probe = out.child(".rsembed-write-probe");
    out.store
        .put(&probe, PutPayload::from_static(b"probe"))
        .await
        .map_err(|e| not_writable(out, e))?;
    out.store
        .delete(&probe)
        .await
        .map_err(|source| Error::OutputNotDeletable {
            url: out.url.to_string(),
            source,
        })?;
    Ok(created)
}

fn not_writable(out: &Location, e: impl Into<crate::error::BoxError>) -> Error {
    Error::OutputNotWritable {
        url: out.url.to_string(),
        source: e.into(),
    }
}

/// Fails with "input … does not exist" when `input` names nothing: a local
/// path that is not there, or an object store prefix with no object at or
/// under it. Checked before the job is compared with the one at the output,
/// so a mistyped `--input` into a used output is reported as what it is
/// rather than as another job. HTTP(S) inputs have no listing; their first
/// read says whether they exist.
async fn check_input_exists(stores: &StoreCache, input: &str) -> Result<()> {
    let loc = stores.location(input)?;
    let missing = || {
        Error::Input(format!(
            "{} does not exist: no file or folder, and no object at or under it; \
             nothing was written",
            loc.url
        ))
    };
    if loc.is_http() {
        return Ok(());
    }
    if let Some(path) = loc.local_dir().filter(|_| loc.is_local()) {
        return match std::fs::metadata(&path) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(missing()),
            // Unreadable (permissions): the listing reports it with its cause.
            Err(_) => Ok(()),
        };
    }
    match loc.store.head(&loc.prefix).await {
        Ok(_) => return Ok(()),
        Err(object_store::Error::NotFound { .. }) => {}
        // A prefix is no object: some stores answer a HEAD of it otherwise.
        Err(e) => tracing::debug!(error = %e, "input is no object; listing it"),
    }
    let prefix = (!loc.prefix.as_ref().is_empty()).then_some(&loc.prefix);
    match loc.store.list(prefix).next().await {
        Some(Ok(_)) => Ok(()),
        None => Err(missing()),
        Some(Err(source)) => Err(Error::InputStore {
            url: loc.url.to_string(),
            source,
        }),
    }
}

/// The error of a plan that found nothing to embed.
fn no_inputs(input: &url::Url, stats: &ListStats) -> Error {
    let skipped = stats.skipped.load(Ordering::Relaxed);
    Error::NoInputs(format!(
        "{input} holds no inputs: {skipped} files were skipped as not images \
         (inputs are {} files and {} archives); nothing was written",
        [InputKind::IMAGE.as_slice(), &InputKind::SCENE]
            .concat()
            .join(" "),
        InputKind::ARCHIVE.join(", ")
    ))
}

#[cfg(test)]
#[path = "setup_tests.rs"]
mod tests;
