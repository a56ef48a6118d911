//! Parity with GDAL on the committed fixtures (fixtures/tiff, see tools/gen_tiff_fixtures.py).

use futures::executor::block_on;

use super::test_util::*;
use super::*;

struct Case {
    tif: String,
    level: usize,
    expected: String,
    dtype: SampleType,
    width: u32,
    height: u32,
    bands: usize,
    mask: Option<String>,
    tol: f64,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(format!("{FIXTURES}/cases.txt")).expect("cases.txt");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Case {
                tif: f[0].into(),
                level: f[1].parse().unwrap(),
                expected: f[2].into(),
                dtype: dtype(f[3]),
                width: f[4].parse().unwrap(),
                height: f[5].parse().unwrap(),
                bands: f[6].parse().unwrap(),
                mask: (f[7] != "-").then(|| f[7].to_string()),
                tol: f[8].parse().unwrap(),
            }
        })
        .collect()
}

/// Name-encoded properties of a fixture: compression, layout, byte order.
fn check_info(c: &Case, info: &ImageInfo) {
    let n = &c.tif;
    let comp = [
        ("none", 1),
        ("lzw", 5),
        ("deflate", 8),
        ("packbits", 32773),
        ("jpeg", 7),
        ("zstd", 50000),
        ("webp", 50001),
    ];
    for (k, v) in comp {
        if n.contains(&format!("_{k}_")) {
            assert_eq!(info.compression, v, "{n}: compression");
        }
    }
    if n.ends_with("_tp.tif") || n.ends_with("_tb.tif") {
        assert!(info.tiled, "{n}: tiled");
    }
    if n.ends_with("_sp.tif") || n.ends_with("_sb.tif") {
        assert!(!info.tiled, "{n}: striped");
    }
    if n.ends_with("b.tif") {
        assert!(info.planar, "{n}: planar");
    }
    if n.contains("pred2") {
        assert_eq!(info.predictor, 2, "{n}");
    }
    if n.contains("pred3") {
        assert_eq!(info.predictor, 3, "{n}");
    }
    if n.contains("jpeg_ycbcr") {
        assert_eq!(info.photometric, 6, "{n}");
    }
}

#[test]
fn fixtures_match_gdal() {
    let all = cases();
    assert!(all.len() >= 40, "cases.txt has {} cases", all.len());
    let mut report = Vec::new();
    for c in &all {
        let f = open_bytes(fixture(&c.tif)).unwrap_or_else(|e| panic!("{}: {e}", c.tif));
        let info = if c.level == 0 {
            f.image().clone()
        } else {
            f.overviews()[c.level - 1].clone()
        };
        assert_eq!(
            (info.width, info.height, info.bands),
            (c.width, c.height, c.bands),
            "{}",
            c.tif
        );
        assert_eq!(info.sample_type, c.dtype, "{}", c.tif);
        check_info(c, &info);
        let exp = raw_values(&fixture(&format!("expected/{}", c.expected)), c.dtype);
        let bands: Vec<usize> = (0..c.bands).collect();
        // The whole raster with a padding frame around it.
        let (x, y) = (-3i64, -2i64);
        let win = block_on(f.read_window(c.level, x, y, c.width + 7, c.height + 5, &bands))
            .unwrap_or_else(|e| panic!("{} level {}: {e}", c.tif, c.level));
        let what = format!("{} level {}", c.tif, c.level);
        let (max, mean) = compare(&win, &exp, x, y, c.width, c.height, &what);
        assert!(max <= c.tol, "{what}: max diff {max} > {}", c.tol);
        // Every codec, JPEG included, is exact against GDAL; the mean bound only
        // matters if a case ever carries a tolerance.
        assert!(mean <= 0.5, "{what}: mean diff {mean}");
        if c.tol > 0.0 {
            report.push(format!("{what}: max {max} mean {mean:.4}"));
        }
        if let Some(m) = &c.mask {
            assert!(f.has_mask(), "{what}: has_mask");
            let mv = fixture(&format!("expected/{m}"));
            for r in 0..c.height as i64 {
                for col in 0..c.width as i64 {
                    let got = win.valid[((r - y) * (c.width as i64 + 7) + col - x) as usize];
                    assert_eq!(
                        got,
                        mv[(r * c.width as i64 + col) as usize] != 0,
                        "{what}: mask at ({col},{r})"
                    );
                }
            }
        }
        // A sub-window at an odd offset must equal the same part of the big read.
        let sub = block_on(f.read_window(c.level, 5, 3, 9, 7, &bands[bands.len() - 1..])).unwrap();
        for r in 0..7 {
            for col in 0..9 {
                let big = win.values.get(
                    ((bands.len() - 1) as i64 * win.width as i64 * win.height as i64
                        + (r + 3 - y) * win.width as i64
                        + col
                        + 5
                        - x) as usize,
                );
                let s = sub.values.get((r * 9 + col) as usize);
                assert!(
                    big == s || (big.is_nan() && s.is_nan()),
                    "{what}: sub-window ({col},{r})"
                );
            }
        }
    }
    for r in report {
        println!("{r}");
    }
}

#[test]
fn nodata_box_is_invalid() {
    let f = open_bytes(fixture("u8_nodata_deflate_tb.tif")).unwrap();
    assert_eq!(f.image().nodata, Some(0.0));
    let w = block_on(f.read_window(0, 0, 0, 45, 37, &[0, 1, 2])).unwrap();
    for r in 0..37 {
        for c in 0..45 {
            let inside = (10..30).contains(&c) && (5..20).contains(&r);
            assert_eq!(w.valid[r * 45 + c], !inside, "({c},{r})");
        }
    }
}

#[test]
fn nan_nodata_is_nan_aware() {
    let f = open_bytes(fixture("f32_deflate_pred3_tp.tif")).unwrap();
    assert!(f.image().nodata.unwrap().is_nan());
    let w = block_on(f.read_window(0, 0, 0, 37, 23, &[0, 1])).unwrap();
    for r in 0..23 {
        for c in 0..37 {
            let inside = (3..9).contains(&c) && (4..11).contains(&r);
            assert_eq!(w.valid[r * 37 + c], !inside, "({c},{r})");
            assert_eq!(w.values.get(r * 37 + c).is_nan(), inside);
        }
    }
}

#[test]
fn alpha_zero_is_invalid() {
    let f = open_bytes(fixture("u8_alpha_deflate_tp.tif")).unwrap();
    assert_eq!(f.image().alpha_band, Some(3));
    let w = block_on(f.read_window(0, 0, 0, 45, 37, &[0])).unwrap();
    assert_eq!(w.values.len(), 45 * 37);
    for r in 0..37 {
        for c in 0..45 {
            assert_eq!(w.valid[r * 45 + c], (r + c) % 5 != 0, "({c},{r})");
        }
    }
}

#[test]
fn mask_and_overviews_are_classified() {
    for name in ["u8_mask_ovr_deflate_tp.tif", "u8_mask_ovr_jpeg_tp.tif"] {
        let f = open_bytes(fixture(name)).unwrap();
        assert_eq!(f.image().bands, 3, "{name}: mask is not a band");
        assert_eq!(f.image().ifd_index, 0);
        assert!(f.has_mask());
        let ov: Vec<u32> = f.overviews().iter().map(|o| o.width).collect();
        assert!(ov.windows(2).all(|p| p[0] > p[1]), "{name}: {ov:?}");
        assert!(f.overviews().iter().all(|o| o.bands == 3));
    }
}

#[test]
fn only_intersecting_tiles_are_fetched() {
    let data = fixture("u8_lzw_tp.tif");
    let r = MemReader::new(data);
    let limits = TiffLimits {
        prefetch_bytes: 0,
        ..TiffLimits::default()
    };
    let f = block_on(TiffFile::open(r.clone(), limits)).unwrap();
    let before = r.bytes.load(std::sync::atomic::Ordering::Relaxed);
    let reqs = r.requests.load(std::sync::atomic::Ordering::Relaxed);
    // One 16x16 tile out of 9.
    block_on(f.read_window(0, 17, 17, 8, 8, &[0, 1, 2])).unwrap();
    let lv = &f.levels[0];
    let tile = lv.counts[lv.across as usize + 1];
    assert_eq!(
        r.bytes.load(std::sync::atomic::Ordering::Relaxed) - before,
        tile
    );
    assert_eq!(
        r.requests.load(std::sync::atomic::Ordering::Relaxed) - reqs,
        1
    );
}

#[test]
fn a_walk_north_to_south_forgets_blocks_above_it_at_no_extra_read() {
    use std::sync::atomic::Ordering::Relaxed;
    // 45x37 in 16x16 tiles, read in 10x10 windows row by row: once keeping
    // every block, once forgetting those above each new row of windows.
    let walk = |forget: bool| {
        let r = MemReader::new(fixture("u8_lzw_tp.tif"));
        // No prefetch: the whole small file would be in it.
        let limits = TiffLimits {
            prefetch_bytes: 0,
            ..TiffLimits::default()
        };
        let f = block_on(TiffFile::open(r.clone(), limits)).unwrap();
        let before = r.bytes.load(Relaxed);
        let mut windows = Vec::new();
        for y in (0..37).step_by(10) {
            if forget {
                f.forget_rows_above(y);
            }
            for x in (0..45).step_by(10) {
                windows.push(block_on(f.read_window(0, x, y, 10, 10, &[0, 1, 2])).unwrap());
            }
        }
        let walked = r.bytes.load(Relaxed) - before;
        // The first row of tiles again: read anew only if it was forgotten.
        block_on(f.read_window(0, 0, 0, 10, 10, &[0, 1, 2])).unwrap();
        (windows, walked, r.bytes.load(Relaxed) - before - walked)
    };
    let (kept, kept_bytes, kept_again) = walk(false);
    let (forgot, forgot_bytes, forgot_again) = walk(true);
    assert_eq!(kept, forgot, "the same pixels");
    assert_eq!(kept_bytes, forgot_bytes, "no block is read twice");
    assert_eq!(kept_again, 0);
    assert!(forgot_again > 0, "the top row of tiles was forgotten");
}

#[test]
fn geo_tags_are_read() {
    let f = open_bytes(fixture("u8_none_tp.tif")).unwrap();
    let g = f.geo_tags();
    assert_eq!(
        g.model_pixel_scale.as_deref().map(|v| &v[..2]),
        Some(&[10.0, 10.0][..])
    );
    assert_eq!(g.model_tiepoint.as_ref().map(|v| v[3]), Some(500000.0));
    assert!(g.geo_key_directory.as_ref().is_some_and(|k| k[0] == 1));
}

#[test]
fn window_fully_outside_is_padding() {
    let f = open_bytes(fixture("u8_none_sp.tif")).unwrap();
    let w = block_on(f.read_window(0, -100, -100, 10, 10, &[0])).unwrap();
    assert!(w.values.to_f64(0..w.values.len()).iter().all(|&v| v == 0.0));
    assert!(w.valid.iter().all(|&v| !v));
    assert!(block_on(f.read_window(0, 0, 0, 4, 4, &[3])).is_err());
    assert!(block_on(f.read_window(5, 0, 0, 4, 4, &[0])).is_err());
}
