//! Hostile inputs: every one must be an `Err`, never a panic or an unbounded allocation.

use std::io::Write;

use futures::executor::block_on;

use super::test_util::*;
use super::*;

/// Opens and reads the whole image; the first error, if any.
fn try_all(data: Vec<u8>, limits: TiffLimits) -> Result<(), TiffError> {
    let f = open_with(data, limits)?;
    let i = f.image().clone();
    let bands: Vec<usize> = (0..i.bands).collect();
    block_on(f.read_window(0, 0, 0, i.width, i.height, &bands))?;
    for l in 1..=f.overviews().len() {
        let o = &f.overviews()[l - 1];
        block_on(f.read_window(l, 0, 0, o.width, o.height, &bands))?;
    }
    Ok(())
}

fn le16(d: &[u8], at: usize) -> usize {
    u16::from_le_bytes([d[at], d[at + 1]]) as usize
}
fn le32(d: &[u8], at: usize) -> usize {
    u32::from_le_bytes([d[at], d[at + 1], d[at + 2], d[at + 3]]) as usize
}
fn put32(d: &mut [u8], at: usize, v: u32) {
    d[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Byte position of the first IFD's entry for `tag` (classic little-endian files).
fn entry(d: &[u8], tag: u16) -> usize {
    let ifd = le32(d, 4);
    let n = le16(d, ifd);
    (0..n)
        .map(|i| ifd + 2 + 12 * i)
        .find(|&e| le16(d, e) == tag as usize)
        .expect("tag")
}

fn set_long(d: &mut [u8], tag: u16, v: u32) {
    let e = entry(d, tag);
    d[e + 2..e + 4].copy_from_slice(&4u16.to_le_bytes());
    put32(d, e + 4, 1);
    put32(d, e + 8, v);
}

const BASE: &str = "u8_deflate_tp.tif";

#[test]
fn base_fixture_reads() {
    try_all(fixture(BASE), TiffLimits::default()).unwrap();
}

#[test]
fn truncated_files_fail() {
    let d = fixture(BASE);
    for cut in [0, 1, 4, 7, 8, 12, 20, 100, d.len() / 2, d.len() - 1] {
        let r = try_all(d[..cut].to_vec(), TiffLimits::default());
        assert!(r.is_err(), "cut at {cut} of {}", d.len());
    }
}

#[test]
fn ifd_loops_fail() {
    let mut d = fixture(BASE);
    let ifd = le32(&d, 4);
    let next = ifd + 2 + 12 * le16(&d, ifd);
    put32(&mut d, next, ifd as u32);
    let e = open_bytes(d).unwrap_err();
    assert!(e.to_string().contains("loop"), "{e}");
    // A longer loop through overview and mask IFDs.
    let mut d = fixture("u8_mask_ovr_deflate_tp.tif");
    let mut off = le32(&d, 4);
    let mut last = 0;
    while off != 0 {
        last = off + 2 + 12 * le16(&d, off);
        off = le32(&d, last);
    }
    let second = le32(&d, le32(&d, 4) + 2 + 12 * le16(&d, le32(&d, 4)));
    put32(&mut d, last, second as u32);
    assert!(open_bytes(d).unwrap_err().to_string().contains("loop"));
}

#[test]
fn tile_past_end_of_file_fails() {
    let mut d = fixture(BASE);
    let e = entry(&d, 324);
    let arr = le32(&d, e + 8);
    let len = d.len() as u32;
    put32(&mut d, arr, len + 100);
    assert!(matches!(
        try_all(d, TiffLimits::default()),
        Err(TiffError::Truncated { .. })
    ));
}

#[test]
fn huge_claimed_dimensions_fail() {
    let mut d = fixture(BASE);
    set_long(&mut d, 256, 1_000_000);
    set_long(&mut d, 257, 1_000_000);
    assert!(matches!(
        open_bytes(d.clone()),
        Err(TiffError::Limit {
            what: "image pixels",
            ..
        })
    ));
    // With the pixel limit lifted the tile count (62500² tiles) is still refused.
    let lifted = TiffLimits {
        max_pixels: u64::MAX,
        ..TiffLimits::default()
    };
    assert!(matches!(
        open_with(d, lifted),
        Err(TiffError::Limit {
            what: "block count",
            ..
        })
    ));
}

#[test]
fn absurd_tile_counts_fail() {
    let mut d = fixture(BASE);
    set_long(&mut d, 322, 1);
    set_long(&mut d, 323, 1);
    assert!(matches!(open_bytes(d), Err(TiffError::Malformed(_))));
    let tight = TiffLimits {
        max_blocks: 4,
        ..TiffLimits::default()
    };
    assert!(matches!(
        open_with(fixture(BASE), tight),
        Err(TiffError::Limit {
            what: "block count",
            ..
        })
    ));
    // Huge tiles: one tile claiming 2^20 x 2^20 pixels.
    let mut d = fixture(BASE);
    set_long(&mut d, 322, 1 << 20);
    set_long(&mut d, 323, 1 << 20);
    assert!(matches!(open_bytes(d), Err(TiffError::Limit { .. })));
}

#[test]
fn decompression_bomb_fails() {
    // 64 MiB of zeros deflate to ~64 KiB; the tile may hold 768 bytes.
    let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..64 {
        enc.write_all(&chunk).unwrap();
    }
    let bomb = enc.finish().unwrap();
    let mut d = fixture(BASE);
    let at = d.len() as u32;
    d.extend_from_slice(&bomb);
    let off = le32(&d, entry(&d, 324) + 8);
    let cnt = le32(&d, entry(&d, 325) + 8);
    put32(&mut d, off, at);
    put32(&mut d, cnt, bomb.len() as u32);
    let e = try_all(d, TiffLimits::default()).unwrap_err();
    assert!(matches!(e, TiffError::BlockSize { .. }), "{e}");
}

#[test]
fn bad_tag_counts_and_types_fail() {
    // TileOffsets claiming 2^31 entries.
    let mut d = fixture(BASE);
    let e = entry(&d, 324);
    put32(&mut d, e + 4, 0x7fff_ffff);
    assert!(open_bytes(d).is_err());
    // Unknown field type on a tag we use.
    let mut d = fixture(BASE);
    let e = entry(&d, 258);
    d[e + 2] = 99;
    assert!(matches!(open_bytes(d), Err(TiffError::Malformed(_))));
    // Entry count far beyond the IFD.
    let mut d = fixture(BASE);
    let ifd = le32(&d, 4);
    d[ifd..ifd + 2].copy_from_slice(&60000u16.to_le_bytes());
    assert!(open_bytes(d).is_err());
    // BitsPerSample count 0: no values.
    let mut d = fixture(BASE);
    let e = entry(&d, 258);
    put32(&mut d, e + 4, 0);
    assert!(open_bytes(d).is_err());
}

#[test]
fn unsupported_encodings_are_named() {
    for (code, name) in [
        (6u32, "old-style JPEG"),
        (34712, "JPEG 2000"),
        (34887, "LERC"),
        (12345, "unknown"),
    ] {
        let mut d = fixture(BASE);
        let e = entry(&d, 259);
        d[e + 8..e + 10].copy_from_slice(&(code as u16).to_le_bytes());
        let err = open_bytes(d).unwrap_err();
        assert!(err.to_string().contains(name), "{err}");
    }
}

#[test]
fn random_corruption_never_panics() {
    let base = fixture("u8_mask_ovr_deflate_tp.tif");
    let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as usize
    };
    let (mut ok, mut err) = (0, 0);
    for _ in 0..400 {
        let mut d = base.clone();
        for _ in 0..1 + next() % 4 {
            // Mostly the metadata region, sometimes anywhere.
            let at = if next() % 4 == 0 {
                next() % d.len()
            } else {
                next() % 1024.min(d.len())
            };
            d[at] = next() as u8;
        }
        match try_all(d, TiffLimits::default()) {
            Ok(()) => ok += 1,
            Err(_) => err += 1,
        }
    }
    println!("corruption: {ok} still readable, {err} errors");
}

/// Found by the `tiff_decode` fuzzer: a 1-bit mask stored as one WebP strip whose
/// stream claims a 16383×2048 RGBA image; decoding it allocated 32× the block's
/// size before the size check. 8-bit codecs now refuse such blocks first.
#[test]
fn webp_mask_cannot_allocate_past_its_block() {
    let data = fuzz_regression("webp_bitmask_amplification.tif");
    let limits = TiffLimits {
        max_window_samples: 1 << 20,
        max_fetch_bytes: 8 << 20,
        max_tile_bytes: 4 << 20,
        ..TiffLimits::default()
    };
    // As the fuzz target reads: a 64×64 window of every band at the origin.
    let f = open_with(data, limits).expect("the header is valid");
    let bands: Vec<usize> = (0..f.image().bands).collect();
    let err =
        block_on(f.read_window(0, 0, 0, 64, 64, &bands)).expect_err("the mask block is refused");
    assert!(err.to_string().contains("8-bit"), "{err}");
}

/// Found by the `tiff_decode` fuzzer: a 1-bit image (not a mask) was copied
/// as if its blocks held a byte a pixel, and indexed past their end.
#[test]
fn bilevel_image_is_an_error_not_a_panic() {
    let data = fuzz_regression("bilevel_image.tif");
    let f = open_with(data, TiffLimits::default()).expect("the header is valid");
    let info = f.image().clone();
    let bands: Vec<usize> = (0..info.bands).collect();
    for (x, y) in [(0, 0), (info.width as i64 - 32, info.height as i64 - 32)] {
        let err = block_on(f.read_window(0, x, y, 64, 64, &bands))
            .expect_err("a bilevel image is refused");
        assert!(err.to_string().contains("1-bit"), "{err}");
    }
}
