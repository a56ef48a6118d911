//! `rsembed text`: text embeddings, one JSON array per line.

use std::io::Write;

use rsembed_worker::engine::text::TextEncoder;
use rsembed_worker::model::ModelDir;

use crate::cli::TextArgs;
use crate::error::Result;

/// Embeds each text and writes one JSON array per line to `out`.
pub fn run(args: &TextArgs, out: &mut dyn Write) -> Result<()> {
    let model = ModelDir::open(&args.model)?;
    let cfg = args.engine.session_config();
    let mut enc = TextEncoder::open(&model, &cfg)?;
    // Batches bound memory for long lists while keeping one run per batch.
    for chunk in args.texts.chunks(64) {
        for row in enc.embed(chunk)? {
            serde_json::to_writer(&mut *out, &row)?;
            writeln!(out).map_err(rsembed_worker::Error::Io)?;
        }
    }
    Ok(())
}
