//! Input buffers the batcher assembles batches in, lent by the engine.
//!
//! With IO binding on ([`crate::engine::session::SessionConfig::io_binding`]),
//! the vision session allocates each batch size's input buffers itself (on
//! CUDA in page-locked host memory) and lends them to the batcher through the
//! [`crate::engine::handle::EngineHandle`]. The batcher writes the chips of a
//! batch straight into one ([`Pixels::Leased`]); the engine binds it as the
//! session's input as it is, with no copy on the host, and the buffer goes
//! back to the pool when the batch is dropped after its run. A batch size
//! keeps at most [`FREE_PER_SIZE`] free buffers (one assembling, two at the
//! engine: [`crate::batch::BATCHES_IN_FLIGHT`]), and the pool at most
//! [`MAX_FREE`] in all, the oldest going first. A shrinking run first lets the
//! free buffers above its size go, as the bound outputs do.

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use ort::memory::Allocator;
use ort::value::{DynTensor, Tensor};

use crate::engine::{PixelFormat, Pixels};

/// Free buffers kept per batch size.
pub const FREE_PER_SIZE: usize = 3;
/// Free buffers kept in all.
pub const MAX_FREE: usize = 12;

struct Inner {
    alloc: Allocator,
    format: PixelFormat,
    /// Channels, height, width of one image.
    image: (usize, usize, usize),
    /// Free buffers and their batch size, oldest first.
    free: Vec<(usize, DynTensor)>,
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A pool of input buffers of one format and image shape. Cloning shares it.
#[derive(Clone)]
pub struct InputPool(Arc<Mutex<Inner>>);

impl std::fmt::Debug for InputPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = lock(&self.0);
        f.debug_struct("InputPool")
            .field("format", &inner.format)
            .field("image", &inner.image)
            .field("free", &inner.free.len())
            .finish()
    }
}

impl InputPool {
    /// A pool allocating from `alloc` (the session's pinned allocator on CUDA).
    pub(crate) fn new(
        alloc: Allocator,
        format: PixelFormat,
        image: (usize, usize, usize),
    ) -> InputPool {
        InputPool(Arc::new(Mutex::new(Inner {
            alloc,
            format,
            image,
            free: Vec::new(),
        })))
    }

    /// A pool of host memory from ONNX Runtime's default allocator (the CPU's
    /// buffers; also for tests of the batcher).
    pub fn host(format: PixelFormat, image: (usize, usize, usize)) -> InputPool {
        InputPool::new(Allocator::default(), format, image)
    }

    /// The format of the buffers.
    pub fn format(&self) -> PixelFormat {
        lock(&self.0).format
    }

    /// A buffer for `n` images: a free one of that size, or a new one. `None`
    /// when allocating fails (the batcher then assembles in its own memory).
    pub fn lease(&self, n: usize) -> Option<Leased> {
        let mut inner = lock(&self.0);
        let tensor = match inner.free.iter().rposition(|(k, _)| *k == n) {
            Some(i) => inner.free.remove(i).1,
            None => {
                let (c, h, w) = inner.image;
                let made = match inner.format {
                    PixelFormat::F32Nchw => {
                        Tensor::<f32>::new(&inner.alloc, [n, c, h, w]).map(|t| t.upcast())
                    }
                    PixelFormat::U8Nhwc => {
                        Tensor::<u8>::new(&inner.alloc, [n, h, w, c]).map(|t| t.upcast())
                    }
                };
                match made {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::warn!(images = n, cause = %e, "no input buffer from the pool");
                        return None;
                    }
                }
            }
        };
        Some(Leased {
            tensor: Some(tensor),
            n,
            format: inner.format,
            pool: Arc::downgrade(&self.0),
        })
    }

    /// Drops the free buffers of sizes above `n`.
    pub(crate) fn release_above(&self, n: usize) {
        lock(&self.0).free.retain(|(k, _)| *k <= n);
    }

    /// Batch sizes of the free buffers, sorted (a size appears once per buffer).
    pub fn free_sizes(&self) -> Vec<usize> {
        let mut v: Vec<usize> = lock(&self.0).free.iter().map(|(k, _)| *k).collect();
        v.sort_unstable();
        v
    }
}

/// A buffer of the pool, lent for one batch; it goes back when dropped.
pub struct Leased {
    tensor: Option<DynTensor>,
    n: usize,
    format: PixelFormat,
    pool: Weak<Mutex<Inner>>,
}

impl Leased {
    /// Images the buffer holds.
    pub fn n(&self) -> usize {
        self.n
    }

    /// The layout of its values.
    pub fn format(&self) -> PixelFormat {
        self.format
    }

    /// The address of its memory (tests prove reuse with it).
    pub fn addr(&self) -> usize {
        self.tensor().data_ptr() as usize
    }

    pub(crate) fn tensor(&self) -> &DynTensor {
        self.tensor
            .as_ref()
            .expect("a lent buffer holds its tensor")
    }

    fn tensor_mut(&mut self) -> &mut DynTensor {
        self.tensor
            .as_mut()
            .expect("a lent buffer holds its tensor")
    }

    /// The values, when they are float32.
    pub fn f32(&self) -> Option<&[f32]> {
        self.tensor()
            .try_extract_tensor::<f32>()
            .ok()
            .map(|(_, d)| d)
    }

    /// The values, when they are uint8.
    pub fn u8(&self) -> Option<&[u8]> {
        self.tensor()
            .try_extract_tensor::<u8>()
            .ok()
            .map(|(_, d)| d)
    }

    /// The values to write, when they are float32.
    pub fn f32_mut(&mut self) -> Option<&mut [f32]> {
        self.tensor_mut()
            .try_extract_tensor_mut::<f32>()
            .ok()
            .map(|(_, d)| d)
    }

    /// The values to write, when they are uint8.
    pub fn u8_mut(&mut self) -> Option<&mut [u8]> {
        self.tensor_mut()
            .try_extract_tensor_mut::<u8>()
            .ok()
            .map(|(_, d)| d)
    }

    /// A copy of the values in the batch's own memory.
    pub fn to_pixels(&self) -> Pixels {
        match self.format {
            PixelFormat::F32Nchw => Pixels::F32(self.f32().unwrap_or_default().to_vec()),
            PixelFormat::U8Nhwc => Pixels::U8(self.u8().unwrap_or_default().to_vec()),
        }
    }
}

impl std::fmt::Debug for Leased {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leased")
            .field("n", &self.n)
            .field("format", &self.format)
            .finish()
    }
}

impl Drop for Leased {
    fn drop(&mut self) {
        let (Some(pool), Some(t)) = (self.pool.upgrade(), self.tensor.take()) else {
            return;
        };
        let mut inner = lock(&pool);
        if inner.free.iter().filter(|(k, _)| *k == self.n).count() >= FREE_PER_SIZE {
            return;
        }
        if inner.free.len() >= MAX_FREE {
            inner.free.remove(0);
        }
        inner.free.push((self.n, t));
    }
}
