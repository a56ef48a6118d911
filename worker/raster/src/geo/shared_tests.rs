//! Checks that need the shared sample data (`../shared/data`, next to the
//! repository); each one prints `SKIPPED` and passes when it is absent.

use super::parity_tests::{fixtures, tags_of};
use super::GeoTiffTags;

const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/geotiff");

/// Minimal first-IFD reader (classic and BigTIFF), only to prove the fixture
/// tags are those of the shared files.
fn read_geotiff_tags(data: &[u8]) -> GeoTiffTags {
    let le = &data[..2] == b"II";
    let u = |o: usize, n: usize| -> u64 {
        let b = &data[o..o + n];
        b.iter().enumerate().fold(0u64, |acc, (i, v)| {
            acc | (u64::from(*v) << (8 * if le { i } else { n - 1 - i }))
        })
    };
    let big = u(2, 2) == 43;
    let (ifd, count_len, entry_len, inline) = if big {
        (u(8, 8), 8, 20, 8)
    } else {
        (u(4, 4), 2, 12, 4)
    };
    let ifd = ifd as usize;
    let n = u(ifd, count_len) as usize;
    let mut t = GeoTiffTags::default();
    for i in 0..n {
        let e = ifd + count_len + i * entry_len;
        let (tag, typ) = (u(e, 2) as u16, u(e + 2, 2));
        let (cnt, val) = if big {
            (u(e + 4, 8) as usize, e + 12)
        } else {
            (u(e + 4, 4) as usize, e + 8)
        };
        let size = match typ {
            2 => 1,
            3 => 2,
            12 => 8,
            _ => continue,
        } * cnt;
        let at = if size <= inline {
            val
        } else {
            u(val, inline) as usize
        };
        let d = |k: usize| f64::from_bits(u(at + 8 * k, 8));
        match tag {
            33550 => t.model_pixel_scale = Some((0..cnt).map(d).collect()),
            33922 => t.model_tiepoint = Some((0..cnt).map(d).collect()),
            34264 => t.model_transformation = Some((0..cnt).map(d).collect()),
            34735 => {
                t.geo_key_directory = Some((0..cnt).map(|k| u(at + 2 * k, 2) as u16).collect())
            }
            34736 => t.geo_double_params = Some((0..cnt).map(d).collect()),
            34737 => {
                t.geo_ascii_params =
                    Some(data[at..at + cnt].iter().map(|b| char::from(*b)).collect())
            }
            _ => {}
        }
    }
    t
}

#[test]
fn fixture_tags_are_those_of_the_shared_files() {
    if !std::path::Path::new(SHARED).is_dir() {
        crate::skipped("../shared/data not present");
        return;
    }
    let mut checked = 0;
    for (name, fx) in fixtures() {
        let Some(rel) = fx["note"]
            .as_str()
            .and_then(|n| n.strip_prefix("real file: "))
        else {
            continue;
        };
        let data = std::fs::read(format!("{SHARED}/{rel}")).unwrap();
        let (file, ours) = (read_geotiff_tags(&data), tags_of(&fx));
        // serde_json's default float parser may land one ulp off.
        let close = |a: &Option<Vec<f64>>, b: &Option<Vec<f64>>| match (a, b) {
            (Some(a), Some(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .zip(b)
                        .all(|(x, y)| (x - y).abs() <= 1e-15 * x.abs())
            }
            (a, b) => a == b,
        };
        assert!(
            close(&file.model_pixel_scale, &ours.model_pixel_scale)
                && close(&file.model_tiepoint, &ours.model_tiepoint)
                && close(&file.model_transformation, &ours.model_transformation)
                && close(&file.geo_double_params, &ours.geo_double_params)
                && file.geo_key_directory == ours.geo_key_directory
                && file.geo_ascii_params == ours.geo_ascii_params,
            "{name}: fixture tags differ from {rel}:\n{file:?}\n{ours:?}"
        );
        checked += 1;
    }
    assert!(checked >= 7);
}
