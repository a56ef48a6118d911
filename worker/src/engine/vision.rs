//! The vision graph as a [`Backend`].

use std::path::PathBuf;

use ort::session::{RunOptions, Session};
use ort::value::{TensorElementType, TensorRef, ValueType};

use crate::engine::bound::{pinned, BoundSets};
use crate::engine::nvml::Nvml;
use crate::engine::pool::InputPool;
use crate::engine::session::{
    finish_profile, open_graph, static_last_dim, ArenaShrink, Device, InputDtype, SessionConfig,
};
use crate::engine::{
    l2_normalize_rows, Backend, DeviceMemory, Embeddings, PixelBatch, PixelFormat, PixelView,
    RunHints,
};
use crate::error::{Error, Result};
use crate::model::ModelDir;

mod copies;
pub use copies::CopyTimes;

/// The ONNX Runtime config key that returns an arena's free chunks to the
/// device at the end of a run. A run option: as a session option ORT ignores it.
pub const ARENA_SHRINK_KEY: &str = "memory.enable_memory_arena_shrinkage";

/// ONNX Runtime running `vision_model.onnx` (or its fp16 variant, or the
/// uint8 entry of either).
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
    format: PixelFormat,
    embed_dim: usize,
    height: usize,
    width: usize,
    /// Inputs and outputs bound once per batch size; `None` runs unbound.
    bound: Option<BoundSets>,
    /// Input buffers lent to the batcher (with `bound`).
    pool: Option<InputPool>,
}

/// The graph a session opens: its file, tensor names and input format.
struct Entry {
    file: PathBuf,
    input: String,
    output: String,
    format: PixelFormat,
}

/// The vision entry `cfg.input_dtype` asks for: the uint8 one when the
/// directory has a usable one (or `Uint8` insists), the float graph otherwise.
fn choose_entry(model: &ModelDir, fp16: bool, cfg: &SessionConfig) -> Result<Entry> {
    let float = || -> Result<Entry> {
        let g = model.vision_graph(fp16)?;
        Ok(Entry {
            file: model.graph_path(g)?,
            input: g.input.clone(),
            output: g.output.clone(),
            format: PixelFormat::F32Nchw,
        })
    };
    let u8_entry = |(file, g): (PathBuf, &rsembed_schemas::model::U8GraphSpec)| Entry {
        file,
        input: g.input.clone(),
        output: g.output.clone(),
        format: PixelFormat::U8Nhwc,
    };
    match cfg.input_dtype {
        InputDtype::Float => float(),
        InputDtype::Uint8 => match model.u8_entry(fp16)? {
            Some(e) => Ok(u8_entry(e)),
            None => Err(Error::ModelInvalid {
                path: model.path(rsembed_schemas::model::MODEL_MANIFEST),
                reason: format!(
                    "--input-dtype uint8 was asked for but the manifest has no `{}` entry; \
                     add it with `python tools/uint8_entry.py {}`",
                    if fp16 { "vision_fp16_u8" } else { "vision_u8" },
                    model.dir.display()
                ),
            }),
        },
        InputDtype::Auto => match model.u8_entry(fp16) {
            Ok(Some(e)) => Ok(u8_entry(e)),
            Ok(None) => float(),
            Err(e) => {
                tracing::warn!(
                    cause = %crate::error::chain(&e),
                    "the model's uint8 entry is not usable; feeding the float graph"
                );
                float()
            }
        },
    }
}

impl OrtVision {
    /// Opens the vision graph and proves, with one probe run, that it produces
    /// `embed_dim` floats per image for the preprocessor's input size.
    pub fn open(model: &ModelDir, fp16: bool, cfg: &SessionConfig) -> Result<OrtVision> {
        let entry = choose_entry(model, fp16, cfg)?;
        let file = entry.file;
        let session = open_graph(cfg, &file, &entry.input, &entry.output)?;
        check_input_type(&session, &file, &entry.input, entry.format)?;
        let embed_dim = model.manifest.embed_dim;
        if let Some(d) = static_last_dim(&session, &entry.output) {
            if d != embed_dim as i64 {
                return Err(wrong_dim(&file, &entry.output, d as usize, embed_dim));
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
        let (bound, pool) = if cfg.io_binding {
            let alloc = match cfg.device {
                Device::Cpu => ort::memory::Allocator::default(),
                Device::Cuda(_) => pinned(&session, ort::memory::MemoryType::CPUInput)?,
            };
            let image = (
                3,
                model.preprocessor.size.height as usize,
                model.preprocessor.size.width as usize,
            );
            (
                Some(BoundSets::new(&session, cfg.device)?),
                Some(InputPool::new(alloc, entry.format, image)),
            )
        } else {
            (None, None)
        };
        tracing::info!(
            graph = %file.display(),
            input = %entry.input,
            format = ?entry.format,
            io_binding = cfg.io_binding,
            "vision entry"
        );
        let mut v = OrtVision {
            session,
            plain: RunOptions::new().map_err(|e| Error::ort("run options", e))?,
            shrink,
            arena_shrink: cfg.arena_shrink,
            device: cfg.device,
            nvml,
            profile: cfg.ort_profile.clone(),
            file,
            input: entry.input,
            output: entry.output,
            format: entry.format,
            embed_dim,
            height: model.preprocessor.size.height as usize,
            width: model.preprocessor.size.width as usize,
            bound,
            pool,
        };
        let probe = v.zeros(1);
        // The probe runs unbound, so a graph of the wrong output shape fails
        // with the checks below rather than inside a bound output. It also
        // proves that ORT accepts the shrink entry. Should a build not find
        // the arena it names, runs would fail on every shrink: warn and run
        // without shrinking instead (it is an optimisation).
        if v.shrink.is_some() {
            match v.run_unbound(&probe, true) {
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
        v.run_unbound(&probe, false)?;
        Ok(v)
    }

    /// A batch of `n` zero images in the entry's format.
    pub fn zeros(&self, n: usize) -> PixelBatch {
        let len = n * 3 * self.height * self.width;
        PixelBatch {
            n,
            channels: 3,
            height: self.height,
            width: self.width,
            data: match self.format {
                PixelFormat::F32Nchw => vec![0f32; len].into(),
                PixelFormat::U8Nhwc => vec![0u8; len].into(),
            },
        }
    }

    /// The embedding dimension.
    pub fn embed_dim(&self) -> usize {
        self.embed_dim
    }

    /// The graph file the session runs.
    pub fn graph_file(&self) -> &std::path::Path {
        &self.file
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

    /// The address of the input buffer bound for batches of `n` images, if
    /// one is (tests prove with it that a batch size's buffer is reused).
    pub fn bound_input_addr(&self, n: usize) -> Option<usize> {
        self.bound.as_ref()?.input_addr(n)
    }

    /// Batch sizes that hold bound buffers now.
    pub fn bound_sizes(&self) -> Vec<usize> {
        self.bound.as_ref().map_or_else(Vec::new, |b| b.sizes())
    }

    /// One run from the batch's own memory (ORT copies it where it must).
    fn run_unbound(&mut self, batch: &PixelBatch, shrink: bool) -> Result<Vec<f32>> {
        let shape = shape_of(self.format, &self.file, batch)?;
        let context = || format!("vision run of {} images", batch.n);
        let input = match batch.data.view() {
            PixelView::F32(d) => TensorRef::from_array_view((shape, d))
                .map_err(|e| Error::ort("vision input tensor", e))?
                .into_dyn(),
            PixelView::U8(d) => TensorRef::from_array_view((shape, d))
                .map_err(|e| Error::ort("vision input tensor", e))?
                .into_dyn(),
        };
        let options = match &self.shrink {
            Some(o) if shrink => o,
            _ => &self.plain,
        };
        let outputs = self
            .session
            .run_with_options(ort::inputs![self.input.as_str() => input], options)
            .map_err(|e| Error::ort(context(), e))?;
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
        Ok(data.to_vec())
    }
}

impl Drop for OrtVision {
    fn drop(&mut self) {
        // Bound values hold the session's allocators: release them first.
        self.bound = None;
        self.pool = None;
        if let Some(p) = &self.profile {
            finish_profile(&mut self.session, p);
        }
    }
}

/// The input shape of `batch`, checked against the entry's format.
fn shape_of(format: PixelFormat, file: &std::path::Path, batch: &PixelBatch) -> Result<[i64; 4]> {
    if batch.data.format() != format || batch.data.len() != batch.n * batch.image_len() {
        return Err(Error::Device {
            context: format!("vision run of {} images", batch.n),
            message: format!(
                "the batch holds {} values as {:?}, but {} takes {:?} ({} values); \
                 this is a bug",
                batch.data.len(),
                batch.data.format(),
                file.display(),
                format,
                batch.n * batch.image_len()
            ),
        });
    }
    let (n, c, h, w) = (
        batch.n as i64,
        batch.channels as i64,
        batch.height as i64,
        batch.width as i64,
    );
    Ok(match format {
        PixelFormat::F32Nchw => [n, c, h, w],
        PixelFormat::U8Nhwc => [n, h, w, c],
    })
}

fn wrong_dim(file: &std::path::Path, output: &str, got: usize, want: usize) -> Error {
    Error::ModelInvalid {
        path: file.to_owned(),
        reason: format!(
            "output tensor `{output}` has dimension {got} but rsembed-model.json says embed_dim {want}"
        ),
    }
}

/// Refuses a graph whose input is not the element type of its entry (a
/// manifest pointing `vision_u8` at a float graph).
fn check_input_type(
    session: &Session,
    file: &std::path::Path,
    input: &str,
    format: PixelFormat,
) -> Result<()> {
    let want = match format {
        PixelFormat::F32Nchw => TensorElementType::Float32,
        PixelFormat::U8Nhwc => TensorElementType::Uint8,
    };
    let found = session.inputs().iter().find(|o| o.name() == input);
    match found.map(|o| o.dtype()) {
        Some(ValueType::Tensor { ty, .. }) if *ty == want => Ok(()),
        other => Err(Error::ModelInvalid {
            path: file.to_owned(),
            reason: format!("input tensor `{input}` is {other:?}, expected a {want:?} tensor"),
        }),
    }
}

impl Backend for OrtVision {
    fn run(&mut self, batch: &PixelBatch, hints: RunHints) -> Result<Embeddings> {
        let shrink = self.shrinks(hints);
        let mut data = match self.bound.as_mut() {
            None => self.run_unbound(batch, shrink)?,
            Some(bound) => {
                let shape = shape_of(self.format, &self.file, batch)?;
                if shrink {
                    // The arena cannot return a region that a bound buffer
                    // holds: let the larger sizes' buffers go first.
                    bound.release_above(batch.n);
                    if let Some(p) = &self.pool {
                        p.release_above(batch.n);
                    }
                }
                let options = match &self.shrink {
                    Some(o) if shrink => o,
                    _ => &self.plain,
                };
                bound.run(
                    &mut self.session,
                    options,
                    &self.input,
                    &self.output,
                    self.embed_dim,
                    shape,
                    batch,
                )?
            }
        };
        if shrink {
            tracing::trace!(batch = batch.n, "arena shrunk after the run");
        }
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

    fn pixel_format(&self) -> PixelFormat {
        self.format
    }

    fn input_pool(&self) -> Option<InputPool> {
        self.pool.clone()
    }
}
