//! The floor under a query that reads its lists from the page cache: how fast
//! this machine hands a process the bytes of warm files (`pread` into a
//! reused buffer, as `search` reads a local column chunk) against how fast it
//! reads the same bytes held in the process's own memory (as FAISS holds its
//! lists). Each piece is summed once, the least work a scan can do with it.
//!
//! ```text
//! cargo run --release -p rsembed-coordinator --example read_floor -- \
//!     --mib 190 --piece-kib 3072 --threads 1,2 --reps 9 /tmp/rsembed-ivf-1e6/ivf/chips/*.parquet
//! ```
//!
//! 190 MiB in 3 MiB pieces is what a default probe (63 lists) of 10⁶ rows of
//! f32 at D = 768 reads. The files should be in the page cache (the first
//! repetition reads them once and is not counted). The pieces are spread
//! over the files at offsets fixed by the piece index, so every repetition
//! and both sources read the same pieces.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;

#[derive(Parser)]
struct Args {
    /// Bytes a "query" reads, MiB.
    #[arg(long, default_value_t = 190)]
    mib: usize,
    /// Bytes of one read (one list's embedding chunk), KiB.
    #[arg(long, default_value_t = 3072)]
    piece_kib: usize,
    /// Thread counts to measure, comma-separated.
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Repetitions (the median is printed).
    #[arg(long, default_value_t = 9)]
    reps: usize,
    /// Warm files to read the pieces from.
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

/// A pass over `bytes` that the compiler cannot drop: eight-byte words
/// summed, vectorised, bound by the memory it reads.
fn sum(bytes: &[u8]) -> u64 {
    bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("eight bytes")))
        .fold(0u64, u64::wrapping_add)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let piece = args.piece_kib << 10;
    let pieces = (args.mib << 20) / piece;
    let files: Vec<(File, u64)> = args
        .files
        .iter()
        .map(|p| {
            let f = File::open(p)?;
            let len = f.metadata()?.len();
            Ok((f, len))
        })
        .collect::<std::io::Result<_>>()?;
    // Piece i: file i mod F, at a stride that spreads the pieces over it.
    let place = |i: usize| -> (usize, u64) {
        let f = i % files.len();
        let slots = (files[f].1 as usize / piece).max(1);
        let per_file = pieces.div_ceil(files.len()).max(1);
        let slot = (i / files.len()) * slots / per_file;
        (f, (slot * piece) as u64)
    };
    let read = |i: usize, buf: &mut [u8]| -> std::io::Result<u64> {
        let (f, at) = place(i);
        let n = files[f].0.read_at(buf, at)?;
        Ok(sum(&buf[..n]))
    };
    // The same pieces, held: what an index in memory scores.
    let mut held = vec![0u8; pieces * piece];
    for (i, chunk) in held.chunks_exact_mut(piece).enumerate() {
        let (f, at) = place(i);
        files[f].0.read_at(chunk, at)?;
    }
    println!(
        "{} pieces of {} KiB ({} MiB) from {} files; median of {} repetitions",
        pieces,
        args.piece_kib,
        (pieces * piece) >> 20,
        files.len(),
        args.reps
    );
    for &threads in &args.threads {
        let per = pieces.div_ceil(threads);
        let mut cached = Vec::new();
        let mut memory = Vec::new();
        let mut check = (0u64, 0u64);
        for rep in 0..=args.reps {
            let t = Instant::now();
            let got: u64 = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|k| {
                        s.spawn(move || -> std::io::Result<u64> {
                            let mut buf = vec![0u8; piece];
                            let mut acc = 0u64;
                            for i in k * per..((k + 1) * per).min(pieces) {
                                acc = acc.wrapping_add(read(i, &mut buf)?);
                            }
                            Ok(acc)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("reader thread"))
                    .try_fold(0u64, |a, r| r.map(|x| a.wrapping_add(x)))
            })?;
            let page_cache = t.elapsed().as_secs_f64();
            let t = Instant::now();
            let held_sum: u64 = std::thread::scope(|s| {
                let held = &held;
                let handles: Vec<_> = (0..threads)
                    .map(|k| {
                        s.spawn(move || {
                            let lo = (k * per * piece).min(held.len());
                            let hi = ((k + 1) * per * piece).min(held.len());
                            sum(&held[lo..hi])
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("memory thread"))
                    .fold(0u64, u64::wrapping_add)
            });
            let in_memory = t.elapsed().as_secs_f64();
            check = (got, held_sum);
            if rep > 0 {
                cached.push(page_cache);
                memory.push(in_memory);
            }
        }
        assert_eq!(check.0, check.1, "both sources summed the same bytes");
        let bytes = (pieces * piece) as f64;
        let (c, m) = (median(cached), median(memory));
        println!(
            "threads {threads}: page cache {:.2} ms ({:.1} GB/s), in memory {:.2} ms ({:.1} GB/s), page cache ÷ memory {:.2}",
            c * 1e3,
            bytes / c / 1e9,
            m * 1e3,
            bytes / m / 1e9,
            c / m
        );
    }
    Ok(())
}
