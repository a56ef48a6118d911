//! `sweep`: the warm-up probe, then every bucket timed with its memory.

use super::*;

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn sweep(a: &SweepArgs) -> Res<()> {
    let c = &a.common;
    let cfg = c.session_config();
    let mem = MemSource::for_device(c.device)?;
    let mem_before_open = mem.used();
    let (model, v, open_s) = open(c, &cfg)?;
    let mem_loaded = mem.used();
    let shape = ImageShape::of_model(&model);
    let mut adaptive = Adaptive::new(
        v,
        AdaptiveConfig {
            max_batch: a.probe_max_batch.max(1),
            ..AdaptiveConfig::default()
        },
    );
    let parity = parity(&model, adaptive.inner_mut())?;

    // The probe, on a fresh session, as `rsembed run --batch-size auto` does it.
    let mut probe = Value::Null;
    if a.probe_max_batch > 0 {
        let t = Instant::now();
        match adaptive.probe(shape) {
            Ok(table) => {
                let st = adaptive.stats();
                let rows: Vec<Value> = table
                    .iter()
                    .map(|r| {
                        json!({
                            "bucket": r.bucket,
                            "images_per_s": r.images_per_s,
                            "memory_used": r.memory_used,
                            "outcome": r.outcome.as_str(),
                        })
                    })
                    .collect();
                probe = json!({
                    "max_batch": a.probe_max_batch,
                    "chosen": st.target,
                    "ceiling": st.ceiling,
                    "seconds": t.elapsed().as_secs_f64(),
                    "rows": rows,
                });
            }
            Err(e) => probe = json!({ "error": chain(&e) }),
        }
    }

    let v = adaptive.inner_mut();
    let all = images(0, a.max_batch, shape);
    let t_sweep = Instant::now();
    let mut rows = Vec::new();
    for b in buckets(a.max_batch) {
        if t_sweep.elapsed().as_secs_f64() > a.deadline_seconds {
            rows.push(json!({ "bucket": b, "status": "skipped (deadline)" }));
            continue;
        }
        let batch = prefix(&all, b);
        let mut status = "ok".to_owned();
        // Warm runs: the first ends with a shrink, returning what larger
        // buckets (the probe) left in the arena; the second grows the arena
        // to this bucket's own size and builds its plan.
        for i in 0..a.warm_runs {
            if let Err(e) = v.run(
                &batch,
                RunHints {
                    shrink_arena: i == 0,
                },
            ) {
                status = if is_out_of_memory(&e) {
                    "oom".into()
                } else {
                    format!("error: {}", chain(&e))
                };
                break;
            }
        }
        if status != "ok" {
            rows.push(json!({ "bucket": b, "status": status }));
            break; // larger buckets need more memory still
        }
        let sampler = Sampler::start(&mem);
        let mut times = Vec::new();
        let t_bucket = Instant::now();
        while times.len() < a.max_runs.max(1)
            && (times.len() < a.min_runs.max(1)
                || t_bucket.elapsed().as_secs_f64() < a.bucket_seconds)
        {
            let t = Instant::now();
            if let Err(e) = v.run(&batch, RunHints::default()) {
                status = if is_out_of_memory(&e) {
                    "oom".into()
                } else {
                    format!("error: {}", chain(&e))
                };
                break;
            }
            times.push(t.elapsed().as_secs_f64());
        }
        let peak = sampler.finish(&mem);
        if times.is_empty() {
            rows.push(json!({ "bucket": b, "status": status }));
            break;
        }
        let best = times.iter().copied().fold(f64::MAX, f64::min);
        let med = median(times.clone());
        rows.push(json!({
            "bucket": b,
            "status": status,
            "runs": times.len(),
            "best_ms": best * 1e3,
            "median_ms": med * 1e3,
            "images_per_s": b as f64 / best,
            "images_per_s_median": b as f64 / med,
            "memory_peak": peak,
            "memory_after": mem.used(),
        }));
        if status != "ok" {
            break;
        }
    }
    let sweep_s = t_sweep.elapsed().as_secs_f64();

    println!(
        "## sweep: {} on {}, {} ({}x{}), memory = {}",
        c.precision(),
        c.device,
        model.manifest.name,
        shape.height,
        shape.width,
        mem.name()
    );
    println!(
        "open {open_s:.1} s; memory before open {} MiB, loaded {} MiB; sweep {sweep_s:.1} s",
        mib(mem_before_open),
        mib(mem_loaded)
    );
    if !parity.is_null() {
        println!("parity vs PyTorch fp32: {parity}");
    }
    if let Some(rows) = probe["rows"].as_array() {
        let line: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{}:{:.1}{}",
                    r["bucket"],
                    r["images_per_s"].as_f64().unwrap_or(0.0),
                    match r["outcome"].as_str() {
                        Some("measured") => "",
                        Some(o) => o,
                        None => "?",
                    }
                )
            })
            .collect();
        println!(
            "adaptive probe (max {}): chose {} (ceiling {}), {:.1} s; bucket:images/s {}",
            probe["max_batch"],
            probe["chosen"],
            probe["ceiling"],
            probe["seconds"].as_f64().unwrap_or(0.0),
            line.join(" ")
        );
    } else if !probe.is_null() {
        println!("adaptive probe: {probe}");
    }
    println!("\n| bucket | images/s (best) | images/s (median) | ms/run (best) | runs | peak MiB | status |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            r["bucket"],
            r["images_per_s"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:.1}")),
            r["images_per_s_median"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:.1}")),
            r["best_ms"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:.2}")),
            r["runs"].as_u64().map_or("-".into(), |x| x.to_string()),
            mib(r["memory_peak"].as_u64()),
            r["status"].as_str().unwrap_or("?"),
        );
    }
    write_json(
        c.json.as_deref(),
        &json!({
            "part": "sweep",
            "precision": c.precision(),
            "device": c.device.to_string(),
            "model": model.manifest.name,
            "image": [shape.height, shape.width],
            "memory_source": mem.name(),
            "memory_total": mem.total(),
            "memory_before_open": mem_before_open,
            "memory_loaded": mem_loaded,
            "open_seconds": open_s,
            "sweep_seconds": sweep_s,
            "parity": parity,
            "probe": probe,
            "rows": rows,
        }),
    )
}
