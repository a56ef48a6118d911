//! Starting the engine: loads the model on its own inference thread as the
//! flags ([`EngineArgs`]) say, and hands back the [`EngineHandle`] the batcher
//! sends batches to.

use crate::engine::adaptive::{Adaptive, AdaptiveConfig, ImageShape};
use crate::engine::fixed::FixedShapes;
use crate::engine::flags::{BatchPolicy, EngineArgs};
use crate::engine::handle::EngineHandle;
use crate::engine::session::Device;
use crate::engine::vision::OrtVision;
use crate::error::{Error, Result};
use crate::metrics;
use crate::model::ModelDir;

/// Loads the model on its own inference thread as `args` say: a fixed batch
/// size, or the adaptive controller after its warm-up probe.
pub fn start_engine(model: &ModelDir, args: &EngineArgs) -> Result<(EngineHandle, BatchPolicy)> {
    let policy = args.batch_policy().map_err(Error::Usage)?;
    let session_cfg = args.session_config();
    let model = model.clone();
    let fp16 = args.fp16;
    let engine = match policy {
        BatchPolicy::Fixed(n) => {
            // CUDA pays for every new input shape (see `engine::fixed`).
            let h = match session_cfg.device {
                Device::Cuda(_) => EngineHandle::spawn("rsembed-engine", 2, move || {
                    Ok(FixedShapes::new(
                        OrtVision::open(&model, fp16, &session_cfg)?,
                        n,
                    ))
                })?,
                Device::Cpu => EngineHandle::spawn("rsembed-engine", 2, move || {
                    OrtVision::open(&model, fp16, &session_cfg)
                })?,
            };
            metrics::global().batch_size.set(n as i64);
            metrics::global().batch_ceiling.set(n as i64);
            h
        }
        BatchPolicy::Auto { max_batch } => EngineHandle::spawn("rsembed-engine", 2, move || {
            let vision = OrtVision::open(&model, fp16, &session_cfg)?;
            let cfg = AdaptiveConfig {
                max_batch,
                ..AdaptiveConfig::default()
            };
            let mut a = Adaptive::new(vision, cfg);
            metrics::global().watch_adaptive(a.stats_handle());
            a.probe(ImageShape::of_model(&model))?;
            Ok(a)
        })?,
    };
    Ok((engine, policy))
}
