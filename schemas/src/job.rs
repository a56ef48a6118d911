//! The job spec (`job.json`) and the manifest (`manifest.json`).

use serde::{Deserialize, Serialize};

use crate::align::Align;
use crate::embedding::EmbeddingType;
use crate::ids::IdHasher;
use crate::window::WindowSpec;

mod manifest;
mod resume;

pub use manifest::{
    IvfLayout, Manifest, ManifestFailedTask, ManifestFailure, ManifestFile, ManifestLists,
    CENTROIDS_FILE, MANIFEST_FORMAT,
};

/// File name of the job spec at the output root.
pub const JOB_FILE: &str = "job.json";
/// File name of the manifest at the output root.
pub const MANIFEST_FILE: &str = "manifest.json";

/// `--footprint-tolerance` when not given: a hundredth of a source pixel.
///
/// Far below what any use of a footprint can tell apart (a pixel is the
/// smallest thing the data locates), and coarse enough that a 256-pixel
/// UTM chip's lon/lat outline needs only a few vertices per edge.
pub const DEFAULT_FOOTPRINT_TOLERANCE: f64 = 0.01;
/// The largest `--footprint-tolerance`: beyond a pixel a footprint would
/// put a chip's pixels outside its own polygon.
pub const MAX_FOOTPRINT_TOLERANCE: f64 = 1.0;

/// `--footprint-tolerance`, checked: finite, positive, at most
/// [`MAX_FOOTPRINT_TOLERANCE`]. The error names the flag.
pub fn check_footprint_tolerance(v: f64) -> Result<f64, String> {
    if v.is_finite() && v > 0.0 && v <= MAX_FOOTPRINT_TOLERANCE {
        Ok(v)
    } else {
        Err(format!(
            "--footprint-tolerance is in source pixels, above 0 and at most \
             {MAX_FOOTPRINT_TOLERANCE}, not {v}"
        ))
    }
}

/// How inputs are cut into chips and scaled to 8 bits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TilingSpec {
    /// Chip size in source pixels; the model's input size when not given.
    pub chip_size: u32,
    /// Stride in source pixels; the chip size when not given.
    pub stride: u32,
    /// 1-based band indexes in R,G,B order.
    pub bands: Vec<u32>,
    /// `auto`, `none` or `MIN:MAX`.
    pub scale: String,
    /// Chips whose valid fraction is below this are dropped; `None` drops only empty chips.
    pub min_valid: Option<f32>,
    /// `--band-files`: scenes stored one file per band, grouped by these name
    /// suffixes in channel order (e.g. `B4,B3,B2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub band_files: Option<Vec<String>>,
    /// `--assets`: STAC asset keys or band common names in R,G,B order, or one
    /// 3-band asset. `None`: `visual` when an item has it, else
    /// `red,green,blue` by common name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assets: Option<Vec<String>>,
    /// `--cloud-mask`: the asset (`SCL`, or `qa_pixel:qa_pixel` for Landsat's
    /// bit flags) whose pixels give each chip's `cloud_fraction`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_mask: Option<String>,
    /// `--max-cloud`: chips whose `cloud_fraction` exceeds this are dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cloud: Option<f32>,
    /// `--footprint-tolerance`: how far, in source pixels, a chip's `geometry`
    /// may stray from the chip's true outline. `None` (absent from `job.json`)
    /// is what jobs written before the flag existed did: each vertex of the
    /// chord within 5e-8 degrees, whatever the pixel size. Every new job
    /// records its value, so a resumed old job keeps its footprints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub footprint_tolerance: Option<f64>,
    /// `--embedding-type`: how the `embedding` column stores vectors. Left
    /// out of the spec when f32, so jobs of earlier versions keep their ids;
    /// not in [`TilingSpec::fingerprint`] (the chips are the same chips), but
    /// in the job id: one job's files hold one type.
    #[serde(default, skip_serializing_if = "EmbeddingType::is_f32")]
    pub embedding_type: EmbeddingType,
    /// `--align`: chips from each scene's own corner (`scene`, left out of
    /// `job.json`, so jobs of earlier versions keep their ids) or on the CRS
    /// lattice (`crs`, in [`TilingSpec::fingerprint`]: other windows, other
    /// chips).
    #[serde(default, skip_serializing_if = "Align::is_scene")]
    pub align: Align,
    /// The chip schema version the job's files are written in:
    /// [`crate::SCHEMA_VERSION`] for a new job, kept when it resumes, so one
    /// job never mixes schemas. Absent from `job.json` (and task messages)
    /// of jobs written before version 3, which are version 2. Not in
    /// [`TilingSpec::fingerprint`] (chip ids do not change with it); in the
    /// job fingerprint.
    #[serde(
        default = "schema_version_unrecorded",
        skip_serializing_if = "is_schema_version_unrecorded"
    )]
    pub schema_version: u32,
    /// `--windows`, `--composite` and `--max-scenes`: one row per (window,
    /// cell). Absent from `job.json` of jobs without windows, which keep
    /// their ids. Not in [`TilingSpec::fingerprint`]: a `best` row's chip is
    /// a scene's chip, with that chip's id; in the job fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<WindowSpec>,
}

fn schema_version_unrecorded() -> u32 {
    crate::SCHEMA_VERSION_UNRECORDED
}

fn is_schema_version_unrecorded(v: &u32) -> bool {
    *v == crate::SCHEMA_VERSION_UNRECORDED
}

impl TilingSpec {
    /// The tiling fingerprint that goes into every `chip_id`.
    ///
    /// `min_valid` is left out: it decides which chips are kept, not what a
    /// chip is; so is `footprint_tolerance`, which decides how precisely the
    /// `geometry` column draws a chip, not which pixels it is (both are in
    /// the job id instead).
    pub fn fingerprint(&self) -> String {
        let mut h = IdHasher::new("rsembed.tiling.v1");
        h.i64(self.chip_size.into()).i64(self.stride.into());
        for b in &self.bands {
            h.i64((*b).into());
        }
        h.str(&self.scale);
        // Absent for single-file scenes, so their fingerprints stay as they were.
        if let Some(files) = &self.band_files {
            h.str("band_files");
            for f in files {
                h.str(f);
            }
        }
        // Other assets are other pixels. The cloud mask and --max-cloud are
        // not: they decide a column and which chips are kept (the job id).
        if let Some(assets) = &self.assets {
            h.str("assets");
            for a in assets {
                h.str(a);
            }
        }
        // Absent for `scene`, so chip ids stay as they were.
        if self.align != Align::Scene {
            h.str("align").str(self.align.as_str());
        }
        h.hex128()
    }
}

/// A model file and its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    /// Path relative to its root (model directory or output).
    pub path: String,
    /// Hex SHA-256 of the bytes.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
}

/// The model a job runs, as recorded for provenance and fingerprinting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRef {
    /// Name from `rsembed-model.json`.
    pub name: String,
    /// Embedding dimension.
    pub embed_dim: usize,
    /// SHA-256 of the vision graph that produces the embeddings.
    pub sha256: String,
    /// Every ONNX file of the model directory with its digest.
    pub files: Vec<FileDigest>,
    /// Digest of `preprocessor_config.json`, which changes pixels as much as the graph does.
    pub preprocessor_sha256: String,
    /// Whether the float16 vision graph is used.
    pub fp16: bool,
}

impl ModelRef {
    /// The model fingerprint: a worker serves a job only when its own equals this.
    pub fn fingerprint(&self) -> String {
        IdHasher::new("rsembed.model.v1")
            .str(&self.name)
            .i64(self.embed_dim as i64)
            .str(&self.sha256)
            .str(&self.preprocessor_sha256)
            .hex128()
    }
}

/// How a job's inputs are grouped into tasks. Part of the job's identity:
/// another grouping names other task files for the same chips, and two
/// groupings in one output would hold every chip twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupingSpec {
    /// `--task-files`: inputs per task, on average.
    pub task_files: u64,
    /// `--task-bytes`: a task ends once its inputs reach this many bytes.
    pub task_bytes: u64,
    /// `--task-chips`: chips per task of a split scene, about.
    pub task_chips: u64,
    /// `--shard-bytes`: TIFFs at least this large are split into chip blocks.
    pub shard_bytes: u64,
}

/// A STAC input's search: which items a job embeds. Part of the job's
/// identity (the same root URL searched otherwise is another job).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StacSearch {
    /// `--collections`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collections: Vec<String>,
    /// `--bbox` W,S,E,N in lon/lat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bbox: Option<[f64; 4]>,
    /// `--datetime`: an RFC 3339 instant or interval (`A/B`, `A/..`, `../B`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datetime: Option<String>,
    /// `--ids`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<String>,
    /// `--filter`: CQL2 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// `--max-items`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_items: Option<u64>,
    /// `--cloud-cover-max`: scenes with `eo:cloud_cover` at most this (percent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_cover_max: Option<f64>,
    /// How `--cloud-cover-max` went to a STAC API, as the planner found the
    /// server: sent with the search, or applied by rsembed to each item.
    /// Recorded so the output's `emb:source-data` link reproduces the request
    /// as it was sent. Not part of the job's identity (it is what the server
    /// supports, not which items the job selects); absent for inputs that are
    /// not an API, without `--cloud-cover-max`, and in older `job.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_cover_by: Option<CloudCoverBy>,
}

/// Where a STAC API search's `--cloud-cover-max` was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CloudCoverBy {
    /// Sent as CQL2 (`filter`): the server conforms to the filter extension.
    Filter,
    /// Sent as the query extension's `query` (`eo:cloud_cover` `lte`).
    Query,
    /// Not sent (the server has neither extension): rsembed judged each
    /// item's `eo:cloud_cover` itself.
    Client,
}

impl StacSearch {
    fn hash_into(&self, h: &mut IdHasher) {
        h.str("stac-search");
        h.i64(self.collections.len() as i64);
        for c in &self.collections {
            h.str(c);
        }
        match self.bbox {
            Some(b) => {
                for v in b {
                    h.str(&v.to_bits().to_string());
                }
            }
            None => {
                h.str("no bbox");
            }
        }
        h.opt_str(self.datetime.as_deref());
        h.i64(self.ids.len() as i64);
        for i in &self.ids {
            h.str(i);
        }
        h.opt_str(self.filter.as_deref());
        h.opt_str(self.max_items.map(|v| v.to_string()).as_deref());
        h.opt_str(
            self.cloud_cover_max
                .map(|v| v.to_bits().to_string())
                .as_deref(),
        );
    }
}

/// The job spec format [`JobSpec::new`] writes. Format 1 had no grouping and
/// a job id that ignored the output, `--min-valid` and the grouping.
pub const JOB_FORMAT: u32 = 2;

/// One field in which two jobs differ, named by the flag that sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The flag (`--min-valid`) or what it is (`the model`).
    pub what: &'static str,
    /// Its value in the job already at the output.
    pub theirs: String,
    /// Its value in the job asked for now.
    pub ours: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} in this command, {} in the job at the output",
            self.what, self.ours, self.theirs
        )
    }
}

/// `job.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Spec format: [`JOB_FORMAT`]; 1 in outputs of older versions.
    pub format: u32,
    /// 32 hex chars: [`JobSpec::job_id_of`] over everything that decides the
    /// rows and the files (fingerprint, `--min-valid`, input, output,
    /// grouping), then the STAC flags and `--footprint-tolerance` where given.
    pub job_id: String,
    /// Hash of everything that determines the rows: model, tiling, schema version.
    pub fingerprint: String,
    /// Input URL as given, canonicalized.
    pub input: String,
    /// Output URL, canonicalized.
    pub output: String,
    /// Model provenance.
    pub model: ModelRef,
    /// Tiling parameters.
    pub tiling: TilingSpec,
    /// Task grouping; absent in format 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grouping: Option<GroupingSpec>,
    /// The search, when the input is a STAC API, catalog or item collection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<StacSearch>,
    /// RFC 3339 time the job was first created; kept on resume.
    pub created_at: String,
    /// Software that created the job.
    pub software_version: String,
}

impl JobSpec {
    /// The job fingerprint for a model and tiling (whose
    /// [`TilingSpec::schema_version`] is the job's chip schema).
    pub fn fingerprint_of(model: &ModelRef, tiling: &TilingSpec) -> String {
        let mut h = IdHasher::new("rsembed.job.v1");
        h.str(&model.fingerprint())
            .str(&tiling.fingerprint())
            .i64(tiling.schema_version.into());
        // Absent without windows, so other jobs keep their fingerprints.
        if let Some(w) = &tiling.windows {
            w.hash_into(&mut h);
        }
        h.hex128()
    }

    /// The job id: everything that decides which rows exist, what they hold
    /// and which files hold them. Two commands with equal ids are one job (a
    /// rerun resumes it); any difference is another job.
    ///
    /// The fingerprint already covers the model (its vision graph, so
    /// `--fp16` too), the preprocessor and the tiling; `--min-valid` is added
    /// here rather than to the fingerprint, because it decides which chips are
    /// kept, not whether two files' rows are comparable.
    pub fn job_id_of(
        fingerprint: &str,
        min_valid: Option<f32>,
        input: &str,
        output: &str,
        grouping: &GroupingSpec,
    ) -> String {
        let mut h = IdHasher::new("rsembed.jobid.v2");
        h.str(fingerprint)
            .opt_str(min_valid.map(|v| v.to_bits().to_string()).as_deref())
            .str(input)
            .str(output)
            .i64(grouping.task_files as i64)
            .i64(grouping.task_bytes as i64)
            .i64(grouping.task_chips as i64)
            .i64(grouping.shard_bytes as i64);
        h.hex128()
    }

    /// A new spec, its fingerprint and id computed from the rest.
    pub fn new(
        input: String,
        output: String,
        model: ModelRef,
        tiling: TilingSpec,
        grouping: GroupingSpec,
        created_at: String,
    ) -> JobSpec {
        let fingerprint = Self::fingerprint_of(&model, &tiling);
        let mut spec = JobSpec {
            format: JOB_FORMAT,
            job_id: String::new(),
            fingerprint,
            input,
            output,
            model,
            tiling,
            grouping: Some(grouping),
            search: None,
            created_at,
            software_version: crate::SOFTWARE_VERSION.to_owned(),
        };
        spec.job_id = spec.id();
        spec
    }

    /// The same job over a STAC input searched by `search`.
    pub fn with_search(mut self, search: Option<StacSearch>) -> JobSpec {
        self.search = search;
        self.job_id = self.id();
        self
    }

    /// [`JobSpec::job_id_of`], and the STAC selection where there is one.
    fn base_id(&self) -> String {
        let grouping = self.grouping.unwrap_or(GroupingSpec {
            task_files: 0,
            task_bytes: 0,
            task_chips: 0,
            shard_bytes: 0,
        });
        let base = Self::job_id_of(
            &self.fingerprint,
            self.tiling.min_valid,
            &self.input,
            &self.output,
            &grouping,
        );
        let t = &self.tiling;
        if self.search.is_none() && t.cloud_mask.is_none() && t.max_cloud.is_none() {
            // Jobs of other inputs keep the ids they had before STAC.
            return base;
        }
        let mut h = IdHasher::new("rsembed.jobid.stac.v1");
        h.str(&base);
        if let Some(s) = &self.search {
            s.hash_into(&mut h);
        }
        h.opt_str(t.cloud_mask.as_deref())
            .opt_str(t.max_cloud.map(|v| v.to_bits().to_string()).as_deref());
        h.hex128()
    }

    /// [`JobSpec::base_id`], extended by an embedding type other than the
    /// default f32: an f32 job keeps the id it had before types existed.
    fn id_before_footprints(&self) -> String {
        let base = self.base_id();
        if self.tiling.embedding_type.is_f32() {
            return base;
        }
        IdHasher::new("rsembed.jobid.embedding.v1")
            .str(&base)
            .str(self.tiling.embedding_type.as_str())
            .hex128()
    }

    /// [`JobSpec::id_before_footprints`], and the footprint tolerance where
    /// one is recorded. Jobs without one (written before the flag existed)
    /// keep their ids, so they are still resumed.
    fn id(&self) -> String {
        let base = self.id_before_footprints();
        match self.tiling.footprint_tolerance {
            None => base,
            Some(v) => IdHasher::new("rsembed.jobid.footprint.v1")
                .str(&base)
                .str(&v.to_bits().to_string())
                .hex128(),
        }
    }

    /// Every field in which `self` (the job asked for now) differs from
    /// `theirs` (the job at the output), named by its flag. Empty when the
    /// two are one job.
    pub fn differences(&self, theirs: &JobSpec) -> Vec<Difference> {
        let mut d = Vec::new();
        let mut diff = |what: &'static str, ours: String, t: String| {
            if ours != t {
                d.push(Difference {
                    what,
                    theirs: t,
                    ours,
                });
            }
        };
        let opt = |v: Option<String>| v.unwrap_or_else(|| "not given".into());
        diff("--input", self.input.clone(), theirs.input.clone());
        diff("--output", self.output.clone(), theirs.output.clone());
        let (a, b) = (&self.model, &theirs.model);
        diff("the model's name", a.name.clone(), b.name.clone());
        diff(
            "the model's embedding dimension",
            a.embed_dim.to_string(),
            b.embed_dim.to_string(),
        );
        diff("--fp16", a.fp16.to_string(), b.fp16.to_string());
        if a.fp16 == b.fp16 {
            diff(
                "the model's vision graph (sha256)",
                a.sha256.clone(),
                b.sha256.clone(),
            );
        }
        diff(
            "the model's preprocessor_config.json (sha256)",
            a.preprocessor_sha256.clone(),
            b.preprocessor_sha256.clone(),
        );
        let (a, b) = (&self.tiling, &theirs.tiling);
        diff(
            "--chip-size",
            a.chip_size.to_string(),
            b.chip_size.to_string(),
        );
        diff("--stride", a.stride.to_string(), b.stride.to_string());
        diff("--bands", join(&a.bands), join(&b.bands));
        diff("--scale", a.scale.clone(), b.scale.clone());
        diff(
            "--min-valid",
            opt(a.min_valid.map(|v| v.to_string())),
            opt(b.min_valid.map(|v| v.to_string())),
        );
        diff(
            "--band-files",
            opt(a.band_files.as_ref().map(|f| f.join(","))),
            opt(b.band_files.as_ref().map(|f| f.join(","))),
        );
        diff(
            "--assets",
            opt(a.assets.as_ref().map(|f| f.join(","))),
            opt(b.assets.as_ref().map(|f| f.join(","))),
        );
        diff(
            "--cloud-mask",
            opt(a.cloud_mask.clone()),
            opt(b.cloud_mask.clone()),
        );
        diff(
            "--max-cloud",
            opt(a.max_cloud.map(|v| v.to_string())),
            opt(b.max_cloud.map(|v| v.to_string())),
        );
        let tolerance = |v: Option<f64>| {
            v.map_or_else(
                || "not recorded (an older rsembed: 5e-8 degrees)".into(),
                |v| format!("{v} pixel"),
            )
        };
        diff(
            "--footprint-tolerance",
            tolerance(a.footprint_tolerance),
            tolerance(b.footprint_tolerance),
        );
        diff(
            "--embedding-type",
            a.embedding_type.to_string(),
            b.embedding_type.to_string(),
        );
        diff("--align", a.align.to_string(), b.align.to_string());
        diff(
            "--windows",
            opt(a.windows.as_ref().map(|w| w.duration.clone())),
            opt(b.windows.as_ref().map(|w| w.duration.clone())),
        );
        // Named only between two windowed jobs: without windows neither flag
        // means anything, and --windows names the difference.
        if let (Some(a), Some(b)) = (&a.windows, &b.windows) {
            diff(
                "--composite",
                a.composite.to_string(),
                b.composite.to_string(),
            );
            diff(
                "--max-scenes",
                a.max_scenes.to_string(),
                b.max_scenes.to_string(),
            );
        }
        diff(
            "the chip schema version",
            a.schema_version.to_string(),
            b.schema_version.to_string(),
        );
        let none = StacSearch::default();
        let (a, b) = (
            self.search.as_ref().unwrap_or(&none),
            theirs.search.as_ref().unwrap_or(&none),
        );
        let list = |v: &[String]| (!v.is_empty()).then(|| v.join(","));
        diff(
            "--collections",
            opt(list(&a.collections)),
            opt(list(&b.collections)),
        );
        let bbox = |v: Option<[f64; 4]>| v.map(|b| format!("{},{},{},{}", b[0], b[1], b[2], b[3]));
        diff("--bbox", opt(bbox(a.bbox)), opt(bbox(b.bbox)));
        diff(
            "--datetime",
            opt(a.datetime.clone()),
            opt(b.datetime.clone()),
        );
        diff("--ids", opt(list(&a.ids)), opt(list(&b.ids)));
        diff("--filter", opt(a.filter.clone()), opt(b.filter.clone()));
        diff(
            "--max-items",
            opt(a.max_items.map(|v| v.to_string())),
            opt(b.max_items.map(|v| v.to_string())),
        );
        diff(
            "--cloud-cover-max",
            opt(a.cloud_cover_max.map(|v| v.to_string())),
            opt(b.cloud_cover_max.map(|v| v.to_string())),
        );
        match (&self.grouping, &theirs.grouping) {
            (Some(a), Some(b)) => {
                diff(
                    "--task-files",
                    a.task_files.to_string(),
                    b.task_files.to_string(),
                );
                diff(
                    "--task-bytes",
                    a.task_bytes.to_string(),
                    b.task_bytes.to_string(),
                );
                diff(
                    "--task-chips",
                    a.task_chips.to_string(),
                    b.task_chips.to_string(),
                );
                diff(
                    "--shard-bytes",
                    a.shard_bytes.to_string(),
                    b.shard_bytes.to_string(),
                );
            }
            (a, b) => diff(
                "the task grouping",
                a.map_or("not recorded".into(), |_| "recorded".into()),
                b.map_or(
                    "not recorded (an older rsembed wrote this job)".into(),
                    |_| "recorded".into(),
                ),
            ),
        }
        let same_flags = d.is_empty();
        if same_flags && self.job_id != theirs.job_id {
            // Same flags, other id: an older spec format or another version's
            // hashing. Name it rather than refuse without a reason.
            d.push(Difference {
                what: "job.json's format",
                ours: self.format.to_string(),
                theirs: format!("{} (job id {})", theirs.format, theirs.job_id),
            });
        }
        d
    }
}

fn join(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiling() -> TilingSpec {
        TilingSpec {
            chip_size: 256,
            stride: 256,
            bands: vec![1, 2, 3],
            scale: "auto".into(),
            min_valid: None,
            band_files: None,
            assets: None,
            cloud_mask: None,
            max_cloud: None,
            footprint_tolerance: Some(DEFAULT_FOOTPRINT_TOLERANCE),
            embedding_type: EmbeddingType::F32,
            align: Align::Scene,
            windows: None,
            schema_version: crate::SCHEMA_VERSION,
        }
    }

    fn model() -> ModelRef {
        ModelRef {
            name: "m".into(),
            embed_dim: 8,
            sha256: "aa".into(),
            files: vec![],
            preprocessor_sha256: "bb".into(),
            fp16: false,
        }
    }

    fn quarters() -> WindowSpec {
        WindowSpec {
            duration: "P3M".into(),
            composite: crate::window::Composite::Best,
            max_scenes: 64,
            cell_blocks: true,
        }
    }

    fn grouping() -> GroupingSpec {
        GroupingSpec {
            task_files: 64,
            task_bytes: 1 << 30,
            task_chips: 64,
            shard_bytes: 16 << 20,
        }
    }

    fn spec() -> JobSpec {
        JobSpec::new(
            "file:///in/".into(),
            "file:///out/".into(),
            model(),
            tiling(),
            grouping(),
            "2026-01-01T00:00:00Z".into(),
        )
    }

    #[test]
    fn every_identity_field_changes_the_job_id_and_is_named() {
        let base = spec();
        assert!(base.differences(&base).is_empty());
        let rebuild = |f: &dyn Fn(
            &mut String,
            &mut String,
            &mut ModelRef,
            &mut TilingSpec,
            &mut GroupingSpec,
        )| {
            let (mut i, mut o, mut m, mut t, mut g) = (
                base.input.clone(),
                base.output.clone(),
                model(),
                tiling(),
                grouping(),
            );
            f(&mut i, &mut o, &mut m, &mut t, &mut g);
            JobSpec::new(i, o, m, t, g, base.created_at.clone())
        };
        let cases: Vec<(&str, JobSpec)> = vec![
            (
                "--input",
                rebuild(&|i, _, _, _, _| *i = "file:///other/".into()),
            ),
            (
                "--output",
                rebuild(&|_, o, _, _, _| *o = "file:///out2/".into()),
            ),
            (
                "the model's name",
                rebuild(&|_, _, m, _, _| m.name = "n".into()),
            ),
            (
                "--fp16",
                rebuild(&|_, _, m, _, _| {
                    m.fp16 = true;
                    m.sha256 = "cc".into();
                }),
            ),
            (
                "the model's vision graph (sha256)",
                rebuild(&|_, _, m, _, _| m.sha256 = "dd".into()),
            ),
            (
                "the model's preprocessor_config.json (sha256)",
                rebuild(&|_, _, m, _, _| m.preprocessor_sha256 = "ee".into()),
            ),
            ("--chip-size", rebuild(&|_, _, _, t, _| t.chip_size = 128)),
            ("--stride", rebuild(&|_, _, _, t, _| t.stride = 128)),
            ("--bands", rebuild(&|_, _, _, t, _| t.bands = vec![3, 2, 1])),
            (
                "--scale",
                rebuild(&|_, _, _, t, _| t.scale = "0:3000".into()),
            ),
            (
                "--min-valid",
                rebuild(&|_, _, _, t, _| t.min_valid = Some(0.5)),
            ),
            (
                "--band-files",
                rebuild(&|_, _, _, t, _| {
                    t.band_files = Some(vec!["B4".into(), "B3".into(), "B2".into()])
                }),
            ),
            ("--task-files", rebuild(&|_, _, _, _, g| g.task_files = 2)),
            ("--task-bytes", rebuild(&|_, _, _, _, g| g.task_bytes = 5)),
            ("--task-chips", rebuild(&|_, _, _, _, g| g.task_chips = 5)),
            ("--shard-bytes", rebuild(&|_, _, _, _, g| g.shard_bytes = 5)),
            (
                "--assets",
                rebuild(&|_, _, _, t, _| t.assets = Some(vec!["visual".into()])),
            ),
            (
                "--cloud-mask",
                rebuild(&|_, _, _, t, _| t.cloud_mask = Some("scl".into())),
            ),
            (
                "--max-cloud",
                rebuild(&|_, _, _, t, _| t.max_cloud = Some(0.2)),
            ),
            (
                "--footprint-tolerance",
                rebuild(&|_, _, _, t, _| t.footprint_tolerance = Some(0.1)),
            ),
            (
                "--footprint-tolerance",
                rebuild(&|_, _, _, t, _| t.footprint_tolerance = None),
            ),
            (
                "--embedding-type",
                rebuild(&|_, _, _, t, _| t.embedding_type = EmbeddingType::Int8),
            ),
            ("--align", rebuild(&|_, _, _, t, _| t.align = Align::Crs)),
            (
                "--windows",
                rebuild(&|_, _, _, t, _| t.windows = Some(quarters())),
            ),
            (
                "the chip schema version",
                rebuild(&|_, _, _, t, _| t.schema_version = 2),
            ),
        ];
        for (flag, other) in cases {
            assert_ne!(other.job_id, base.job_id, "{flag} must change the job id");
            let d = other.differences(&base);
            assert_eq!(
                d.iter().map(|d| d.what).collect::<Vec<_>>(),
                vec![flag],
                "{flag}: {d:?}"
            );
        }
    }

    #[test]
    fn every_search_field_changes_the_job_id_and_is_named() {
        let base = spec().with_search(Some(StacSearch::default()));
        assert_ne!(base.job_id, spec().job_id, "a STAC job is another job");
        assert!(base.differences(&base).is_empty());
        let with = |f: &dyn Fn(&mut StacSearch)| {
            let mut s = StacSearch::default();
            f(&mut s);
            spec().with_search(Some(s))
        };
        let cases: Vec<(&str, JobSpec)> = vec![
            ("--collections", with(&|s| s.collections = vec!["c".into()])),
            ("--bbox", with(&|s| s.bbox = Some([0.0, 0.0, 1.0, 1.0]))),
            (
                "--datetime",
                with(&|s| s.datetime = Some("2024-06-01T00:00:00Z".into())),
            ),
            ("--ids", with(&|s| s.ids = vec!["a".into()])),
            ("--filter", with(&|s| s.filter = Some("x = 1".into()))),
            ("--max-items", with(&|s| s.max_items = Some(3))),
            (
                "--cloud-cover-max",
                with(&|s| s.cloud_cover_max = Some(20.0)),
            ),
        ];
        for (flag, other) in cases {
            assert_ne!(other.job_id, base.job_id, "{flag} must change the job id");
            let d = other.differences(&base);
            assert_eq!(
                d.iter().map(|d| d.what).collect::<Vec<_>>(),
                vec![flag],
                "{flag}: {d:?}"
            );
        }
    }

    #[test]
    fn where_the_cloud_cover_filter_ran_is_recorded_but_not_identity() {
        let search = StacSearch {
            cloud_cover_max: Some(30.0),
            ..StacSearch::default()
        };
        let base = spec().with_search(Some(search.clone()));
        let json = serde_json::to_value(&base).unwrap();
        assert!(json["search"].get("cloud_cover_by").is_none(), "{json}");
        let client = spec().with_search(Some(StacSearch {
            cloud_cover_by: Some(CloudCoverBy::Client),
            ..search
        }));
        assert_eq!(client.job_id, base.job_id);
        assert!(client.differences(&base).is_empty());
        let json = serde_json::to_value(&client).unwrap();
        assert_eq!(json["search"]["cloud_cover_by"], "client");
        let back: JobSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back, client);
    }

    #[test]
    fn a_format_1_spec_is_another_job_with_a_reason() {
        let base = spec();
        let mut old = base.clone();
        old.format = 1;
        old.grouping = None;
        old.job_id = "0".repeat(32);
        let d = base.differences(&old);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].what, "the task grouping");
        assert!(d[0].to_string().contains("older rsembed"), "{}", d[0]);
    }

    #[test]
    fn f32_jobs_keep_their_ids_and_other_types_are_recorded() {
        let base = spec();
        // An f32 spec is written as before: no field, so an older job.json
        // reads back as f32 and keeps its id.
        let json = serde_json::to_value(&base).unwrap();
        assert!(json["tiling"].get("embedding_type").is_none());
        let back: JobSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back.job_id, base.job_id);
        assert_eq!(back.id(), base.job_id);
        let mut t = tiling();
        t.embedding_type = EmbeddingType::F16;
        // The chips are the same chips: chip ids do not change.
        assert_eq!(t.fingerprint(), tiling().fingerprint());
        let f16 = JobSpec::new(
            base.input.clone(),
            base.output.clone(),
            model(),
            t,
            grouping(),
            base.created_at.clone(),
        );
        let json = serde_json::to_value(&f16).unwrap();
        assert_eq!(json["tiling"]["embedding_type"], "f16");
        let back: JobSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back.tiling.embedding_type, EmbeddingType::F16);
        assert_eq!(back.id(), f16.job_id);
        assert_ne!(f16.job_id, base.job_id);
    }

    #[test]
    fn tiling_fingerprint_ignores_min_valid_and_footprint_tolerance() {
        let a = tiling();
        let mut b = tiling();
        b.min_valid = Some(0.5);
        assert_eq!(a.fingerprint(), b.fingerprint());
        b.footprint_tolerance = None;
        assert_eq!(a.fingerprint(), b.fingerprint());
        b.footprint_tolerance = Some(0.5);
        assert_eq!(a.fingerprint(), b.fingerprint());
        b.stride = 128;
        assert_ne!(a.fingerprint(), b.fingerprint());
    }
}

#[cfg(test)]
#[path = "job_schema_tests.rs"]
mod schema_tests;

#[cfg(test)]
mod footprint_tests {
    use super::*;

    /// `job.json` of a job written before `--footprint-tolerance` existed
    /// (rsembed 0.1, format 2, a plain GeoTIFF input): its id must not move.
    const OLD_JOB: &str = r#"{"format":2,"job_id":"","fingerprint":"","input":"file:///in/",
        "output":"file:///out/","model":{"name":"m","embed_dim":8,"sha256":"aa","files":[],
        "preprocessor_sha256":"bb","fp16":false},"tiling":{"chip_size":256,"stride":256,
        "bands":[1,2,3],"scale":"auto","min_valid":null},"grouping":{"task_files":64,
        "task_bytes":1073741824,"task_chips":64,"shard_bytes":16777216},
        "created_at":"2026-01-01T00:00:00Z","software_version":"rsembed 0.1.0"}"#;

    fn old_job() -> JobSpec {
        let mut old: JobSpec = serde_json::from_str(OLD_JOB).unwrap();
        old.fingerprint = JobSpec::fingerprint_of(&old.model, &old.tiling);
        old.job_id = JobSpec::job_id_of(
            &old.fingerprint,
            None,
            &old.input,
            &old.output,
            &old.grouping.unwrap(),
        );
        old
    }

    fn asked(tolerance: Option<f64>) -> JobSpec {
        let old = old_job();
        let mut tiling = old.tiling.clone();
        tiling.footprint_tolerance = tolerance;
        JobSpec::new(
            old.input.clone(),
            old.output.clone(),
            old.model.clone(),
            tiling,
            old.grouping.unwrap(),
            "2026-02-01T00:00:00Z".into(),
        )
    }

    #[test]
    fn an_old_job_has_no_tolerance_and_keeps_its_id() {
        let old = old_job();
        assert_eq!(old.tiling.footprint_tolerance, None);
        assert_eq!(asked(None).job_id, old.job_id);
        let json = serde_json::to_string(&old).unwrap();
        assert!(!json.contains("footprint_tolerance"), "{json}");
        let new = serde_json::to_string(&asked(Some(0.01))).unwrap();
        assert!(new.contains(r#""footprint_tolerance":0.01"#), "{new}");
    }

    #[test]
    fn the_default_resumes_an_old_job_with_its_footprints() {
        let old = old_job();
        let resumed = asked(Some(DEFAULT_FOOTPRINT_TOLERANCE)).resuming_old_footprints(Some(&old));
        assert_eq!(resumed.job_id, old.job_id);
        assert_eq!(resumed.tiling.footprint_tolerance, None);
        // Another job at the output: the new default stays.
        let mut other = old.clone();
        other.input = "file:///elsewhere/".into();
        other.job_id = "0".repeat(32);
        let fresh = asked(Some(DEFAULT_FOOTPRINT_TOLERANCE)).resuming_old_footprints(Some(&other));
        assert_eq!(
            fresh.tiling.footprint_tolerance,
            Some(DEFAULT_FOOTPRINT_TOLERANCE)
        );
        // A new job at the output: no change either.
        let new = asked(Some(0.5));
        let again = asked(Some(DEFAULT_FOOTPRINT_TOLERANCE)).resuming_old_footprints(Some(&new));
        assert_eq!(
            again.tiling.footprint_tolerance,
            Some(DEFAULT_FOOTPRINT_TOLERANCE)
        );
        let d = again.differences(&new);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(
            d[0].to_string(),
            "--footprint-tolerance: 0.01 pixel in this command, 0.5 pixel in the job at the output"
        );
    }

    #[test]
    fn a_given_tolerance_does_not_resume_an_old_job() {
        let old = old_job();
        let d = asked(Some(0.01)).differences(&old);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].what, "--footprint-tolerance");
        assert!(
            d[0].to_string().contains("older rsembed: 5e-8 degrees"),
            "{}",
            d[0]
        );
    }

    #[test]
    fn the_flag_is_checked() {
        assert_eq!(check_footprint_tolerance(0.01), Ok(0.01));
        assert_eq!(check_footprint_tolerance(1.0), Ok(1.0));
        for bad in [0.0, -0.1, 1.5, f64::NAN, f64::INFINITY] {
            let e = check_footprint_tolerance(bad).unwrap_err();
            assert!(e.starts_with("--footprint-tolerance"), "{e}");
        }
    }
}
