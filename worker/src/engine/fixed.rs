//! `--batch-size N` on CUDA: partial batches run padded to a power of two.
//!
//! A task rarely holds a multiple of `N` chips, so its last batch has any size
//! from 1 to `N − 1`, and tasks differ. ONNX Runtime's CUDA provider pays for
//! the first run of every input shape (kernel selection, the memory plan):
//! about 0.1 s on an H200 with the fused attention of `tools/fuse_graph.py`,
//! against 35 ms for a whole batch of 64. Run as they come, a job's last batches
//! met dozens of new shapes, and the end-to-end run of `bench/gpu` kept the
//! device busy little more than half the time. Padded, as the adaptive engine
//! pads its pieces, a job meets at most `log2(N) + 1` shapes; the padding rows
//! are dropped. On the CPU a run's cost is linear in its images and a new shape
//! costs little, so the CPU runs batches as they come.

use crate::engine::adaptive::piece;
use crate::engine::controller::bucket_for;
use crate::engine::{Backend, DeviceMemory, Embeddings, PixelBatch, PixelFormat, RunHints};
use crate::error::Result;

/// A backend whose runs are `size` images, or a power of two below it.
pub(crate) struct FixedShapes<B> {
    inner: B,
    size: usize,
}

impl<B: Backend> FixedShapes<B> {
    /// `inner`, run at `size` images or a power of two below.
    pub fn new(inner: B, size: usize) -> FixedShapes<B> {
        FixedShapes {
            inner,
            size: size.max(1),
        }
    }

    /// The shape a batch of `n` images runs at.
    pub fn shape_for(&self, n: usize) -> usize {
        if n >= self.size {
            n
        } else {
            bucket_for(n).min(self.size)
        }
    }
}

impl<B: Backend> Backend for FixedShapes<B> {
    fn run(&mut self, batch: &PixelBatch, hints: RunHints) -> Result<Embeddings> {
        let size = self.shape_for(batch.n);
        let padded = piece(batch, 0..batch.n, size);
        let mut out = self.inner.run(&padded, hints)?;
        if out.n > batch.n {
            out.data.truncate(batch.n * out.dim);
            out.n = batch.n;
        }
        Ok(out)
    }

    fn max_batch(&self) -> Option<usize> {
        self.inner.max_batch()
    }

    fn preferred_batch(&self) -> Option<usize> {
        self.inner.preferred_batch()
    }

    fn device_memory(&self) -> Option<DeviceMemory> {
        self.inner.device_memory()
    }

    fn pixel_format(&self) -> PixelFormat {
        self.inner.pixel_format()
    }

    fn input_pool(&self) -> Option<crate::engine::pool::InputPool> {
        self.inner.input_pool()
    }

    fn stage(&mut self, next: &PixelBatch) {
        let size = self.shape_for(next.n);
        self.inner.stage(&piece(next, 0..next.n, size));
    }

    fn unstage(&mut self) {
        self.inner.unstage();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the size of every run; row `i` is `[first pixel of image i]`.
    struct Sizes(Vec<usize>);
    impl Backend for Sizes {
        fn run(&mut self, b: &PixelBatch, _: RunHints) -> Result<Embeddings> {
            self.0.push(b.n);
            Ok(Embeddings {
                n: b.n,
                dim: 1,
                data: (0..b.n)
                    .map(|i| b.data.value(i * b.image_len()).unwrap())
                    .collect(),
            })
        }
    }

    fn batch(n: usize) -> PixelBatch {
        PixelBatch {
            n,
            channels: 1,
            height: 1,
            width: 2,
            data: (0..n)
                .flat_map(|i| [i as f32 + 1.0, 0.5])
                .collect::<Vec<f32>>()
                .into(),
        }
    }

    #[test]
    fn every_size_below_the_batch_runs_at_a_power_of_two_and_keeps_its_rows() {
        let mut f = FixedShapes::new(Sizes(vec![]), 48);
        for n in 1..=48 {
            let out = f.embed(&batch(n)).unwrap();
            assert_eq!(out.n, n);
            let want: Vec<f32> = (0..n).map(|i| i as f32 + 1.0).collect();
            assert_eq!(out.data, want, "rows of a batch of {n}");
        }
        let mut shapes = f.inner.0.clone();
        shapes.sort_unstable();
        shapes.dedup();
        assert_eq!(shapes, vec![1, 2, 4, 8, 16, 32, 48]);
    }

    #[test]
    fn a_whole_batch_runs_as_it_is() {
        let mut f = FixedShapes::new(Sizes(vec![]), 64);
        f.embed(&batch(64)).unwrap();
        f.embed(&batch(33)).unwrap();
        f.embed(&batch(3)).unwrap();
        assert_eq!(f.inner.0, vec![64, 64, 4]);
    }
}
