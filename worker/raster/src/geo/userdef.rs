//! proj4 strings for user-defined (code 32767) GeoTIFF CRSs.
//!
//! Mirrors libgeotiff's `GTIFGetProj4Defn` for the coordinate transformations
//! remote-sensing products use, with GDAL's key choices (e.g. Albers from the
//! natural-origin keys, LCC 2SP from the false-origin keys). When no
//! transformation key exists, a PROJ4 EXTENSION embedded in the citation (GDAL's
//! ESRI PE string, as in GOES geostationary files) is used verbatim.

use super::geokeys::{id, USER_DEFINED};
use super::GeoKeys;

/// `ProjCoordTransGeoKey` codes (GeoTIFF 1.0 §6.3.3.3).
mod ct {
    pub const TRANSVERSE_MERCATOR: u16 = 1;
    pub const MERCATOR: u16 = 7;
    pub const LCC_2SP: u16 = 8;
    pub const LCC_1SP: u16 = 9;
    pub const LAEA: u16 = 10;
    pub const ALBERS: u16 = 11;
    pub const STEREOGRAPHIC: u16 = 14;
    pub const POLAR_STEREOGRAPHIC: u16 = 15;
    pub const OBLIQUE_STEREOGRAPHIC: u16 = 16;
    pub const EQUIRECTANGULAR: u16 = 17;
    pub const CASSINI: u16 = 18;
    pub const GNOMONIC: u16 = 19;
    pub const MILLER: u16 = 20;
    pub const ORTHOGRAPHIC: u16 = 21;
    pub const POLYCONIC: u16 = 22;
    pub const ROBINSON: u16 = 23;
    pub const SINUSOIDAL: u16 = 24;
    pub const CYLINDRICAL_EQUAL_AREA: u16 = 28;
}

/// Degrees per unit of `GeogAngularUnitsGeoKey`.
fn angular_unit(keys: &GeoKeys) -> Option<f64> {
    match keys.short(id::GEOG_ANGULAR_UNITS) {
        None | Some(9102) | Some(9122) => Some(1.0),
        Some(9101) => Some(180.0 / std::f64::consts::PI),
        Some(9103) => Some(1.0 / 60.0),
        Some(9104) => Some(1.0 / 3600.0),
        Some(9105) | Some(9106) => Some(0.9),
        Some(_) => None,
    }
}

/// Metres per unit of `ProjLinearUnitsGeoKey`.
fn linear_unit(keys: &GeoKeys) -> Option<f64> {
    match keys.short(id::PROJ_LINEAR_UNITS) {
        None | Some(9001) => Some(1.0),
        Some(9002) => Some(0.3048),
        Some(9003) => Some(1200.0 / 3937.0),
        Some(9036) => Some(1000.0),
        Some(USER_DEFINED) => keys.double(id::PROJ_LINEAR_UNIT_SIZE).filter(|s| *s > 0.0),
        Some(_) => None,
    }
}

/// Datum / ellipsoid / prime meridian terms.
///
/// Datums PROJ relates to WGS 84 by a null transformation get `+towgs84=0,0,0`;
/// unknown datums get their ellipsoid only, which proj4rs (like PROJ's ballpark
/// transformation) reprojects without a datum shift.
fn datum_terms(keys: &GeoKeys) -> Option<String> {
    const WGS84: &str = "+datum=WGS84";
    const GRS80_NULL: &str = "+ellps=GRS80 +towgs84=0,0,0";
    let by_datum = match keys.short(id::GEOG_GEODETIC_DATUM) {
        Some(6326) => Some(WGS84),
        Some(6269) | Some(6258) | Some(6283) | Some(6167) | Some(6619) => Some(GRS80_NULL),
        _ => None,
    };
    let by_gcs = || match keys.short(id::GEOGRAPHIC_TYPE) {
        Some(4326) => Some(WGS84),
        Some(4269) | Some(4258) | Some(4283) | Some(4167) | Some(4619) => Some(GRS80_NULL),
        _ => None,
    };
    let by_ellps = || match keys.short(id::GEOG_ELLIPSOID) {
        Some(7030) => Some("+ellps=WGS84"),
        Some(7019) => Some("+ellps=GRS80"),
        Some(7008) => Some("+ellps=clrk66"),
        Some(7004) => Some("+ellps=bessel"),
        Some(7022) => Some("+ellps=intl"),
        Some(7043) => Some("+ellps=WGS72"),
        Some(7001) => Some("+ellps=airy"),
        Some(7024) => Some("+ellps=krass"),
        _ => None,
    };
    let mut terms = match by_datum.or_else(by_gcs).or_else(by_ellps) {
        Some(t) => t.to_string(),
        None => match keys.double(id::GEOG_SEMI_MAJOR_AXIS).filter(|a| *a > 0.0) {
            Some(a) => match (
                keys.double(id::GEOG_INV_FLATTENING),
                keys.double(id::GEOG_SEMI_MINOR_AXIS),
            ) {
                (Some(rf), _) if rf > 0.0 => format!("+a={a} +rf={rf}"),
                (_, Some(b)) if b > 0.0 => format!("+a={a} +b={b}"),
                _ => format!("+a={a} +b={a}"),
            },
            // Nothing at all: GDAL assumes the WGS 84 ellipsoid.
            None => "+ellps=WGS84".to_string(),
        },
    };
    if let Some(pm) = keys
        .double(id::GEOG_PRIME_MERIDIAN_LONG)
        .filter(|pm| *pm != 0.0)
    {
        terms.push_str(&format!(" +pm={}", pm * angular_unit(keys)?));
    } else if matches!(keys.short(id::GEOG_PRIME_MERIDIAN), Some(p) if p != 8901 && p != USER_DEFINED)
    {
        // A named non-Greenwich meridian we have no table for.
        return None;
    }
    Some(terms)
}

/// proj4 of a user-defined geographic CRS.
pub(crate) fn geographic(keys: &GeoKeys) -> Option<String> {
    Some(format!("+proj=longlat {} +no_defs", datum_terms(keys)?))
}

/// The PROJ4 EXTENSION of an ESRI PE / WKT1 string in the citations.
pub(crate) fn citation_proj4(keys: &GeoKeys) -> Option<String> {
    const MARK: &str = "EXTENSION[\"PROJ4\",\"";
    [id::PCS_CITATION, id::GT_CITATION, id::GEOG_CITATION]
        .iter()
        .find_map(|k| {
            let text = keys.ascii(*k)?;
            let rest = &text[text.find(MARK)? + MARK.len()..];
            let p = rest[..rest.find('"')?].trim();
            p.starts_with("+proj=").then(|| p.to_string())
        })
}

/// proj4 of a user-defined projected CRS.
pub(crate) fn projected(keys: &GeoKeys) -> Option<String> {
    let proj = match keys.short(id::PROJ_COORD_TRANS) {
        Some(ct) => transformation(keys, ct)?,
        None => match keys.short(id::PROJECTION) {
            Some(p @ 16001..=16060) => format!("+proj=utm +zone={}", p - 16000),
            Some(p @ 16101..=16160) => format!("+proj=utm +zone={} +south", p - 16100),
            _ => return citation_proj4(keys),
        },
    };
    let to_meter = linear_unit(keys)?;
    let units = if to_meter == 1.0 {
        "+units=m".to_string()
    } else {
        format!("+to_meter={to_meter}")
    };
    Some(format!("{proj} {} {units} +no_defs", datum_terms(keys)?))
}

/// Projection terms for one coordinate transformation; angles in degrees,
/// false easting/northing in metres (PROJ's x_0/y_0 are always metres).
fn transformation(keys: &GeoKeys, ct: u16) -> Option<String> {
    let ang = angular_unit(keys)?;
    let lin = linear_unit(keys)?;
    let a = |ks: &[u16]| ks.iter().find_map(|k| keys.double(*k)).map(|v| v * ang);
    let l = |ks: &[u16]| {
        ks.iter()
            .find_map(|k| keys.double(*k))
            .map(|v| v * lin)
            .unwrap_or(0.0)
    };
    let s = |ks: &[u16]| ks.iter().find_map(|k| keys.double(*k)).unwrap_or(1.0);
    use id::*;
    let nat_lat = a(&[PROJ_NAT_ORIGIN_LAT, PROJ_CENTER_LAT, PROJ_FALSE_ORIGIN_LAT]).unwrap_or(0.0);
    let nat_lon = a(&[
        PROJ_NAT_ORIGIN_LONG,
        PROJ_CENTER_LONG,
        PROJ_FALSE_ORIGIN_LONG,
    ])
    .unwrap_or(0.0);
    let ctr_lat = a(&[PROJ_CENTER_LAT, PROJ_NAT_ORIGIN_LAT]).unwrap_or(0.0);
    let ctr_lon = a(&[PROJ_CENTER_LONG, PROJ_NAT_ORIGIN_LONG]).unwrap_or(0.0);
    let fo_lat = a(&[PROJ_FALSE_ORIGIN_LAT, PROJ_NAT_ORIGIN_LAT]).unwrap_or(0.0);
    let fo_lon = a(&[PROJ_FALSE_ORIGIN_LONG, PROJ_NAT_ORIGIN_LONG]).unwrap_or(0.0);
    let fe = l(&[
        PROJ_FALSE_EASTING,
        PROJ_CENTER_EASTING,
        PROJ_FALSE_ORIGIN_EASTING,
    ]);
    let fn_ = l(&[
        PROJ_FALSE_NORTHING,
        PROJ_CENTER_NORTHING,
        PROJ_FALSE_ORIGIN_NORTHING,
    ]);
    let fo_e = l(&[PROJ_FALSE_ORIGIN_EASTING, PROJ_FALSE_EASTING]);
    let fo_n = l(&[PROJ_FALSE_ORIGIN_NORTHING, PROJ_FALSE_NORTHING]);
    let k = s(&[PROJ_SCALE_AT_NAT_ORIGIN, PROJ_SCALE_AT_CENTER]);
    let sp1 = a(&[PROJ_STD_PARALLEL1]);
    let sp2 = a(&[PROJ_STD_PARALLEL2]);
    let en = format!("+x_0={fe} +y_0={fn_}");
    let terms = match ct {
        ct::TRANSVERSE_MERCATOR => {
            format!("+proj=tmerc +lat_0={nat_lat} +lon_0={nat_lon} +k={k} {en}")
        }
        ct::MERCATOR => match sp1 {
            Some(ts) => format!("+proj=merc +lat_ts={ts} +lon_0={nat_lon} {en}"),
            None => format!("+proj=merc +lon_0={nat_lon} +k={k} {en}"),
        },
        ct::LCC_2SP => format!(
            "+proj=lcc +lat_0={fo_lat} +lon_0={fo_lon} +lat_1={} +lat_2={} +x_0={fo_e} +y_0={fo_n}",
            sp1?,
            sp2.or(sp1)?
        ),
        ct::LCC_1SP => {
            format!("+proj=lcc +lat_1={nat_lat} +lat_0={nat_lat} +lon_0={nat_lon} +k_0={k} {en}")
        }
        ct::LAEA => format!("+proj=laea +lat_0={ctr_lat} +lon_0={ctr_lon} {en}"),
        ct::ALBERS => format!(
            "+proj=aea +lat_0={nat_lat} +lon_0={nat_lon} +lat_1={} +lat_2={} {en}",
            sp1?,
            sp2.or(sp1)?
        ),
        ct::STEREOGRAPHIC => format!("+proj=stere +lat_0={ctr_lat} +lon_0={ctr_lon} +k={k} {en}"),
        ct::POLAR_STEREOGRAPHIC => {
            let pole = if nat_lat < 0.0 { -90 } else { 90 };
            let lon0 = a(&[PROJ_STRAIGHT_VERT_POLE_LONG, PROJ_NAT_ORIGIN_LONG]).unwrap_or(0.0);
            // GDAL reads NatOriginLat as the standard parallel (variant B); a
            // pole latitude there means variant A, defined by its scale.
            if nat_lat.abs() == 90.0 {
                format!("+proj=stere +lat_0={pole} +lon_0={lon0} +k={k} {en}")
            } else {
                format!("+proj=stere +lat_0={pole} +lat_ts={nat_lat} +lon_0={lon0} {en}")
            }
        }
        ct::OBLIQUE_STEREOGRAPHIC => {
            format!("+proj=sterea +lat_0={nat_lat} +lon_0={nat_lon} +k={k} {en}")
        }
        ct::EQUIRECTANGULAR => {
            format!(
                "+proj=eqc +lat_ts={} +lon_0={ctr_lon} {en}",
                sp1.unwrap_or(0.0)
            )
        }
        ct::CASSINI => format!("+proj=cass +lat_0={nat_lat} +lon_0={nat_lon} {en}"),
        ct::GNOMONIC => format!("+proj=gnom +lat_0={ctr_lat} +lon_0={ctr_lon} {en}"),
        ct::MILLER => format!("+proj=mill +lat_0={ctr_lat} +lon_0={ctr_lon} {en}"),
        ct::ORTHOGRAPHIC => format!("+proj=ortho +lat_0={ctr_lat} +lon_0={ctr_lon} {en}"),
        ct::POLYCONIC => format!("+proj=poly +lat_0={nat_lat} +lon_0={nat_lon} {en}"),
        ct::ROBINSON => format!("+proj=robin +lon_0={ctr_lon} {en}"),
        ct::SINUSOIDAL => format!("+proj=sinu +lon_0={ctr_lon} {en}"),
        ct::CYLINDRICAL_EQUAL_AREA => {
            format!(
                "+proj=cea +lat_ts={} +lon_0={nat_lon} {en}",
                sp1.unwrap_or(0.0)
            )
        }
        _ => return None,
    };
    Some(terms)
}
