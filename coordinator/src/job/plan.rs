//! Planning: list the input as a stream and cut it into deterministic tasks.
//!
//! The listing is never held whole: inputs flow through a bounded channel into
//! task groups, and each finished group is sent on as a task. Order is
//! lexicographic by path, as object stores list, so a plan made twice is the
//! same plan. `plan/measure.rs` sizes each input on the way: the chip blocks
//! of a large scene, and for `rsembed plan` every scene's chips and bytes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use object_store::{ObjectMeta, ObjectStoreExt};
use rsembed_raster::tiff::TiffLimits;
use rsembed_schemas::job::{GroupingSpec, StacSearch, TilingSpec};
use rsembed_schemas::task::{ends_group, BandFile, ItemInfo, Task, TaskInput};
use rsembed_worker::input::InputKind;
use rsembed_worker::store::{Location, StoreCache};
use tokio::sync::mpsc;

use crate::error::{Error, Result};
use crate::stac::scene::{scene_of, Selection};

mod measure;
mod windows;
use crate::stac::source::{stream_items, Found, SourceStats, StacInput};
pub use measure::Sharding;
use measure::{measure, Measure, MEASURE_IN_FLIGHT};
pub use windows::WindowCount;
use windows::{Placed, WindowPlan};

/// How inputs are grouped into tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grouping {
    /// Inputs per task, on average (content-defined boundaries).
    pub files: usize,
    /// A task also ends once its inputs reach this many bytes.
    pub bytes: u64,
    /// Chips per task of a split scene, about.
    pub chips: usize,
}

impl Grouping {
    /// How a job's recorded grouping groups its inputs.
    pub fn of(g: &rsembed_schemas::job::GroupingSpec) -> Grouping {
        Grouping {
            files: g.task_files.max(1) as usize,
            bytes: g.task_bytes.max(1),
            chips: g.task_chips.max(1) as usize,
        }
    }

    /// `files` inputs (and chips) per task, no byte cap.
    pub fn files(files: usize) -> Grouping {
        Grouping {
            files,
            bytes: u64::MAX,
            chips: files,
        }
    }
}

/// What a job reads: a listing of a folder or prefix, or the items a STAC
/// input selects.
pub enum Source {
    /// Objects under a URL, grouped by name.
    Listing(Location),
    /// A STAC API search, catalog or item collection.
    Stac(Box<StacSource>),
}

/// A STAC input, its search and the job's asset selection.
pub struct StacSource {
    /// The API, catalog or item collection.
    pub input: StacInput,
    /// What to select from it.
    pub search: StacSearch,
    /// Which assets make the scene.
    pub selection: Selection,
}

/// Counts of what the listing saw.
#[derive(Debug, Default)]
pub struct ListStats {
    /// Inputs planned: files, band-file scenes, STAC items (each selected
    /// item is one input, the unreadable ones included).
    pub inputs: AtomicU64,
    /// Bytes of the planned inputs, as far as the planner knows them.
    pub bytes: AtomicU64,
    /// Objects left out because their extension is not an image's.
    pub skipped: AtomicU64,
    /// Tasks planned.
    pub tasks: AtomicU64,
    /// Scenes split into chip blocks.
    pub sharded_scenes: AtomicU64,
    /// Grid chips of the split scenes (chips without a valid pixel are dropped later).
    pub sharded_chips: AtomicU64,
    /// Grid chips of every input whose size the planner knows (from
    /// `proj:shape` or a header; a whole image is one, an item that is an
    /// error record none), before chips are dropped for nodata,
    /// `--min-valid` or `--max-cloud`.
    pub measured_chips: AtomicU64,
    /// Inputs whose chips the planner does not know (archives, headers not
    /// read or unreadable).
    pub unmeasured: AtomicU64,
    /// The listing has ended: `inputs` is the plan's total.
    pub listed: std::sync::atomic::AtomicBool,
    /// For a STAC input: documents, pages and items read, filtered, repeated.
    pub stac: SourceStats,
    /// A windowed job's items that no window holds (or without a time).
    pub outside_windows: AtomicU64,
    /// A windowed job's tasks, one a window with an acquisition, once the
    /// listing has ended.
    pub windows: std::sync::Mutex<Vec<WindowCount>>,
}

fn is_image_name(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    if base.starts_with('.') {
        // Dotfiles: macOS `._x.jpg` resource forks, editor swap files.
        return false;
    }
    InputKind::of(base).is_some()
}

/// `source_version`: the ETag where the store has one, else size + modification time.
///
/// Local files use size + mtime even though object_store makes an ETag for them,
/// because that ETag includes the inode, which changes when a dataset is copied.
fn version_of(loc: &Location, meta: &ObjectMeta) -> String {
    match (&meta.e_tag, loc.is_local()) {
        (Some(tag), false) => tag.trim_matches('"').to_owned(),
        _ => format!(
            "{}-{}",
            meta.size,
            meta.last_modified.timestamp_nanos_opt().unwrap_or_default()
        ),
    }
}

fn input_of(loc: &Location, meta: &ObjectMeta) -> TaskInput {
    TaskInput {
        uri: loc.uri_of(&meta.location),
        size: meta.size,
        version: Some(version_of(loc, meta)),
        chips: None,
        parts: vec![],
        item: None,
    }
}

/// Lists the inputs under `loc` in lexicographic order into `tx`.
async fn list(loc: &Location, stats: &ListStats, tx: mpsc::Sender<TaskInput>) -> Result<()> {
    let send = |meta: ObjectMeta| {
        let tx = tx.clone();
        async move {
            if !is_image_name(meta.location.as_ref()) {
                stats.skipped.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            stats.inputs.fetch_add(1, Ordering::Relaxed);
            tx.send(input_of(loc, &meta))
                .await
                .map_err(|_| Error::Cancelled)
        }
    };
    if loc.is_http() {
        // Named, so no extension filter: the worker reads the content.
        let meta = http_file(loc).await?;
        stats.inputs.fetch_add(1, Ordering::Relaxed);
        return tx
            .send(input_of(loc, &meta))
            .await
            .map_err(|_| Error::Cancelled);
    }
    // A single object is an input of its own.
    if !loc.prefix.as_ref().is_empty() {
        if let Ok(meta) = loc.store.head(&loc.prefix).await {
            let is_dir = loc.local_dir().map(|d| d.is_dir()).unwrap_or(false);
            if !is_dir {
                return send(meta).await;
            }
        }
    }
    if let Some(dir) = loc.local_dir() {
        if !dir.is_dir() {
            return Err(Error::Input(format!(
                "input {} does not exist or is not a folder or file",
                loc.url
            )));
        }
        // object_store's local listing follows readdir order; a sorted walk keeps
        // plans deterministic, reading one directory at a time.
        let (wtx, mut wrx) =
            mpsc::channel::<std::result::Result<std::path::PathBuf, walkdir::Error>>(256);
        let root = dir.clone();
        let walker = tokio::task::spawn_blocking(move || {
            let walk = walkdir::WalkDir::new(&root)
                .sort_by_file_name()
                .into_iter()
                .filter_entry(|e| {
                    e.depth() == 0 || !e.file_name().to_string_lossy().starts_with('.')
                });
            for e in walk {
                let item = match e {
                    Ok(e) if e.file_type().is_file() => Ok(e.into_path()),
                    Ok(_) => continue,
                    Err(err) => Err(err),
                };
                if wtx.blocking_send(item).is_err() {
                    break;
                }
            }
        });
        while let Some(item) = wrx.recv().await {
            let path = item.map_err(|source| Error::ListInput {
                url: loc.url.to_string(),
                source,
            })?;
            let p = object_store::path::Path::from(path.to_string_lossy().trim_start_matches('/'));
            let meta = loc.store.head(&p).await?;
            send(meta).await?;
        }
        walker.await.map_err(|source| Error::Panicked {
            what: "listing",
            source,
        })?;
        return Ok(());
    }
    let mut s = loc.store.list(Some(&loc.prefix));
    let mut listed = 0u64;
    while let Some(meta) = s.next().await {
        send(meta?).await?;
        listed += 1;
    }
    // A bucket has no folders: a mistyped prefix lists nothing, exactly as an
    // empty one does, and a job that silently embeds nothing is the worse outcome.
    if listed == 0 {
        return Err(Error::Input(format!(
            "input {} has no objects (no such prefix?)",
            loc.url
        )));
    }
    Ok(())
}

/// Streams the items of a STAC input into `tx` as scenes: one task input per
/// item; an item that cannot be read becomes an input whose error the worker
/// records.
async fn list_stac(
    stores: &StoreCache,
    src: &StacSource,
    stats: &ListStats,
    tx: mpsc::Sender<TaskInput>,
) -> Result<()> {
    let (ftx, mut frx) = mpsc::channel::<Found>(256);
    let items = stream_items(stores, &src.input, &src.search, &stats.stac, ftx);
    let scenes = async {
        while let Some(found) = frx.recv().await {
            let input = match found {
                Found::Item(f) => scene_of(&f.href, &f.base, &f.item, &src.selection),
                Found::Bad { href, id, reason } => TaskInput {
                    uri: href,
                    size: 0,
                    version: None,
                    chips: None,
                    parts: vec![],
                    item: Some(Box::new(ItemInfo {
                        id: id.unwrap_or_default(),
                        collection: None,
                        datetime: None,
                        end_datetime: None,
                        cloud_cover: None,
                        units: vec![],
                        mask: None,
                        grid: None,
                        // The source already names the item and its href.
                        proj: None,
                        error: Some(reason),
                    })),
                },
            };
            stats.inputs.fetch_add(1, Ordering::Relaxed);
            tx.send(input).await.map_err(|_| Error::Cancelled)?;
        }
        Ok::<(), Error>(())
    };
    let (a, b) = tokio::join!(items, scenes);
    a?;
    b
}

/// The one file an `http(s)://` input names.
///
/// HTTP has no listing (object_store would send a WebDAV PROPFIND, which
/// plain web servers refuse), so the URL must name a file, checked by a HEAD
/// request. A folder URL (empty path or a trailing `/`) or a web page (a
/// folder index) is refused, saying so.
async fn http_file(loc: &Location) -> Result<ObjectMeta> {
    let no_listing = |why: &str| {
        Error::Input(format!(
            "{}: {why}; HTTP has no listing, so an http(s) input must name one file \
             (an image, a TIFF or a tar archive). For a folder, read it through its \
             object store's API instead (s3://bucket/prefix, gs://, az://)",
            loc.url
        ))
    };
    if loc.prefix.as_ref().is_empty() || loc.url.path().ends_with('/') {
        return Err(no_listing("the URL names a folder"));
    }
    if loc.url.query().is_some() {
        // The store addresses objects by path: the query (a pre-signed URL's
        // signature) would be dropped from every request.
        return Err(Error::Input(format!(
            "{}: http(s) URLs with a query string (`?…`) are not supported",
            loc.url
        )));
    }
    let head = object_store::GetOptions {
        head: true,
        ..Default::default()
    };
    match loc.store.get_opts(&loc.prefix, head).await {
        Ok(r) => {
            let html = r
                .attributes
                .get(&object_store::Attribute::ContentType)
                .is_some_and(|t| t.to_ascii_lowercase().starts_with("text/html"));
            if html && !is_image_name(loc.prefix.as_ref()) {
                return Err(no_listing(
                    "it answers with a web page (a folder index?), not a file",
                ));
            }
            Ok(r.meta)
        }
        Err(object_store::Error::NotFound { .. }) => Err(Error::Input(format!(
            "{}: not found (HTTP 404 to a HEAD request)",
            loc.url
        ))),
        Err(source) => Err(Error::InputStore {
            url: loc.url.to_string(),
            source,
        }),
    }
}

/// Where a name holds one of `suffixes` as a whole word: the suffix index, and
/// the name with the suffix cut out (the scene key).
fn band_suffix(uri: &str, suffixes: &[String]) -> Option<(usize, String, String)> {
    let base_start = uri.rfind('/').map_or(0, |i| i + 1);
    let base = &uri[base_start..];
    let word = |c: Option<char>| c.is_none_or(|c| !c.is_ascii_alphanumeric());
    for (k, suf) in suffixes.iter().enumerate() {
        if let Some(p) = base.rfind(suf.as_str()) {
            let before = base[..p].chars().next_back();
            let after = base[p + suf.len()..].chars().next();
            if word(before) && word(after) && p > 0 {
                let prefix = format!("{}{}", &uri[..base_start], &base[..p]);
                let rest = base[p + suf.len()..].to_owned();
                return Some((k, prefix, rest));
            }
        }
    }
    None
}

/// Groups band files into scenes as the listing streams by. A scene is sent on
/// when all its bands are seen; incomplete ones go on at the end, and the worker
/// records which band is missing.
struct BandGrouper {
    suffixes: Vec<String>,
    pending: std::collections::BTreeMap<(String, String), Vec<Option<BandFile>>>,
}

impl BandGrouper {
    fn scene(&self, key: &(String, String), files: Vec<Option<BandFile>>) -> TaskInput {
        let parts: Vec<BandFile> = files.into_iter().flatten().collect();
        TaskInput {
            uri: format!("{}{{{}}}{}", key.0, self.suffixes.join(","), key.1),
            size: parts.iter().map(|p| p.size).sum(),
            version: Some(
                parts
                    .iter()
                    .map(|p| p.version.clone().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            chips: None,
            parts,
            item: None,
        }
    }

    /// Takes one listed input; returns a completed scene, if this completed one.
    /// `Err(())` when the input is not a band file (it is skipped).
    fn push(&mut self, input: TaskInput) -> std::result::Result<Option<TaskInput>, ()> {
        let (k, prefix, rest) = band_suffix(&input.uri, &self.suffixes).ok_or(())?;
        let n = self.suffixes.len();
        let key = (prefix, rest);
        let slot = self
            .pending
            .entry(key.clone())
            .or_insert_with(|| vec![None; n]);
        slot[k] = Some(BandFile {
            suffix: self.suffixes[k].clone(),
            uri: input.uri,
            size: input.size,
            version: input.version,
            bands: vec![],
        });
        if slot.iter().all(Option::is_some) {
            let files = self
                .pending
                .remove(&key)
                .expect("the entry was just filled");
            return Ok(Some(self.scene(&key, files)));
        }
        Ok(None)
    }

    fn finish(self) -> Vec<TaskInput> {
        self.pending
            .iter()
            .map(|(k, v)| self.scene(k, v.clone()))
            .collect()
    }
}

/// The tasks of a planner as a stream.
pub fn receiver_stream<T: Send + 'static>(
    mut rx: mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// A running planner: its tasks arrive on `tasks`; `done` ends with its result.
pub struct Planner {
    /// The tasks, in plan order.
    pub tasks: mpsc::Receiver<Task>,
    /// What the listing saw so far.
    pub stats: Arc<ListStats>,
    /// The planner's end.
    pub done: tokio::task::JoinHandle<Result<()>>,
}

/// Starts planning `input` for job `job_id` as the tiling flags ask, with
/// large scenes split (headers read through `stores`), `capacity` tasks ahead
/// of the reader.
pub fn start(
    stores: &StoreCache,
    input: Source,
    job_id: String,
    tiling: TilingSpec,
    grouping: &GroupingSpec,
    capacity: usize,
) -> Planner {
    start_with(stores, input, job_id, tiling, grouping, capacity, false)
}

/// [`start`] for `rsembed plan`: every input is measured for the estimate
/// (see [`Sharding::estimate`]); the tasks are the same.
pub fn start_dry_run(
    stores: &StoreCache,
    input: Source,
    tiling: TilingSpec,
    grouping: &GroupingSpec,
    capacity: usize,
) -> Planner {
    start_with(
        stores,
        input,
        "plan".into(),
        tiling,
        grouping,
        capacity,
        true,
    )
}

fn start_with(
    stores: &StoreCache,
    input: Source,
    job_id: String,
    tiling: TilingSpec,
    grouping: &GroupingSpec,
    capacity: usize,
    estimate: bool,
) -> Planner {
    let stats = Arc::new(ListStats::default());
    let (tx, tasks) = mpsc::channel(capacity);
    let sharding = Sharding {
        stores: stores.clone(),
        tiling,
        min_bytes: grouping.shard_bytes,
        limits: TiffLimits::default(),
        estimate,
    };
    let done = tokio::spawn(plan(
        stores.clone(),
        input,
        job_id,
        Grouping::of(grouping),
        Some(sharding),
        stats.clone(),
        tx,
    ));
    Planner { tasks, stats, done }
}

impl ListStats {
    /// A windowed job's acquisitions left out of a task by `--max-scenes`,
    /// over every window planned so far.
    pub fn dropped_past_max_scenes(&self) -> u64 {
        self.windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|w| w.dropped)
            .sum()
    }
}

/// Streams the tasks of a job into `tasks`. Returns when the listing is done.
///
/// With `sharding`, a large georeferenced TIFF becomes tasks of its own, one per
/// block of about `grouping.chips` chips; every other input is grouped with its
/// neighbours: about `grouping.files` a task, and never past `grouping.bytes`
/// (after the input that reaches it).
pub async fn plan(
    stores: StoreCache,
    source: Source,
    job_id: String,
    grouping: Grouping,
    sharding: Option<Sharding>,
    stats: Arc<ListStats>,
    tasks: mpsc::Sender<Task>,
) -> Result<()> {
    let window_plan = match (
        &source,
        sharding.as_ref().and_then(|s| s.tiling.windows.as_ref()),
    ) {
        (Source::Stac(src), Some(w)) => {
            let t = &sharding
                .as_ref()
                .expect("windows come with sharding")
                .tiling;
            Some(WindowPlan::new(
                w,
                src.search.datetime.as_deref(),
                t.chip_size,
                t.stride,
                grouping.chips,
            )?)
        }
        _ => None,
    };
    let (itx, mut irx) = mpsc::channel::<TaskInput>(1024);
    // An item is a scene already: no band-file grouping.
    let band_files = match &source {
        Source::Listing(_) => sharding.as_ref().and_then(|s| s.tiling.band_files.clone()),
        Source::Stac(_) => None,
    };
    let lister = {
        let stats = stats.clone();
        async move {
            match &source {
                Source::Listing(loc) => list(loc, &stats, itx).await,
                Source::Stac(src) => list_stac(&stores, src, &stats, itx).await,
            }
        }
    };
    let (stx, srx) = mpsc::channel::<TaskInput>(1024);
    let scenes = {
        let stats = stats.clone();
        async move {
            let Some(suffixes) = band_files else {
                while let Some(i) = irx.recv().await {
                    stx.send(i).await.map_err(|_| Error::Cancelled)?;
                }
                return Ok::<(), Error>(());
            };
            let mut g = BandGrouper {
                suffixes,
                pending: Default::default(),
            };
            while let Some(i) = irx.recv().await {
                match g.push(i) {
                    Ok(Some(scene)) => {
                        // A scene of n files is one input.
                        stats
                            .inputs
                            .fetch_sub(scene.parts.len() as u64 - 1, Ordering::Relaxed);
                        stx.send(scene).await.map_err(|_| Error::Cancelled)?
                    }
                    Ok(None) => {}
                    Err(()) => {
                        stats.inputs.fetch_sub(1, Ordering::Relaxed);
                        stats.skipped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            for scene in g.finish() {
                let n = scene.parts.len().max(1) as u64;
                stats.inputs.fetch_sub(n - 1, Ordering::Relaxed);
                stx.send(scene).await.map_err(|_| Error::Cancelled)?;
            }
            Ok(())
        }
    };
    let task_chips = grouping.chips.max(1);
    let sharding = &sharding;
    let grouper = async {
        if let Some(plan) = window_plan {
            return group_windows(plan, srx, &job_id, grouping.files, &stats, &tasks).await;
        }
        // Owns the receiver: a grouper that stops hangs up on the scenes.
        let mut measured = std::pin::pin!(receiver_stream(srx)
            .map(|mut input| async move {
                let m = match sharding {
                    Some(sh) => measure(sh, &mut input, task_chips).await,
                    None => Measure::default(),
                };
                (input, m)
            })
            .buffered(MEASURE_IN_FLIGHT));
        let mut group = Vec::new();
        let mut group_bytes = 0u64;
        while let Some((input, m)) = measured.next().await {
            stats.bytes.fetch_add(input.size, Ordering::Relaxed);
            match m.chips {
                Some(n) => stats.measured_chips.fetch_add(n, Ordering::Relaxed),
                None => stats.unmeasured.fetch_add(1, Ordering::Relaxed),
            };
            if let Some(blocks) = m.blocks {
                stats.sharded_scenes.fetch_add(1, Ordering::Relaxed);
                for b in blocks {
                    stats.tasks.fetch_add(1, Ordering::Relaxed);
                    stats
                        .sharded_chips
                        .fetch_add(u64::from(b.cols) * u64::from(b.rows), Ordering::Relaxed);
                    let part = TaskInput {
                        chips: Some(b),
                        ..input.clone()
                    };
                    tasks
                        .send(Task::new(&job_id, vec![part]))
                        .await
                        .map_err(|_| Error::Cancelled)?;
                }
                continue;
            }
            let uri = input.uri.clone();
            group_bytes = group_bytes
                .saturating_add(input.size)
                .saturating_add(input.parts.iter().map(|p| p.size).sum());
            group.push(input);
            if ends_group(&uri, group.len(), grouping.files) || group_bytes >= grouping.bytes {
                group_bytes = 0;
                stats.tasks.fetch_add(1, Ordering::Relaxed);
                let t = Task::new(&job_id, std::mem::take(&mut group));
                tasks.send(t).await.map_err(|_| Error::Cancelled)?;
            }
        }
        if !group.is_empty() {
            stats.tasks.fetch_add(1, Ordering::Relaxed);
            tasks
                .send(Task::new(&job_id, group))
                .await
                .map_err(|_| Error::Cancelled)?;
        }
        Ok::<(), Error>(())
    };
    let (l, b, g) = tokio::join!(lister, scenes, grouper);
    stats.listed.store(l.is_ok(), Ordering::Relaxed);
    l?;
    b?;
    g
}

/// The tasks of a windowed job: a window's blocks of cells (or the whole
/// window), once every item is placed;
/// items that cannot be read are grouped as any input is, so that their
/// errors are recorded.
async fn group_windows(
    mut plan: WindowPlan,
    mut inputs: mpsc::Receiver<TaskInput>,
    job_id: &str,
    files: usize,
    stats: &ListStats,
    tasks: &mpsc::Sender<Task>,
) -> Result<()> {
    let send = |t: Task| async move {
        stats.tasks.fetch_add(1, Ordering::Relaxed);
        tasks.send(t).await.map_err(|_| Error::Cancelled)
    };
    let mut errors = Vec::new();
    while let Some(input) = inputs.recv().await {
        match plan.push(input) {
            Placed::Held => {}
            Placed::Outside => {
                stats.outside_windows.fetch_add(1, Ordering::Relaxed);
            }
            Placed::Error(input) => {
                let uri = input.uri.clone();
                errors.push(input);
                if ends_group(&uri, errors.len(), files) {
                    send(Task::new(job_id, std::mem::take(&mut errors))).await?;
                }
            }
        }
    }
    if !errors.is_empty() {
        send(Task::new(job_id, errors)).await?;
    }
    for (count, window_tasks) in plan.finish(job_id) {
        // An acquisition in several blocks' tasks is one input's bytes.
        let mut seen = std::collections::HashSet::new();
        let bytes: u64 = window_tasks
            .iter()
            .flat_map(|t| &t.inputs)
            .filter(|i| seen.insert(i.uri.as_str()))
            .map(|i| i.size)
            .sum();
        stats.bytes.fetch_add(bytes, Ordering::Relaxed);
        stats
            .unmeasured
            .fetch_add(count.acquisitions, Ordering::Relaxed);
        stats
            .windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(count);
        for task in window_tasks {
            send(task).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn band_suffixes_are_whole_words() {
        let s: Vec<String> = ["B4", "B3", "B2"].iter().map(|s| s.to_string()).collect();
        let (k, prefix, rest) = band_suffix("file:///d/LC8_B3.tif", &s).unwrap();
        assert_eq!(
            (k, prefix.as_str(), rest.as_str()),
            (1, "file:///d/LC8_", ".tif")
        );
        assert!(
            band_suffix("file:///d/LC8_B12.tif", &s).is_none(),
            "B2 is not B12"
        );
        assert!(band_suffix("file:///d/LC8_B4X.tif", &s).is_none());
        let s2: Vec<String> = ["B04".to_string()].to_vec();
        let (_, p, r) = band_suffix("s3://b/T33_B04_10m.tif", &s2).unwrap();
        assert_eq!((p.as_str(), r.as_str()), ("s3://b/T33_", "_10m.tif"));
    }

    #[test]
    fn band_grouper_waits_for_every_band() {
        let s: Vec<String> = ["B4", "B3", "B2"].iter().map(|s| s.to_string()).collect();
        let mut g = BandGrouper {
            suffixes: s,
            pending: Default::default(),
        };
        let inp = |u: &str| TaskInput {
            uri: u.into(),
            size: 10,
            version: Some("v".into()),
            chips: None,
            parts: vec![],
            item: None,
        };
        assert_eq!(g.push(inp("file:///d/x_B2.tif")), Ok(None));
        assert_eq!(g.push(inp("file:///d/x_B10.tif")), Err(()));
        assert_eq!(g.push(inp("file:///d/x_B3.tif")), Ok(None));
        assert_eq!(g.push(inp("file:///d/y_B3.tif")), Ok(None));
        let scene = g.push(inp("file:///d/x_B4.tif")).unwrap().unwrap();
        assert_eq!(scene.uri, "file:///d/x_{B4,B3,B2}.tif");
        let order: Vec<&str> = scene.parts.iter().map(|p| p.suffix.as_str()).collect();
        assert_eq!(order, ["B4", "B3", "B2"]);
        assert_eq!(scene.size, 30);
        let rest = g.finish();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].parts.len(), 1, "y is missing two bands");
    }

    #[test]
    fn selects_images_by_extension() {
        assert!(is_image_name("a/b/c.PNG"));
        assert!(is_image_name("x.jpeg"));
        assert!(is_image_name("scene.TIF"));
        assert!(!is_image_name("labels.csv"));
        assert!(!is_image_name("a/._c.jpg"));
        assert!(!is_image_name("noext"));
        assert!(is_image_name("chips/batch1.tar.gz"));
        assert!(is_image_name("x.TGZ"));
    }
}
