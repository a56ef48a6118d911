//! The vision graph as a [`Backend`].

use std::path::PathBuf;

use ort::session::{RunOptions, Session};
use ort::value::TensorRef;

use crate::engine::nvml::Nvml;
use crate::engine::session::{
    finish_profile, open_graph, static_last_dim, ArenaShrink, Device, SessionConfig,
};
use crate::engine::{l2_normalize_rows, Backend, DeviceMemory, Embeddings, PixelBatch, RunHints};
use crate::error::{Error, Result};
use crate::model::ModelDir;

/// The ONNX Runtime config key that returns an arena's free chunks to the
/// device at the end of a run. A run option: as a session option ORT ignores it.
pub const ARENA_SHRINK_KEY: &str = "memory.enable_memory_arena_shrinkage";

/// ONNX Runtime running `vision_model.onnx` (or its fp16 variant).
pub struct OrtVision {
    session: Session,
    /// Options of an ordinary run.
    plain: RunOptions,
    /// Options of a run that shrinks the arena; `None` under [`ArenaShrink::Never`].
    /// ORT cannot remove a run config entry, so the two are kept side by side.
    shrink: Option<RunOptions>,
    arena_shrink: ArenaShrink,
    device: Device,
    nvml: Option<Nvml>,
    profile: Option<PathBuf>,
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
        let file = model.graph_path(g)?;
        let session = open_graph(cfg, &file, &g.input, &g.output)?;
        let embed_dim = model.manifest.embed_dim;
        if let Some(d) = static_last_dim(&session, &g.output) {
            if d != embed_dim as i64 {
                return Err(wrong_dim(&file, &g.output, d as usize, embed_dim));
            }
        }
        let shrink = match cfg.arena_shrink {
            ArenaShrink::Never => None,
            ArenaShrink::OnChange | ArenaShrink::Always => {
                let mut o = RunOptions::new().map_err(|e| Error::ort("run options", e))?;
                o.set(ARENA_SHRINK_KEY, cfg.shrink_target())
                    .map_err(|e| Error::ort(format!("run option {ARENA_SHRINK_KEY}"), e))?;
                Some(o)
            }
        };
        let nvml = match cfg.device {
            Device::Cuda(_) => Nvml::load(),
            Device::Cpu => None,
        };
        let mut v = OrtVision {
            session,
            plain: RunOptions::new().map_err(|e| Error::ort("run options", e))?,
            shrink,
            arena_shrink: cfg.arena_shrink,
            device: cfg.device,
            nvml,
            profile: cfg.ort_profile.clone(),
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
        // The probe also proves that ORT accepts the shrink entry. Should a
        // build not find the arena it names, runs would fail on every shrink:
        // warn and run without shrinking instead (it is an optimisation).
        if v.shrink.is_some() {
            match v.run(&probe, RunHints { shrink_arena: true }) {
                Ok(_) => return Ok(v),
                Err(e) if crate::error::chain(&e).contains("arena shrink list") => {
                    tracing::warn!(
                        cause = %crate::error::chain(&e),
                        target = %cfg.shrink_target(),
                        "ONNX Runtime refuses to shrink this arena; --arena-shrink ignored"
                    );
                    v.shrink = None;
                }
                Err(e) => return Err(e),
            }
        }
        v.embed(&probe)?;
        Ok(v)
    }

    /// The embedding dimension.
    pub fn embed_dim(&self) -> usize {
        self.embed_dim
    }

    /// Whether a run with these hints shrinks the arena: always under
    /// [`ArenaShrink::Always`], never under [`ArenaShrink::Never`], and when
    /// the batching layer asks under [`ArenaShrink::OnChange`] (and never when
    /// ONNX Runtime refused the shrink entry at open).
    pub fn shrinks(&self, hints: RunHints) -> bool {
        self.shrink.is_some()
            && match self.arena_shrink {
                ArenaShrink::Never => false,
                ArenaShrink::Always => true,
                ArenaShrink::OnChange => hints.shrink_arena,
            }
    }
}

impl Drop for OrtVision {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            finish_profile(&mut self.session, p);
        }
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
    fn run(&mut self, batch: &PixelBatch, hints: RunHints) -> Result<Embeddings> {
        let shape = [
            batch.n as i64,
            batch.channels as i64,
            batch.height as i64,
            batch.width as i64,
        ];
        let input = TensorRef::from_array_view((shape, batch.data.as_slice()))
            .map_err(|e| Error::ort("vision input tensor", e))?;
        let shrink = self.shrinks(hints);
        let options = match &self.shrink {
            Some(o) if shrink => o,
            _ => &self.plain,
        };
        let outputs = self
            .session
            .run_with_options(ort::inputs![self.input.as_str() => input], options)
            .map_err(|e| Error::ort(format!("vision run of {} images", batch.n), e))?;
        if shrink {
            tracing::trace!(batch = batch.n, "arena shrunk after the run");
        }
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

    fn device_memory(&self) -> Option<DeviceMemory> {
        match self.device {
            Device::Cuda(n) => self.nvml.as_ref()?.cuda_memory(n),
            Device::Cpu => None,
        }
    }
}
