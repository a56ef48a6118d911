//! Text embeddings: `tokenizer.json` plus the text graph.

use std::path::PathBuf;

use ort::session::Session;
use ort::value::TensorRef;
use tokenizers::Tokenizer;

use crate::engine::l2_normalize_rows;
use crate::engine::session::{finish_profile, open_graph, SessionConfig};
use crate::error::{Error, Result};
use crate::model::ModelDir;

/// Tokenizes captions and runs the text graph.
pub struct TextEncoder {
    tokenizer: Tokenizer,
    session: Session,
    file: PathBuf,
    input: String,
    output: String,
    max_length: usize,
    embed_dim: usize,
    profile: Option<PathBuf>,
}

impl Drop for TextEncoder {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            finish_profile(&mut self.session, p);
        }
    }
}

impl TextEncoder {
    /// Opens the tokenizer and the text graph of a model directory.
    pub fn open(model: &ModelDir, cfg: &SessionConfig) -> Result<TextEncoder> {
        let tpath = model.tokenizer_path()?;
        let tokenizer = Tokenizer::from_file(&tpath).map_err(|e| Error::ModelInvalid {
            path: tpath.clone(),
            reason: format!("not a Hugging Face tokenizers file: {e}"),
        })?;
        let g = &model.manifest.text;
        let file = model.graph_path(g)?;
        let session = open_graph(cfg, &file, &g.input, &g.output)?;
        Ok(TextEncoder {
            tokenizer,
            session,
            file,
            input: g.input.clone(),
            output: g.output.clone(),
            max_length: g
                .max_length
                .expect("max_length was checked when the model opened"),
            embed_dim: model.manifest.embed_dim,
            profile: cfg.ort_profile.clone(),
        })
    }

    /// Token ids of one text: exactly `max_length` ids, padded and truncated as
    /// `tokenizer.json` says.
    pub fn token_ids(&self, text: &str) -> Result<Vec<i64>> {
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        let ids: Vec<i64> = enc.get_ids().iter().map(|i| i64::from(*i)).collect();
        if ids.len() != self.max_length {
            return Err(Error::Tokenizer(format!(
                "tokenizer.json produced {} ids but the text graph takes {}; it must pad and truncate to max_length",
                ids.len(),
                self.max_length
            )));
        }
        Ok(ids)
    }

    /// L2-normalized embeddings, one row per text.
    pub fn embed(&mut self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(vec![]);
        }
        let mut ids = Vec::with_capacity(texts.len() * self.max_length);
        for t in texts {
            ids.extend(self.token_ids(t)?);
        }
        let shape = [texts.len() as i64, self.max_length as i64];
        let input = TensorRef::from_array_view((shape, ids.as_slice()))
            .map_err(|e| Error::ort("text input tensor", e))?;
        let outputs = self
            .session
            .run(ort::inputs![self.input.as_str() => input])
            .map_err(|e| Error::ort("text run", e))?;
        let (shape, data) = outputs[self.output.as_str()]
            .try_extract_tensor::<f32>()
            .map_err(|e| Error::ort("text output", e))?;
        let dims: &[i64] = shape;
        if dims != [texts.len() as i64, self.embed_dim as i64] {
            return Err(Error::ModelInvalid {
                path: self.file.clone(),
                reason: format!(
                    "output tensor `{}` has shape {dims:?}, expected [{}, {}] (embed_dim)",
                    self.output,
                    texts.len(),
                    self.embed_dim
                ),
            });
        }
        let mut data = data.to_vec();
        l2_normalize_rows(&mut data, self.embed_dim);
        Ok(data
            .chunks_exact(self.embed_dim)
            .map(<[f32]>::to_vec)
            .collect())
    }
}
