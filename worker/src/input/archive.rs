//! The archive path of the task runner: a tar (or tar.gz) input is streamed
//! from storage, never unpacked to disk. A PNG or JPEG member becomes one
//! chip; a TIFF member is read from memory by the same scene reader as a TIFF
//! file, so it yields the rows that file would (its grid, nodata, stretch and
//! footprints), with `<archive>#<member>` as their source.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use rsembed_raster::image::{decode_rgb8, is_tiff_content, DecodeLimits};
use rsembed_raster::tar::{member_uri, walk, Entry, TarLimits};
use rsembed_schemas::chip::ErrorStage;
use rsembed_schemas::ids::Window;
use rsembed_schemas::task::TaskInput;
use tokio::sync::mpsc;

use crate::context::Counters;
use crate::input::scene::{produce_member_scene, SceneContext};
use crate::input::{input_error, Item, Prepared};
use crate::preprocess::Preprocessor;
use crate::sink::rows::ErrorRow;
use crate::store::StoreCache;

/// What the archive path needs besides the input.
pub(crate) struct ArchiveContext {
    /// Stores for input URIs.
    pub stores: StoreCache,
    /// Model preprocessing.
    pub pre: Arc<Preprocessor>,
    /// Counters for progress and bytes read.
    pub counters: Arc<Counters>,
    /// Decoder bounds for members.
    pub limits: DecodeLimits,
    /// How TIFF members are read: tiling, `--scale`, TIFF limits.
    pub scene: Arc<SceneContext>,
}

fn member_error(uri: String, stage: ErrorStage, error: String) -> Item {
    tracing::warn!(uri = %uri, stage = stage.as_str(), cause = %error, "archive member failed");
    Err(ErrorRow {
        source_uri: uri,
        stage,
        error,
        store: None,
        cause: None,
    })
}

/// A blocking reader of an archive's bytes as they stream in (counted in
/// `counters.bytes_read`), for [`walk`] on a blocking thread, and the tar
/// limits of a task's decode limits: how a task and `search --html` read an
/// archive alike.
pub(crate) fn tar_reader(
    got: object_store::GetResult,
    counters: &Counters,
    limits: &DecodeLimits,
) -> (impl std::io::Read + Send + 'static, TarLimits) {
    let counted = counters.bytes_read.clone();
    let stream = got
        .into_stream()
        .inspect_ok(move |b| {
            counted.fetch_add(b.len() as u64, Ordering::Relaxed);
        })
        .map_err(std::io::Error::other);
    let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(stream));
    let limits = TarLimits {
        max_member_bytes: limits.max_alloc,
        ..TarLimits::default()
    };
    (reader, limits)
}

/// Streams one archive into `tx`: a chip per image member, an error row per
/// rejected or undecodable member, and one for the archive if it breaks off.
pub(crate) async fn produce_archive(
    ctx: Arc<ArchiveContext>,
    input: TaskInput,
    tx: mpsc::Sender<Item>,
) {
    let loc = match ctx.stores.location(&input.uri) {
        Ok(l) => l,
        Err(e) => {
            let _ = tx
                .send(Err(input_error(&input, ErrorStage::Fetch, e)))
                .await;
            return;
        }
    };
    let got = match loc.store.get(&loc.prefix).await {
        Ok(g) => g,
        Err(e) => {
            let _ = tx
                .send(Err(input_error(&input, ErrorStage::Fetch, e)))
                .await;
            return;
        }
    };
    let (reader, limits) = tar_reader(got, &ctx.counters, &ctx.limits);
    let archive = input.clone();
    let ctx2 = ctx.clone();
    let tx2 = tx.clone();
    let runtime = tokio::runtime::Handle::current();
    // The tar walk is synchronous; it runs on a blocking thread and hands each
    // chip to the async side through the same bounded channel as every input.
    let walked = tokio::task::spawn_blocking(move || {
        walk(reader, limits, |entry| {
            let item = match entry {
                Entry::Rejected { path, reason } => {
                    member_error(member_uri(&archive.uri, &path), ErrorStage::Decode, reason)
                }
                Entry::Image(m) if is_tiff_content(&m.data) => {
                    let member = TaskInput {
                        uri: member_uri(&archive.uri, &m.path),
                        size: m.data.len() as u64,
                        version: archive.version.clone(),
                        chips: None,
                        parts: vec![],
                        item: None,
                    };
                    // The scene reader is async; over bytes in memory it never
                    // waits on I/O, and this blocking thread may wait on the
                    // runtime (chips go out through the bounded channel).
                    let scene = ctx2.scene.clone();
                    let data = bytes::Bytes::from(m.data);
                    runtime.block_on(produce_member_scene(scene, member, data, tx2.clone()));
                    return match tx2.is_closed() {
                        true => Err("task dropped".to_owned()),
                        false => Ok(()),
                    };
                }
                Entry::Image(m) if !ctx2.scene.tiling.align.is_scene() => member_error(
                    member_uri(&archive.uri, &m.path),
                    ErrorStage::Decode,
                    crate::input::NOT_ON_A_LATTICE.to_owned(),
                ),
                Entry::Image(m) => {
                    let uri = member_uri(&archive.uri, &m.path);
                    match decode_rgb8(&m.data, ctx2.limits) {
                        Err(e) => member_error(uri, ErrorStage::Decode, crate::error::chain(&e)),
                        Ok(img) => match ctx2.pre.run(&img) {
                            Err(e) => member_error(uri, ErrorStage::Preprocess, e.to_string()),
                            Ok(pixels) => Ok(Prepared {
                                input: TaskInput {
                                    uri,
                                    size: m.data.len() as u64,
                                    version: archive.version.clone(),
                                    chips: None,
                                    parts: vec![],
                                    item: None,
                                },
                                window: Window {
                                    x: 0,
                                    y: 0,
                                    width: img.width as i32,
                                    height: img.height as i32,
                                },
                                valid_fraction: 1.0,
                                crs: None,
                                footprint: None,
                                centre: None,
                                pixels,
                                cloud_fraction: None,
                                cell: None,
                                identity: None,
                                queued: crate::metrics::global().queue_chips.hold(1),
                            }),
                        },
                    }
                }
            };
            tx2.blocking_send(item)
                .map_err(|_| "task dropped".to_owned())
        })
    })
    .await;
    let failure = match walked {
        Ok(Ok(_stats)) => None,
        Ok(Err(e)) => Some(crate::error::chain(&e)),
        Err(join) => Some(format!("archive reader panicked: {join}")),
    };
    if let Some(message) = failure {
        let e = std::io::Error::other(message);
        let _ = tx
            .send(Err(input_error(&input, ErrorStage::Decode, e)))
            .await;
    }
}
