//! Verification helper for gen_fixtures.py: decodes each `image[,tables]`
//! argument and writes the raw samples to `image.out`. The optional
//! `--transform=none|ycc` flag selects the colour transform.

use std::fs;

fn main() {
    let mut transform = rsembed_raster::jpeg::ColorTransform::Auto;
    for arg in std::env::args().skip(1) {
        if let Some(t) = arg.strip_prefix("--transform=") {
            transform = match t {
                "none" => rsembed_raster::jpeg::ColorTransform::None,
                "ycc" => rsembed_raster::jpeg::ColorTransform::YCbCrToRgb,
                _ => rsembed_raster::jpeg::ColorTransform::Auto,
            };
            continue;
        }
        let (img, tables) = match arg.split_once(',') {
            Some((i, t)) => (i.to_string(), Some(fs::read(t).expect("read tables"))),
            None => (arg.clone(), None),
        };
        let data = fs::read(&img).expect("read image");
        match rsembed_raster::jpeg::decode(
            tables.as_deref(),
            &data,
            transform,
            &rsembed_raster::jpeg::Limits::default(),
        ) {
            Ok(im) => {
                fs::write(format!("{img}.out"), &im.data).expect("write output");
                println!("OK {} {} {} {}", img, im.width, im.height, im.components);
            }
            Err(e) => println!("ERR {img} {e}"),
        }
    }
}
