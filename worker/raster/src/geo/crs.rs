//! The source CRS of a scene, from its GeoKeys.
//!
//! EPSG codes are kept as codes (they are what users query by and what GDAL
//! reports); user-defined CRSs are rebuilt as proj4 strings in
//! [`super::userdef`]. Anything we cannot describe faithfully is `None`, so the
//! caller writes a null crs/geometry rather than a wrong footprint.

use super::geokeys::{id, USER_DEFINED};
use super::{userdef, GeoError, GeoKeys};

/// `GTModelTypeGeoKey` values.
const MODEL_PROJECTED: u16 = 1;
const MODEL_GEOGRAPHIC: u16 = 2;
const MODEL_GEOCENTRIC: u16 = 3;

/// A coordinate reference system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Crs {
    /// An EPSG code (projected or geographic).
    Epsg(u32),
    /// A CRS without a code, as a proj4 string.
    UserDefined {
        /// proj4 definition, e.g. `+proj=geos +lon_0=-75 +h=35786023 ...`.
        proj4: String,
    },
}

impl Crs {
    /// The value of the `crs` column: `EPSG:<code>`, or the proj4 string.
    pub fn label(&self) -> String {
        match self {
            Crs::Epsg(code) => format!("EPSG:{code}"),
            Crs::UserDefined { proj4 } => proj4.clone(),
        }
    }

    /// The proj4 definition, looked up in the EPSG table for codes.
    pub fn proj4(&self) -> Option<String> {
        match self {
            Crs::Epsg(code) => {
                let def = crs_definitions::from_code(u16::try_from(*code).ok()?)?;
                Some(def.proj4.to_string())
            }
            Crs::UserDefined { proj4 } => Some(proj4.clone()),
        }
    }
}

fn epsg(code: Option<u16>) -> Option<u16> {
    code.filter(|c| *c != 0 && *c < USER_DEFINED)
}

/// The CRS described by the GeoKeys; `Ok(None)` when absent or not understood.
pub fn crs_from_geokeys(keys: &GeoKeys) -> Result<Option<Crs>, GeoError> {
    let model = keys.short(id::GT_MODEL_TYPE);
    if model == Some(MODEL_GEOCENTRIC) {
        return Ok(None);
    }
    let pcs = keys.short(id::PROJECTED_CS_TYPE);
    // GDAL writes GTModelType=32767 for CRSs it can only express as an ESRI
    // PE string (goes.tif), so the projected keys decide, not the model type.
    let projected = model == Some(MODEL_PROJECTED)
        || (model != Some(MODEL_GEOGRAPHIC)
            && (pcs.is_some()
                || keys.short(id::PROJ_COORD_TRANS).is_some()
                || keys.short(id::PROJECTION).is_some()
                || userdef::citation_proj4(keys).is_some()));
    if projected {
        if let Some(code) = epsg(pcs) {
            return Ok(Some(Crs::Epsg(u32::from(code))));
        }
        return Ok(userdef::projected(keys).map(|proj4| Crs::UserDefined { proj4 }));
    }
    let gcs = keys.short(id::GEOGRAPHIC_TYPE);
    if let Some(code) = epsg(gcs) {
        return Ok(Some(Crs::Epsg(u32::from(code))));
    }
    if model == Some(MODEL_GEOGRAPHIC) || gcs == Some(USER_DEFINED) {
        return Ok(userdef::geographic(keys).map(|proj4| Crs::UserDefined { proj4 }));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geo::{parse_geokeys, GeoTiffTags};

    fn keys(dir: Vec<u16>, doubles: Vec<f64>) -> GeoKeys {
        let t = GeoTiffTags {
            geo_key_directory: Some(dir),
            geo_double_params: Some(doubles),
            ..Default::default()
        };
        parse_geokeys(&t).unwrap().unwrap()
    }

    #[test]
    fn epsg_codes() {
        let k = keys(vec![1, 1, 0, 2, 1024, 0, 1, 1, 3072, 0, 1, 32618], vec![]);
        assert_eq!(crs_from_geokeys(&k).unwrap(), Some(Crs::Epsg(32618)));
        assert_eq!(Crs::Epsg(32618).label(), "EPSG:32618");
        let k = keys(vec![1, 1, 0, 2, 1024, 0, 1, 2, 2048, 0, 1, 4326], vec![]);
        assert_eq!(crs_from_geokeys(&k).unwrap(), Some(Crs::Epsg(4326)));
        assert!(Crs::Epsg(4326).proj4().unwrap().contains("longlat"));
    }

    #[test]
    fn unknown_is_none() {
        let k = keys(vec![1, 1, 0, 1, 1024, 0, 1, 3], vec![]);
        assert_eq!(crs_from_geokeys(&k).unwrap(), None);
        // Projected, user-defined, but with a transformation we do not map.
        let k = keys(
            vec![1, 1, 0, 3, 1024, 0, 1, 1, 3072, 0, 1, 32767, 3075, 0, 1, 26],
            vec![],
        );
        assert_eq!(crs_from_geokeys(&k).unwrap(), None);
        let k = keys(vec![1, 1, 0, 0], vec![]);
        assert_eq!(crs_from_geokeys(&k).unwrap(), None);
    }

    #[test]
    fn utm_from_projection_key() {
        let k = keys(
            vec![
                1, 1, 0, 4, 1024, 0, 1, 1, 2048, 0, 1, 4326, 3072, 0, 1, 32767, 3074, 0, 1, 16133,
            ],
            vec![],
        );
        let crs = crs_from_geokeys(&k).unwrap().unwrap();
        assert_eq!(
            crs.label(),
            "+proj=utm +zone=33 +south +datum=WGS84 +units=m +no_defs"
        );
    }

    #[test]
    fn random_directories_never_panic() {
        // Deterministic LCG: no dev-dependency needed for a smoke fuzz.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u16
        };
        let interesting = [
            0, 1, 2, 3, 1024, 1025, 2048, 3072, 3074, 3075, 32767, 34735, 34736, 34737,
        ];
        for _ in 0..20_000 {
            let n = usize::from(next() % 12);
            let mut dir = vec![1, 1, 0, next() % 8];
            for _ in 0..n {
                let v = next();
                dir.push(if v % 3 == 0 {
                    v
                } else {
                    interesting[usize::from(v) % interesting.len()]
                });
            }
            let t = GeoTiffTags {
                geo_key_directory: Some(dir),
                geo_double_params: Some(vec![f64::NAN, 1.0, -90.0, 1e308]),
                geo_ascii_params: Some("a|EXTENSION[\"PROJ4\",\"|".into()),
                model_transformation: Some(vec![1.0; usize::from(next() % 20)]),
                ..Default::default()
            };
            if let Ok(Some(k)) = parse_geokeys(&t) {
                let _ = crate::geo::geotransform(&t, Some(&k));
                if let Ok(Some(crs)) = crs_from_geokeys(&k) {
                    let _ = crate::geo::Projector::new(&crs);
                }
            }
        }
    }
}
