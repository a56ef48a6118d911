//! Header + IFD chain parsing + IFD classification of arbitrary bytes, then
//! the GeoTIFF tags and GeoKey directory of whatever opens. Default limits:
//! the ones production uses for opening.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use rsembed_worker::raster::geo::parse_geokeys;
use rsembed_worker::raster::tiff::{TiffFile, TiffLimits};

fuzz_target!(|data: &[u8]| {
    let opened = futures::executor::block_on(TiffFile::open(
        common::MemReader::new(data),
        TiffLimits::default(),
    ));
    let f = match opened {
        Ok(f) => f,
        Err(e) => {
            // Error messages are built from file values: format them too.
            let _ = e.to_string();
            return;
        }
    };
    let _ = format!("{f:?}");
    let img = f.image();
    assert!(img.width > 0 && img.height > 0, "empty main image: {img:?}");
    assert!(img.bands > 0, "main image without bands: {img:?}");
    for o in f.overviews() {
        assert!(o.width > 0 && o.height > 0 && o.bands > 0, "bad overview {o:?}");
    }
    let _ = f.has_mask();
    match parse_geokeys(f.geo_tags()) {
        Ok(keys) => {
            let _ = format!("{keys:?}");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
