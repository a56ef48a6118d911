//! The vision session's inputs and outputs, allocated once per batch size and
//! bound to it (ONNX Runtime's IO binding).
//!
//! A plain run gives ORT the batch's own memory and takes a freshly allocated
//! output back. Bound, each batch size has one output buffer for good, and
//! the input is bound again for every batch (on CUDA that is when ORT copies
//! it to the device): the batch's own buffer when the batcher assembled it in
//! one the engine lent ([`crate::engine::pool`]), otherwise the size's input
//! buffer, made at its first such batch, with the batch copied into it. On the CPU the buffers come from ORT's default allocator,
//! outside the session's arena; on CUDA from the CUDA provider's page-locked
//! ("pinned") host allocator, from which the copy to the device is a DMA
//! transfer with no staging through a pageable buffer. The CUDA path cannot
//! run on this project's CPU-only test machines: it is the same code with
//! another allocator, and `bench/gpu` measures it.
//!
//! At most [`MAX_SETS`] sizes are kept, the least recently used going first:
//! the adaptive engine and `FixedShapes` run power-of-two buckets, so a run
//! meets a handful of sizes, and an unpadded CPU run's odd last batches do not
//! pile up. A run that shrinks the arena (a smaller bucket, an OOM retry)
//! first lets the sizes above its own go, so a split batch runs on its smaller
//! size's buffers and the large ones do not pin memory the shrink returns.

use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, RunOptions, Session};
use ort::value::{DynTensor, Tensor};

use crate::engine::session::Device;
use crate::engine::{PixelBatch, PixelFormat, PixelView, Pixels};
use crate::error::{Error, Result};

/// Batch sizes whose buffers are kept at once.
pub const MAX_SETS: usize = 6;

/// The bound buffers of one batch size.
struct Set {
    n: usize,
    binding: IoBinding,
    /// Made at the first batch of this size that is not in a lent buffer.
    input: Option<DynTensor>,
    output: Tensor<f32>,
}

/// Every batch size's bound buffers, most recently used last.
pub(crate) struct BoundSets {
    input_alloc: Allocator,
    output_alloc: Allocator,
    sets: Vec<Set>,
}

impl BoundSets {
    /// The allocators of `device`: ORT's CPU allocator, or CUDA's pinned one.
    pub(crate) fn new(session: &Session, device: Device) -> Result<BoundSets> {
        let (input_alloc, output_alloc) = match device {
            Device::Cpu => (Allocator::default(), Allocator::default()),
            Device::Cuda(_) => (
                pinned(session, MemoryType::CPUInput)?,
                pinned(session, MemoryType::CPUOutput)?,
            ),
        };
        Ok(BoundSets {
            input_alloc,
            output_alloc,
            sets: Vec::new(),
        })
    }

    /// The address of the input buffer of batches of `n` images, if bound.
    pub(crate) fn input_addr(&self, n: usize) -> Option<usize> {
        self.sets
            .iter()
            .find(|s| s.n == n)
            .and_then(|s| s.input.as_ref())
            .map(|t| t.data_ptr() as usize)
    }

    /// The batch sizes bound now.
    pub(crate) fn sizes(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.sets.iter().map(|s| s.n).collect();
        v.sort_unstable();
        v
    }

    /// Drops the buffers of sizes above `n`.
    pub(crate) fn release_above(&mut self, n: usize) {
        self.sets.retain(|s| s.n <= n);
    }

    /// Runs `batch` through its size's bound buffers; the output rows, raw.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &mut self,
        session: &mut Session,
        options: &RunOptions,
        input: &str,
        output: &str,
        dim: usize,
        shape: [i64; 4],
        batch: &PixelBatch,
    ) -> Result<Vec<f32>> {
        let context = || format!("vision run of {} images (bound)", batch.n);
        let at = match self.sets.iter().position(|s| s.n == batch.n) {
            Some(i) => i,
            None => {
                if self.sets.len() >= MAX_SETS {
                    self.sets.remove(0);
                }
                let set = self.make(session, output, dim, batch.n).map_err(|e| {
                    Error::ort(format!("binding buffers for {} images", batch.n), e)
                })?;
                self.sets.push(set);
                self.sets.len() - 1
            }
        };
        // Most recently used last.
        let set = self.sets.remove(at);
        self.sets.push(set);
        let set = self.sets.last_mut().expect("just pushed");
        // Bound again for every batch: where the session wants the input on
        // another device, this is the copy to it.
        match &batch.data {
            // Assembled by the batcher in a buffer of the pool: bound as it is.
            Pixels::Leased(l) if l.n() == batch.n => set.binding.bind_input(input, l.tensor()),
            data => {
                if set.input.is_none() {
                    let dims: Vec<usize> = shape.iter().map(|d| *d as usize).collect();
                    let made = match data.format() {
                        PixelFormat::F32Nchw => {
                            Tensor::<f32>::new(&self.input_alloc, dims).map(|t| t.upcast())
                        }
                        PixelFormat::U8Nhwc => {
                            Tensor::<u8>::new(&self.input_alloc, dims).map(|t| t.upcast())
                        }
                    };
                    set.input = Some(made.map_err(|e| {
                        Error::ort(format!("binding an input for {} images", batch.n), e)
                    })?);
                }
                let t = set.input.as_mut().expect("just made");
                match data.view() {
                    PixelView::F32(d) => t
                        .try_extract_tensor_mut::<f32>()
                        .map_err(|e| Error::ort(context(), e))?
                        .1
                        .copy_from_slice(d),
                    PixelView::U8(d) => t
                        .try_extract_tensor_mut::<u8>()
                        .map_err(|e| Error::ort(context(), e))?
                        .1
                        .copy_from_slice(d),
                }
                set.binding.bind_input(input, &*t)
            }
        }
        .map_err(|e| Error::ort(context(), e))?;
        let ran = session
            .run_binding_with_options(&set.binding, options)
            .map(drop);
        if let Err(e) = ran {
            // A failed run (most often out of memory, which the adaptive layer
            // answers by splitting) lets its size's buffers go before the
            // halves are made.
            self.sets.pop();
            return Err(Error::ort(context(), e));
        }
        let set = self.sets.last().expect("the set just run");
        let (_, rows) = set.output.extract_tensor();
        Ok(rows.to_vec())
    }

    fn make(&self, session: &Session, output: &str, dim: usize, n: usize) -> ort::Result<Set> {
        let mut out = Tensor::<f32>::new(&self.output_alloc, [n, dim])?;
        let mut binding = session.create_binding()?;
        binding.bind_output(output, &mut out)?;
        Ok(Set {
            n,
            binding,
            input: None,
            output: out,
        })
    }
}

/// CUDA's page-locked host allocator, registered by the CUDA provider.
pub(crate) fn pinned(session: &Session, kind: MemoryType) -> Result<Allocator> {
    let info = MemoryInfo::new(
        AllocationDevice::CUDA_PINNED,
        0,
        AllocatorType::Device,
        kind,
    )
    .map_err(|e| Error::ort("pinned memory info", e))?;
    Allocator::new(session, info).map_err(|e| Error::ort("CUDA pinned host allocator", e))
}
