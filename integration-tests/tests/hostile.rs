//! Hostile inputs through `rsembed run`: each becomes an error record for that
//! input, the others are still embedded, nothing panics, and the process's peak
//! memory stays under a stated bound.
//!
//! The files are made by patching a small committed GeoTIFF
//! (`fixtures/tiff/u8_deflate_tp.tif`: little-endian classic TIFF, 16×16 deflate
//! tiles) in its first IFD. Decompression bombs and IFD loops through overviews
//! are covered at the reader level (`worker/raster/src/tiff/tests_hostile.rs`).

use std::path::Path;
use std::time::Duration;

use rsembed_integration_tests::*;

/// Peak resident memory the whole run may reach, model and ONNX Runtime included.
const PEAK_RSS_BOUND_KIB: u64 = 512 * 1024;

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

/// Byte offset of the IFD entry for `tag` in the first IFD.
fn entry(b: &[u8], tag: u16) -> usize {
    let ifd = u32_at(b, 4) as usize;
    let n = u16_at(b, ifd) as usize;
    (0..n)
        .map(|i| ifd + 2 + 12 * i)
        .find(|e| u16_at(b, *e) == tag)
        .unwrap_or_else(|| panic!("tag {tag} in the fixture"))
}

fn set_long(b: &mut [u8], tag: u16, value: u32) {
    let e = entry(b, tag);
    b[e + 2..e + 4].copy_from_slice(&4u16.to_le_bytes());
    b[e + 4..e + 8].copy_from_slice(&1u32.to_le_bytes());
    b[e + 8..e + 12].copy_from_slice(&value.to_le_bytes());
}

fn hostile_files(dir: &Path) -> Vec<&'static str> {
    let good = std::fs::read(root().join("fixtures/tiff/u8_deflate_tp.tif")).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("good.tif"), &good).unwrap();
    let put = |name: &str, b: &[u8]| std::fs::write(dir.join(name), b).unwrap();

    put("truncated.tif", &good[..good.len() / 3]);

    let mut loop_ = good.clone();
    let ifd = u32_at(&good, 4) as usize;
    let n = u16_at(&good, ifd) as usize;
    let next = ifd + 2 + 12 * n;
    loop_[next..next + 4].copy_from_slice(&(ifd as u32).to_le_bytes());
    put("ifd_loop.tif", &loop_);

    let mut past = good.clone();
    let e = entry(&good, 324);
    let (count, at) = (u32_at(&good, e + 4) as usize, u32_at(&good, e + 8) as usize);
    for i in 0..count {
        past[at + 4 * i..at + 4 * i + 4].copy_from_slice(&0x7fff_0000u32.to_le_bytes());
    }
    put("tiles_past_eof.tif", &past);

    let mut huge = good.clone();
    set_long(&mut huge, 256, 1_000_000);
    set_long(&mut huge, 257, 1_000_000);
    put("million_by_million.tif", &huge);

    let mut tiles = good.clone();
    // Under the pixel limit (65535² < 2³²) but 16.8 million 16×16 tiles.
    set_long(&mut tiles, 256, 65_535);
    set_long(&mut tiles, 257, 65_535);
    put("absurd_tile_count.tif", &tiles);

    let mut keys = good.clone();
    let e = entry(&good, 34735);
    let at = u32_at(&good, e + 8) as usize;
    // GeoKeyDirectory header: version, revision, minor, key count. Claim 60 000 keys.
    keys[at + 6..at + 8].copy_from_slice(&60_000u16.to_le_bytes());
    put("bad_geokeys.tif", &keys);

    vec![
        "truncated.tif",
        "ifd_loop.tif",
        "tiles_past_eof.tif",
        "million_by_million.tif",
        "absurd_tile_count.tif",
        "bad_geokeys.tif",
    ]
}

/// Runs a command, sampling its peak resident set (VmHWM) until it exits.
fn run_with_peak(cmd: &mut std::process::Command) -> (std::process::Output, u64) {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let status_path = format!("/proc/{pid}/status");
    let sampler = std::thread::spawn(move || {
        let mut peak = 0u64;
        while let Ok(s) = std::fs::read_to_string(&status_path) {
            if let Some(kib) = s
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
            {
                peak = peak.max(kib);
            }
            if s.contains("State:\tZ") {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        peak
    });
    let out = child.wait_with_output().unwrap();
    (out, sampler.join().unwrap())
}

#[test]
fn hostile_tiffs_are_error_records_within_a_memory_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let names = hostile_files(&input);
    let out = tmp.path().join("out");
    let (o, peak_kib) = run_with_peak(&mut run_cmd(&input, &out, &tiny_model()));
    eprintln!("stderr:\n{}", String::from_utf8_lossy(&o.stderr));
    eprintln!("peak RSS {peak_kib} KiB");
    assert_eq!(o.status.code(), Some(3), "finished, with failed inputs");
    assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
    assert!(
        peak_kib > 0 && peak_kib < PEAK_RSS_BOUND_KIB,
        "peak RSS {peak_kib} KiB"
    );
    let errors = duckdb(&format!(
        "SELECT regexp_extract(source_uri, '[^/]+$'), error FROM '{}/errors/*.parquet' ORDER BY 1",
        out.display()
    ));
    let failed: Vec<&str> = errors
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_str().unwrap())
        .collect();
    for n in &names {
        assert!(failed.contains(n), "{n} has an error record: {errors}");
    }
    assert_eq!(failed.len(), names.len());
    let good = duckdb(&format!(
        "SELECT count(*) FROM '{}/chips/*.parquet' WHERE source_uri LIKE '%/good.tif'",
        out.display()
    ));
    assert_eq!(good[0][0], 1, "the good file is still embedded");
}

#[test]
fn a_tar_member_that_lies_about_its_size_is_an_error_record() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    // One good member, then one whose header claims 1 MiB with 10 bytes present.
    let script = r#"
import io, sys, tarfile
out, png = sys.argv[1], sys.argv[2]
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w") as t:
    t.add(png, arcname="good.png")
    ti = tarfile.TarInfo("liar.png"); ti.size = 1 << 20
    t.addfile(ti, io.BytesIO(b"\0" * (1 << 20)))
data = buf.getvalue()
start = data.index(b"liar.png") + 512
open(out, "wb").write(data[:start + 10])
"#;
    let st = std::process::Command::new(python())
        .args(["-c", script])
        .arg(input.join("lies.tar"))
        .arg(fixture_images().join("small_64.jpg"))
        .status()
        .unwrap();
    assert!(st.success());
    let out = tmp.path().join("out");
    let o = run(&mut run_cmd(&input, &out, &tiny_model()));
    assert_eq!(o.status.code(), Some(3));
    let errors = duckdb(&format!(
        "SELECT source_uri FROM '{}/errors/*.parquet'",
        out.display()
    ));
    let uris: Vec<&str> = errors
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[0].as_str().unwrap())
        .collect();
    assert!(
        uris.iter()
            .any(|u| u.ends_with("lies.tar#liar.png") || u.ends_with("lies.tar")),
        "{uris:?}"
    );
    let good = duckdb(&format!(
        "SELECT count(*) FROM '{}/chips/*.parquet'",
        out.display()
    ));
    assert_eq!(good[0][0], 1, "the member before it is embedded");
}
