//! `shrink`: what each `--arena-shrink` mode returns after large batches.

use super::*;

pub(crate) fn shrink_child(a: &ShrinkArgs, mode: ArenaShrink) -> Res<()> {
    let c = &a.common;
    if a.small_runs < 2 {
        return Err("--small-runs must be at least 2".into());
    }
    let mut cfg = c.session_config();
    cfg.arena_shrink = mode;
    let mem = MemSource::for_device(c.device)?;
    let before = mem.used();
    let (model, mut v, open_s) = open(c, &cfg)?;
    let loaded = mem.used();
    let shape = ImageShape::of_model(&model);
    let big = images(0, a.big, shape);
    let small = images(0, a.small, shape);
    let sampler = Sampler::start(&mem);
    let mut big_t = Vec::new();
    for _ in 0..a.big_runs.max(1) {
        let t = Instant::now();
        v.run(&big, RunHints::default())
            .map_err(|e| engine_err("big batch", &e))?;
        big_t.push(t.elapsed().as_secs_f64());
    }
    let after_big = mem.used();
    let mut small_t = Vec::new();
    let mut after_first_small = None;
    for i in 0..a.small_runs {
        // The bucket just fell: the adaptive layer asks for one shrink.
        let hints = RunHints {
            shrink_arena: i == 0,
        };
        let t = Instant::now();
        v.run(&small, hints)
            .map_err(|e| engine_err("small batch", &e))?;
        small_t.push(t.elapsed().as_secs_f64());
        if i == 0 {
            after_first_small = mem.used();
        }
    }
    let after_small = mem.used();
    let peak = sampler.finish(&mem);
    println!(
        "{}",
        json!({
            "mode": mode.to_string(),
            "open_seconds": open_s,
            "memory_before_open": before,
            "memory_loaded": loaded,
            "memory_after_big": after_big,
            "memory_after_first_small": after_first_small,
            "memory_after_small": after_small,
            "memory_peak": peak,
            "big_ms": median(big_t) * 1e3,
            "small_first_ms": small_t[0] * 1e3,
            "small_second_ms": small_t[1] * 1e3,
            "small_ms": median(small_t[1..].to_vec()) * 1e3,
        })
    );
    Ok(())
}

pub(crate) fn shrink(a: &ShrinkArgs) -> Res<()> {
    if let Some(mode) = a.child {
        return shrink_child(a, mode);
    }
    let c = &a.common;
    let exe = std::env::current_exe().map_err(err)?;
    let mut results = Vec::new();
    for mode in &a.modes {
        let mut cmd = Command::new(&exe);
        cmd.arg("shrink")
            .arg("--child")
            .arg(mode.to_string())
            .arg("--model")
            .arg(&c.model)
            .args(["--device", &c.device.to_string()])
            .args(["--big", &a.big.to_string()])
            .args(["--small", &a.small.to_string()])
            .args(["--big-runs", &a.big_runs.to_string()])
            .args(["--small-runs", &a.small_runs.to_string()]);
        if c.fp16 {
            cmd.arg("--fp16");
        }
        if c.tf32 {
            cmd.arg("--tf32");
        }
        if let Some(t) = c.threads {
            cmd.args(["--threads", &t.to_string()]);
        }
        if let Some(l) = &c.ort_lib {
            cmd.arg("--ort-lib").arg(l);
        }
        let out = cmd.output().map_err(err)?;
        if !out.status.success() {
            return Err(format!(
                "shrink child {mode}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let line = String::from_utf8_lossy(&out.stdout);
        let r: Value = serde_json::from_str(line.trim())
            .map_err(|e| format!("shrink child {mode} printed {line:?}: {e}"))?;
        results.push(r);
    }
    let mem_name = MemSource::for_device(c.device)?.name();
    println!(
        "## shrink: {} on {}, {} x {} images then {} x {} (first with the shrink hint), memory = {mem_name}",
        c.precision(),
        c.device,
        a.big_runs,
        a.big,
        a.small_runs,
        a.small
    );
    println!("| --arena-shrink | loaded MiB | after big | after 1st small | after small | peak | returned MiB | ms/run big | ms small #1 (shrink) | ms small #2 | ms/run small (median) |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let g = |r: &Value, k: &str| r[k].as_u64();
    let f = |r: &Value, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    for r in &results {
        let returned = match (g(r, "memory_after_big"), g(r, "memory_after_small")) {
            (Some(b), Some(s)) => format!("{:.0}", (mib_f(b) - mib_f(s)).round() + 0.0),
            _ => "-".into(),
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {returned} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r["mode"].as_str().unwrap_or("?"),
            mib(g(r, "memory_loaded")),
            mib(g(r, "memory_after_big")),
            mib(g(r, "memory_after_first_small")),
            mib(g(r, "memory_after_small")),
            mib(g(r, "memory_peak")),
            f(r, "big_ms"),
            f(r, "small_first_ms"),
            f(r, "small_second_ms"),
            f(r, "small_ms"),
        );
    }
    write_json(
        c.json.as_deref(),
        &json!({
            "part": "shrink",
            "precision": c.precision(),
            "device": c.device.to_string(),
            "memory_source": mem_name,
            "big": a.big,
            "small": a.small,
            "big_runs": a.big_runs,
            "small_runs": a.small_runs,
            "modes": results,
        }),
    )
}
