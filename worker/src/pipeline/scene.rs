//! The scene path of the task runner: a TIFF input becomes many chips.

use std::sync::Arc;

use rsembed_schemas::chip::ErrorStage;
use rsembed_schemas::job::TilingSpec;
use rsembed_schemas::task::TaskInput;
use tokio::sync::mpsc;

use crate::pipeline::{input_error, Counters, Item, Prepared};
use crate::preprocess::Preprocessor;
use crate::raster::scale::ScaleSpec;
use crate::raster::scene::{Scene, StoreRange};
use crate::raster::tiff::TiffLimits;
use crate::store::StoreCache;

/// What the scene path needs besides the input.
pub struct SceneContext {
    /// Stores for input URIs.
    pub stores: StoreCache,
    /// Model preprocessing.
    pub pre: Arc<Preprocessor>,
    /// Counters for progress and bytes read.
    pub counters: Arc<Counters>,
    /// Tiling of the job.
    pub tiling: TilingSpec,
    /// Parsed `--scale`.
    pub scale: ScaleSpec,
    /// TIFF reader bounds.
    pub limits: TiffLimits,
}

type OpenError = (ErrorStage, Box<dyn std::error::Error + Send + Sync>);

/// A counted range reader of one object.
fn reader(
    ctx: &SceneContext,
    uri: &str,
    size: u64,
) -> Result<Arc<dyn crate::raster::tiff::RangeRead>, OpenError> {
    let loc = ctx
        .stores
        .location(uri)
        .map_err(|e| (ErrorStage::Fetch, Box::new(e) as _))?;
    Ok(Arc::new(StoreRange::new(
        loc.store.clone(),
        loc.prefix.clone(),
        size,
        ctx.counters.bytes_read.clone(),
    )))
}

async fn open_single(ctx: &SceneContext, input: &TaskInput) -> Result<Scene, OpenError> {
    let reader = reader(ctx, &input.uri, input.size)?;
    Scene::open(
        reader,
        &ctx.tiling,
        ctx.scale,
        ctx.limits.clone(),
        &input.uri,
    )
    .await
    .map_err(|e| (ErrorStage::Decode, Box::new(e) as _))
}

async fn open_band_files(ctx: &SceneContext, input: &TaskInput) -> Result<Scene, OpenError> {
    let want = ctx.tiling.band_files.clone().unwrap_or_default();
    let missing: Vec<&String> = want
        .iter()
        .filter(|s| !input.parts.iter().any(|p| &p.suffix == *s))
        .collect();
    if !missing.is_empty() {
        let e = std::io::Error::other(format!("missing band file(s) for {missing:?}"));
        return Err((ErrorStage::Fetch, Box::new(e)));
    }
    let mut readers = Vec::new();
    for p in &input.parts {
        readers.push((p.uri.clone(), reader(ctx, &p.uri, p.size)?));
    }
    Scene::open_band_files(
        readers,
        &ctx.tiling,
        ctx.scale,
        ctx.limits.clone(),
        &input.uri,
    )
    .await
    .map_err(|e| (ErrorStage::Decode, Box::new(e) as _))
}

/// Reads every chip of a scene into `tx`; a failure becomes one error row for
/// the input, after the chips read before it.
pub async fn produce_scene(ctx: Arc<SceneContext>, input: TaskInput, tx: mpsc::Sender<Item>) {
    let opened = if input.parts.is_empty() {
        open_single(&ctx, &input).await
    } else {
        open_band_files(&ctx, &input).await
    };
    let scene = match opened {
        Ok(s) => s,
        Err((stage, e)) => {
            let _ = tx.send(Err(input_error(&input, stage, &*e))).await;
            return;
        }
    };
    for window in scene.windows(input.chips) {
        let chip = match scene.chip(window, ctx.tiling.min_valid).await {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                let _ = tx
                    .send(Err(input_error(&input, ErrorStage::Decode, &e)))
                    .await;
                return;
            }
        };
        let pre = ctx.pre.clone();
        let rgb = chip.rgb;
        let pixels = match tokio::task::spawn_blocking(move || pre.run(&rgb)).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                let _ = tx
                    .send(Err(input_error(&input, ErrorStage::Preprocess, &e)))
                    .await;
                return;
            }
            Err(join) => {
                let e = std::io::Error::other(format!("preprocess panicked: {join}"));
                let _ = tx
                    .send(Err(input_error(&input, ErrorStage::Preprocess, &e)))
                    .await;
                return;
            }
        };
        let item = Ok(Prepared {
            input: input.clone(),
            window: chip.window,
            valid_fraction: chip.valid_fraction,
            crs: chip.crs,
            footprint: chip.footprint,
            pixels,
            queued: crate::metrics::global().queue_chips.hold(1),
        });
        if tx.send(item).await.is_err() {
            return;
        }
    }
}
