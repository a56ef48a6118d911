//! The engine's time of one batch split into copy in, compute and copy out
//! (issue 32, item 0), for `bench/gpu` (`gpu_bench copies`).
//!
//! The same batch is run four ways; the differences are the copies:
//! - input and output on the device: the compute alone;
//! - input on the device, output to (pinned) host memory: plus the copy out;
//! - input from pinned host memory, bound as the worker does on CUDA: plus
//!   the copy in by DMA;
//! - input from pageable memory, unbound: plus ORT's staging of the input.
//!
//! On the CPU every "device" is host memory, so the four agree up to noise:
//! that is what the CPU run of `bench/gpu` checks, not a measurement.

use std::time::Instant;

use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::value::{DynTensor, Tensor};

use super::*;
use crate::engine::bound::BoundSets;
use crate::engine::PixelView;

/// Median seconds of one run of a batch, fed four ways.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CopyTimes {
    /// Input and output on the device: the compute alone.
    pub device_resident: f64,
    /// Input on the device, output copied to host (pinned on CUDA).
    pub output_to_host: f64,
    /// Input from pinned host memory, bound (the worker's CUDA path).
    pub pinned_input: f64,
    /// Input from pageable host memory, unbound.
    pub pageable_input: f64,
}

fn ort_err(what: &str) -> impl Fn(ort::Error) -> Error + '_ {
    move |e| Error::ort(format!("copy breakdown: {what}"), e)
}

impl OrtVision {
    /// Runs `batch` `runs` times each way (after two warm runs each) and
    /// returns the median seconds of each.
    pub fn copy_times(&mut self, batch: &PixelBatch, runs: usize) -> Result<CopyTimes> {
        let shape = shape_of(self.format, &self.file, batch)?;
        let (device, id) = match self.device {
            Device::Cpu => (AllocationDevice::CPU, 0),
            Device::Cuda(n) => (AllocationDevice::CUDA, n as i32),
        };
        let host: DynTensor = match batch.data.view() {
            PixelView::F32(d) => Tensor::from_array((shape, d.to_vec()))
                .map_err(ort_err("input"))?
                .upcast(),
            PixelView::U8(d) => Tensor::from_array((shape, d.to_vec()))
                .map_err(ort_err("input"))?
                .upcast(),
        };
        let resident = host
            .to(device.clone(), id)
            .map_err(ort_err("input to the device"))?;
        let on_device = MemoryInfo::new(device, id, AllocatorType::Device, MemoryType::Default)
            .map_err(ort_err("device memory info"))?;
        let runs = runs.max(1);
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            f()?;
            f()?;
            let mut v = Vec::with_capacity(runs);
            for _ in 0..runs {
                let t = Instant::now();
                f()?;
                v.push(t.elapsed().as_secs_f64());
            }
            Ok(median(v))
        };

        let mut b = self.session.create_binding().map_err(ort_err("binding"))?;
        b.bind_input(&self.input, &resident)
            .map_err(ort_err("bind input"))?;
        b.bind_output_to_device(&self.output, &on_device)
            .map_err(ort_err("bind output"))?;
        let session = &mut self.session;
        let device_resident = time(&mut || {
            session.run_binding(&b).map_err(ort_err("run"))?;
            b.synchronize_outputs().map_err(ort_err("sync"))
        })?;

        let host_out = match self.device {
            Device::Cpu => Allocator::default(),
            Device::Cuda(_) => {
                let info = MemoryInfo::new(
                    AllocationDevice::CUDA_PINNED,
                    0,
                    AllocatorType::Device,
                    MemoryType::CPUOutput,
                )
                .map_err(ort_err("pinned memory info"))?;
                Allocator::new(session, info).map_err(ort_err("pinned allocator"))?
            }
        };
        let mut out =
            Tensor::<f32>::new(&host_out, [batch.n, self.embed_dim]).map_err(ort_err("output"))?;
        let mut b = session.create_binding().map_err(ort_err("binding"))?;
        b.bind_input(&self.input, &resident)
            .map_err(ort_err("bind input"))?;
        b.bind_output(&self.output, &mut out)
            .map_err(ort_err("bind output"))?;
        let output_to_host = time(&mut || {
            session.run_binding(&b).map_err(ort_err("run"))?;
            Ok(())
        })?;

        let mut bound = BoundSets::new(session, self.device)?;
        let (input, output, dim, plain) = (&self.input, &self.output, self.embed_dim, &self.plain);
        let pinned_input = time(&mut || {
            bound
                .run(session, plain, input, output, dim, shape, batch)
                .map(drop)
        })?;
        drop(bound);
        let pageable_input = time(&mut || self.run_unbound(batch, false).map(drop))?;
        Ok(CopyTimes {
            device_resident,
            output_to_host,
            pinned_input,
            pageable_input,
        })
    }
}
