//! File key-value metadata: GeoParquet `geo` and `rsembed`.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::embedding::{EmbeddingType, Quantization};
use crate::job::{ModelRef, TilingSpec};

/// Key of the GeoParquet metadata entry.
pub const GEO_KEY: &str = "geo";
/// Key of the rsembed metadata entry.
pub const RSEMBED_KEY: &str = "rsembed";

/// The GeoParquet 1.1 `geo` metadata of a chip file.
///
/// `bbox` is the file's extent in lon/lat, or `None` when no chip has a footprint.
/// No `crs` key is written: GeoParquet's default is OGC:CRS84, which is what
/// the footprints are in.
pub fn geo_metadata(bbox: Option<[f64; 4]>) -> Value {
    let mut col = json!({
        "encoding": "WKB",
        "geometry_types": ["Polygon"],
        "covering": {
            "bbox": {
                "xmin": ["bbox", "xmin"],
                "ymin": ["bbox", "ymin"],
                "xmax": ["bbox", "xmax"],
                "ymax": ["bbox", "ymax"],
            }
        }
    });
    if let Some(b) = bbox {
        col["bbox"] = json!(b);
    }
    json!({
        "version": "1.1.0",
        "primary_column": "geometry",
        "columns": { "geometry": col },
    })
}

/// The `rsembed` metadata of a chip or error file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileMeta {
    /// Chip schema version.
    pub schema_version: u32,
    /// The job.
    pub job_id: String,
    /// The job fingerprint ([`crate::job::JobSpec::fingerprint_of`]): files
    /// with equal fingerprints hold comparable rows (same model, tiling and
    /// schema), whatever job wrote them. Empty in files written before it was
    /// recorded.
    #[serde(default)]
    pub job_fingerprint: String,
    /// The task this file is the output of.
    pub task_id: String,
    /// Model name.
    pub model_name: String,
    /// SHA-256 of the vision graph.
    pub model_sha256: String,
    /// Embedding dimension.
    pub embed_dim: usize,
    /// Tiling parameters.
    pub tiling: TilingSpec,
    /// Software that wrote the file.
    pub software_version: String,
    /// How `embedding` stores the vectors and how to get float32 back; absent
    /// for float32 (and in files written before other types existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<Quantization>,
}

impl FileMeta {
    /// The metadata of every file of job `job_id` run with `model` (the task id
    /// is filled in per file), in the job's chip schema version
    /// ([`TilingSpec::schema_version`]).
    pub fn of_job(job_id: &str, model: &ModelRef, tiling: &TilingSpec) -> FileMeta {
        FileMeta {
            schema_version: tiling.schema_version,
            job_id: job_id.to_owned(),
            job_fingerprint: crate::job::JobSpec::fingerprint_of(model, tiling),
            task_id: String::new(),
            model_name: model.name.clone(),
            model_sha256: model.sha256.clone(),
            embed_dim: model.embed_dim,
            tiling: tiling.clone(),
            software_version: crate::SOFTWARE_VERSION.to_owned(),
            quantization: tiling.embedding_type.quantization(),
        }
    }

    /// The stored type of the embeddings of a file with this metadata.
    pub fn embedding_type(&self) -> EmbeddingType {
        self.tiling.embedding_type
    }

    /// This metadata for a file whose embeddings are stored as `ty` (a
    /// compaction that converts them).
    pub fn with_embedding_type(mut self, ty: EmbeddingType) -> FileMeta {
        self.tiling.embedding_type = ty;
        self.quantization = ty.quantization();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geo_metadata_is_geoparquet_1_1() {
        let g = geo_metadata(Some([-1.0, -2.0, 3.0, 4.0]));
        assert_eq!(g["version"], "1.1.0");
        assert_eq!(g["primary_column"], "geometry");
        assert_eq!(g["columns"]["geometry"]["encoding"], "WKB");
        assert_eq!(g["columns"]["geometry"]["bbox"][2], 3.0);
        assert_eq!(
            g["columns"]["geometry"]["covering"]["bbox"]["xmin"],
            json!(["bbox", "xmin"])
        );
        assert!(geo_metadata(None)["columns"]["geometry"]
            .get("bbox")
            .is_none());
    }
}
