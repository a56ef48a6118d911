//! Reading inputs: whole PNG/JPEG images, (Geo)TIFF scenes, tar archives of both.

pub mod geo;
pub mod grid;
pub mod image;
pub mod jpeg;
pub mod png;
pub mod scale;
pub mod scene;
pub mod tar;
pub mod tiff;
