//! The job spec (`job.json`) and the manifest (`manifest.json`).

use serde::{Deserialize, Serialize};

use crate::ids::IdHasher;

/// File name of the job spec at the output root.
pub const JOB_FILE: &str = "job.json";
/// File name of the manifest at the output root.
pub const MANIFEST_FILE: &str = "manifest.json";

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
}

impl TilingSpec {
    /// The tiling fingerprint that goes into every `chip_id`.
    ///
    /// `min_valid` is left out: it decides which chips are kept, not what a chip is.
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

/// `job.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Spec format; only 1 exists.
    pub format: u32,
    /// 32 hex chars, from the fingerprint and the input URL.
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
    /// RFC 3339 time the job was first created; kept on resume.
    pub created_at: String,
    /// Software that created the job.
    pub software_version: String,
}

impl JobSpec {
    /// The job fingerprint for a model and tiling.
    pub fn fingerprint_of(model: &ModelRef, tiling: &TilingSpec) -> String {
        IdHasher::new("rsembed.job.v1")
            .str(&model.fingerprint())
            .str(&tiling.fingerprint())
            .i64(crate::SCHEMA_VERSION.into())
            .hex128()
    }

    /// The job id for a fingerprint and input URL.
    pub fn job_id_of(fingerprint: &str, input: &str) -> String {
        IdHasher::new("rsembed.jobid.v1")
            .str(fingerprint)
            .str(input)
            .hex128()
    }
}

/// One data file listed in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// Path relative to the output root.
    pub path: String,
    /// Rows in the file.
    pub rows: u64,
    /// Hex SHA-256 of the file.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
}

/// An input recorded as failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFailure {
    /// The input.
    pub source_uri: String,
    /// Stage that failed.
    pub stage: String,
    /// Reason.
    pub error: String,
}

/// A task given up on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFailedTask {
    /// The task.
    pub task_id: String,
    /// Its inputs' URIs.
    pub inputs: Vec<String>,
    /// The last error a worker reported.
    pub error: String,
    /// Deliveries before it was given up.
    pub deliveries: u64,
}

/// `manifest.json`: written last, only when every task of the plan is done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Manifest format; only 1 exists.
    pub format: u32,
    /// The job.
    pub job_id: String,
    /// The job fingerprint.
    pub fingerprint: String,
    /// Tasks in the plan; each has a chip file.
    pub tasks: u64,
    /// Chip rows over all files.
    pub rows: u64,
    /// Inputs recorded in `errors/`.
    pub failed_inputs: u64,
    /// Chip files.
    pub files: Vec<ManifestFile>,
    /// Error files.
    pub error_files: Vec<ManifestFile>,
    /// The failed inputs, up to a bound; `failed_inputs` has the full count.
    pub failures: Vec<ManifestFailure>,
    /// Tasks given up on (distributed mode: dead-lettered), with their last
    /// error. A manifest is written with failed tasks only by `finalize
    /// --allow-failed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_tasks: Vec<ManifestFailedTask>,
    /// RFC 3339 time the manifest was written.
    pub finalized_at: String,
    /// Software that wrote it.
    pub software_version: String,
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
        }
    }

    #[test]
    fn tiling_fingerprint_ignores_min_valid() {
        let a = tiling();
        let mut b = tiling();
        b.min_valid = Some(0.5);
        assert_eq!(a.fingerprint(), b.fingerprint());
        b.stride = 128;
        assert_ne!(a.fingerprint(), b.fingerprint());
    }
}
