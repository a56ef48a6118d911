//! `copies`: the engine's time per chip split into copy in, compute and copy
//! out (`OrtVision::copy_times`), for the float graph and the uint8 entry.

use rsembed_worker::engine::session::InputDtype;
use rsembed_worker::engine::{PixelFormat, PixelView, Pixels};

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

/// The bound paths against the plain one on `batch`: a session with IO
/// binding, fed the batch from its own memory and from a buffer of the
/// session's pool (as the worker's batcher fills it). Max |Δ| and the least
/// cosine of the L2-normalized rows against `plain`'s.
fn bound_parity(
    c: &Common,
    cfg: &SessionConfig,
    batch: &PixelBatch,
    plain: &Embeddings,
) -> Res<Value> {
    let cfg = SessionConfig {
        io_binding: true,
        ..cfg.clone()
    };
    let (_, mut bound, _) = open(c, &cfg)?;
    let own = bound
        .embed(batch)
        .map_err(|e| engine_err("bound run", &e))?;
    let pool = bound.input_pool().ok_or("no input pool with IO binding")?;
    let mut l = pool.lease(batch.n).ok_or("the pool lent nothing")?;
    match batch.data.view() {
        PixelView::F32(d) => l.f32_mut().ok_or("pool format")?.copy_from_slice(d),
        PixelView::U8(d) => l.u8_mut().ok_or("pool format")?.copy_from_slice(d),
    }
    let lent = PixelBatch {
        data: Pixels::Leased(l),
        ..batch.clone()
    };
    let leased = bound
        .embed(&lent)
        .map_err(|e| engine_err("lent-buffer run", &e))?;
    let cmp = |e: &Embeddings| {
        let max = e
            .data
            .iter()
            .zip(&plain.data)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let cos = (0..e.n)
            .map(|i| cosine(e.row(i), plain.row(i)))
            .fold(1.0, f64::min);
        json!({ "max_abs_diff": max, "min_cosine": cos })
    };
    Ok(json!({ "images": batch.n, "own_buffer": cmp(&own), "lent_buffer": cmp(&leased) }))
}

pub(crate) fn copies(a: &CopiesArgs) -> Res<()> {
    let c = &a.common;
    let mut rows = Vec::new();
    let mut parity = Vec::new();
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
        // The bound and lent-buffer paths give the plain path's embeddings.
        if let Some(&n) = a.buckets.last() {
            let batch = match v.pixel_format() {
                PixelFormat::F32Nchw => images(0, n, shape),
                PixelFormat::U8Nhwc => images_u8(0, n, shape),
            };
            let plain = v.embed(&batch).map_err(|e| engine_err("plain run", &e))?;
            drop(v);
            let p = bound_parity(c, &cfg, &batch, &plain)?;
            println!("bound vs plain ({dtype}, {n} images): {p}");
            parity.push(json!({ "entry": dtype.to_string(), "parity": p }));
        }
    }
    let out = json!({
        "device": c.device.to_string(),
        "precision": c.precision(),
        "runs": a.runs,
        "rows": rows,
        "bound_parity": parity,
    });
    write_json(c.json.as_deref(), &out)
}
