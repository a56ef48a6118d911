//! The pixel-to-map affine, read from the GeoTIFF tags the way GDAL 3.6 does.
//!
//! GDAL precedence (`GTiffDataset::LoadGeoreferencing`): ModelPixelScale plus
//! the first ModelTiepoint when the scale is non-zero, otherwise the
//! ModelTransformation matrix. A raster tagged PixelIsPoint has its tiepoint at
//! the centre of the pixel, so GDAL (with its default `GTIFF_POINT_GEO_IGNORE=NO`)
//! moves the origin back by half a pixel along both axes; we do the same so that
//! chip footprints match what GDAL, rasterio and QGIS show for the file.

use super::geokeys::id;
use super::{GeoError, GeoKeys, GeoTiffTags};

/// `GTRasterTypeGeoKey` value for PixelIsPoint.
const RASTER_PIXEL_IS_POINT: u16 = 2;

/// GDAL-order affine: `x = gt[0] + col*gt[1] + row*gt[2]`,
/// `y = gt[3] + col*gt[4] + row*gt[5]`, with (col, row) in pixel-corner
/// coordinates ((0, 0) is the outer corner of the first pixel).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeoTransform(pub [f64; 6]);

impl GeoTransform {
    /// Map coordinates of the pixel-corner position (col, row).
    pub fn apply(&self, col: f64, row: f64) -> (f64, f64) {
        let g = &self.0;
        (
            g[0] + col * g[1] + row * g[2],
            g[3] + col * g[4] + row * g[5],
        )
    }

    /// Pixel-corner position (col, row) of the map coordinates (x, y): the
    /// inverse of [`GeoTransform::apply`]. Scenes' affines are checked to be
    /// non-singular when read.
    pub fn invert(&self, x: f64, y: f64) -> (f64, f64) {
        let g = &self.0;
        let det = g[1] * g[5] - g[2] * g[4];
        let (dx, dy) = (x - g[0], y - g[3]);
        ((g[5] * dx - g[2] * dy) / det, (g[1] * dy - g[4] * dx) / det)
    }

    /// Whether the affine has no rotation or shear terms.
    pub fn is_north_up(&self) -> bool {
        self.0[2] == 0.0 && self.0[4] == 0.0
    }

    fn check(self) -> Result<Self, GeoError> {
        let g = &self.0;
        if g.iter().any(|v| !v.is_finite()) {
            return Err(GeoError::InvalidTransform(format!(
                "non-finite coefficients {g:?}"
            )));
        }
        // A singular affine maps the raster onto a line: nothing to reproject.
        if g[1] * g[5] - g[2] * g[4] == 0.0 {
            return Err(GeoError::InvalidTransform(format!("singular affine {g:?}")));
        }
        Ok(self)
    }
}

/// The scene's affine from its tags, `Ok(None)` when the file carries none.
///
/// `keys` is consulted only for `GTRasterTypeGeoKey` (PixelIsPoint).
pub fn geotransform(
    tags: &GeoTiffTags,
    keys: Option<&GeoKeys>,
) -> Result<Option<GeoTransform>, GeoError> {
    let pixel_is_point =
        keys.and_then(|k| k.short(id::GT_RASTER_TYPE)) == Some(RASTER_PIXEL_IS_POINT);

    let scale = tags
        .model_pixel_scale
        .as_deref()
        .filter(|s| s.len() >= 2 && s[0] != 0.0 && s[1] != 0.0);
    let tie = tags.model_tiepoint.as_deref().filter(|t| t.len() >= 6);
    let mut gt = if let (Some(s), Some(t)) = (scale, tie) {
        // GDAL treats a negative ScaleY as a north-up file written by a
        // confused producer (GTIFF_HONOUR_NEGATIVE_SCALEY unset), hence -|sy|.
        let (sx, sy) = (s[0], -s[1].abs());
        [t[3] - t[0] * sx, sx, 0.0, t[4] - t[1] * sy, 0.0, sy]
    } else if let Some(m) = tags.model_transformation.as_deref() {
        if m.len() != 16 {
            return Err(GeoError::InvalidTransform(format!(
                "ModelTransformation has {} values, not 16",
                m.len()
            )));
        }
        [m[3], m[0], m[1], m[7], m[4], m[5]]
    } else {
        // Tiepoints alone are GCPs, which chips do not use.
        return Ok(None);
    };
    if pixel_is_point {
        gt[0] -= gt[1] * 0.5 + gt[2] * 0.5;
        gt[3] -= gt[4] * 0.5 + gt[5] * 0.5;
    }
    GeoTransform(gt).check().map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geo::parse_geokeys;

    fn point_keys() -> GeoKeys {
        let t = GeoTiffTags {
            geo_key_directory: Some(vec![1, 1, 0, 1, 1025, 0, 1, 2]),
            ..Default::default()
        };
        parse_geokeys(&t).unwrap().unwrap()
    }

    fn scale_tie(scale: Vec<f64>, tie: Vec<f64>) -> GeoTiffTags {
        GeoTiffTags {
            model_pixel_scale: Some(scale),
            model_tiepoint: Some(tie),
            ..Default::default()
        }
    }

    #[test]
    fn affine_math() {
        let gt = GeoTransform([100.0, 2.0, 0.5, 50.0, -0.25, -3.0]);
        assert_eq!(gt.apply(0.0, 0.0), (100.0, 50.0));
        assert_eq!(gt.apply(10.0, 4.0), (100.0 + 20.0 + 2.0, 50.0 - 2.5 - 12.0));
        assert!(!gt.is_north_up());
        let (x, y) = gt.apply(10.25, -4.5);
        let (c, r) = gt.invert(x, y);
        assert!(
            (c - 10.25).abs() < 1e-12 && (r + 4.5).abs() < 1e-12,
            "{c} {r}"
        );
    }

    #[test]
    fn tiepoint_and_scale() {
        let t = scale_tie(
            vec![30.0, 30.0, 0.0],
            vec![10.0, 20.0, 0.0, 1000.0, 2000.0, 0.0],
        );
        let gt = geotransform(&t, None).unwrap().unwrap();
        assert_eq!(gt.0, [700.0, 30.0, 0.0, 2600.0, 0.0, -30.0]);
        assert!(gt.is_north_up());
    }

    #[test]
    fn negative_scale_y_is_north_up_like_gdal() {
        let t = scale_tie(
            vec![30.0, -30.0, 0.0],
            vec![0.0, 0.0, 0.0, 1000.0, 2000.0, 0.0],
        );
        assert_eq!(geotransform(&t, None).unwrap().unwrap().0[5], -30.0);
    }

    #[test]
    fn pixel_is_point_shifts_half_pixel() {
        let t = scale_tie(
            vec![10.0, 10.0, 0.0],
            vec![0.0, 0.0, 0.0, 500005.0, 3999995.0, 0.0],
        );
        let gt = geotransform(&t, Some(&point_keys())).unwrap().unwrap();
        assert_eq!(gt.0, [500000.0, 10.0, 0.0, 4000000.0, 0.0, -10.0]);
    }

    #[test]
    fn rotation_and_shear_from_matrix() {
        let m = vec![
            25.0, 5.0, 0.0, 500000.0, 4.0, -25.0, 0.0, 4000000.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
            0.0, 1.0,
        ];
        let t = GeoTiffTags {
            model_transformation: Some(m.clone()),
            ..Default::default()
        };
        let gt = geotransform(&t, None).unwrap().unwrap();
        assert_eq!(gt.0, [500000.0, 25.0, 5.0, 4000000.0, 4.0, -25.0]);
        // PixelIsPoint moves the origin by half a pixel along both (sheared) axes.
        let mut m2 = m;
        m2[3] = 500015.0;
        m2[7] = 3999989.5;
        let t2 = GeoTiffTags {
            model_transformation: Some(m2),
            ..Default::default()
        };
        assert_eq!(geotransform(&t2, Some(&point_keys())).unwrap().unwrap(), gt);
    }

    #[test]
    fn scale_takes_precedence_over_matrix() {
        let mut t = scale_tie(vec![1.0, 1.0, 0.0], vec![0.0, 0.0, 0.0, 5.0, 6.0, 0.0]);
        t.model_transformation = Some(vec![9.0; 16]);
        assert_eq!(
            geotransform(&t, None).unwrap().unwrap().0,
            [5.0, 1.0, 0.0, 6.0, 0.0, -1.0]
        );
    }

    #[test]
    fn missing_or_bad() {
        assert_eq!(geotransform(&GeoTiffTags::default(), None).unwrap(), None);
        // Zero scale is ignored (GDAL too), leaving only GCP-style tiepoints.
        let t = scale_tie(vec![0.0, 1.0], vec![0.0; 6]);
        assert_eq!(geotransform(&t, None).unwrap(), None);
        let t = GeoTiffTags {
            model_transformation: Some(vec![1.0; 5]),
            ..Default::default()
        };
        assert!(geotransform(&t, None).is_err());
        let t = scale_tie(vec![1.0, 1.0], vec![0.0, 0.0, 0.0, f64::NAN, 0.0, 0.0]);
        assert!(geotransform(&t, None).is_err());
        let t = GeoTiffTags {
            model_transformation: Some(vec![0.0; 16]),
            ..Default::default()
        };
        assert!(geotransform(&t, None).is_err());
    }
}
