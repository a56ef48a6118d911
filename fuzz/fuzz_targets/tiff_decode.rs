//! Opens arbitrary bytes and reads a few windows of all bands (level 0 and the
//! first overview): a 64×64 window at the origin and one crossing the right
//! and bottom edges. Limits are tight so that the fuzzer spends its time on
//! panics and limit bypasses rather than on legitimately large (slow) reads;
//! scripts/fuzz.sh also caps single allocations (-malloc_limit_mb) well below
//! anything these limits allow.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use rsembed_raster::tiff::{TiffFile, TiffLimits, WindowData};

fn limits() -> TiffLimits {
    TiffLimits {
        max_ifds: 16,
        max_pixels: 1 << 26,
        max_tile_bytes: 4 << 20,
        max_blocks: 1 << 16,
        max_tag_bytes: 1 << 20,
        max_ifd_entries: 1024,
        max_bands: 64,
        max_window_samples: 1 << 20,
        max_fetch_bytes: 8 << 20,
        coalesce_gap: 4 << 10,
        max_request_bytes: 1 << 20,
        prefetch_bytes: 4 << 10,
    }
}

fn check(d: &WindowData, w: u32, h: u32, bands: usize) {
    let npix = w as usize * h as usize;
    assert_eq!((d.width, d.height, d.bands), (w, h, bands));
    assert_eq!(d.values.len(), npix * bands, "values length");
    assert_eq!(d.valid.len(), npix, "valid length");
}

fuzz_target!(|data: &[u8]| {
    let limits = limits();
    futures::executor::block_on(async {
        let f = match TiffFile::open(common::MemReader::new(data), limits.clone()).await {
            Ok(f) => f,
            Err(e) => {
                let _ = e.to_string();
                return;
            }
        };
        let mut levels = vec![(0usize, f.image().clone())];
        if let Some(o) = f.overviews().first() {
            levels.push((1, o.clone()));
        }
        for (level, info) in levels {
            let bands: Vec<usize> = (0..info.bands).collect();
            let (w, h) = (64u32, 64u32);
            let windows = [
                (0i64, 0i64),
                (info.width as i64 - 32, info.height as i64 - 32),
            ];
            for (x, y) in windows {
                match f.read_window(level, x, y, w, h, &bands).await {
                    Ok(d) => {
                        assert!(
                            (w as u64 * h as u64 * bands.len() as u64) <= limits.max_window_samples,
                            "window over max_window_samples returned"
                        );
                        check(&d, w, h, bands.len())
                    }
                    Err(e) => {
                        let _ = e.to_string();
                    }
                }
            }
        }
    });
});
