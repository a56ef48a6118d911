//! Inference: the ONNX Runtime sessions, the backend trait and the engine thread.

pub mod adaptive;
pub mod controller;
pub(crate) mod fixed;
pub mod flags;
pub mod handle;
pub mod nvml;
pub mod runtime;
pub mod session;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
pub mod start;
pub mod text;
pub mod vision;

use crate::error::Result;

/// A batch of preprocessed images, NCHW float32.
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
    /// `n * channels * height * width` floats.
    pub data: Vec<f32>,
}

impl PixelBatch {
    /// Floats per image.
    pub fn image_len(&self) -> usize {
        self.channels * self.height * self.width
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
