//! Parity with GDAL on the real files under shared/data/geotiff (skipped when absent).

use futures::executor::block_on;

use super::test_util::*;
use super::*;

fn shared_present() -> bool {
    let ok = std::path::Path::new(SHARED).is_dir();
    if !ok {
        crate::skipped("../shared/data not present");
    }
    ok
}

fn open_shared(rel: &str) -> TiffFile {
    let d = std::fs::read(format!("{SHARED}/{rel}")).unwrap();
    open_bytes(d).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn real_windows_match_gdal() {
    if !shared_present() {
        return;
    }
    let text = std::fs::read_to_string(format!("{FIXTURES}/real_windows.txt")).unwrap();
    let mut cache: std::collections::HashMap<String, TiffFile> = Default::default();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let p: Vec<&str> = line.split_whitespace().collect();
        let (rel, level) = (p[0], p[1].parse::<usize>().unwrap());
        let n: Vec<i64> = p[2..6].iter().map(|v| v.parse().unwrap()).collect();
        let t = dtype(p[6]);
        let tol: f64 = p[9].parse().unwrap();
        let f = cache
            .entry(rel.to_string())
            .or_insert_with(|| open_shared(rel));
        let info = if level == 0 {
            f.image().clone()
        } else {
            f.overviews()[level - 1].clone()
        };
        let bands: Vec<usize> = (0..info.bands).collect();
        let win = block_on(f.read_window(level, n[0], n[1], n[2] as u32, n[3] as u32, &bands))
            .unwrap_or_else(|e| panic!("{line}: {e}"));
        let exp = raw_values(&fixture(&format!("expected/{}", p[7])), t);
        let (max, mean) = compare(&win, &exp, n[0], n[1], info.width, info.height, line);
        println!(
            "{rel} level {level} window {:?}: max diff {max}, mean {mean:.4}",
            &n
        );
        assert!(
            max <= tol && mean <= 0.5,
            "{line}: max diff {max}, mean {mean}"
        );
        if p[8] != "-" {
            let m = fixture(&format!("expected/{}", p[8]));
            let cw = (n[0] + n[2]).min(info.width as i64) - n[0];
            let ch = (n[1] + n[3]).min(info.height as i64) - n[1];
            for r in 0..ch {
                for c in 0..cw {
                    let got = win.valid[(r * n[2] + c) as usize];
                    assert_eq!(got, m[(r * cw + c) as usize] != 0, "{line}: mask ({c},{r})");
                }
            }
        }
    }
}

#[test]
fn real_infos_match_gdalinfo() {
    if !shared_present() {
        return;
    }
    // (path, width, height, bands, type, tiled, planar, compression, block, overviews, mask, nodata)
    #[allow(clippy::type_complexity)]
    let want: &[(
        &str,
        u32,
        u32,
        usize,
        SampleType,
        bool,
        bool,
        u16,
        (u32, u32),
        usize,
        bool,
        Option<f64>,
    )] = &[
        (
            "rasterio/RGB.byte.tif",
            791,
            718,
            3,
            SampleType::U8,
            false,
            false,
            1,
            (791, 3),
            0,
            false,
            Some(0.0),
        ),
        (
            "rasterio/rgb_lzw.tif",
            791,
            718,
            3,
            SampleType::U8,
            true,
            false,
            5,
            (256, 256),
            0,
            false,
            Some(0.0),
        ),
        (
            "rasterio/rgb_deflate.tif",
            791,
            718,
            3,
            SampleType::U8,
            false,
            true,
            8,
            (791, 3),
            0,
            false,
            Some(0.0),
        ),
        (
            "rasterio/cogeo.tif",
            1024,
            1024,
            3,
            SampleType::U8,
            true,
            false,
            7,
            (512, 512),
            6,
            true,
            None,
        ),
        (
            "rasterio/goes.tif",
            542,
            542,
            3,
            SampleType::U8,
            true,
            false,
            7,
            (512, 512),
            1,
            true,
            None,
        ),
        (
            "rasterio/all-nodata.tif",
            71,
            2475,
            4,
            SampleType::U16,
            true,
            true,
            5,
            (256, 256),
            0,
            false,
            Some(0.0),
        ),
        (
            "rio-color/rgb16.tif",
            438,
            500,
            3,
            SampleType::U16,
            true,
            false,
            5,
            (32, 32),
            0,
            false,
            None,
        ),
        (
            "opengeos-data/m_4709963_se_14_1_20200831.tif",
            934,
            723,
            4,
            SampleType::U8,
            true,
            false,
            8,
            (512, 512),
            1,
            false,
            Some(0.0),
        ),
        (
            "rio-pansharpen/LC81070352015122LGN00/LC81070352015122LGN00_B2.tif",
            1550,
            1578,
            1,
            SampleType::U16,
            true,
            false,
            5,
            (256, 256),
            0,
            false,
            None,
        ),
    ];
    for &(rel, w, h, b, t, tiled, planar, comp, block, ovr, mask, nodata) in want {
        let f = open_shared(rel);
        let i = f.image();
        assert_eq!(
            (i.width, i.height, i.bands, i.sample_type),
            (w, h, b, t),
            "{rel}"
        );
        assert_eq!(
            (i.tiled, i.planar, i.compression),
            (tiled, planar, comp),
            "{rel}"
        );
        assert_eq!((i.block_width, i.block_height), block, "{rel}");
        assert_eq!(f.overviews().len(), ovr, "{rel}");
        assert_eq!(f.has_mask(), mask, "{rel}");
        assert_eq!(i.nodata, nodata, "{rel}");
        assert!(f.geo_tags().geo_key_directory.is_some(), "{rel}");
    }
}

#[test]
fn rgb_encodings_give_identical_windows() {
    if !shared_present() {
        return;
    }
    let files = [
        "rasterio/RGB.byte.tif",
        "rasterio/rgb_lzw.tif",
        "rasterio/rgb_deflate.tif",
    ];
    let opened: Vec<TiffFile> = files.iter().map(|r| open_shared(r)).collect();
    for (x, y, w, h) in [
        (0i64, 0i64, 791u32, 718u32),
        (250, 250, 300, 200),
        (700, 650, 128, 128),
        (-10, -5, 64, 64),
    ] {
        let wins: Vec<WindowData> = opened
            .iter()
            .map(|f| block_on(f.read_window(0, x, y, w, h, &[0, 1, 2])).unwrap())
            .collect();
        assert_eq!(wins[0], wins[1], "{x},{y}");
        assert_eq!(wins[0], wins[2], "{x},{y}");
    }
}

#[test]
fn all_real_files_decode_fully() {
    if !shared_present() {
        return;
    }
    let mut stack = vec![std::path::PathBuf::from(SHARED)];
    let mut n = 0;
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|x| x != "tif") {
                continue;
            }
            let f = open_bytes(std::fs::read(&path).unwrap())
                .unwrap_or_else(|e| panic!("{path:?}: {e}"));
            let i = f.image().clone();
            let bands: Vec<usize> = (0..i.bands).collect();
            let w = block_on(f.read_window(0, 0, 0, i.width, i.height, &bands))
                .unwrap_or_else(|e| panic!("{path:?}: {e}"));
            let valid = w.valid.iter().filter(|&&v| v).count();
            println!(
                "{}: {}x{}x{} valid {valid}",
                path.display(),
                i.width,
                i.height,
                i.bands
            );
            if path.ends_with("all-nodata.tif") {
                assert_eq!(valid, 0);
            }
            n += 1;
        }
    }
    assert!(n >= 9);
}
