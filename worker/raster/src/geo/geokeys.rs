//! GeoKey directory parsing (GeoTIFF 1.0 §2.4), bounded and panic-free.
//!
//! Headers come from untrusted files: every count and offset is checked against
//! the arrays it points into, and the number of keys is capped so a forged
//! header cannot make us allocate or loop without bound.

use std::collections::BTreeMap;

use super::{GeoError, GeoTiffTags};

/// Tag holding the directory itself; keys stored there are SHORT arrays.
const TAG_DIRECTORY: u16 = 34735;
const TAG_DOUBLES: u16 = 34736;
const TAG_ASCII: u16 = 34737;
/// The directory can address at most 65535 shorts, i.e. 16383 entries; real
/// files have a few dozen keys, so anything far above is a forged header.
const MAX_KEYS: usize = 4096;

/// Well-known GeoKey ids used by this module.
pub(crate) mod id {
    pub const GT_MODEL_TYPE: u16 = 1024;
    pub const GT_RASTER_TYPE: u16 = 1025;
    pub const GT_CITATION: u16 = 1026;
    pub const GEOGRAPHIC_TYPE: u16 = 2048;
    pub const GEOG_CITATION: u16 = 2049;
    pub const GEOG_GEODETIC_DATUM: u16 = 2050;
    pub const GEOG_PRIME_MERIDIAN: u16 = 2051;
    pub const GEOG_ANGULAR_UNITS: u16 = 2054;
    pub const GEOG_ELLIPSOID: u16 = 2056;
    pub const GEOG_SEMI_MAJOR_AXIS: u16 = 2057;
    pub const GEOG_SEMI_MINOR_AXIS: u16 = 2058;
    pub const GEOG_INV_FLATTENING: u16 = 2059;
    pub const GEOG_PRIME_MERIDIAN_LONG: u16 = 2061;
    pub const PROJECTED_CS_TYPE: u16 = 3072;
    pub const PCS_CITATION: u16 = 3073;
    pub const PROJECTION: u16 = 3074;
    pub const PROJ_COORD_TRANS: u16 = 3075;
    pub const PROJ_LINEAR_UNITS: u16 = 3076;
    pub const PROJ_LINEAR_UNIT_SIZE: u16 = 3077;
    pub const PROJ_STD_PARALLEL1: u16 = 3078;
    pub const PROJ_STD_PARALLEL2: u16 = 3079;
    pub const PROJ_NAT_ORIGIN_LONG: u16 = 3080;
    pub const PROJ_NAT_ORIGIN_LAT: u16 = 3081;
    pub const PROJ_FALSE_EASTING: u16 = 3082;
    pub const PROJ_FALSE_NORTHING: u16 = 3083;
    pub const PROJ_FALSE_ORIGIN_LONG: u16 = 3084;
    pub const PROJ_FALSE_ORIGIN_LAT: u16 = 3085;
    pub const PROJ_FALSE_ORIGIN_EASTING: u16 = 3086;
    pub const PROJ_FALSE_ORIGIN_NORTHING: u16 = 3087;
    pub const PROJ_CENTER_LONG: u16 = 3088;
    pub const PROJ_CENTER_LAT: u16 = 3089;
    pub const PROJ_CENTER_EASTING: u16 = 3090;
    pub const PROJ_CENTER_NORTHING: u16 = 3091;
    pub const PROJ_SCALE_AT_NAT_ORIGIN: u16 = 3092;
    pub const PROJ_SCALE_AT_CENTER: u16 = 3093;
    pub const PROJ_STRAIGHT_VERT_POLE_LONG: u16 = 3095;
}

/// GeoKey value meaning "user-defined" (the parameters are in other keys).
pub(crate) const USER_DEFINED: u16 = 32767;

/// The value of one GeoKey.
#[derive(Debug, Clone, PartialEq)]
pub enum GeoKeyValue {
    /// SHORT values (stored inline, or in the directory tag itself).
    Shorts(Vec<u16>),
    /// DOUBLE values from GeoDoubleParams.
    Doubles(Vec<f64>),
    /// A string from GeoAsciiParams, without its trailing `|` terminator.
    Ascii(String),
}

/// A parsed GeoKey directory.
#[derive(Debug, Clone, PartialEq)]
pub struct GeoKeys {
    /// (KeyRevision, MinorRevision) from the directory header.
    pub revision: (u16, u16),
    keys: BTreeMap<u16, GeoKeyValue>,
}

impl GeoKeys {
    /// The raw value of a key.
    pub fn get(&self, key: u16) -> Option<&GeoKeyValue> {
        self.keys.get(&key)
    }

    /// The first SHORT of a key.
    pub fn short(&self, key: u16) -> Option<u16> {
        match self.keys.get(&key)? {
            GeoKeyValue::Shorts(v) => v.first().copied(),
            _ => None,
        }
    }

    /// The first DOUBLE of a key, when finite.
    pub fn double(&self, key: u16) -> Option<f64> {
        match self.keys.get(&key)? {
            GeoKeyValue::Doubles(v) => v.first().copied().filter(|d| d.is_finite()),
            _ => None,
        }
    }

    /// The string of an ASCII key.
    pub(crate) fn ascii(&self, key: u16) -> Option<&str> {
        match self.keys.get(&key)? {
            GeoKeyValue::Ascii(s) => Some(s),
            _ => None,
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the directory holds no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

fn malformed(msg: String) -> GeoError {
    GeoError::MalformedGeoKeys(msg)
}

/// `start..start+count` of a slice, or a descriptive error.
fn range<'a, T>(
    data: &'a [T],
    start: u16,
    count: u16,
    key: u16,
    what: &str,
) -> Result<&'a [T], GeoError> {
    let (start, count) = (usize::from(start), usize::from(count));
    data.get(start..start + count).ok_or_else(|| {
        malformed(format!(
            "key {key}: {what} values {start}..{} out of range (have {})",
            start + count,
            data.len()
        ))
    })
}

/// Parse the GeoKey directory; `Ok(None)` when the file has none.
pub fn parse_geokeys(tags: &GeoTiffTags) -> Result<Option<GeoKeys>, GeoError> {
    let Some(dir) = tags.geo_key_directory.as_deref() else {
        return Ok(None);
    };
    let [version, revision, minor, n_keys, ..] = *dir else {
        return Err(malformed(format!(
            "directory of {} shorts is shorter than its header",
            dir.len()
        )));
    };
    // libgeotiff refuses any other directory version too.
    if version != 1 {
        return Err(malformed(format!(
            "unsupported KeyDirectoryVersion {version}"
        )));
    }
    let n_keys = usize::from(n_keys);
    if n_keys > MAX_KEYS {
        return Err(malformed(format!("absurd key count {n_keys}")));
    }
    let entries = dir.get(4..4 + 4 * n_keys).ok_or_else(|| {
        malformed(format!(
            "{n_keys} keys announced but the directory has {} shorts",
            dir.len()
        ))
    })?;
    let doubles = tags.geo_double_params.as_deref().unwrap_or(&[]);
    let ascii = tags.geo_ascii_params.as_deref().unwrap_or("").as_bytes();

    let mut keys = BTreeMap::new();
    for e in entries.chunks_exact(4) {
        let (key, location, count, value) = (e[0], e[1], e[2], e[3]);
        let parsed = match location {
            0 => {
                if count > 1 {
                    return Err(malformed(format!(
                        "key {key}: inline value with count {count}"
                    )));
                }
                GeoKeyValue::Shorts(vec![value])
            }
            TAG_DIRECTORY => GeoKeyValue::Shorts(range(dir, value, count, key, "SHORT")?.to_vec()),
            TAG_DOUBLES => {
                GeoKeyValue::Doubles(range(doubles, value, count, key, "DOUBLE")?.to_vec())
            }
            TAG_ASCII => {
                let bytes = range(ascii, value, count, key, "ASCII")?;
                // The GeoTIFF spec terminates each string with '|' (libgeotiff
                // turns the last one into NUL); neither belongs to the value.
                let text = String::from_utf8_lossy(bytes);
                let text = text.trim_end_matches('\0');
                let text = text.strip_suffix('|').unwrap_or(text);
                GeoKeyValue::Ascii(text.to_string())
            }
            other => {
                return Err(malformed(format!(
                    "key {key}: values in unknown tag {other}"
                )))
            }
        };
        // First occurrence wins, as in libgeotiff's sorted lookup of a
        // well-formed directory; duplicates are tolerated, not trusted.
        keys.entry(key).or_insert(parsed);
    }
    Ok(Some(GeoKeys {
        revision: (revision, minor),
        keys,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(dir: Vec<u16>) -> GeoTiffTags {
        GeoTiffTags {
            geo_key_directory: Some(dir),
            geo_double_params: Some(vec![1.5, 2.5]),
            geo_ascii_params: Some("WGS 84|x|".to_string()),
            ..Default::default()
        }
    }

    #[test]
    fn none_without_directory() {
        assert_eq!(parse_geokeys(&GeoTiffTags::default()).unwrap(), None);
    }

    #[test]
    fn parses_all_locations() {
        let dir = vec![
            1, 1, 0, 4, 1024, 0, 1, 1, 2057, 34736, 1, 1, 1026, 34737, 7, 0, 3000, 34735, 2, 2,
        ];
        let k = parse_geokeys(&tags(dir)).unwrap().unwrap();
        assert_eq!(k.len(), 4);
        assert_eq!(k.short(1024), Some(1));
        assert_eq!(k.double(2057), Some(2.5));
        assert_eq!(k.ascii(1026), Some("WGS 84"));
        assert_eq!(k.get(3000), Some(&GeoKeyValue::Shorts(vec![0, 4])));
    }

    #[test]
    fn malformed_directories_are_errors() {
        let cases: Vec<Vec<u16>> = vec![
            vec![],                                            // empty
            vec![1, 1, 0],                                     // truncated header
            vec![2, 1, 0, 0],                                  // unknown version
            vec![1, 1, 0, 2, 1024, 0, 1, 1],                   // count past end
            vec![1, 1, 0, 1, 1024, 0, 1],                      // truncated entry
            vec![1, 1, 0, u16::MAX],                           // huge key count
            vec![1, 1, 0, 1, 2057, 34736, 1, 2],               // double offset out of range
            vec![1, 1, 0, 1, 2057, 34736, u16::MAX, u16::MAX], // huge double count
            vec![1, 1, 0, 1, 1026, 34737, 100, 0],             // ascii past end
            vec![1, 1, 0, 1, 3000, 34735, 10, 60000],          // short offset out of range
            vec![1, 1, 0, 1, 1024, 0, 2, 1],                   // inline with count 2
            vec![1, 1, 0, 1, 1024, 33550, 1, 0],               // bad tag location
        ];
        for dir in cases {
            let r = parse_geokeys(&tags(dir.clone()));
            assert!(
                matches!(r, Err(GeoError::MalformedGeoKeys(_))),
                "{dir:?} -> {r:?}"
            );
        }
    }

    #[test]
    fn absent_param_arrays_are_errors_not_panics() {
        let t = GeoTiffTags {
            geo_key_directory: Some(vec![1, 1, 0, 2, 2057, 34736, 1, 0, 1026, 34737, 3, 0]),
            ..Default::default()
        };
        assert!(parse_geokeys(&t).is_err());
    }

    #[test]
    fn multibyte_ascii_does_not_panic() {
        let t = GeoTiffTags {
            geo_key_directory: Some(vec![1, 1, 0, 1, 1026, 34737, 2, 1]),
            geo_ascii_params: Some("é|ü|".to_string()),
            ..Default::default()
        };
        assert!(parse_geokeys(&t).unwrap().unwrap().ascii(1026).is_some());
    }
}
