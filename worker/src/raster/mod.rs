//! Reading inputs: whole images now; GeoTIFF scenes and windows come next.

pub mod geo;
pub mod grid;
pub mod image;
pub mod jpeg;
pub mod scale;
pub mod scene;
pub mod tar;
pub mod tiff;
