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
pub mod png;
pub mod scale;
pub mod scene;
pub mod tar;
pub mod tiff;
