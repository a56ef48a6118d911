//! Text queries: what the query side needs of a model, as traits. The
//! coordinator implements them over ONNX Runtime (the worker's text graph),
//! so this crate runs no inference and links no runtime.

use rsembed_schemas::model::ModelManifest;

use crate::{BoxError, Error, Result};

/// Texts embedded per run of the text graph: batches bound memory for long
/// lists while keeping one run per batch.
const TEXT_BATCH: usize = 64;

/// An open text graph.
pub trait TextEncoder: Send {
    /// The unit embeddings of `texts`, in order (one run of the graph).
    fn embed(&mut self, texts: &[String]) -> Result<Vec<Vec<f32>>, BoxError>;
}

/// The model a query's texts are embedded with: its manifest (name,
/// dimension, logit scale and bias) and its text graph.
pub trait TextModel: Send + Sync {
    /// `rsembed-model.json`.
    fn manifest(&self) -> &ModelManifest;
    /// Opens the text graph, once for many calls of [`embed_with`].
    fn encoder(&self) -> Result<Box<dyn TextEncoder>, BoxError>;
}

/// Unit embeddings of `texts`, in order.
pub fn embed(model: &dyn TextModel, texts: &[String]) -> Result<Vec<Vec<f32>>> {
    let mut enc = model.encoder().map_err(Error::Text)?;
    embed_with(enc.as_mut(), texts)
}

/// Embeds `texts` with an open text graph, a batch at a time.
pub fn embed_with(enc: &mut dyn TextEncoder, texts: &[String]) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(TEXT_BATCH) {
        out.extend(enc.embed(chunk).map_err(Error::Text)?);
    }
    Ok(out)
}
