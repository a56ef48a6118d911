//! Inference: the ONNX Runtime sessions, the backend trait and the engine thread.

pub mod adaptive;
pub(crate) mod bound;
pub mod controller;
pub(crate) mod fixed;
pub mod flags;
pub mod handle;
pub mod nvml;
pub mod pool;
pub mod runtime;
pub mod session;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
pub mod start;
pub mod text;
pub mod vision;

use crate::error::Result;

/// A batch of preprocessed images: NCHW float32 for a float vision entry, or
/// the 8-bit resized images, NHWC, for a uint8 entry (`vision_u8`), which
/// rescales and normalizes inside the graph.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelBatch {
    /// Images in the batch.
    pub n: usize,
    /// Channels (3).
    pub channels: usize,
    /// Height.
    pub height: usize,
    /// Width.
    pub width: usize,
    /// `n * channels * height * width` values, in the layout of their type.
    pub data: Pixels,
}

impl PixelBatch {
    /// Values per image.
    pub fn image_len(&self) -> usize {
        self.channels * self.height * self.width
    }
}

/// What a vision entry takes as input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PixelFormat {
    /// float32 `[N,3,H,W]`, rescaled and normalized by the preprocessor.
    #[default]
    F32Nchw,
    /// uint8 `[N,H,W,3]`: the resized 8-bit image, a quarter of the bytes.
    U8Nhwc,
}

/// The values of a [`PixelBatch`].
#[derive(Debug)]
pub enum Pixels {
    /// [`PixelFormat::F32Nchw`].
    F32(Vec<f32>),
    /// [`PixelFormat::U8Nhwc`].
    U8(Vec<u8>),
    /// Either format, in a buffer the engine lent ([`pool`]): bound as the
    /// session's input as it is.
    Leased(pool::Leased),
}

/// The values of [`Pixels`], borrowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PixelView<'a> {
    /// float32, NCHW.
    F32(&'a [f32]),
    /// uint8, NHWC.
    U8(&'a [u8]),
}

impl Clone for Pixels {
    /// A lent buffer's values are copied into the batch's own memory.
    fn clone(&self) -> Pixels {
        match self {
            Pixels::F32(v) => Pixels::F32(v.clone()),
            Pixels::U8(v) => Pixels::U8(v.clone()),
            Pixels::Leased(l) => l.to_pixels(),
        }
    }
}

impl PartialEq for Pixels {
    /// Equal values in the same format, wherever they live.
    fn eq(&self, other: &Pixels) -> bool {
        self.view() == other.view()
    }
}

impl From<Vec<f32>> for Pixels {
    fn from(v: Vec<f32>) -> Pixels {
        Pixels::F32(v)
    }
}

impl From<Vec<u8>> for Pixels {
    fn from(v: Vec<u8>) -> Pixels {
        Pixels::U8(v)
    }
}

impl FromIterator<f32> for Pixels {
    fn from_iter<I: IntoIterator<Item = f32>>(iter: I) -> Pixels {
        Pixels::F32(iter.into_iter().collect())
    }
}

impl FromIterator<u8> for Pixels {
    fn from_iter<I: IntoIterator<Item = u8>>(iter: I) -> Pixels {
        Pixels::U8(iter.into_iter().collect())
    }
}

impl Pixels {
    /// The values, borrowed.
    pub fn view(&self) -> PixelView<'_> {
        match self {
            Pixels::F32(v) => PixelView::F32(v),
            Pixels::U8(v) => PixelView::U8(v),
            Pixels::Leased(l) => match l.format() {
                PixelFormat::F32Nchw => PixelView::F32(l.f32().unwrap_or_default()),
                PixelFormat::U8Nhwc => PixelView::U8(l.u8().unwrap_or_default()),
            },
        }
    }

    /// The float32 values, if these are float32.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self.view() {
            PixelView::F32(v) => Some(v),
            PixelView::U8(_) => None,
        }
    }

    /// Values held.
    pub fn len(&self) -> usize {
        match self.view() {
            PixelView::F32(v) => v.len(),
            PixelView::U8(v) => v.len(),
        }
    }

    /// True when there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The layout these values are in.
    pub fn format(&self) -> PixelFormat {
        match self.view() {
            PixelView::F32(_) => PixelFormat::F32Nchw,
            PixelView::U8(_) => PixelFormat::U8Nhwc,
        }
    }

    /// Value `i` as a float (simulated backends and tests identify images by it).
    pub fn value(&self, i: usize) -> Option<f32> {
        match self.view() {
            PixelView::F32(v) => v.get(i).copied(),
            PixelView::U8(v) => v.get(i).map(|x| *x as f32),
        }
    }

    /// Values `range`, followed by zeros up to `len` values, in the batch's
    /// own memory.
    pub fn padded(&self, range: std::ops::Range<usize>, len: usize) -> Pixels {
        fn pad<T: Copy + Default>(v: &[T], len: usize) -> Vec<T> {
            let mut out = Vec::with_capacity(len.max(v.len()));
            out.extend_from_slice(v);
            out.resize(len.max(v.len()), T::default());
            out
        }
        match self.view() {
            PixelView::F32(v) => Pixels::F32(pad(&v[range], len)),
            PixelView::U8(v) => Pixels::U8(pad(&v[range], len)),
        }
    }
}

/// Embeddings of a batch, row-major [n, dim], L2-normalized.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    /// Rows.
    pub n: usize,
    /// Dimension.
    pub dim: usize,
    /// `n * dim` floats.
    pub data: Vec<f32>,
}

impl Embeddings {
    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }
}

/// What the batching layer asks of one run, beyond the pixels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunHints {
    /// Return the memory arena's unused chunks to the device after this run
    /// (ORT's `memory.enable_memory_arena_shrinkage` run option).
    pub shrink_arena: bool,
}

/// Device memory, in bytes, as NVML reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// In use on the device (all processes).
    pub used: u64,
    /// The device's total.
    pub total: u64,
}

/// The model behind the engine thread. Small and synchronous, so a
/// fault-injecting backend can stand in for ONNX Runtime in tests.
pub trait Backend: Send {
    /// Embeds a batch; returns L2-normalized rows in batch order.
    fn run(&mut self, batch: &PixelBatch, hints: RunHints) -> Result<Embeddings>;
    /// [`Backend::run`] without hints.
    fn embed(&mut self, batch: &PixelBatch) -> Result<Embeddings> {
        self.run(batch, RunHints::default())
    }
    /// The largest batch the backend accepts, when it knows one.
    fn max_batch(&self) -> Option<usize> {
        None
    }
    /// The batch size the backend runs best at now (the adaptive controller's
    /// current bucket), when it has a preference; the batcher fills batches to it.
    fn preferred_batch(&self) -> Option<usize> {
        None
    }
    /// Device memory now, when the backend can measure it.
    fn device_memory(&self) -> Option<DeviceMemory> {
        None
    }
    /// The pixels the backend takes; the batcher assembles batches in it.
    fn pixel_format(&self) -> PixelFormat {
        PixelFormat::F32Nchw
    }
    /// Buffers the backend lends the batcher to assemble batches in, if any.
    fn input_pool(&self) -> Option<pool::InputPool> {
        None
    }
    /// Starts moving `next`, the batch queued behind the one about to run, to
    /// the device while that run goes on (two batches in flight: batch n
    /// computes while batch n+1 is copied). A later run may skip its copy only
    /// when it is that very batch; any other run ignores what is staged.
    /// Default: nothing (the copy happens in [`Backend::run`]).
    fn stage(&mut self, next: &PixelBatch) {
        let _ = next;
    }
    /// Drops what [`Backend::stage`] holds on the device (before an
    /// out-of-memory retry, so the retry has that memory too).
    fn unstage(&mut self) {}
}

/// Scales every row of `data` (rows of `dim`) to unit L2 norm.
///
/// An all-zero row stays zero rather than becoming NaN.
pub(crate) fn l2_normalize_rows(data: &mut [f32], dim: usize) {
    for row in data.chunks_exact_mut(dim) {
        let norm = row
            .iter()
            .map(|v| (*v as f64) * (*v as f64))
            .sum::<f64>()
            .sqrt();
        if norm > 0.0 {
            let inv = (1.0 / norm) as f32;
            row.iter_mut().for_each(|v| *v *= inv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l2_normalizes_each_row() {
        let mut d = vec![3.0, 4.0, 0.0, 0.0, 0.0, 0.0];
        l2_normalize_rows(&mut d, 3);
        assert_eq!(&d[..3], &[0.6, 0.8, 0.0]);
        assert_eq!(&d[3..], &[0.0, 0.0, 0.0]);
    }
}
