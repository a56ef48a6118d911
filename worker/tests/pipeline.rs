//! The task runner's pipelined inference (`worker/src/task.rs`, `worker/src/batch.rs`): real
//! files, decoders, preprocessing, engine thread and Parquet writer, with a
//! slow backend standing in for ONNX Runtime so that the engine is the
//! bottleneck, as it is on a GPU.
//!
//! - while the engine runs a batch, the next one is already waiting for it;
//! - every chip gets its own embedding back (no mix-up between batches in
//!   flight), none lost or duplicated;
//! - a fatal engine error fails the task and writes no chip file;
//! - the queue gauges are back at zero afterwards.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Array, FixedSizeListArray, Float32Array, StringArray};
use rsembed_raster::image::DecodeLimits;
use rsembed_raster::scale::ScaleSpec;
use rsembed_raster::tiff::TiffLimits;
use rsembed_schemas::job::TilingSpec;
use rsembed_schemas::meta::FileMeta;
use rsembed_schemas::model::PreprocessorConfig;
use rsembed_schemas::task::{Task, TaskInput};
use rsembed_worker::batch::BATCHES_IN_FLIGHT;
use rsembed_worker::engine::handle::EngineHandle;
use rsembed_worker::engine::pool::InputPool;
use rsembed_worker::engine::{Backend, Embeddings, PixelBatch, PixelFormat, Pixels, RunHints};
use rsembed_worker::error::{Error, Result};
use rsembed_worker::metrics;
use rsembed_worker::preprocess::Preprocessor;
use rsembed_worker::sink::commit::Commit;
use rsembed_worker::store::StoreCache;
use rsembed_worker::task::{Counters, JobContext, StoreErrors, TaskRunner};

/// The queue gauges are process-wide: the tests of this file take turns.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A device that takes `delay` per batch and answers `[first pixel, 1]` per
/// image, so each row says which image it came from. It records the most
/// batches it saw at the engine (its own included) while it ran, and fails
/// its `fail_at`-th run when asked.
struct Slow {
    delay: Duration,
    runs: usize,
    fail_at: Option<usize>,
    most_at_engine: Arc<AtomicI64>,
    /// Takes 8-bit NHWC batches, as a uint8 vision entry does.
    u8: bool,
    /// Lends the batcher buffers to assemble batches in; the addresses of
    /// the lent buffers its runs were given.
    pool: Option<(InputPool, Arc<std::sync::Mutex<Vec<usize>>>)>,
}

impl Backend for Slow {
    fn run(&mut self, batch: &PixelBatch, _: RunHints) -> Result<Embeddings> {
        self.runs += 1;
        std::thread::sleep(self.delay);
        self.most_at_engine
            .fetch_max(metrics::global().queue_batches.get(), Ordering::Relaxed);
        if self.fail_at == Some(self.runs) {
            return Err(Error::Device {
                context: "run".into(),
                message: "injected failure".into(),
            });
        }
        let il = batch.image_len();
        let data = (0..batch.n)
            .flat_map(|i| [batch.data.value(i * il).unwrap(), 1.0])
            .collect();
        assert_eq!(batch.data.format(), self.pixel_format(), "batch format");
        if let (Some((_, seen)), Pixels::Leased(l)) = (&self.pool, &batch.data) {
            seen.lock().unwrap().push(l.addr());
        }
        Ok(Embeddings {
            n: batch.n,
            dim: 2,
            data,
        })
    }

    fn input_pool(&self) -> Option<InputPool> {
        self.pool.as_ref().map(|(p, _)| p.clone())
    }

    fn pixel_format(&self) -> PixelFormat {
        if self.u8 {
            PixelFormat::U8Nhwc
        } else {
            PixelFormat::F32Nchw
        }
    }
}

/// `n` uniform 20×12 PNGs, image `i` of grey level `5·i`.
fn images(dir: &Path, n: usize) -> Vec<TaskInput> {
    (0..n)
        .map(|i| {
            let p = dir.join(format!("img{i:03}.png"));
            let v = (5 * i) as u8;
            let mut e = png::Encoder::new(std::fs::File::create(&p).unwrap(), 20, 12);
            e.set_color(png::ColorType::Rgb);
            e.write_header()
                .unwrap()
                .write_image_data(&[v; 20 * 12 * 3])
                .unwrap();
            TaskInput {
                uri: format!("file://{}", p.display()),
                size: std::fs::metadata(&p).unwrap().len(),
                version: None,
                chips: None,
                parts: vec![],
                item: None,
            }
        })
        .collect()
}

fn runner(out: &Path, backend: Slow, batch_size: usize) -> (TaskRunner, JobContext) {
    let stores = StoreCache::default();
    let pre: PreprocessorConfig =
        serde_json::from_value(serde_json::json!({"size": {"height": 8, "width": 8}})).unwrap();
    let engine = EngineHandle::spawn("test-engine", 2, move || Ok(backend)).unwrap();
    let job = JobContext {
        output: stores.location(out.to_str().unwrap()).unwrap(),
        scale: ScaleSpec::Auto,
        file_meta: FileMeta {
            schema_version: 1,
            job_id: "job".into(),
            job_fingerprint: "f".repeat(32),
            task_id: String::new(),
            model_name: "slow".into(),
            model_sha256: "0".repeat(64),
            embed_dim: 2,
            tiling: TilingSpec {
                chip_size: 8,
                stride: 8,
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
            software_version: "test".into(),
            quantization: None,
        },
    };
    let runner = TaskRunner {
        stores,
        preprocessor: Arc::new(Preprocessor::new(&pre)),
        engine,
        batch_size,
        decode_concurrency: 2,
        limits: DecodeLimits::default(),
        tiff_limits: TiffLimits::default(),
        store_errors: StoreErrors::Record,
        commit: Commit::Overwrite,
        counters: Arc::new(Counters::default()),
    };
    (runner, job)
}

/// `(source_uri, first embedding value)` of every row of a chip file, in file order.
fn read_rows(path: &Path) -> Vec<(String, f32)> {
    let bytes = bytes::Bytes::from(std::fs::read(path).unwrap());
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
        .unwrap()
        .build()
        .unwrap();
    let mut rows = Vec::new();
    for b in reader {
        let b = b.unwrap();
        let uris = b
            .column_by_name("source_uri")
            .unwrap()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .clone();
        let emb = b
            .column_by_name("embedding")
            .unwrap()
            .as_any()
            .downcast_ref::<FixedSizeListArray>()
            .unwrap()
            .clone();
        for i in 0..b.num_rows() {
            let e = emb.value(i);
            let e = e.as_any().downcast_ref::<Float32Array>().unwrap();
            rows.push((uris.value(i).to_owned(), e.value(0)));
        }
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_batch_waits_at_the_engine_and_every_chip_keeps_its_embedding() {
    let _serial = SERIAL.lock().await;
    let tmp = tempfile::tempdir().unwrap();
    let inputs = images(tmp.path(), 30);
    let most = Arc::new(AtomicI64::new(0));
    let backend = Slow {
        delay: Duration::from_millis(80),
        runs: 0,
        fail_at: None,
        most_at_engine: most.clone(),
        u8: false,
        pool: None,
    };
    let out = tmp.path().join("out");
    let (r, job) = runner(&out, backend, 4);
    let task = Task::new("job", inputs.clone());
    let report = r.run(&job, &task).await.unwrap();

    assert_eq!(report.chips_file.rows, 30);
    assert!(report.failures.is_empty());
    assert_eq!(r.counters.chips.load(Ordering::Relaxed), 30);
    let seen = most.load(Ordering::Relaxed);
    assert!(
        seen >= 2,
        "while a batch runs, the next one is already at the engine: saw {seen}"
    );
    assert!(seen <= BATCHES_IN_FLIGHT as i64, "bounded: saw {seen}");

    let rows = read_rows(&out.join(task.chips_path()));
    let mut uris: Vec<&str> = rows.iter().map(|(u, _)| u.as_str()).collect();
    let sorted = {
        let mut s = uris.clone();
        s.sort();
        s
    };
    assert_eq!(uris, sorted, "rows in source order");
    uris.dedup();
    assert_eq!(uris.len(), 30, "no chip lost or duplicated");
    for (uri, got) in &rows {
        let i: usize = uri.rsplit("img").next().unwrap()[..3].parse().unwrap();
        // SigLIP normalisation of grey level 5·i: (v/255 − 0.5)/0.5.
        let want = ((5 * i) as f32 / 255.0 - 0.5) / 0.5;
        assert!((got - want).abs() < 1e-5, "{uri}: {got} != {want}");
    }
    let m = metrics::global();
    assert_eq!(m.queue_chips.get(), 0);
    assert_eq!(m.queue_batches.get(), 0);
    assert_eq!(m.queue_tasks.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_engine_error_fails_the_task_and_writes_nothing() {
    let _serial = SERIAL.lock().await;
    let tmp = tempfile::tempdir().unwrap();
    let inputs = images(tmp.path(), 20);
    let backend = Slow {
        delay: Duration::from_millis(10),
        runs: 0,
        fail_at: Some(2),
        most_at_engine: Arc::default(),
        u8: false,
        pool: None,
    };
    let out = tmp.path().join("out");
    let (r, job) = runner(&out, backend, 4);
    let task = Task::new("job", inputs);
    let err = r.run(&job, &task).await.unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
    assert!(!out.join(task.chips_path()).exists());
    assert!(!out.join(task.errors_path()).exists());
    // Dropped with the task: the gauges come back once the producer and the
    // engine have let go of what they held.
    let m = metrics::global();
    for _ in 0..100 {
        if m.queue_chips.get() == 0 && m.queue_batches.get() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(m.queue_chips.get(), 0);
    assert_eq!(m.queue_batches.get(), 0);
    assert_eq!(m.queue_tasks.get(), 0);
}

/// A pull worker's input that its store cannot give (listed, then missing)
/// fails the task with the store error as its typed source and hint `Later`,
/// so the queue redelivers it; an input whose content is bad stays an error
/// row (no store failure) and the task completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_input_fails_the_task_with_its_store_error_and_bad_content_is_a_row() {
    use rsembed_worker::retry::{hint_in_chain, Retry, RetryHint};
    let _serial = SERIAL.lock().await;
    let tmp = tempfile::tempdir().unwrap();
    let slow = || Slow {
        delay: Duration::ZERO,
        runs: 0,
        fail_at: None,
        most_at_engine: Arc::new(AtomicI64::new(0)),
        u8: false,
        pool: None,
    };
    let out = tmp.path().join("out");

    let inputs = images(tmp.path(), 3);
    let missing = inputs[1].uri.clone();
    std::fs::remove_file(missing.trim_start_matches("file://")).unwrap();
    let (mut r, job) = runner(&out, slow(), 2);
    r.store_errors = StoreErrors::FailTask;
    let task = Task::new("job", inputs);
    let err = r.run(&job, &task).await.unwrap_err();
    match &err {
        Error::InputUnavailable { uri, source } => {
            assert_eq!(uri, &missing);
            assert!(
                matches!(hint_in_chain(&**source), Some(RetryHint::Later)),
                "the store error is kept as the source: {source:?}"
            );
        }
        other => panic!("not the typed input error: {other:?}"),
    }
    assert_eq!(err.retry_hint(), RetryHint::Later);
    assert!(
        !out.join(task.chips_path()).exists(),
        "nothing written before the retry"
    );

    // Bad content is the input's own fault: a row, and the task is done.
    let inputs = images(tmp.path(), 2);
    std::fs::write(inputs[0].uri.trim_start_matches("file://"), b"not a png").unwrap();
    let (mut r, job) = runner(&out, slow(), 2);
    r.store_errors = StoreErrors::FailTask;
    let task = Task::new("job", inputs.clone());
    let report = r.run(&job, &task).await.unwrap();
    assert_eq!(report.chips_file.rows, 1);
    assert_eq!(report.failures.len(), 1);
    assert_eq!(report.failures[0].source_uri, inputs[0].uri);
    assert_eq!(report.failures[0].store, None);
    assert!(report.failures[0].cause.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uint8_engine_is_sent_the_8_bit_images() {
    let _serial = SERIAL.lock().await;
    let tmp = tempfile::tempdir().unwrap();
    let inputs = images(tmp.path(), 10);
    let backend = Slow {
        delay: Duration::from_millis(1),
        runs: 0,
        fail_at: None,
        most_at_engine: Arc::default(),
        u8: true,
        pool: None,
    };
    let out = tmp.path().join("out");
    let (r, job) = runner(&out, backend, 4);
    let task = Task::new("job", inputs);
    let report = r.run(&job, &task).await.unwrap();
    assert_eq!(report.chips_file.rows, 10);
    let rows = read_rows(&out.join(task.chips_path()));
    assert_eq!(rows.len(), 10);
    for (uri, got) in &rows {
        let i: usize = uri.rsplit("img").next().unwrap()[..3].parse().unwrap();
        // The grey level itself: the engine normalises, not the batcher.
        assert_eq!(*got, (5 * i) as f32, "{uri}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_assembled_in_the_engines_lent_buffers_and_reuse_them() {
    let _serial = SERIAL.lock().await;
    let tmp = tempfile::tempdir().unwrap();
    let inputs = images(tmp.path(), 40);
    let pool = InputPool::host(PixelFormat::U8Nhwc, (3, 8, 8));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let backend = Slow {
        delay: Duration::from_millis(5),
        runs: 0,
        fail_at: None,
        most_at_engine: Arc::default(),
        u8: true,
        pool: Some((pool.clone(), seen.clone())),
    };
    let out = tmp.path().join("out");
    let (r, job) = runner(&out, backend, 4);
    let task = Task::new("job", inputs);
    let report = r.run(&job, &task).await.unwrap();
    assert_eq!(report.chips_file.rows, 40);
    for (uri, got) in &read_rows(&out.join(task.chips_path())) {
        let i: usize = uri.rsplit("img").next().unwrap()[..3].parse().unwrap();
        assert_eq!(*got, (5 * i) as f32, "{uri}");
    }
    let mut addrs = seen.lock().unwrap().clone();
    assert_eq!(addrs.len(), 10, "every batch of 4 came in a lent buffer");
    addrs.sort_unstable();
    addrs.dedup();
    // One assembling, two at the engine at most: never one buffer a batch.
    assert!(addrs.len() <= 3, "{} buffers for 10 batches", addrs.len());
    assert!(!pool.free_sizes().is_empty(), "the buffers came back");
}
