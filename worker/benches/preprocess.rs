//! Per-image preprocessing cost: decode + Pillow-exact resize + rescale/normalize
//! to NCHW float32, as `rsembed run` does for every whole image.
//!
//! Cases: a 256×256 PNG (the model's size: no resize) and a 512×384 JPEG
//! (bicubic downscale to 256×256), each with and without the decode (the
//! decode-free 256×256 case is a GeoTIFF chip's), and that resize alone. Run
//! with `cargo bench -p rsembed-worker --bench preprocess`; `bench/compare.py`
//! and `bench/preprocess.py` time Hugging Face's SiglipImageProcessor on the
//! same images for the ratios in docs/benchmarks.md.

use std::io::Cursor;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use rsembed_raster::image::{decode_rgb8, DecodeLimits};
use rsembed_worker::model::ModelDir;
use rsembed_worker::preprocess::resize::{resize_u8, Filter};
use rsembed_worker::preprocess::Preprocessor;

/// The same deterministic pattern `bench/compare.py` draws.
fn pattern(w: u32, h: u32) -> image::RgbImage {
    image::RgbImage::from_fn(w, h, |x, y| {
        let v = (x * 7 + y * 13) ^ (x * y / 5);
        image::Rgb([
            (v % 256) as u8,
            ((x * 3) % 256) as u8,
            ((y * 5 + v / 3) % 256) as u8,
        ])
    })
}

fn encode(img: &image::RgbImage, f: image::ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, f).unwrap();
    out.into_inner()
}

fn bench(c: &mut Criterion) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-siglip");
    let model = ModelDir::open(dir).expect("tiny model is committed");
    let pre = Preprocessor::new(&model.preprocessor);
    let png = encode(&pattern(256, 256), image::ImageFormat::Png);
    let jpg = encode(&pattern(512, 384), image::ImageFormat::Jpeg);
    let limits = DecodeLimits::default();
    let mut out = vec![0f32; pre.len()];

    c.bench_function("png_256_no_resize", |b| {
        b.iter(|| {
            let img = decode_rgb8(&png, limits).unwrap();
            pre.run_into(&img, &mut out).unwrap();
        })
    });
    c.bench_function("jpeg_512x384_resize", |b| {
        b.iter(|| {
            let img = decode_rgb8(&jpg, limits).unwrap();
            pre.run_into(&img, &mut out).unwrap();
        })
    });
    let decoded = decode_rgb8(&jpg, limits).unwrap();
    c.bench_function("resize_normalize_only_512x384", |b| {
        b.iter(|| pre.run_into(&decoded, &mut out).unwrap())
    });
    // The resize alone, for the split between it and the rescale/normalize.
    c.bench_function("resize_only_512x384", |b| {
        b.iter(|| {
            resize_u8(
                &decoded.data,
                decoded.width as usize,
                decoded.height as usize,
                3,
                pre.width() as usize,
                pre.height() as usize,
                Filter::Bicubic,
            )
        })
    });
    // A GeoTIFF chip: already decoded and at the model's size (bench/preprocess.py).
    let chip = decode_rgb8(&png, limits).unwrap();
    c.bench_function("normalize_only_256", |b| {
        b.iter(|| pre.run_into(&chip, &mut out).unwrap())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
