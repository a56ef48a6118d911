//! Decodes arbitrary bytes with the libjpeg-exact JPEG decoder (plain and
//! TIFF-style with a tables stream). The first byte picks the colour transform
//! and whether a tables stream is split off the front; limits are tight so the
//! fuzzer spends its time on panics and limit bypasses, not on large images.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rsembed_raster::jpeg::{decode, read_header, ColorTransform, Limits};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let transform = match mode % 3 {
        0 => ColorTransform::Auto,
        1 => ColorTransform::YCbCrToRgb,
        _ => ColorTransform::None,
    };
    // With the high bit set, the bytes up to the first EOI are a tables stream.
    let (tables, image) = match (mode & 0x80 != 0)
        .then(|| rest.windows(2).position(|w| w == [0xFF, 0xD9]))
        .flatten()
    {
        Some(i) => (Some(&rest[..i + 2]), &rest[i + 2..]),
        None => (None, rest),
    };
    let limits = Limits {
        max_width: 2048,
        max_height: 2048,
        max_alloc: 32 << 20,
    };
    let header = read_header(tables, image);
    if let Ok(img) = decode(tables, image, transform, &limits) {
        let h = header.expect("a stream that decodes has a header");
        assert_eq!((img.width, img.height), (h.width, h.height));
        assert_eq!(
            img.data.len(),
            img.width as usize * img.height as usize * usize::from(img.components)
        );
    }
});
