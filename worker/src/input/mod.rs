//! Reading inputs: each task input is fetched, decoded and preprocessed into
//! chips ready for the model (`Prepared`), or into an error row naming the
//! input and the cause; both go to the batcher ([`crate::batch`]) as `Item`s.
//!
//! A whole image (`input/image.rs`) is one chip; a TIFF scene (`input/scene.rs`) and a tar
//! archive (`input/archive.rs`) are read chip by chip. A STAC item is a scene
//! of its assets, or a whole image when its one asset is a PNG or JPEG.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::StreamExt;
use object_store::ObjectStoreExt;
use rsembed_raster::geo::Footprint;
use rsembed_schemas::chip::ErrorStage;
use rsembed_schemas::ids::Window;
use rsembed_schemas::task::TaskInput;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::context::{Counters, JobContext};
use crate::error::chain;
use crate::metrics::Held;
use crate::preprocess::Preprocessor;
use crate::retry::hint_in_chain;
use crate::sink::rows::ErrorRow;
use crate::store::StoreCache;
use rsembed_raster::image::DecodeLimits;
use rsembed_raster::tiff::TiffLimits;

/// The one place that decides an input's kind (defined with the readers, so
/// the tar reader's member filter uses it too).
pub use rsembed_raster::kind::InputKind;

mod archive;
pub mod chip;
mod image;
pub(crate) mod scene;

pub use chip::{ChipError, ChipReader};

/// The error record of a whole image (PNG, JPEG) in an `--align crs` job.
pub(crate) const NOT_ON_A_LATTICE: &str =
    "--align crs: the image is not georeferenced (a PNG or JPEG), so it has no place on a \
     CRS lattice";

/// What the input stage sends on: a chip ready for the model, or an error row.
pub(crate) type Item = std::result::Result<Prepared, ErrorRow>;

/// One chip ready for the model.
pub(crate) struct Prepared {
    pub(crate) input: TaskInput,
    pub(crate) window: Window,
    pub(crate) valid_fraction: f32,
    pub(crate) crs: Option<String>,
    pub(crate) footprint: Option<Footprint>,
    /// Lon/lat of the window's centre (it may lie on Earth when a corner
    /// does not, and the footprint is `None`).
    pub(crate) centre: Option<[f64; 2]>,
    /// Share of the valid pixels the `--cloud-mask` marks as cloud.
    pub(crate) cloud_fraction: Option<f32>,
    /// The chip's cell of the CRS lattice (`--align crs`).
    pub(crate) cell: Option<String>,
    /// The resized 8-bit image, HWC ([`crate::preprocess::Preprocessor::run`]).
    pub(crate) pixels: Vec<u8>,
    /// A composite's row (`--composite median`), which is no chip of
    /// `input`: its own `chip_id` and item columns. `None` for a scene's chip.
    pub(crate) identity: Option<Box<RowIdentity>>,
    /// Counts the chip in [`metrics::names::QUEUE_CHIPS`] until it is sent to
    /// the engine (or dropped with its task).
    pub(crate) queued: Held<'static>,
}

/// What names a composite's row instead of its input.
pub(crate) struct RowIdentity {
    /// The row's `chip_id`.
    pub(crate) chip_id: String,
    /// Its item columns.
    pub(crate) stac: rsembed_schemas::chip_file::rows::StacColumns,
}

/// What the readers of one task counted besides chips and error rows.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ReadStats {
    /// Chips left out because their cloud fraction exceeds `--max-cloud`.
    pub(crate) cloudy_chips_dropped: u64,
}

/// What the readers of a task take from the runner that starts them.
pub(crate) struct Readers<'a> {
    /// Stores for input URIs.
    pub(crate) stores: &'a StoreCache,
    /// Model preprocessing.
    pub(crate) pre: &'a Arc<Preprocessor>,
    /// Decoder bounds for whole images.
    pub(crate) limits: DecodeLimits,
    /// Counters for progress.
    pub(crate) counters: &'a Arc<Counters>,
    /// Inputs decoded at once.
    pub(crate) decode_concurrency: usize,
    /// Reader bounds for TIFF scenes.
    pub(crate) tiff_limits: &'a TiffLimits,
}

/// Starts reading `inputs` into `tx`, `decode_concurrency` at once; the
/// task ends when the returned handle does and `tx` is closed.
pub(crate) fn spawn_readers(
    runner: &Readers<'_>,
    job: &JobContext,
    inputs: Vec<TaskInput>,
    tx: mpsc::Sender<Item>,
) -> tokio::task::JoinHandle<ReadStats> {
    let stores = runner.stores.clone();
    let pre = runner.pre.clone();
    let limits = runner.limits;
    let counters = runner.counters.clone();
    let conc = runner.decode_concurrency.max(1);
    let scene_ctx = Arc::new(scene::SceneContext {
        stores: stores.clone(),
        pre: pre.clone(),
        counters: counters.clone(),
        tiling: job.file_meta.tiling.clone(),
        scale: job.scale,
        limits: runner.tiff_limits.clone(),
        cloudy_dropped: Default::default(),
    });
    let stats_ctx = scene_ctx.clone();
    let archive_ctx = Arc::new(archive::ArchiveContext {
        stores: stores.clone(),
        pre: pre.clone(),
        counters: counters.clone(),
        limits,
        scene: scene_ctx.clone(),
    });
    tokio::spawn(
        async move {
            // Unordered: a slow input must not hold back the others.
            // Rows are sorted before writing, so files stay deterministic.
            let mut s = futures::stream::iter(inputs)
                .map(move |input| {
                    let tx = tx.clone();
                    let stores = stores.clone();
                    let pre = pre.clone();
                    let counters = counters.clone();
                    let scene_ctx = scene_ctx.clone();
                    let archive_ctx = archive_ctx.clone();
                    async move {
                        // The planner sends only inputs; any other name is
                        // decoded as an image, which sniffs its content and
                        // names the input in its error when it is none. A
                        // STAC item is a scene whatever its URI ends with,
                        // unless its one asset is a whole image.
                        let kind = if input.item.is_some() {
                            item_kind(&stores, &input).await
                        } else {
                            InputKind::of(&input.uri).unwrap_or(InputKind::Image)
                        };
                        match kind {
                            InputKind::Archive => {
                                archive::produce_archive(archive_ctx, input, tx).await
                            }
                            InputKind::Scene => scene::produce_scene(scene_ctx, input, tx).await,
                            InputKind::Image if !scene_ctx.tiling.align.is_scene() => {
                                let e = std::io::Error::other(NOT_ON_A_LATTICE);
                                let _ = tx
                                    .send(Err(input_error(&input, ErrorStage::Decode, e)))
                                    .await;
                            }
                            InputKind::Image => {
                                let item =
                                    image::prepare(stores, pre, limits, counters.clone(), input)
                                        .await;
                                // A closed channel means the task is being dropped.
                                let _ = tx.send(item).await;
                            }
                        }
                        counters.inputs.fetch_add(1, Ordering::Relaxed);
                    }
                })
                .buffer_unordered(conc);
            while s.next().await.is_some() {}
            ReadStats {
                cloudy_chips_dropped: stats_ctx.cloudy_dropped.load(Ordering::Relaxed),
            }
        }
        .in_current_span(),
    )
}

/// How a STAC item is read: a scene of its assets, or (its one selected
/// asset a PNG or JPEG, by the href's name, else by the first bytes not being
/// a TIFF's) a whole image, embedded exactly as the same file in a folder is,
/// with the item's columns. An asset the store cannot give goes the scene's
/// way, which records the store's error.
pub(crate) async fn item_kind(stores: &StoreCache, input: &TaskInput) -> InputKind {
    let Some(item) = input.item.as_deref() else {
        return InputKind::Scene;
    };
    let [part] = &input.parts[..] else {
        return InputKind::Scene;
    };
    if item.error.is_some() || item.mask.is_some() || input.chips.is_some() {
        return InputKind::Scene;
    }
    match InputKind::of(&part.uri) {
        Some(InputKind::Image) => InputKind::Image,
        Some(_) => InputKind::Scene,
        None => {
            let head = async {
                let loc = stores.location(&part.uri).ok()?;
                loc.store.get_range(&loc.prefix, 0..8).await.ok()
            };
            match head.await {
                Some(b) if !b.is_empty() && !rsembed_raster::image::is_tiff_content(&b) => {
                    InputKind::Image
                }
                _ => InputKind::Scene,
            }
        }
    }
}

/// The object an input's bytes are read from: a STAC item's one asset, else
/// the input itself.
pub(crate) fn object_uri(input: &TaskInput) -> &str {
    match (&input.item, &input.parts[..]) {
        (Some(_), [part]) => &part.uri,
        _ => &input.uri,
    }
}

/// One input's failure as its error row, with the hint decided here: an
/// input the store could not give us (a store error in the chain: the
/// store's failure, which says nothing about the content) keeps its error,
/// so the batcher can fail the task with it as the source.
pub(crate) fn input_error(
    input: &TaskInput,
    stage: ErrorStage,
    err: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> ErrorRow {
    let err = err.into();
    let message = chain(&*err);
    let store = hint_in_chain(&*err);
    tracing::warn!(uri = %input.uri, stage = stage.as_str(), cause = %message, store_failed = store.is_some(), "input failed");
    ErrorRow {
        source_uri: input.uri.clone(),
        stage,
        error: message,
        store,
        cause: store.is_some().then_some(err),
    }
}
