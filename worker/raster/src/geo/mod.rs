//! Georeferencing of GeoTIFF scenes, in pure Rust.
//!
//! The TIFF reader hands over the raw GeoTIFF tags ([`GeoTiffTags`]); this module
//! turns them into the pixel-to-map affine ([`geotransform`]), the source CRS
//! ([`crs_from_geokeys`]) and, through a [`Projector`] built once per scene, the
//! lon/lat (OGC:CRS84) footprint of every chip window as a WKB polygon.
//!
//! GDAL is the reference for every choice made here (half-pixel shift of
//! PixelIsPoint rasters, precedence of the tags, the proj4 rebuilt from
//! user-defined keys); `tools/gen_geo_fixtures.py` records GDAL's answers in
//! `fixtures/geo/` and the tests hold this module to them.

mod crs;
mod footprint;
mod geokeys;
mod transform;
mod userdef;
mod wkb;

#[cfg(test)]
mod parity_tests;
#[cfg(test)]
mod shared_tests;

pub use crs::{crs_from_geokeys, Crs};
pub use footprint::{Footprint, Projector, Tolerance};
pub use geokeys::{parse_geokeys, GeoKeyValue, GeoKeys};
pub use transform::{geotransform, GeoTransform};
pub use wkb::polygon_wkb;

/// The GeoTIFF tags that carry georeferencing, as read from the first IFD.
///
/// Tags 33550 ModelPixelScale, 33922 ModelTiepoint, 34264 ModelTransformation,
/// 34735 GeoKeyDirectory, 34736 GeoDoubleParams and 34737 GeoAsciiParams.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GeoTiffTags {
    /// ModelPixelScaleTag (33550): (ScaleX, ScaleY, ScaleZ).
    pub model_pixel_scale: Option<Vec<f64>>,
    /// ModelTiepointTag (33922): one or more (I, J, K, X, Y, Z) tuples.
    pub model_tiepoint: Option<Vec<f64>>,
    /// ModelTransformationTag (34264): 4x4 row-major matrix.
    pub model_transformation: Option<Vec<f64>>,
    /// GeoKeyDirectoryTag (34735).
    pub geo_key_directory: Option<Vec<u16>>,
    /// GeoDoubleParamsTag (34736).
    pub geo_double_params: Option<Vec<f64>>,
    /// GeoAsciiParamsTag (34737).
    pub geo_ascii_params: Option<String>,
}

/// Everything that can go wrong while georeferencing a scene.
#[derive(Debug, thiserror::Error)]
pub enum GeoError {
    /// The GeoKey directory is structurally invalid (untrusted input).
    #[error("malformed GeoKey directory: {0}")]
    MalformedGeoKeys(String),
    /// The affine tags are present but unusable.
    #[error("invalid geotransform: {0}")]
    InvalidTransform(String),
    /// The CRS is known but no projection could be built for it.
    #[error("unsupported CRS {crs}")]
    UnsupportedCrs {
        /// Label of the CRS, as in [`Crs::label`].
        crs: String,
    },
    /// proj4rs refused the projection definition.
    #[error("cannot build projection for {crs}")]
    Projection {
        /// Label of the CRS, as in [`Crs::label`].
        crs: String,
        /// The proj4rs error.
        #[source]
        source: proj4rs::errors::Error,
    },
}
