//! rsembed's input readers: whole PNG/JPEG images, (Geo)TIFF scenes and tar
//! archives of both, with the georeferencing that gives each chip its lon/lat
//! footprint.
//!
//! Everything here is synchronous or runtime-agnostic (`futures` only): reads
//! go through [`tiff::RangeRead`], which the worker implements over object
//! storage and [`scene::MemRange`] over bytes in memory. The crate depends on
//! no async runtime, ONNX Runtime, Arrow, NATS or object store, so the fuzz
//! targets build it alone (docs/decisions.md, "Raster is its own crate").
#![warn(missing_docs)]

pub mod cloud;
pub mod geo;
pub mod grid;
pub mod image;
pub mod jpeg;
pub mod kind;
pub mod lattice;
pub mod pixels;
pub mod png;
pub mod scale;
pub mod scene;
pub mod tar;
pub mod tiff;

/// Says that the calling test skips, as `rsembed_integration_tests::skipped`
/// does (this crate cannot depend on that one): `SKIPPED: <reason>`, and a
/// line in the file `RSEMBED_SKIP_LOG` names, which `scripts/test.sh` counts.
#[cfg(test)]
pub(crate) fn skipped(reason: &str) {
    use std::io::Write as _;
    println!("SKIPPED: {reason}");
    if let Some(log) = std::env::var_os("RSEMBED_SKIP_LOG") {
        let test = std::thread::current().name().unwrap_or("a test").to_owned();
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut f| writeln!(f, "{test}: {reason}"))
            .expect("RSEMBED_SKIP_LOG is writable");
    }
}
