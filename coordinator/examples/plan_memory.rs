//! Coordinator memory while planning N small objects: the planner must stream
//! the listing, so peak RSS may not grow with N.
//!
//! ```text
//! cargo run --release -p rsembed-coordinator --example plan_memory -- 1000000 [TASK_SIZE]
//! ```
//!
//! The store is synthetic: its listing generates `chips/{i:07}.png` on the fly
//! and holds nothing, so whatever RSS grows by is the planner's. Run each N in
//! a fresh process; VmHWM is a per-process high-water mark.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use rsembed_coordinator::job::plan::{plan, Grouping, ListStats, Sharding, Source};
use rsembed_raster::tiff::TiffLimits;
use rsembed_schemas::job::TilingSpec;
use rsembed_schemas::task::Task;
use rsembed_worker::store::{Location, StoreCache};
use tokio::sync::mpsc;

const PREFIX: &str = "chips";

#[derive(Debug)]
struct Synthetic {
    n: u64,
}

impl fmt::Display for Synthetic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Synthetic({})", self.n)
    }
}

fn meta(i: u64) -> ObjectMeta {
    ObjectMeta {
        location: Path::from(format!("{PREFIX}/{i:07}.png")),
        last_modified: Default::default(),
        size: 1000,
        e_tag: Some(format!("\"{i:032x}\"")),
        version: None,
    }
}

fn not_implemented(op: &str) -> object_store::Error {
    object_store::Error::NotImplemented {
        operation: op.into(),
        implementer: "Synthetic".into(),
    }
}

impl Synthetic {
    fn index_of(&self, p: &Path) -> Option<u64> {
        let i: u64 = p
            .as_ref()
            .strip_prefix(PREFIX)?
            .strip_prefix('/')?
            .strip_suffix(".png")?
            .parse()
            .ok()?;
        (i < self.n).then_some(i)
    }
}

#[async_trait::async_trait]
impl ObjectStore for Synthetic {
    async fn put_opts(
        &self,
        _: &Path,
        _: PutPayload,
        _: PutOptions,
    ) -> object_store::Result<PutResult> {
        Err(not_implemented("put_opts"))
    }

    async fn put_multipart_opts(
        &self,
        _: &Path,
        _: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(not_implemented("put_multipart_opts"))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if !options.head {
            return Err(not_implemented("get_opts"));
        }
        let Some(i) = self.index_of(location) else {
            return Err(object_store::Error::NotFound {
                path: location.to_string(),
                source: "no such synthetic object".into(),
            });
        };
        let meta = meta(i);
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream::empty().boxed()),
            range: 0..meta.size,
            meta,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }

    fn delete_stream(
        &self,
        _: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        stream::once(async { Err(not_implemented("delete_stream")) }).boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let all = prefix.is_none_or(|p| p.as_ref().is_empty() || p.as_ref() == PREFIX);
        let n = if all { self.n } else { 0 };
        stream::iter(0..n).map(|i| Ok(meta(i))).boxed()
    }

    async fn list_with_delimiter(&self, _: Option<&Path>) -> object_store::Result<ListResult> {
        Err(not_implemented("list_with_delimiter"))
    }

    async fn copy_opts(&self, _: &Path, _: &Path, _: CopyOptions) -> object_store::Result<()> {
        Err(not_implemented("copy_opts"))
    }
}

/// `VmHWM` (peak resident set) in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status")
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .expect("usage: plan_memory N [TASK_SIZE]");
    let task_size: usize = args.next().map_or(64, |s| s.parse().expect("TASK_SIZE"));
    let before = peak_rss_kib();
    let loc = Location {
        store: Arc::new(Synthetic { n }),
        prefix: Path::from(PREFIX),
        url: format!("s3://synthetic/{PREFIX}").parse().expect("a URL"),
    };
    // Sharding as `submit` passes it; the objects are far below shard_bytes,
    // so no header is read.
    let sharding = Sharding {
        stores: StoreCache::default(),
        tiling: TilingSpec {
            chip_size: 224,
            stride: 224,
            bands: vec![1, 2, 3],
            scale: "auto".into(),
            min_valid: None,
            band_files: None,
            assets: None,
            cloud_mask: None,
            max_cloud: None,
            footprint_tolerance: Some(rsembed_schemas::job::DEFAULT_FOOTPRINT_TOLERANCE),
            embedding_type: Default::default(),
            align: Default::default(),
            windows: None,
            schema_version: rsembed_schemas::SCHEMA_VERSION,
        },
        min_bytes: 16 << 20,
        limits: TiffLimits::default(),
        estimate: false,
    };
    let stats = Arc::new(ListStats::default());
    let (tx, mut rx) = mpsc::channel::<Task>(256);
    let started = Instant::now();
    let planner = tokio::spawn(plan(
        sharding.stores.clone(),
        Source::Listing(loc),
        "0123456789abcdef0123456789abcdef".into(),
        Grouping::files(task_size),
        Some(sharding),
        stats.clone(),
        tx,
    ));
    let (mut tasks, mut inputs) = (0u64, 0u64);
    while let Some(t) = rx.recv().await {
        tasks += 1;
        inputs += t.inputs.len() as u64;
    }
    planner.await.expect("planner").expect("plan");
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(inputs, n);
    assert_eq!(stats.inputs.load(Ordering::Relaxed), n);
    let peak = peak_rss_kib();
    println!(
        "objects {n:>9}  tasks {tasks:>7}  seconds {secs:>6.2}  objects/s {:>9.0}  peak RSS {:>6.1} MiB (at start {:.1} MiB)",
        n as f64 / secs,
        peak as f64 / 1024.0,
        before as f64 / 1024.0
    );
}
