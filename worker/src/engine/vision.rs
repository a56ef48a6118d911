//! The vision graph as a [`Backend`].

use std::path::PathBuf;

use ort::session::Session;
use ort::value::TensorRef;

use crate::engine::session::{open_graph, static_last_dim, SessionConfig};
use crate::engine::{l2_normalize_rows, Backend, Embeddings, PixelBatch, RunHints};
use crate::error::{Error, Result};
use crate::model::ModelDir;

/// ONNX Runtime running `vision_model.onnx` (or its fp16 variant).
pub struct OrtVision {
    session: Session,
    file: PathBuf,
    input: String,
    output: String,
    embed_dim: usize,
    height: usize,
    width: usize,
}

impl OrtVision {
    /// Opens the vision graph and proves, with one probe run, that it produces
    /// `embed_dim` floats per image for the preprocessor's input size.
    pub fn open(model: &ModelDir, fp16: bool, cfg: &SessionConfig) -> Result<OrtVision> {
        let g = model.vision_graph(fp16)?;
        let file = model.path(&g.file);
        let session = open_graph(cfg, &file, &g.input, &g.output)?;
        let embed_dim = model.manifest.embed_dim;
        if let Some(d) = static_last_dim(&session, &g.output) {
            if d != embed_dim as i64 {
                return Err(wrong_dim(&file, &g.output, d as usize, embed_dim));
            }
        }
        let mut v = OrtVision {
            session,
            file,
            input: g.input.clone(),
            output: g.output.clone(),
            embed_dim,
            height: model.preprocessor.size.height as usize,
            width: model.preprocessor.size.width as usize,
        };
        let probe = PixelBatch {
            n: 1,
            channels: 3,
            height: v.height,
            width: v.width,
            data: vec![0.0; 3 * v.height * v.width],
        };
        v.embed(&probe)?;
        Ok(v)
    }

    /// The embedding dimension.
    pub fn embed_dim(&self) -> usize {
        self.embed_dim
    }
}

fn wrong_dim(file: &std::path::Path, output: &str, got: usize, want: usize) -> Error {
    Error::ModelInvalid {
        path: file.to_owned(),
        reason: format!(
            "output tensor `{output}` has dimension {got} but rsembed-model.json says embed_dim {want}"
        ),
    }
}

impl Backend for OrtVision {
    fn run(&mut self, batch: &PixelBatch, _hints: RunHints) -> Result<Embeddings> {
        let shape = [
            batch.n as i64,
            batch.channels as i64,
            batch.height as i64,
            batch.width as i64,
        ];
        let input = TensorRef::from_array_view((shape, batch.data.as_slice()))
            .map_err(|e| Error::ort("vision input tensor", e))?;
        let outputs = self
            .session
            .run(ort::inputs![self.input.as_str() => input])
            .map_err(|e| Error::ort(format!("vision run of {} images", batch.n), e))?;
        let out = &outputs[self.output.as_str()];
        let (shape, data) = out
            .try_extract_tensor::<f32>()
            .map_err(|e| Error::ort("vision output", e))?;
        let dims: &[i64] = shape;
        if dims.len() != 2 || dims[0] != batch.n as i64 {
            return Err(Error::ModelInvalid {
                path: self.file.clone(),
                reason: format!(
                    "output tensor `{}` has shape {dims:?}, expected [{}, {}]",
                    self.output, batch.n, self.embed_dim
                ),
            });
        }
        if dims[1] != self.embed_dim as i64 {
            return Err(wrong_dim(
                &self.file,
                &self.output,
                dims[1] as usize,
                self.embed_dim,
            ));
        }
        let mut data = data.to_vec();
        l2_normalize_rows(&mut data, self.embed_dim);
        Ok(Embeddings {
            n: batch.n,
            dim: self.embed_dim,
            data,
        })
    }
}
