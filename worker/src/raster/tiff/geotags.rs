//! GeoTIFF tags as stored in the file, for the georeferencing module to interpret.

/// Raw GeoTIFF tags of the main image; `None` where the tag is absent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GeoTiffTags {
    /// ModelPixelScaleTag (33550).
    pub model_pixel_scale: Option<Vec<f64>>,
    /// ModelTiepointTag (33922).
    pub model_tiepoint: Option<Vec<f64>>,
    /// ModelTransformationTag (34264).
    pub model_transformation: Option<Vec<f64>>,
    /// GeoKeyDirectoryTag (34735).
    pub geo_key_directory: Option<Vec<u16>>,
    /// GeoDoubleParamsTag (34736).
    pub geo_double_params: Option<Vec<f64>>,
    /// GeoAsciiParamsTag (34737).
    pub geo_ascii_params: Option<String>,
}
