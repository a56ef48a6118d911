//! `oom`: every chip back, in order, through `--batch-size auto` under a memory cap.

use super::*;

pub(crate) fn oom(a: &OomArgs) -> Res<()> {
    let c = &a.common;
    let mut cfg = c.session_config();
    cfg.gpu_mem_limit = Some(a.gpu_mem_limit);
    let mem = MemSource::for_device(c.device)?;
    let (model, mut v, open_s) = open(c, &cfg)?;
    let shape = ImageShape::of_model(&model);
    let total = a.requests * a.request_size;

    // The reference: every image embedded by the same session in small batches.
    let t = Instant::now();
    let mut reference: Vec<f32> = Vec::new();
    let mut dim = 0;
    let mut i = 0;
    while i < total {
        let n = a.reference_batch.max(1).min(total - i);
        let e = v
            .embed(&images(i, n, shape))
            .map_err(|e| engine_err("reference batch (lower --reference-batch)", &e))?;
        dim = e.dim;
        reference.extend_from_slice(&e.data);
        i += n;
    }
    let reference_s = t.elapsed().as_secs_f64();

    // Unprobed, the controller starts at the largest bucket: the first
    // request runs out of memory and is split until the pieces fit.
    let mut ad = Adaptive::new(
        v,
        AdaptiveConfig {
            max_batch: a.max_batch,
            ..AdaptiveConfig::default()
        },
    );
    let start_bucket = ad.stats().bucket;
    let sampler = Sampler::start(&mem);
    let t = Instant::now();
    let mut per_request = Vec::new();
    let mut out: Vec<Embeddings> = Vec::new();
    let mut failures = Vec::new();
    for r in 0..a.requests {
        let before = ad.stats();
        let tr = Instant::now();
        match ad.embed(&images(r * a.request_size, a.request_size, shape)) {
            Ok(e) => {
                let after = ad.stats();
                per_request.push(json!({
                    "request": r,
                    "seconds": tr.elapsed().as_secs_f64(),
                    "ooms": after.ooms - before.ooms,
                    "runs": after.runs - before.runs,
                    "bucket_after": after.bucket,
                    "ceiling_after": after.ceiling,
                }));
                out.push(e);
            }
            Err(e) => {
                failures.push(format!("request {r}: {}", chain(&e)));
                per_request.push(json!({ "request": r, "error": chain(&e) }));
            }
        }
    }
    let run_s = t.elapsed().as_secs_f64();
    let peak = sampler.finish(&mem);
    let st = ad.stats();

    // Every chip back, in order: row k's nearest reference is image k.
    let rows: Vec<&[f32]> = out
        .iter()
        .flat_map(|e| (0..e.n).map(|i| e.row(i)))
        .collect();
    let returned = rows.len();
    let mut misplaced = 0usize;
    let mut min_own = 1f64;
    let mut max_other = -1f64;
    for (k, row) in rows.iter().enumerate() {
        let own = cosine(row, &reference[k * dim..(k + 1) * dim]);
        min_own = min_own.min(own);
        let mut best_other = -1f64;
        for j in (0..total).filter(|&j| j != k) {
            best_other = best_other.max(cosine(row, &reference[j * dim..(j + 1) * dim]));
        }
        max_other = max_other.max(best_other);
        if best_other >= own {
            misplaced += 1;
        }
    }
    let lost = total - returned.min(total);
    let ok = failures.is_empty() && lost == 0 && misplaced == 0;

    println!(
        "## oom: {} on {} under --gpu-mem-limit {} MiB, {} requests of {} images, max bucket {}",
        c.precision(),
        c.device,
        a.gpu_mem_limit >> 20,
        a.requests,
        a.request_size,
        a.max_batch
    );
    println!(
        "open {open_s:.1} s, reference (batches of {}) {reference_s:.1} s",
        a.reference_batch
    );
    println!("| start bucket | OOMs | runs | shrink runs | final bucket | ceiling | hard limit | failed requests | chips in | chips out | lost | misplaced | min cos own | max cos other | images/s | peak MiB |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    println!(
        "| {start_bucket} | {} | {} | {} | {} | {} | {} | {} | {total} | {returned} | {lost} | {misplaced} | {min_own:.6} | {max_other:.6} | {:.1} | {} |",
        st.ooms,
        st.runs,
        st.shrink_runs,
        st.bucket,
        st.ceiling,
        st.hard_limit.map_or("-".into(), |h| h.to_string()),
        st.failed_requests,
        returned as f64 / run_s,
        mib(Some(peak)),
    );
    if let Some(m) = &st.last_oom {
        println!("last OOM message: {}", m.lines().next().unwrap_or(""));
    }
    for f in &failures {
        println!("FAILED {f}");
    }
    println!(
        "{}",
        if ok {
            "RESULT ok: zero lost chips"
        } else {
            "RESULT FAILED"
        }
    );
    write_json(
        c.json.as_deref(),
        &json!({
            "part": "oom",
            "precision": c.precision(),
            "device": c.device.to_string(),
            "gpu_mem_limit": a.gpu_mem_limit,
            "max_batch": a.max_batch,
            "requests": a.requests,
            "request_size": a.request_size,
            "open_seconds": open_s,
            "reference_seconds": reference_s,
            "run_seconds": run_s,
            "images_per_s": returned as f64 / run_s,
            "memory_source": mem.name(),
            "memory_peak": peak,
            "start_bucket": start_bucket,
            "ooms": st.ooms,
            "runs": st.runs,
            "shrink_runs": st.shrink_runs,
            "final_bucket": st.bucket,
            "ceiling": st.ceiling,
            "hard_limit": st.hard_limit,
            "failed_requests": st.failed_requests,
            "padded_images": st.padded_images,
            "last_oom": st.last_oom.as_deref(),
            "chips_in": total,
            "chips_out": returned,
            "lost": lost,
            "misplaced": misplaced,
            "min_cosine_own": min_own,
            "max_cosine_other": max_other,
            "per_request": per_request,
            "ok": ok,
        }),
    )?;
    if ok {
        Ok(())
    } else {
        Err("out-of-memory recovery lost, misplaced or failed chips".into())
    }
}
