//! `rsembed text`: text embeddings, one JSON array per line; and the model
//! that the query crate's `search` and `classify` embed their texts with,
//! over the worker's text graph on ONNX Runtime.

use std::io::Write;

use rsembed_query::text::{TextEncoder, TextModel};
use rsembed_query::BoxError;
use rsembed_schemas::model::ModelManifest;
use rsembed_worker::engine::session::SessionConfig;
use rsembed_worker::engine::text::TextEncoder as OrtTextEncoder;
use rsembed_worker::model::ModelDir;

use crate::cli::{TextArgs, TextEngineArgs};
use crate::error::Result;

/// A model directory whose text graph runs on ONNX Runtime as
/// [`TextEngineArgs`] say.
pub struct OrtText {
    model: ModelDir,
    session: SessionConfig,
}

impl OrtText {
    /// Opens the model directory at `dir` (its manifest and configs; the
    /// graph opens with [`TextModel::encoder`]).
    pub fn open(dir: &std::path::Path, engine: &TextEngineArgs) -> Result<OrtText> {
        Ok(OrtText {
            model: ModelDir::open(dir)?,
            session: engine.session_config(),
        })
    }

    /// The model directory.
    pub fn dir(&self) -> &ModelDir {
        &self.model
    }
}

struct OrtEncoder(OrtTextEncoder);

impl TextEncoder for OrtEncoder {
    fn embed(&mut self, texts: &[String]) -> std::result::Result<Vec<Vec<f32>>, BoxError> {
        Ok(self.0.embed(texts)?)
    }
}

impl TextModel for OrtText {
    fn manifest(&self) -> &ModelManifest {
        &self.model.manifest
    }

    fn encoder(&self) -> std::result::Result<Box<dyn TextEncoder>, BoxError> {
        Ok(Box::new(OrtEncoder(OrtTextEncoder::open(
            &self.model,
            &self.session,
        )?)))
    }
}

/// Embeds each text and writes one JSON array per line to `out`.
pub fn run(args: &TextArgs, out: &mut dyn Write) -> Result<()> {
    let model = OrtText::open(&args.model, &args.engine)?;
    for row in rsembed_query::text::embed(&model, &args.texts)? {
        serde_json::to_writer(&mut *out, &row)?;
        writeln!(out).map_err(rsembed_worker::Error::Io)?;
    }
    Ok(())
}
