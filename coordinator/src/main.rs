//! The `rsembed` command.

use std::process::ExitCode;
use std::sync::atomic::Ordering;

use clap::Parser;
use rsembed_coordinator::cli::{Cli, Command, PlanArgs};
use rsembed_coordinator::job::plan;
use rsembed_coordinator::{
    fetch_model,
    job::{finalize, run, status, submit},
    query, text,
};
use rsembed_schemas::job::TilingSpec;
use tracing_subscriber::EnvFilter;

/// Exit code of a run that finished with some inputs recorded as failed.
const EXIT_FAILED_INPUTS: u8 = 3;

fn init_tracing(format: &str) {
    let filter = EnvFilter::try_from_env("RSEMBED_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        b.json().init();
    } else {
        b.init();
    }
}

/// Query commands stream many large, short-lived buffers (fetched column
/// chunks of tens of MiB, decode batches): glibc maps and unmaps each one
/// above its mmap threshold, and the page faults cost more than the scan
/// (docs/benchmarks.md). Raising the thresholds makes malloc reuse them; and
/// two arenas at most, because each arena keeps what it once held: object
/// store reads allocate on tokio's blocking threads, up to 16 arenas on a
/// 2-core machine, so without the cap the peak grew with the number of row
/// groups read (exact scan of 10^6 rows: 174 MiB, 82 MiB capped, same time).
/// The peak stays bounded by what is in flight, and these processes are short.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // SAFETY: mallopt only sets allocator parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 512 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Search(_) | Command::Classify(_) | Command::Compact(_)
    ) {
        keep_freed_memory();
    }
    init_tracing(&cli.log_format);
    // Before anything opens a TLS connection (NATS, object stores).
    rsembed_worker::queue::install_crypto_provider();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match rt.block_on(dispatch(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    };
    tracing::debug!("command done");
    // Ends here after a CUDA session (see rsembed_worker::exit).
    let code = rsembed_worker::exit::finish(code);
    drop(rt);
    tracing::debug!("async runtime dropped");
    code
}

/// The error and its causes, each once: object_store's messages already
/// include their sources, so `{:#}` printed the same text several times.
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        next = s.source();
    }
    out
}

async fn dispatch(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Run(args) => {
            let json = args.json;
            let s = tokio::select! {
                r = run::run(args) => r?,
                _ = tokio::signal::ctrl_c() => {
                    eprintln!(
                        "rsembed run: interrupted. Finished tasks are kept in the output; \
                         run the same command again to resume (only unfinished tasks run)."
                    );
                    // Not a return: the runtime would wait for decoders and the
                    // inference thread to finish their work first.
                    rsembed_worker::exit::interrupted(130);
                }
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print!("{}", s.render());
            }
            Ok(if s.failed_inputs > 0 {
                ExitCode::from(EXIT_FAILED_INPUTS)
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Plan(args) => plan_cmd(args).await,
        Command::Submit(args) => {
            let json = args.json;
            let s = submit::submit(args).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print!("{}", s.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Status(args) => {
            let (json, watch) = (args.json, args.watch);
            let s = status::status(args).await?;
            if json && !watch {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else if !json {
                print!("{}", s.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Finalize(args) => {
            let json = args.json;
            let r = finalize::finalize(args).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", r.render());
            }
            Ok(if r.manifest.is_none() {
                ExitCode::FAILURE
            } else if r.failed > 0 {
                ExitCode::from(EXIT_FAILED_INPUTS)
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Text(args) => {
            let mut out = std::io::stdout().lock();
            text::run(&args, &mut out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Search(args) => {
            let mut out = std::io::stdout().lock();
            query::search(args, &mut out).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Classify(args) => {
            let json = args.classify.json;
            let s = query::classify(args).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print!("{}", s.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Compact(args) => {
            let json = args.json;
            let s = query::compact(args).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print!("{}", s.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Change(args) => {
            let json = args.json;
            let s = rsembed_query::change::change(args).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print!("{}", s.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::FetchModel(args) => {
            let json = args.json;
            let s = fetch_model::fetch_model(args).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print!("{}", s.render());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn plan_cmd(args: PlanArgs) -> anyhow::Result<ExitCode> {
    let stores = rsembed_worker::store::StoreCache::default();
    // Without a model there is no input size to default the chip size to; 256 is
    // Git-RSCLIP's.
    let chip_size = args.tiling.chip_size.unwrap_or(256);
    let (windows, align) = rsembed_coordinator::job::setup::window_spec(&args.tiling)?;
    let tiling = TilingSpec {
        chip_size,
        stride: args.tiling.stride.unwrap_or(chip_size),
        bands: args.tiling.bands.clone().unwrap_or_else(|| vec![1, 2, 3]),
        scale: args.tiling.scale.clone(),
        min_valid: args.tiling.min_valid,
        band_files: args.tiling.band_files.clone(),
        assets: args.tiling.assets.clone(),
        cloud_mask: args.tiling.cloud_mask.clone(),
        max_cloud: args.tiling.max_cloud,
        footprint_tolerance: Some(rsembed_coordinator::job::setup::footprint_tolerance(
            &args.tiling,
        )?),
        embedding_type: args.tiling.embedding_type,
        align,
        schema_version: rsembed_schemas::SCHEMA_VERSION,
        windows,
    };
    rsembed_coordinator::job::setup::check_stac_tiling(&args.tiling)?;
    let resolved =
        rsembed_coordinator::stac::resolve(&stores, &args.input, &tiling, &args.tiling.stac)
            .await?;
    let input = resolved.location.clone();
    let is_stac = resolved.search.is_some();
    let resolved_datetime = resolved.search.as_ref().and_then(|s| s.datetime.clone());
    let tiling_windows = tiling.windows.clone();
    let mut planner = plan::start_dry_run(
        &stores,
        resolved.source,
        tiling,
        &args.tiling.grouping_spec(),
        64,
    );
    let stats = planner.stats.clone();
    let mut largest = 0usize;
    while let Some(t) = planner.tasks.recv().await {
        largest = largest.max(t.inputs.len());
    }
    planner.done.await??;
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let (measured, unmeasured) = (n(&stats.measured_chips), n(&stats.unmeasured));
    let sharded_chips = n(&stats.sharded_chips);
    let bytes = n(&stats.bytes);
    let mut v = serde_json::json!({
        "input": input.url.as_str(),
        "inputs": n(&stats.inputs),
        "skipped": n(&stats.skipped),
        "tasks": n(&stats.tasks),
        "largest_task": largest,
        "sharded_scenes": n(&stats.sharded_scenes),
        // Grid chips of the split scenes.
        "sharded_chips": sharded_chips,
        // About: the grid chips of every input (from STAC proj:shape or TIFF
        // headers; one per whole image), before chips are dropped for nodata,
        // --min-valid or --max-cloud, plus one per input not opened (archives).
        "chips_estimate": measured + unmeasured,
        "measured_chips": measured,
        "unmeasured_inputs": unmeasured,
        "bytes": bytes,
    });
    if is_stac {
        let st = &stats.stac;
        // What the search read and kept: `selected` is `inputs`, the items
        // that can be read and the unreadable ones (`bad`) together.
        v["stac"] = serde_json::json!({
            "documents": n(&st.documents),
            "pages": n(&st.pages),
            "selected": n(&st.items) + n(&st.bad),
            "items": n(&st.items),
            "filtered": n(&st.filtered),
            "duplicates": n(&st.duplicates),
            "bad": n(&st.bad),
        });
    }
    let windows = std::mem::take(
        &mut *stats
            .windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    if let Some(w) = &tiling_windows {
        // Every window, the empty ones too: a season without a scene is news.
        let all = rsembed_schemas::window::Windows::of_interval(
            resolved_datetime.as_deref().unwrap_or_default(),
            w.calendar()?,
        )?;
        let list: Vec<_> = all
            .iter()
            .enumerate()
            .map(|(k, tw)| {
                let c = windows.iter().find(|c| c.index as usize == k);
                serde_json::json!({
                    "window": tw.label(),
                    "tasks": c.map_or(0, |c| c.tasks),
                    "acquisitions": c.map_or(0, |c| c.acquisitions),
                    "dropped_past_max_scenes": c.map_or(0, |c| c.dropped),
                })
            })
            .collect();
        v["windows"] = serde_json::json!({
            "duration": w.duration,
            "composite": w.composite,
            "max_scenes": w.max_scenes,
            "outside_windows": n(&stats.outside_windows),
            "windows": list,
        });
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("rsembed plan: {}", input.url);
        if let Some(w) = v.get("windows") {
            println!(
                "  {:<15}{} of {}, composite {}, at most {} acquisitions a block of cells; \
                 {} items outside every window",
                "windows",
                w["windows"].as_array().map_or(0, Vec::len),
                w["duration"].as_str().unwrap_or_default(),
                w["composite"].as_str().unwrap_or_default(),
                w["max_scenes"],
                w["outside_windows"]
            );
            for x in w["windows"].as_array().into_iter().flatten() {
                println!(
                    "    {}  {} tasks, {} acquisitions, {} dropped past --max-scenes",
                    x["window"].as_str().unwrap_or_default(),
                    x["tasks"],
                    x["acquisitions"],
                    x["dropped_past_max_scenes"]
                );
            }
        }
        for k in [
            "inputs",
            "skipped",
            "tasks",
            "largest_task",
            "sharded_scenes",
            "sharded_chips",
        ] {
            println!("  {k:<15}{}", v[k]);
        }
        if let Some(st) = v.get("stac") {
            println!(
                "  {:<15}{} items selected, one input each ({} readable, {} unreadable that \
                 become error records); {} left out by the filters here, {} repeated; {} pages \
                 and {} documents read",
                "stac",
                st["selected"],
                st["items"],
                st["bad"],
                st["filtered"],
                st["duplicates"],
                st["pages"],
                st["documents"]
            );
        }
        let unopened = if unmeasured > 0 {
            format!(", one each for {unmeasured} inputs not opened (archives)")
        } else {
            String::new()
        };
        println!(
            "  {:<15}about {} (the chip grids from proj:shape and TIFF headers, one per whole \
             image{unopened}; before chips are dropped for nodata, --min-valid or --max-cloud)",
            "chips",
            measured + unmeasured
        );
        println!(
            "  {:<15}{}",
            "bytes",
            rsembed_schemas::units::human_bytes(bytes)
        );
    }
    Ok(ExitCode::SUCCESS)
}
