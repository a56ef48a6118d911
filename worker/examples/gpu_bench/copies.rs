//! `copies`: the engine's time per chip split into copy in, compute and copy
//! out (`OrtVision::copy_times`), for the float graph and the uint8 entry.

use rsembed_worker::engine::session::InputDtype;
use rsembed_worker::engine::PixelFormat;

use super::*;

/// `n` distinct images as 8-bit NHWC, image `first + i` always the same.
fn images_u8(first: usize, n: usize, s: ImageShape) -> PixelBatch {
    let f = images(first, n, s);
    let data: Vec<u8> = (0..f.data.len())
        .map(|i| ((f.data.value(i).unwrap() + 1.0) * 127.5) as u8)
        .collect();
    PixelBatch {
        data: data.into(),
        ..f
    }
}

pub(crate) fn copies(a: &CopiesArgs) -> Res<()> {
    let c = &a.common;
    let mut rows = Vec::new();
    println!("| entry | bucket | input bytes/chip | compute ms/chip | copy out ms/chip | copy in (pinned) ms/chip | copy in (pageable) ms/chip | engine ms/chip (pinned) |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for dtype in [InputDtype::Float, InputDtype::Uint8] {
        let cfg = SessionConfig {
            input_dtype: dtype,
            ..c.session_config()
        };
        let (model, mut v, _) = match open(c, &cfg) {
            Ok(x) => x,
            Err(e) if dtype == InputDtype::Uint8 => {
                rows.push(json!({ "entry": dtype.to_string(), "error": e }));
                eprintln!("copies: no uint8 entry: {e}");
                continue;
            }
            Err(e) => return Err(e),
        };
        let shape = ImageShape::of_model(&model);
        for &n in &a.buckets {
            let batch = match v.pixel_format() {
                PixelFormat::F32Nchw => images(0, n, shape),
                PixelFormat::U8Nhwc => images_u8(0, n, shape),
            };
            let bytes = batch.data.len() / n
                * match v.pixel_format() {
                    PixelFormat::F32Nchw => 4,
                    PixelFormat::U8Nhwc => 1,
                };
            let t = v
                .copy_times(&batch, a.runs)
                .map_err(|e| engine_err("copy breakdown", &e))?;
            let per = |s: f64| s * 1e3 / n as f64;
            let row = json!({
                "entry": dtype.to_string(),
                "graph": v.graph_file().file_name().map(|f| f.to_string_lossy().into_owned()),
                "bucket": n,
                "input_bytes_per_chip": bytes,
                "ms_per_chip": {
                    "device_resident": per(t.device_resident),
                    "output_to_host": per(t.output_to_host),
                    "pinned_input": per(t.pinned_input),
                    "pageable_input": per(t.pageable_input),
                },
                "compute_ms_per_chip": per(t.device_resident),
                "copy_out_ms_per_chip": per(t.output_to_host - t.device_resident),
                "copy_in_pinned_ms_per_chip": per(t.pinned_input - t.output_to_host),
                "copy_in_pageable_ms_per_chip": per(t.pageable_input - t.output_to_host),
            });
            println!(
                "| {dtype} | {n} | {bytes} | {:.4} | {:.4} | {:.4} | {:.4} | {:.4} |",
                per(t.device_resident),
                per(t.output_to_host - t.device_resident),
                per(t.pinned_input - t.output_to_host),
                per(t.pageable_input - t.output_to_host),
                per(t.pinned_input),
            );
            rows.push(row);
        }
    }
    let out = json!({
        "device": c.device.to_string(),
        "precision": c.precision(),
        "runs": a.runs,
        "rows": rows,
    });
    write_json(c.json.as_deref(), &out)
}
