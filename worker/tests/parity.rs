//! Parity with Hugging Face transformers, the reference implementation:
//! `fixtures/models/tiny-siglip/reference.json` holds SiglipImageProcessor +
//! get_image_features and SiglipTokenizer + get_text_features outputs, written
//! by `tools/make_test_model.py`.

use std::path::{Path, PathBuf};

use rsembed_raster::image::{decode_rgb8, is_tiff_content, DecodeLimits, Rgb8};
use rsembed_raster::scale::ScaleSpec;
use rsembed_raster::scene::{MemRange, Scene};
use rsembed_raster::tiff::TiffLimits;
use rsembed_worker::engine::session::SessionConfig;
use rsembed_worker::engine::text::TextEncoder;
use rsembed_worker::engine::vision::OrtVision;
use rsembed_worker::engine::{Backend, PixelBatch};
use rsembed_worker::model::ModelDir;
use rsembed_worker::preprocess::Preprocessor;
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn session_cfg() -> SessionConfig {
    let lib = std::env::var_os("ORT_DYLIB_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".cache/ort/libonnxruntime.so.1.31.1"));
    assert!(
        lib.is_file(),
        "ONNX Runtime library missing at {}: run scripts/setup-ort.sh",
        lib.display()
    );
    SessionConfig {
        ort_lib: Some(lib),
        ..Default::default()
    }
}

fn model() -> ModelDir {
    ModelDir::open(root().join("fixtures/models/tiny-siglip")).unwrap()
}

/// A fixture image as `rsembed run` reads it: PNG and JPEG whole, a TIFF
/// through the scene reader (a plain TIFF is one whole-image chip).
fn decode(file: &Path) -> Rgb8 {
    let bytes = std::fs::read(file).unwrap();
    if !is_tiff_content(&bytes) {
        return decode_rgb8(&bytes, DecodeLimits::default()).unwrap();
    }
    let tiling = serde_json::from_value(serde_json::json!({
        "chip_size": 256, "stride": 256, "bands": [1, 2, 3], "scale": "auto", "min_valid": null
    }))
    .unwrap();
    futures::executor::block_on(async {
        let r = std::sync::Arc::new(MemRange::new(bytes.into()));
        let uri = file.display().to_string();
        let scene = Scene::open(
            r,
            &tiling,
            ScaleSpec::Auto,
            TiffLimits::default(),
            &uri,
            None,
        )
        .await
        .unwrap();
        let windows = scene.windows(None);
        assert_eq!(windows.len(), 1, "{uri} is one whole-image chip");
        scene.chip(windows[0], None).await.unwrap().unwrap().rgb
    })
}

fn reference() -> Value {
    let p = root().join("fixtures/models/tiny-siglip/reference.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|x| *x as f64).collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn preprocessing_matches_siglip_image_processor() {
    let m = model();
    let pre = Preprocessor::new(&m.preprocessor);
    let reference = reference();
    let images = reference["images"].as_array().unwrap();
    assert!(images.iter().any(|i| i["resized"] == true));
    assert!(images.iter().any(|i| i["resized"] == false));
    for img in images {
        let file = root().join("fixtures").join(img["file"].as_str().unwrap());
        let rgb = decode(&file);
        assert_eq!(rgb.width as u64, img["width"].as_u64().unwrap());
        let px = pre.run_f32(&rgb).unwrap();
        let plane = (pre.width() * pre.height()) as usize;
        // JPEG too: the decoder is libjpeg-turbo-exact, as Pillow is.
        let tol = 1e-5;
        for s in img["pixel_values_sample"].as_array().unwrap() {
            let (c, y, x) = (
                s[0].as_u64().unwrap() as usize,
                s[1].as_u64().unwrap() as usize,
                s[2].as_u64().unwrap() as usize,
            );
            let ours = px[c * plane + y * pre.width() as usize + x] as f64;
            let theirs = s[3].as_f64().unwrap();
            assert!(
                (ours - theirs).abs() <= tol,
                "{}: ({c},{y},{x}) {ours} vs {theirs}",
                file.display()
            );
        }
        let means = floats(&img["pixel_values_mean"]);
        for (c, want) in means.iter().enumerate() {
            let got = px[c * plane..(c + 1) * plane]
                .iter()
                .map(|v| *v as f64)
                .sum::<f64>()
                / plane as f64;
            assert!(
                (got - want).abs() < 2e-3,
                "{}: channel {c} mean {got} vs {want}",
                file.display()
            );
        }
    }
}

#[test]
fn image_embeddings_match_get_image_features() {
    let m = model();
    let pre = Preprocessor::new(&m.preprocessor);
    let mut vision = OrtVision::open(&m, false, &session_cfg()).unwrap();
    let reference = reference();
    let images = reference["images"].as_array().unwrap();
    // All images in one batch: this also proves the batch axis is dynamic.
    let mut data = Vec::new();
    for img in images {
        let file = root().join("fixtures").join(img["file"].as_str().unwrap());
        let rgb = decode(&file);
        data.extend(pre.run_f32(&rgb).unwrap());
    }
    let batch = PixelBatch {
        n: images.len(),
        channels: 3,
        height: pre.height() as usize,
        width: pre.width() as usize,
        data: data.into(),
    };
    let emb = vision.embed(&batch).unwrap();
    for (i, img) in images.iter().enumerate() {
        let ours = to_f64(emb.row(i));
        let theirs = floats(&img["image_embeds"]);
        let cos = cosine(&ours, &theirs);
        let min = if img["resized"].as_bool().unwrap() {
            0.999
        } else {
            0.9999
        };
        assert!(cos >= min, "{}: cosine {cos} < {min}", img["file"]);
    }
}

#[test]
fn fp16_graph_stays_close() {
    let m = model();
    if m.manifest.vision_fp16.is_none() {
        panic!("the tiny model is exported with --fp16 and must have vision_fp16");
    }
    let pre = Preprocessor::new(&m.preprocessor);
    let mut fp32 = OrtVision::open(&m, false, &session_cfg()).unwrap();
    let mut fp16 = OrtVision::open(&m, true, &session_cfg()).unwrap();
    let reference = reference();
    let img = &reference["images"][0];
    let file = root().join("fixtures").join(img["file"].as_str().unwrap());
    let rgb = decode(&file);
    let batch = PixelBatch {
        n: 1,
        channels: 3,
        height: pre.height() as usize,
        width: pre.width() as usize,
        data: pre.run_f32(&rgb).unwrap().into(),
    };
    let a = to_f64(&fp32.embed(&batch).unwrap().data);
    let b = to_f64(&fp16.embed(&batch).unwrap().data);
    let cos = cosine(&a, &b);
    assert!(cos > 0.99, "fp16 cosine {cos}");
}

#[test]
fn token_ids_match_siglip_tokenizer() {
    let m = model();
    let enc = TextEncoder::open(&m, &session_cfg()).unwrap();
    let reference = reference();
    let mut n = 0;
    for case in reference["tokenizer_probe"]
        .as_array()
        .unwrap()
        .iter()
        .chain(reference["texts"].as_array().unwrap())
    {
        let text = case["text"].as_str().unwrap();
        let want: Vec<i64> = case["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        assert_eq!(enc.token_ids(text).unwrap(), want, "text {text:?}");
        n += 1;
    }
    assert!(n >= 10);
}

#[test]
fn text_embeddings_match_get_text_features() {
    let m = model();
    let mut enc = TextEncoder::open(&m, &session_cfg()).unwrap();
    let reference = reference();
    let texts = reference["texts"].as_array().unwrap();
    let strings: Vec<String> = texts
        .iter()
        .map(|t| t["text"].as_str().unwrap().to_owned())
        .collect();
    let ours = enc.embed(&strings).unwrap();
    for (t, o) in texts.iter().zip(&ours) {
        let o = to_f64(o);
        let cos = cosine(&o, &floats(&t["text_embeds"]));
        assert!(cos >= 0.9999, "{:?}: cosine {cos}", t["text"]);
    }
}
