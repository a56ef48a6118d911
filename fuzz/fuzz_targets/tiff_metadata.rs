//! Header + IFD chain parsing + IFD classification of arbitrary bytes, then
//! the GeoTIFF tags of whatever opens: GeoKey directory, the CRS it names and
//! the affine transform (the metadata a scene is planned from). Default
//! limits: the ones production opens files with.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use rsembed_raster::geo::{crs_from_geokeys, geotransform, parse_geokeys};
use rsembed_raster::tiff::{TiffFile, TiffLimits};

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
        assert!(
            o.width > 0 && o.height > 0 && o.bands > 0,
            "bad overview {o:?}"
        );
    }
    let _ = f.has_mask();
    let tags = f.geo_tags();
    let keys = match parse_geokeys(tags) {
        Ok(keys) => keys,
        Err(e) => {
            let _ = e.to_string();
            None
        }
    };
    if let Some(k) = &keys {
        match crs_from_geokeys(k) {
            Ok(Some(crs)) => {
                let _ = (crs.label(), crs.proj4());
            }
            Ok(None) => {}
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
    match geotransform(tags, keys.as_ref()) {
        Ok(Some(gt)) => {
            let _ = (gt.apply(0.0, 0.0), gt.is_north_up());
        }
        Ok(None) => {}
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
