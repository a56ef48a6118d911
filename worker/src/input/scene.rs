//! The scene path of the task runner: a TIFF input becomes many chips, whether
//! it is a file in storage, a member of a tar archive, several band files, or
//! a STAC item's assets (with its units, cloud mask and planned grid).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use object_store::ObjectStoreExt;
use rsembed_raster::scale::{ScaleSpec, StretchCache};
use rsembed_raster::scene::{
    MemRange, Scene, SceneChip, SceneMask, ScenePart, SceneParts, StretchMemo,
};
use rsembed_raster::tiff::TiffLimits;
use rsembed_schemas::chip::ErrorStage;
use rsembed_schemas::job::TilingSpec;
use rsembed_schemas::task::TaskInput;
use tokio::sync::mpsc;

use crate::context::Counters;
use crate::input::{input_error, Item, Prepared};
use crate::preprocess::Preprocessor;
use crate::store::{StoreCache, StoreRange};

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
    /// Chips of this task left out because their cloud fraction exceeds
    /// `--max-cloud` (the context is the task's own).
    pub cloudy_dropped: AtomicU64,
}

pub(crate) type OpenError = (ErrorStage, Box<dyn std::error::Error + Send + Sync>);

/// What opening a scene needs: the part of [`SceneContext`] that a single
/// chip's reader ([`crate::input::chip`]) shares with the task's, so both
/// open a scene the same way.
pub(crate) struct Opener<'a> {
    pub stores: &'a StoreCache,
    pub counters: &'a Counters,
    pub tiling: &'a TilingSpec,
    pub scale: ScaleSpec,
    pub limits: &'a TiffLimits,
}

impl SceneContext {
    pub(crate) fn opener(&self) -> Opener<'_> {
        Opener {
            stores: &self.stores,
            counters: &self.counters,
            tiling: &self.tiling,
            scale: self.scale,
            limits: &self.limits,
        }
    }
}

/// The `--scale auto` stretches of every task this process runs, as the
/// metrics are: tasks of one scene (a sharded scene is many tasks) read its
/// sample once per process instead of once per task. Only a memo of a pure
/// function, so it cannot make two tasks disagree.
fn stretches() -> &'static StretchCache {
    static CACHE: OnceLock<StretchCache> = OnceLock::new();
    CACHE.get_or_init(StretchCache::default)
}

/// The key of a scene's stretch: every file's URI, version and size (as the
/// store gave it when the task did not), and the bands read. A file that
/// changed has another version, so another key.
fn stretch_key(ctx: &Opener<'_>, input: &TaskInput, sizes: &[u64]) -> String {
    let mut key = format!("bands={:?}", ctx.tiling.bands);
    let version = |v: &Option<String>| v.as_deref().unwrap_or("").to_owned();
    key += &format!(
        "\n{}\t{}\t{}",
        input.uri,
        version(&input.version),
        input.size
    );
    for (p, size) in input.parts.iter().zip(sizes) {
        key += &format!(
            "\n{}\t{}\t{size}\t{:?}",
            p.uri,
            version(&p.version),
            p.bands
        );
    }
    key
}

fn memo(ctx: &Opener<'_>, input: &TaskInput, sizes: &[u64]) -> Option<StretchMemo<'static>> {
    Some(StretchMemo {
        cache: stretches(),
        key: stretch_key(ctx, input, sizes),
    })
}

/// A counted range reader of one object, and its size: `size`, or the
/// store's answer to a HEAD when `size` is 0 (a STAC asset without
/// `file:size`). A store failure is the input's fetch error.
async fn reader(
    ctx: &Opener<'_>,
    uri: &str,
    size: u64,
) -> Result<(Arc<dyn rsembed_raster::tiff::RangeRead>, u64), OpenError> {
    let fetch = |e: Box<dyn std::error::Error + Send + Sync>| (ErrorStage::Fetch, e);
    let loc = ctx.stores.location(uri).map_err(|e| fetch(Box::new(e)))?;
    let size = match size {
        0 => {
            loc.store
                .head(&loc.prefix)
                .await
                .map_err(|e| fetch(Box::new(e)))?
                .size
        }
        n => n,
    };
    let r = StoreRange::new(
        loc.store.clone(),
        loc.prefix.clone(),
        size,
        ctx.counters.bytes_read.clone(),
    );
    Ok((Arc::new(r), size))
}

pub(crate) async fn open_single(ctx: &Opener<'_>, input: &TaskInput) -> Result<Scene, OpenError> {
    let (reader, _) = reader(ctx, &input.uri, input.size).await?;
    Scene::open(
        reader,
        ctx.tiling,
        ctx.scale,
        ctx.limits.clone(),
        &input.uri,
        memo(ctx, input, &[]),
    )
    .await
    .map_err(|e| (ErrorStage::Decode, Box::new(e) as _))
}

/// A scene of several files: `--band-files`, or a STAC item's assets with
/// what its item says about them.
pub(crate) async fn open_parts(ctx: &Opener<'_>, input: &TaskInput) -> Result<Scene, OpenError> {
    let want = ctx.tiling.band_files.clone().unwrap_or_default();
    let missing: Vec<&String> = want
        .iter()
        .filter(|s| !input.parts.iter().any(|p| &p.suffix == *s))
        .collect();
    if !missing.is_empty() {
        let e = std::io::Error::other(format!("missing band file(s) for {missing:?}"));
        return Err((ErrorStage::Fetch, Box::new(e)));
    }
    let mut files = Vec::new();
    let mut sizes = Vec::new();
    for p in &input.parts {
        let (r, size) = reader(ctx, &p.uri, p.size).await?;
        sizes.push(size);
        files.push(ScenePart {
            uri: p.uri.clone(),
            reader: r,
            bands: p.bands.clone(),
        });
    }
    let item = input.item.as_deref();
    let mask = match item.and_then(|i| i.mask.as_ref()) {
        Some(m) => Some(SceneMask {
            kind: m.kind,
            uri: m.file.uri.clone(),
            reader: reader(ctx, &m.file.uri, m.file.size).await?.0,
        }),
        None => None,
    };
    let parts = SceneParts {
        files,
        mask,
        units: item.map(|i| i.units.clone()).unwrap_or_default(),
        grid: item.and_then(|i| i.grid),
    };
    Scene::open_parts(
        parts,
        ctx.tiling,
        ctx.scale,
        ctx.limits.clone(),
        &input.uri,
        memo(ctx, input, &sizes),
    )
    .await
    .map_err(|e| (ErrorStage::Decode, Box::new(e) as _))
}

/// Opens a task input's scene: one file, or several (band files, a STAC
/// item's assets, its mask). An item the planner found unreadable is its
/// fetch error, not read.
pub(crate) async fn open_input(ctx: &Opener<'_>, input: &TaskInput) -> Result<Scene, OpenError> {
    if let Some(reason) = input.item.as_ref().and_then(|i| i.error.clone()) {
        return Err((ErrorStage::Fetch, Box::new(std::io::Error::other(reason))));
    }
    if input.parts.is_empty() && input.item.is_none() {
        open_single(ctx, input).await
    } else {
        open_parts(ctx, input).await
    }
}

/// Reads every chip of a scene into `tx`; a failure becomes one error row for
/// the input, after the chips read before it.
pub(crate) async fn produce_scene(
    ctx: Arc<SceneContext>,
    input: TaskInput,
    tx: mpsc::Sender<Item>,
) {
    match open_input(&ctx.opener(), &input).await {
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
        if let (Some(max), Some(cloud)) = (ctx.tiling.max_cloud, chip.cloud_fraction) {
            // Before preprocessing: a dropped chip costs its read, nothing more.
            if cloud > max {
                ctx.cloudy_dropped.fetch_add(1, Ordering::Relaxed);
                crate::metrics::global().cloudy_chips_dropped.inc_by(1);
                continue;
            }
        }
        let item = match prepared(&ctx.pre, input, chip).await {
            Ok(p) => Ok(p),
            Err(e) => {
                let _ = tx
                    .send(Err(input_error(input, ErrorStage::Preprocess, e)))
                    .await;
                return;
            }
        };
        if tx.send(item).await.is_err() {
            return;
        }
    }
}

/// A scene's chip of `input` ready for the model: its image preprocessed
/// (on the blocking pool), its place and fractions as the chip has them.
pub(crate) async fn prepared(
    pre: &Arc<Preprocessor>,
    input: &TaskInput,
    chip: SceneChip,
) -> Result<Prepared, Box<dyn std::error::Error + Send + Sync>> {
    let pixels = preprocess(pre, chip.rgb).await?;
    Ok(Prepared {
        input: input.clone(),
        window: chip.window,
        valid_fraction: chip.valid_fraction,
        crs: chip.crs,
        footprint: chip.footprint,
        centre: chip.centre,
        pixels,
        cloud_fraction: chip.cloud_fraction,
        cell: chip.cell,
        identity: None,
        queued: crate::metrics::global().queue_chips.hold(1),
    })
}

/// The resized 8-bit image the model takes, on the blocking pool.
pub(crate) async fn preprocess(
    pre: &Arc<Preprocessor>,
    rgb: rsembed_raster::pixels::Rgb8,
) -> Result<Vec<u8>, Box<dyn std::error::Error + Send + Sync>> {
    let pre = pre.clone();
    match tokio::task::spawn_blocking(move || pre.run(&rgb)).await {
        Ok(Ok(p)) => Ok(p),
        Ok(Err(e)) => Err(Box::new(e)),
        Err(join) => Err(Box::new(std::io::Error::other(format!(
            "preprocess panicked: {join}"
        )))),
    }
}
