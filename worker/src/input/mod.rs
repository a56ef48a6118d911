//! Reading inputs: each task input is fetched, decoded and preprocessed into
//! chips ready for the model (`Prepared`), or into an error row naming the
//! input and the cause; both go to the batcher ([`crate::batch`]) as `Item`s.
//!
//! A whole image (`input/image.rs`) is one chip; a TIFF scene (`input/scene.rs`) and a tar
//! archive (`input/archive.rs`) are read chip by chip.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::StreamExt;
use rsembed_raster::geo::Footprint;
use rsembed_schemas::chip::ErrorStage;
use rsembed_schemas::ids::Window;
use rsembed_schemas::task::TaskInput;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::error::chain;
use crate::metrics::Held;
use crate::retry::store_hint;
use crate::sink::rows::ErrorRow;
use crate::task::{JobContext, TaskRunner};

mod archive;
mod image;
mod scene;

/// What an input is, by its name: the one place that decides which reader
/// takes it, for the planner (which objects of a listing are inputs) and the
/// task (which reader runs). Case-insensitive, by the name's ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// A whole image (PNG, JPEG): one chip.
    Image,
    /// A TIFF (GeoTIFF, COG, or one band file of a scene): cut into chips.
    Scene,
    /// A tar archive, plain or gzip: every image or TIFF member is read.
    Archive,
}

impl InputKind {
    /// Endings of whole images.
    pub const IMAGE: [&'static str; 3] = [".png", ".jpg", ".jpeg"];
    /// Endings of TIFF scenes.
    pub const SCENE: [&'static str; 2] = [".tif", ".tiff"];
    /// Endings of tar archives.
    pub const ARCHIVE: [&'static str; 3] = [".tar", ".tar.gz", ".tgz"];

    /// The kind of the input named `uri` (a URI or a file name); `None` for
    /// a name that is not an input (the planner skips it).
    pub fn of(uri: &str) -> Option<InputKind> {
        let lower = uri.to_ascii_lowercase();
        let ends = |endings: &[&str]| endings.iter().any(|e| lower.ends_with(e));
        if ends(&Self::ARCHIVE) {
            Some(InputKind::Archive)
        } else if ends(&Self::SCENE) {
            Some(InputKind::Scene)
        } else if ends(&Self::IMAGE) {
            Some(InputKind::Image)
        } else {
            None
        }
    }
}

/// What the input stage sends on: a chip ready for the model, or an error row.
pub(crate) type Item = std::result::Result<Prepared, ErrorRow>;

/// One chip ready for the model.
pub(crate) struct Prepared {
    pub(crate) input: TaskInput,
    pub(crate) window: Window,
    pub(crate) valid_fraction: f32,
    pub(crate) crs: Option<String>,
    pub(crate) footprint: Option<Footprint>,
    pub(crate) pixels: Vec<f32>,
    /// Counts the chip in [`metrics::names::QUEUE_CHIPS`] until it is sent to
    /// the engine (or dropped with its task).
    pub(crate) queued: Held<'static>,
}

/// Starts reading `inputs` into `tx`, [`TaskRunner::decode_concurrency`] at
/// once; the task ends when the returned handle does and `tx` is closed.
pub(crate) fn spawn_readers(
    runner: &TaskRunner,
    job: &JobContext,
    inputs: Vec<TaskInput>,
    tx: mpsc::Sender<Item>,
) -> tokio::task::JoinHandle<()> {
    let stores = runner.stores.clone();
    let pre = runner.preprocessor.clone();
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
    });
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
                        // names the input in its error when it is none.
                        match InputKind::of(&input.uri).unwrap_or(InputKind::Image) {
                            InputKind::Archive => {
                                archive::produce_archive(archive_ctx, input, tx).await
                            }
                            InputKind::Scene => scene::produce_scene(scene_ctx, input, tx).await,
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
        }
        .in_current_span(),
    )
}

/// One input's failure as its error row, with the hint decided here: an
/// input the store could not give us ([`store_hint`]) keeps its error, so
/// the batcher can fail the task with it as the source.
pub(crate) fn input_error(
    input: &TaskInput,
    stage: ErrorStage,
    err: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> ErrorRow {
    let err = err.into();
    let message = chain(&*err);
    let store = store_hint(&*err);
    tracing::warn!(uri = %input.uri, stage = stage.as_str(), cause = %message, store_failed = store.is_some(), "input failed");
    ErrorRow {
        source_uri: input.uri.clone(),
        stage,
        error: message,
        store,
        cause: store.is_some().then_some(err),
    }
}

#[cfg(test)]
mod tests {
    use super::InputKind;

    #[test]
    fn kind_by_name() {
        for (name, kind) in [
            ("s3://b/a/c.PNG", Some(InputKind::Image)),
            ("x.jpeg", Some(InputKind::Image)),
            ("x.jpg", Some(InputKind::Image)),
            ("scene.TIF", Some(InputKind::Scene)),
            ("gs://b/B4.tiff", Some(InputKind::Scene)),
            ("s3://b/x.TAR", Some(InputKind::Archive)),
            ("chips/batch1.tar.gz", Some(InputKind::Archive)),
            ("A.TGZ", Some(InputKind::Archive)),
            ("a.tar.zst", None),
            ("labels.csv", None),
            ("noext", None),
            ("tar", None),
            ("png", None),
        ] {
            assert_eq!(InputKind::of(name), kind, "{name}");
        }
    }
}
