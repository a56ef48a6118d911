//! The uint8 vision entries (`vision_u8`, `vision_fp16_u8`, made by
//! `tools/uint8_entry.py`) and the bound input/output buffers, on the CPU
//! execution provider with the committed tiny model.
//!
//! The bound checked between the entries: the same 8-bit images through the
//! Rust preprocessor into the float graph, and as they are into the uint8
//! entry, give L2-normalized embeddings within 1e-6 of each other per
//! component, cosine ≥ 0.999999 (the entry's table is the preprocessor's, so
//! on the CPU they are in fact identical).

use std::path::{Path, PathBuf};

use rsembed_raster::image::{decode_rgb8, DecodeLimits, Rgb8};
use rsembed_worker::engine::adaptive::{Adaptive, AdaptiveConfig};
use rsembed_worker::engine::session::{InputDtype, SessionConfig};
use rsembed_worker::engine::vision::OrtVision;
use rsembed_worker::engine::{Backend, Embeddings, PixelBatch, PixelFormat, Pixels, RunHints};
use rsembed_worker::error::{chain, Error, Result};
use rsembed_worker::model::ModelDir;
use rsembed_worker::preprocess::Preprocessor;

const MAX_ABS: f32 = 1e-6;
const MIN_COSINE: f64 = 0.999_999;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tiny_dir() -> PathBuf {
    root().join("fixtures/models/tiny-siglip")
}

fn cfg(dtype: InputDtype, io_binding: bool) -> SessionConfig {
    let lib = std::env::var_os("ORT_DYLIB_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".cache/ort/libonnxruntime.so.1.31.1"));
    SessionConfig {
        ort_lib: Some(lib),
        intra_threads: Some(1),
        input_dtype: dtype,
        io_binding,
        ..Default::default()
    }
}

/// The fixture images, decoded (resized and not).
fn images() -> Vec<Rgb8> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("fixtures/images"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| ["png", "jpg", "jpeg"].contains(&e.to_str().unwrap()))
        })
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    files
        .iter()
        .map(|f| decode_rgb8(&std::fs::read(f).unwrap(), DecodeLimits::default()).unwrap())
        .collect()
}

fn batch(pre: &Preprocessor, imgs: &[Rgb8], format: PixelFormat) -> PixelBatch {
    let data: Pixels = match format {
        PixelFormat::F32Nchw => imgs.iter().flat_map(|i| pre.run_f32(i).unwrap()).collect(),
        PixelFormat::U8Nhwc => imgs.iter().flat_map(|i| pre.run(i).unwrap()).collect(),
    };
    PixelBatch {
        n: imgs.len(),
        channels: 3,
        height: pre.height() as usize,
        width: pre.width() as usize,
        data,
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn assert_close(a: &Embeddings, b: &Embeddings, what: &str) {
    assert_eq!((a.n, a.dim), (b.n, b.dim), "{what}");
    for i in 0..a.n {
        let max = a
            .row(i)
            .iter()
            .zip(b.row(i))
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        let cos = cosine(a.row(i), b.row(i));
        assert!(
            max <= MAX_ABS && cos >= MIN_COSINE,
            "{what}, image {i}: max |Δ| {max}, cosine {cos}"
        );
    }
}

#[test]
fn the_uint8_entries_agree_with_the_float_graphs() {
    let m = ModelDir::open(tiny_dir()).unwrap();
    assert!(m.manifest.vision_u8.is_some() && m.manifest.vision_fp16_u8.is_some());
    let pre = Preprocessor::new(&m.preprocessor);
    let imgs = images();
    for fp16 in [false, true] {
        let mut float = OrtVision::open(&m, fp16, &cfg(InputDtype::Float, false)).unwrap();
        let mut u8e = OrtVision::open(&m, fp16, &cfg(InputDtype::Uint8, false)).unwrap();
        assert_eq!(float.pixel_format(), PixelFormat::F32Nchw);
        assert_eq!(u8e.pixel_format(), PixelFormat::U8Nhwc);
        assert!(u8e.graph_file().ends_with(if fp16 {
            "vision_model_fp16_u8.onnx"
        } else {
            "vision_model_u8.onnx"
        }));
        let a = float
            .embed(&batch(&pre, &imgs, PixelFormat::F32Nchw))
            .unwrap();
        let b = u8e.embed(&batch(&pre, &imgs, PixelFormat::U8Nhwc)).unwrap();
        assert_close(&a, &b, if fp16 { "fp16" } else { "fp32" });
        // The entry is fed a quarter of the bytes.
        let u8_bytes = batch(&pre, &imgs, PixelFormat::U8Nhwc).data.len();
        let f32_bytes = 4 * batch(&pre, &imgs, PixelFormat::F32Nchw).data.len();
        assert_eq!(4 * u8_bytes, f32_bytes);
    }
}

/// A copy of the tiny model without its uint8 entries, as an older export.
fn without_entries(dir: &Path) -> ModelDir {
    for e in std::fs::read_dir(tiny_dir()).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with("_u8.onnx") {
            std::fs::copy(e.path(), dir.join(&name)).unwrap();
        }
    }
    let path = dir.join("rsembed-model.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let o = m.as_object_mut().unwrap();
    o.remove("vision_u8");
    o.remove("vision_fp16_u8");
    let files = o["files"].as_object_mut().unwrap();
    files.retain(|k, _| !k.ends_with("_u8.onnx"));
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    ModelDir::open(dir).unwrap()
}

#[test]
fn the_job_identity_is_the_float_graphs() {
    let tmp = tempfile::tempdir().unwrap();
    let old = without_entries(tmp.path());
    let new = ModelDir::open(tiny_dir()).unwrap();
    for fp16 in [false, true] {
        assert_eq!(
            old.model_ref(fp16).unwrap(),
            new.model_ref(fp16).unwrap(),
            "fp16 {fp16}"
        );
    }
    assert_eq!(
        new.model_ref(false).unwrap().files[0].path,
        "vision_model.onnx"
    );
    new.check_files().unwrap();
}

#[test]
fn auto_takes_a_valid_entry_and_falls_back_to_the_float_graph() {
    let m = ModelDir::open(tiny_dir()).unwrap();
    let auto = OrtVision::open(&m, false, &cfg(InputDtype::Auto, false)).unwrap();
    assert_eq!(auto.pixel_format(), PixelFormat::U8Nhwc);
    let float = OrtVision::open(&m, false, &cfg(InputDtype::Float, false)).unwrap();
    assert_eq!(float.pixel_format(), PixelFormat::F32Nchw);

    // An older directory: auto feeds floats, uint8 says how to add the entry.
    let tmp = tempfile::tempdir().unwrap();
    let old = without_entries(tmp.path());
    let v = OrtVision::open(&old, false, &cfg(InputDtype::Auto, false)).unwrap();
    assert_eq!(v.pixel_format(), PixelFormat::F32Nchw);
    let e = chain(
        &OrtVision::open(&old, false, &cfg(InputDtype::Uint8, false))
            .err()
            .unwrap(),
    );
    assert!(
        e.contains("vision_u8") && e.contains("tools/uint8_entry.py"),
        "{e}"
    );

    // A stale entry (the preprocessor changed since it was made) is never fed.
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(tiny_dir()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
    }
    let pp = tmp.path().join("preprocessor_config.json");
    let text = std::fs::read_to_string(&pp).unwrap();
    std::fs::write(&pp, text.replace("0.5", "0.25")).unwrap();
    let stale = ModelDir::open(tmp.path()).unwrap();
    let v = OrtVision::open(&stale, false, &cfg(InputDtype::Auto, false)).unwrap();
    assert_eq!(v.pixel_format(), PixelFormat::F32Nchw);
    let e = chain(
        &OrtVision::open(&stale, false, &cfg(InputDtype::Uint8, false))
            .err()
            .unwrap(),
    );
    assert!(
        e.contains("made for another preprocessor_config.json"),
        "{e}"
    );
}

#[test]
fn bound_runs_match_unbound_ones_bit_for_bit_and_reuse_their_buffers() {
    let m = ModelDir::open(tiny_dir()).unwrap();
    let pre = Preprocessor::new(&m.preprocessor);
    let imgs = images();
    for dtype in [InputDtype::Float, InputDtype::Uint8] {
        let mut plain = OrtVision::open(&m, false, &cfg(dtype, false)).unwrap();
        let mut bound = OrtVision::open(&m, false, &cfg(dtype, true)).unwrap();
        let format = plain.pixel_format();
        assert!(plain.bound_sizes().is_empty());
        let n = imgs.len();
        let b = batch(&pre, &imgs, format);
        let want = plain.embed(&b).unwrap();
        let got = bound.embed(&b).unwrap();
        assert_eq!(got, want, "{dtype}: bound and unbound differ");
        let addr = bound
            .bound_input_addr(n)
            .expect("a bound input for the batch size");
        // Other images, same size: the same buffer, and their own rows.
        let mut rev = imgs.clone();
        rev.reverse();
        let again = bound.embed(&batch(&pre, &rev, format)).unwrap();
        assert_eq!(
            bound.bound_input_addr(n),
            Some(addr),
            "{dtype}: reallocated"
        );
        assert_eq!(again.row(0), want.row(n - 1));
        // Another size gets its own buffers, the first size's stay.
        let b1 = batch(&pre, &imgs[..1], format);
        assert_eq!(bound.embed(&b1).unwrap(), plain.embed(&b1).unwrap());
        assert_eq!(bound.bound_sizes(), vec![1, n]);
        assert_eq!(bound.bound_input_addr(n), Some(addr));
    }
}

/// Fails, as out of memory, every run above `limit` images while `armed`.
struct OomAbove<B> {
    inner: B,
    limit: usize,
    armed: bool,
}

impl<B: Backend> Backend for OomAbove<B> {
    fn run(&mut self, batch: &PixelBatch, hints: RunHints) -> Result<Embeddings> {
        if self.armed && batch.n > self.limit {
            return Err(Error::Device {
                context: "injected".into(),
                message: "CUDA failure 2: out of memory".into(),
            });
        }
        self.inner.run(batch, hints)
    }
    fn pixel_format(&self) -> PixelFormat {
        self.inner.pixel_format()
    }
}

#[test]
fn a_split_batch_runs_on_the_smaller_buckets_buffers() {
    let m = ModelDir::open(tiny_dir()).unwrap();
    let pre = Preprocessor::new(&m.preprocessor);
    let imgs: Vec<Rgb8> = images().into_iter().cycle().take(8).collect();
    let mut reference = OrtVision::open(&m, false, &cfg(InputDtype::Uint8, false)).unwrap();
    let b = batch(&pre, &imgs, PixelFormat::U8Nhwc);
    let want = reference.embed(&b).unwrap();
    let vision = OrtVision::open(&m, false, &cfg(InputDtype::Uint8, true)).unwrap();
    let mut a = Adaptive::new(
        OomAbove {
            inner: vision,
            limit: 4,
            armed: false,
        },
        AdaptiveConfig {
            max_batch: 8,
            ..AdaptiveConfig::default()
        },
    );
    // Unarmed: one run at bucket 8 binds its buffers.
    let first = a.embed(&b).unwrap();
    assert_eq!(first, want);
    assert_eq!(a.inner_mut().inner.bound_sizes(), vec![8]);
    // Armed: the batch of 8 fails, its halves run (shrinking) at 4, and the
    // bucket-8 buffers are let go so the shrink can return them.
    a.inner_mut().armed = true;
    let split = a.embed(&b).unwrap();
    assert_eq!(a.stats().ooms, 1);
    // Batches of 4, not 8: ORT's CPU kernels may round differently.
    for i in 0..8 {
        let c = cosine(split.row(i), want.row(i));
        assert!(c > 0.99999, "row {i}: cosine {c} with its own image");
    }
    let v = &a.inner_mut().inner;
    assert_eq!(v.bound_sizes(), vec![4]);
    let addr = v.bound_input_addr(4).unwrap();
    a.embed(&b).unwrap();
    assert_eq!(a.inner_mut().inner.bound_input_addr(4), Some(addr));
}

#[test]
fn a_batch_assembled_in_a_lent_buffer_runs_from_it_and_the_buffer_comes_back() {
    let m = ModelDir::open(tiny_dir()).unwrap();
    let pre = Preprocessor::new(&m.preprocessor);
    let imgs = images();
    let n = imgs.len();
    let mut plain = OrtVision::open(&m, false, &cfg(InputDtype::Uint8, false)).unwrap();
    assert!(plain.input_pool().is_none(), "unbound: nothing to lend");
    let mut bound = OrtVision::open(&m, false, &cfg(InputDtype::Uint8, true)).unwrap();
    let pool = bound.input_pool().expect("bound: buffers to lend");
    assert_eq!(pool.format(), PixelFormat::U8Nhwc);
    let own = batch(&pre, &imgs, PixelFormat::U8Nhwc);
    let want = plain.embed(&own).unwrap();
    let mut addrs = Vec::new();
    for _ in 0..3 {
        let mut l = pool.lease(n).unwrap();
        addrs.push(l.addr());
        let out = l.u8_mut().unwrap();
        for (img, o) in imgs.iter().zip(out.chunks_exact_mut(pre.len())) {
            o.copy_from_slice(&pre.run(img).unwrap());
        }
        let lent = PixelBatch {
            data: Pixels::Leased(l),
            ..own.clone()
        };
        assert_eq!(lent.data, own.data);
        assert_eq!(bound.embed(&lent).unwrap(), want);
        assert!(pool.free_sizes().is_empty(), "lent while the batch lives");
        drop(lent);
        assert_eq!(pool.free_sizes(), vec![n], "back after the run");
    }
    assert!(
        addrs.iter().all(|a| *a == addrs[0]),
        "one buffer, reused: {addrs:?}"
    );
    assert_eq!(
        bound.bound_input_addr(n),
        None,
        "bound as it is: no input buffer of the engine's own"
    );
    // A shrinking run at a smaller size lets the larger free buffers go.
    bound
        .run(
            &batch(&pre, &imgs[..1], PixelFormat::U8Nhwc),
            RunHints { shrink_arena: true },
        )
        .unwrap();
    assert!(pool.free_sizes().is_empty());
}
