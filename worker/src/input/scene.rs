//! The scene path of the task runner: a TIFF input becomes many chips, whether
//! it is a file in storage or a member of a tar archive.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use rsembed_raster::scale::{ScaleSpec, StretchCache};
use rsembed_raster::scene::{MemRange, Scene, StretchMemo};
use rsembed_raster::tiff::TiffLimits;
use rsembed_schemas::chip::ErrorStage;
use rsembed_schemas::job::TilingSpec;
use rsembed_schemas::task::TaskInput;
use tokio::sync::mpsc;

use crate::input::{input_error, Item, Prepared};
use crate::preprocess::Preprocessor;
use crate::store::{StoreCache, StoreRange};
use crate::task::Counters;

/// What the scene path needs besides the input.
pub(crate) struct SceneContext {
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

/// The `--scale auto` stretches of every task this process runs, as the
/// metrics are: tasks of one scene (a sharded scene is many tasks) read its
/// sample once per process instead of once per task. Only a memo of a pure
/// function, so it cannot make two tasks disagree.
fn stretches() -> &'static StretchCache {
    static CACHE: OnceLock<StretchCache> = OnceLock::new();
    CACHE.get_or_init(StretchCache::default)
}

/// The key of a scene's stretch: every file's URI, version and size, and the
/// bands read. A file that changed has another version, so another key.
fn stretch_key(ctx: &SceneContext, input: &TaskInput) -> String {
    let mut key = format!("bands={:?}", ctx.tiling.bands);
    let files = std::iter::once((&input.uri, &input.version, input.size))
        .chain(input.parts.iter().map(|p| (&p.uri, &p.version, p.size)));
    for (uri, version, size) in files {
        key += &format!("\n{uri}\t{}\t{size}", version.as_deref().unwrap_or(""));
    }
    key
}

fn memo(ctx: &SceneContext, input: &TaskInput) -> Option<StretchMemo<'static>> {
    Some(StretchMemo {
        cache: stretches(),
        key: stretch_key(ctx, input),
    })
}

/// A counted range reader of one object.
fn reader(
    ctx: &SceneContext,
    uri: &str,
    size: u64,
) -> Result<Arc<dyn rsembed_raster::tiff::RangeRead>, OpenError> {
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
        memo(ctx, input),
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
        memo(ctx, input),
    )
    .await
    .map_err(|e| (ErrorStage::Decode, Box::new(e) as _))
}

/// Reads every chip of a scene into `tx`; a failure becomes one error row for
/// the input, after the chips read before it.
pub(crate) async fn produce_scene(
    ctx: Arc<SceneContext>,
    input: TaskInput,
    tx: mpsc::Sender<Item>,
) {
    let opened = if input.parts.is_empty() {
        open_single(&ctx, &input).await
    } else {
        open_band_files(&ctx, &input).await
    };
    match opened {
        Ok(scene) => emit_chips(&ctx, &scene, &input, tx).await,
        Err((stage, e)) => {
            let _ = tx.send(Err(input_error(&input, stage, e))).await;
        }
    }
}

/// Reads every chip of a TIFF held in memory (a tar member named by
/// `input.uri`) into `tx`, exactly as the same file in storage would be read:
/// the same reader, limits, grid, stretch and footprints.
pub(crate) async fn produce_member_scene(
    ctx: Arc<SceneContext>,
    input: TaskInput,
    bytes: Bytes,
    tx: mpsc::Sender<Item>,
) {
    let reader = Arc::new(MemRange::new(bytes));
    let opened = Scene::open(
        reader,
        &ctx.tiling,
        ctx.scale,
        ctx.limits.clone(),
        &input.uri,
        // Its sample costs no I/O, and a member has no version of its own.
        None,
    )
    .await;
    match opened {
        Ok(scene) => emit_chips(&ctx, &scene, &input, tx).await,
        Err(e) => {
            let _ = tx
                .send(Err(input_error(&input, ErrorStage::Decode, e)))
                .await;
        }
    }
}

/// Sends the chips of `input`'s windows (its chip block, or all) to `tx`; a
/// failure becomes one error row for the input, after the chips before it.
async fn emit_chips(ctx: &SceneContext, scene: &Scene, input: &TaskInput, tx: mpsc::Sender<Item>) {
    for window in scene.windows(input.chips) {
        let chip = match scene.chip(window, ctx.tiling.min_valid).await {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                let _ = tx
                    .send(Err(input_error(input, ErrorStage::Decode, e)))
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
                    .send(Err(input_error(input, ErrorStage::Preprocess, e)))
                    .await;
                return;
            }
            Err(join) => {
                let e = std::io::Error::other(format!("preprocess panicked: {join}"));
                let _ = tx
                    .send(Err(input_error(input, ErrorStage::Preprocess, e)))
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
            cloud_fraction: None,
            queued: crate::metrics::global().queue_chips.hold(1),
        });
        if tx.send(item).await.is_err() {
            return;
        }
    }
}
