//! `rsembed-model.json` and `preprocessor_config.json`: the model directory contract.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// File name of the model manifest inside a model directory.
pub const MODEL_MANIFEST: &str = "rsembed-model.json";
/// File name of the Hugging Face image processor config.
pub const PREPROCESSOR_CONFIG: &str = "preprocessor_config.json";
/// File name of the Hugging Face tokenizer.
pub const TOKENIZER: &str = "tokenizer.json";

/// One ONNX graph of the model and the names of its tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphSpec {
    /// Graph file, relative to the model directory.
    pub file: String,
    /// Name of the input tensor.
    pub input: String,
    /// Name of the output tensor.
    pub output: String,
    /// Token sequence length (text graph only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<usize>,
}

/// `rsembed-model.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelManifest {
    /// Manifest format; only 1 exists.
    pub format: u32,
    /// Model name, e.g. `Git-RSCLIP`.
    pub name: String,
    /// Embedding dimension D.
    pub embed_dim: usize,
    /// Vision graph: `pixel_values` `[N,3,H,W]` to `[N,D]`.
    pub vision: GraphSpec,
    /// Text graph: `input_ids` `[N,L]` to `[N,D]`.
    pub text: GraphSpec,
    /// Optional float16 vision graph with float32 inputs and outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision_fp16: Option<GraphSpec>,
    /// Optional uint8 entry of `vision`: takes the resized 8-bit image, NHWC,
    /// and rescales and normalizes it in the graph (`tools/uint8_entry.py`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision_u8: Option<U8GraphSpec>,
    /// Optional uint8 entry of `vision_fp16`, made the same way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision_fp16_u8: Option<U8GraphSpec>,
    /// The raw learned logit scale; scores use `exp(logit_scale)`.
    pub logit_scale: f64,
    /// The learned logit bias.
    pub logit_bias: f64,
    /// Digests of the directory's other files, keyed by their `/`-separated
    /// path relative to the directory, as the exporter wrote them.
    /// `fetch-model` checks every file it copies against this record.
    /// Optional: directories made before it existed have none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, FileRecord>,
}

/// A uint8 entry of a vision graph: input uint8 `[N,H,W,3]`, the graph it
/// wraps after the preprocessor's rescaling and normalisation, the same
/// output. Its weights are the wrapped graph's own bytes (ONNX external data),
/// so it is only valid beside the very file it was made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct U8GraphSpec {
    /// Graph file, relative to the model directory.
    pub file: String,
    /// Name of the uint8 input tensor.
    pub input: String,
    /// Name of the output tensor.
    pub output: String,
    /// SHA-256 of the float graph it wraps, when it was made.
    pub wraps_sha256: String,
    /// SHA-256 of `preprocessor_config.json`, whose rescaling and
    /// normalisation it carries, when it was made.
    pub preprocessor_sha256: String,
}

/// What `rsembed-model.json` records about one file of the model directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Lower-case hex SHA-256 of the file's bytes.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
}

/// Target size of the image processor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Size {
    /// Height in pixels.
    pub height: u32,
    /// Width in pixels.
    pub width: u32,
}

/// The fields of a Hugging Face `SiglipImageProcessor` config that rsembed honours.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreprocessorConfig {
    /// Resize to `size` before anything else.
    #[serde(default = "yes")]
    pub do_resize: bool,
    /// Model input size.
    pub size: Size,
    /// PIL resampling code: 2 bilinear, 3 bicubic (SigLIP's default).
    #[serde(default = "bicubic")]
    pub resample: u32,
    /// Multiply by `rescale_factor`.
    #[serde(default = "yes")]
    pub do_rescale: bool,
    /// Usually 1/255.
    #[serde(default = "one_over_255")]
    pub rescale_factor: f64,
    /// Subtract `image_mean` and divide by `image_std`.
    #[serde(default = "yes")]
    pub do_normalize: bool,
    /// Per-channel mean (SigLIP: 0.5).
    #[serde(default = "half3")]
    pub image_mean: Vec<f64>,
    /// Per-channel standard deviation (SigLIP: 0.5).
    #[serde(default = "half3")]
    pub image_std: Vec<f64>,
}

fn yes() -> bool {
    true
}
fn bicubic() -> u32 {
    3
}
fn one_over_255() -> f64 {
    1.0 / 255.0
}
fn half3() -> Vec<f64> {
    vec![0.5; 3]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_design_example() {
        let m: ModelManifest = serde_json::from_str(
            r#"{"format": 1, "name": "x", "embed_dim": 4,
                "vision": {"file": "vision_model.onnx", "input": "pixel_values", "output": "image_embeds"},
                "text": {"file": "text_model.onnx", "input": "input_ids", "output": "text_embeds", "max_length": 64},
                "logit_scale": 4.6, "logit_bias": -10.0}"#,
        )
        .unwrap();
        assert_eq!(m.text.max_length, Some(64));
        assert!(m.vision_fp16.is_none());
        assert!(m.vision_u8.is_none() && m.vision_fp16_u8.is_none());
        assert!(m.files.is_empty(), "older manifests record no digests");
    }

    #[test]
    fn parses_recorded_digests() {
        let m: ModelManifest = serde_json::from_str(
            r#"{"format": 1, "name": "x", "embed_dim": 4,
                "vision": {"file": "vision_model.onnx", "input": "pixel_values", "output": "image_embeds"},
                "text": {"file": "text_model.onnx", "input": "input_ids", "output": "text_embeds", "max_length": 64},
                "logit_scale": 4.6, "logit_bias": -10.0,
                "files": {"vision_model.onnx": {"sha256": "ab", "bytes": 3}}}"#,
        )
        .unwrap();
        assert_eq!(m.files["vision_model.onnx"].bytes, 3);
    }

    #[test]
    fn preprocessor_defaults_are_siglip() {
        let p: PreprocessorConfig =
            serde_json::from_str(r#"{"size": {"height": 256, "width": 256}}"#).unwrap();
        assert_eq!(p.resample, 3);
        assert_eq!(p.image_mean, vec![0.5; 3]);
    }
}
