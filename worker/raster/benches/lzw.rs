//! TIFF LZW block decoding: the reader's former decoder
//! (`benches/support/lzw_ours.rs`) against weezl 0.2, which replaced it, and
//! weezl 0.1, in the same run (issue 14, item 7).
//!
//! Inputs are whole LZW blocks as the TIFF reader hands them to the codec:
//! every tile of the shared `rasterio/rgb_lzw.tif` (256×256 RGB u8),
//! `rio-color/rgb16.tif` (32×32 RGB u16: small blocks, where a decoder's setup
//! cost shows) and one Landsat 8 band (256×256 u16), each when present under
//! `RSEMBED_BENCH_DATA` (default `../shared/data/geotiff` from the repository
//! root), plus a synthetic 256×256 u16 tile with horizontal differencing
//! (predictor 2), encoded here with weezl's TIFF encoder. One iteration decodes
//! every block of an input into a fresh buffer of the block's expected size,
//! as `codec.rs` does; the outputs of all decoders are checked equal first.
//!
//! Decoders: `ours`; `weezl-0.2` (a decoder built per block, MSB, 8-bit, TIFF
//! size switch, yield on a full buffer, as the codec would call it);
//! `weezl-0.2-reused` (one decoder, `reset` per block); `weezl-0.1` (built per
//! block). Run with `cargo bench -p rsembed-raster --bench lzw`; the ratios in
//! docs/benchmarks.md are criterion's mean times, ours ÷ weezl.

// The decoder the reader used before weezl 0.2.
#[path = "support/lzw_ours.rs"]
#[allow(dead_code)]
mod lzw;

use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// Decoded blocks of one input: the compressed bytes and the decoded size.
struct Input {
    name: String,
    blocks: Vec<Vec<u8>>,
    expected: usize,
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}

/// The LZW tiles of the first IFD of a little-endian classic TIFF; `None`
/// (with the reason printed) for anything else.
fn lzw_tiles(path: &Path) -> Option<Input> {
    let b = std::fs::read(path).ok()?;
    if b.get(..4) != Some(b"II*\0") {
        println!(
            "SKIPPED {}: not a little-endian classic TIFF",
            path.display()
        );
        return None;
    }
    let ifd = u32_at(&b, 4)? as usize;
    let n = u16_at(&b, ifd)? as usize;
    let mut tags = std::collections::HashMap::new();
    for i in 0..n {
        let e = ifd + 2 + i * 12;
        let (tag, typ, count) = (
            u16_at(&b, e)?,
            u16_at(&b, e + 2)?,
            u32_at(&b, e + 4)? as usize,
        );
        let size = if typ == 3 { 2 } else { 4 };
        let at = if size * count <= 4 {
            e + 8
        } else {
            u32_at(&b, e + 8)? as usize
        };
        let vals: Option<Vec<u64>> = (0..count.min(1 << 20))
            .map(|k| match typ {
                3 => u16_at(&b, at + 2 * k).map(u64::from),
                _ => u32_at(&b, at + 4 * k).map(u64::from),
            })
            .collect();
        tags.insert(tag, vals?);
    }
    let one = |t: u16| tags.get(&t).and_then(|v| v.first().copied());
    if one(259) != Some(5) || !tags.contains_key(&324) {
        println!("SKIPPED {}: not tiled LZW", path.display());
        return None;
    }
    let planar = one(284).unwrap_or(1);
    let spp = if planar == 2 { 1 } else { one(277)? };
    let expected = (one(322)? * one(323)? * spp * one(258)? / 8) as usize;
    let blocks = tags[&324]
        .iter()
        .zip(&tags[&325])
        .map(|(&o, &n)| b.get(o as usize..(o + n) as usize).map(<[u8]>::to_vec))
        .collect::<Option<Vec<_>>>()?;
    Some(Input {
        name: format!(
            "{} ({} tiles, predictor {})",
            path.file_name()?.to_string_lossy(),
            blocks.len(),
            one(317).unwrap_or(1)
        ),
        blocks,
        expected,
    })
}

/// A 256×256 u16 tile shaped like a Landsat band (smooth field, a few levels
/// of noise), horizontally differenced as TIFF predictor 2 stores it.
fn synthetic_u16_predictor2() -> Input {
    let (w, h) = (256usize, 256usize);
    let mut st = 0x2545F4914F6CDD1Du64;
    let mut px = vec![0u16; w * h];
    for y in 0..h {
        for x in 0..w {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            let (fx, fy) = (x as f64, y as f64);
            let v = 8000.0 + 600.0 * (fx / 17.0).sin() + 400.0 * (fy / 23.0).cos() + fx * fy / 40.0;
            px[y * w + x] = v as u16 + (st % 24) as u16;
        }
    }
    let mut bytes = Vec::with_capacity(w * h * 2);
    for row in px.chunks(w) {
        let mut prev = 0u16;
        for &v in row {
            bytes.extend_from_slice(&v.wrapping_sub(prev).to_le_bytes());
            prev = v;
        }
    }
    let enc = weezl::encode::Encoder::with_tiff_size_switch(weezl::BitOrder::Msb, 8)
        .encode(&bytes)
        .expect("encoding the synthetic tile");
    Input {
        name: "synthetic u16 256x256 (predictor 2)".into(),
        expected: bytes.len(),
        blocks: vec![enc],
    }
}

fn weezl02() -> weezl::decode::Decoder {
    weezl::decode::Configuration::with_tiff_size_switch(weezl::BitOrder::Msb, 8)
        .with_yield_on_full_buffer(true)
        .build()
}

fn ours(block: &[u8], expected: usize) -> Vec<u8> {
    let mut out = vec![0u8; expected];
    let d = lzw::decode(block, &mut out).expect("ours decodes");
    assert_eq!(d.written, expected);
    out
}

/// Calls `decode_bytes` until the block is full, the stream ends or no
/// progress is made: one call may stop early (a clear code, a full internal
/// buffer).
macro_rules! decode_loop {
    ($dec:expr, $block:expr, $out:expr, $ok:pat) => {{
        let (mut i, mut o) = (0usize, 0usize);
        while o < $out.len() {
            let r = $dec.decode_bytes(&$block[i..], &mut $out[o..]);
            i += r.consumed_in;
            o += r.consumed_out;
            match r.status.expect("weezl decodes") {
                $ok if r.consumed_in + r.consumed_out > 0 => {}
                _ => break,
            }
        }
        o
    }};
}

fn with_weezl02(dec: &mut weezl::decode::Decoder, block: &[u8], expected: usize) -> Vec<u8> {
    let mut out = vec![0u8; expected];
    let o = decode_loop!(dec, block, out, weezl::LzwStatus::Ok);
    assert_eq!(o, expected);
    out
}

fn with_weezl01(block: &[u8], expected: usize) -> Vec<u8> {
    let mut out = vec![0u8; expected];
    let mut dec = weezl01::decode::Decoder::with_tiff_size_switch(weezl01::BitOrder::Msb, 8);
    let o = decode_loop!(dec, block, out, weezl01::LzwStatus::Ok);
    assert_eq!(o, expected);
    out
}

fn inputs() -> Vec<Input> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let data = std::env::var_os("RSEMBED_BENCH_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("../shared/data/geotiff"));
    let mut out = Vec::new();
    for f in [
        "rasterio/rgb_lzw.tif",
        "rio-color/rgb16.tif",
        "rio-pansharpen/LC81070352015122LGN00/LC81070352015122LGN00_B3.tif",
    ] {
        let p = data.join(f);
        if p.is_file() {
            out.extend(lzw_tiles(&p));
        } else {
            println!("SKIPPED {}: absent (set RSEMBED_BENCH_DATA)", p.display());
        }
    }
    out.push(synthetic_u16_predictor2());
    out
}

fn bench(c: &mut Criterion) {
    for input in inputs() {
        let (blocks, n) = (&input.blocks, input.expected);
        for b in blocks {
            let want = with_weezl01(b, n);
            assert!(ours(b, n) == want, "{}: ours differs", input.name);
            assert!(
                with_weezl02(&mut weezl02(), b, n) == want,
                "{}: weezl 0.2 differs",
                input.name
            );
        }
        let mut g = c.benchmark_group(format!("lzw/{}", input.name));
        g.throughput(Throughput::Bytes((n * blocks.len()) as u64));
        g.bench_function("ours", |bch| {
            bch.iter(|| {
                for b in blocks {
                    std::hint::black_box(ours(b, n));
                }
            })
        });
        g.bench_function("weezl-0.2", |bch| {
            bch.iter(|| {
                for b in blocks {
                    std::hint::black_box(with_weezl02(&mut weezl02(), b, n));
                }
            })
        });
        let mut dec = weezl02();
        g.bench_function("weezl-0.2-reused", |bch| {
            bch.iter(|| {
                for b in blocks {
                    dec.reset();
                    std::hint::black_box(with_weezl02(&mut dec, b, n));
                }
            })
        });
        g.bench_function("weezl-0.1", |bch| {
            bch.iter(|| {
                for b in blocks {
                    std::hint::black_box(with_weezl01(b, n));
                }
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
