//! `rsembed text`: text embeddings, one JSON array per line; and the text
//! embedding that `search` and `classify` share.

use std::io::Write;

use rsembed_worker::engine::text::TextEncoder;
use rsembed_worker::model::ModelDir;

use crate::cli::{TextArgs, TextEngineArgs};
use crate::error::Result;

/// Texts embedded per run of the text graph: batches bound memory for long
/// lists while keeping one run per batch.
const TEXT_BATCH: usize = 64;

/// Unit embeddings of `texts`, in order, with the given inference flags.
pub(crate) fn embed(
    model: &ModelDir,
    engine: &TextEngineArgs,
    texts: &[String],
) -> Result<Vec<Vec<f32>>> {
    embed_with(&mut encoder(model, engine)?, texts)
}

/// The model's text graph, opened once for many calls of [`embed_with`]
/// (`search --queries -` embeds line after line).
pub(crate) fn encoder(model: &ModelDir, engine: &TextEngineArgs) -> Result<TextEncoder> {
    Ok(TextEncoder::open(model, &engine.session_config())?)
}

/// Embeds `texts` with an open text graph, a batch at a time.
pub(crate) fn embed_with(enc: &mut TextEncoder, texts: &[String]) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(TEXT_BATCH) {
        out.extend(enc.embed(chunk)?);
    }
    Ok(out)
}

/// Embeds each text and writes one JSON array per line to `out`.
pub fn run(args: &TextArgs, out: &mut dyn Write) -> Result<()> {
    let model = ModelDir::open(&args.model)?;
    for row in embed(&model, &args.engine, &args.texts)? {
        serde_json::to_writer(&mut *out, &row)?;
        writeln!(out).map_err(rsembed_worker::Error::Io)?;
    }
    Ok(())
}
