//! `search`'s filters on what schema version 2 added: `--datetime` on the
//! acquisition time and `--max-cloud` on the cloud fraction, judged per row
//! group from the footer's statistics and per row from the columns.
//!
//! A filter on a property a chip does not have excludes the chip: a chip
//! without a `datetime` (an input that was not a STAC item, or a file of
//! schema version 1, which has no such column) is not "in" any interval, and
//! one without a `cloud_fraction` (no `--cloud-mask`) is not known to be
//! clear. Those chips are counted ([`Missing`]) and the count is reported, so
//! none is dropped silently.
//!
//! The filters apply in a fixed order, `--bbox`, then `--datetime`, then
//! `--max-cloud`, and a chip is counted under the first filter whose property
//! it lacks. The counts are exact: a row group is skipped from its statistics
//! only where they also give its count; where they prove that no row matches
//! but not how many lack the property, only the few filter columns are read
//! ([`Verdict::Count`]), never the embeddings.

use arrow_array::{Array, Float32Array, RecordBatch, TimestampMicrosecondArray};
use rsembed_schemas::chip::col;

use crate::format::footer::{GroupStats, Stats};
use crate::format::index::bbox_mask;
use crate::{Error, Result};

/// Parses `W,S,E,N` (lon/lat degrees) for `--bbox`.
pub fn parse_bbox(s: &str) -> Result<[f64; 4], String> {
    let v: Vec<f64> = s
        .split(',')
        .map(|p| p.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--bbox wants W,S,E,N in degrees: {e}"))?;
    let b: [f64; 4] = v
        .try_into()
        .map_err(|_| "--bbox wants four numbers: W,S,E,N".to_owned())?;
    if !b.iter().all(|x| x.is_finite()) || b[0] > b[2] || b[1] > b[3] {
        return Err(format!(
            "--bbox {s}: want W <= E and S <= N (a box across the antimeridian is two searches)"
        ));
    }
    // Footprints are lon/lat: a box in projected metres (or lat,lon swapped)
    // would match nothing, silently.
    if b[0] < -180.0 || b[2] > 180.0 || b[1] < -90.0 || b[3] > 90.0 {
        return Err(format!(
            "--bbox {s}: out of lon/lat range: want longitudes in [-180, 180] and latitudes \
             in [-90, 90], degrees in the order W,S,E,N (OGC:CRS84), not projected coordinates"
        ));
    }
    Ok(b)
}

/// Checks `search --datetime` (see [`rsembed_schemas::datetime::range`]).
pub fn parse_datetime(s: &str) -> Result<String, String> {
    rsembed_schemas::datetime::range(s).map(|_| s.to_owned())
}

/// Parses a fraction in [0, 1] for `search --max-cloud`.
pub fn parse_fraction(s: &str) -> Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        Ok(f) => Err(format!("{f} is not a fraction in [0, 1]")),
        Err(e) => Err(format!("`{s}` is not a number: {e}")),
    }
}

/// Chips excluded because they lack the property a filter is on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Missing {
    /// Without a `datetime`, under `--datetime`.
    pub datetime: u64,
    /// Without a `cloud_fraction`, under `--max-cloud`.
    pub cloud_fraction: u64,
}

impl Missing {
    /// Adds `o`'s counts.
    pub fn add(&mut self, o: Missing) {
        self.datetime += o.datetime;
        self.cloud_fraction += o.cloud_fraction;
    }
}

/// What the statistics say of a row group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No row matches, and these many lack a filtered property.
    Skip(Missing),
    /// No row matches, but how many lack a property needs the rows: read the
    /// filter columns only.
    Count,
    /// Some rows may match: read and score it.
    Read,
}

/// The row filters of one search.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Filters {
    /// `--bbox`, W,S,E,N.
    pub bbox: Option<[f64; 4]>,
    /// `--datetime`, an inclusive range of µs since the epoch; `None` ends are open.
    pub datetime: Option<(Option<i64>, Option<i64>)>,
    /// `--max-cloud`.
    pub max_cloud: Option<f32>,
}

impl Filters {
    /// Whether any filter needs rows tested (the scan then reads [`Filters::columns`]).
    pub fn any(&self) -> bool {
        self.bbox.is_some() || self.datetime.is_some() || self.max_cloud.is_some()
    }

    /// The columns the row tests read: `bbox` must be there; the others are
    /// read where a file has them (a file without one has only nulls in it).
    pub fn columns(&self) -> (Vec<&'static str>, Vec<&'static str>) {
        let required = if self.bbox.is_some() {
            vec![col::BBOX]
        } else {
            vec![]
        };
        let mut optional = Vec::new();
        if self.datetime.is_some() {
            optional.extend([col::DATETIME, col::END_DATETIME]);
        }
        if self.max_cloud.is_some() {
            optional.push(col::CLOUD_FRACTION);
        }
        (required, optional)
    }

    /// What the statistics `g` of a row group prove, for a group the
    /// `bbox` statistics kept.
    pub fn judge(&self, g: &GroupStats) -> Verdict {
        let rows = g.rows;
        let no_bbox = self.bbox.is_none();
        // Rows without a datetime, when the statistics say.
        let mut dt_nulls = Some(0);
        if let Some((from, to)) = self.datetime {
            let (dt, end) = (g.datetime, g.end_datetime);
            dt_nulls = None;
            if let Stats::Known { nulls, min, max } = dt {
                dt_nulls = Some(nulls);
                // The latest moment any row's range reaches, when known.
                let latest = match (max, end) {
                    (m, Stats::Known { max: e, .. }) => match (m, e) {
                        (Some(m), Some(e)) => Some(m.max(e)),
                        (m, None) => m,
                        (None, e) => e,
                    },
                    (_, Stats::Unknown) => None,
                };
                let out = nulls == rows
                    || matches!((to, min), (Some(to), Some(m)) if m > to)
                    || matches!((from, latest), (Some(from), Some(l)) if l < from);
                if out {
                    return if nulls == 0 {
                        Verdict::Skip(Missing::default())
                    } else if no_bbox {
                        Verdict::Skip(Missing {
                            datetime: nulls,
                            cloud_fraction: 0,
                        })
                    } else {
                        Verdict::Count
                    };
                }
            }
        }
        if let Some(max_cloud) = self.max_cloud {
            if let Stats::Known { nulls, min, .. } = g.cloud_fraction {
                let out = nulls == rows || matches!(min, Some(m) if m > max_cloud);
                if out {
                    // Which rows reach the cloud test: all without --bbox and
                    // --datetime; with --datetime (and no --bbox) those with a
                    // datetime that matches, of unknown number.
                    let dt_counted = self.datetime.is_none() || dt_nulls == Some(0) || no_bbox;
                    return match dt_nulls {
                        Some(dn) if nulls == 0 && dt_counted => Verdict::Skip(Missing {
                            datetime: if self.datetime.is_some() { dn } else { 0 },
                            cloud_fraction: 0,
                        }),
                        _ if no_bbox && self.datetime.is_none() => Verdict::Skip(Missing {
                            datetime: 0,
                            cloud_fraction: nulls,
                        }),
                        _ => Verdict::Count,
                    };
                }
            }
        }
        Verdict::Read
    }

    /// Per row of `batch`: whether it passes every filter. Rows lacking a
    /// filtered property are counted in `missing`.
    pub fn mask(&self, batch: &RecordBatch, uri: &str, missing: &mut Missing) -> Result<Vec<bool>> {
        let n = batch.num_rows();
        let mut keep = match self.bbox {
            Some(b) => bbox_mask(batch, b, uri)?,
            None => vec![true; n],
        };
        if let Some((from, to)) = self.datetime {
            let dt = timestamps(batch, col::DATETIME, uri)?;
            let end = timestamps(batch, col::END_DATETIME, uri)?;
            for (i, k) in keep.iter_mut().enumerate().filter(|(_, k)| **k) {
                let Some(start) = dt.filter(|a| a.is_valid(i)).map(|a| a.value(i)) else {
                    missing.datetime += 1;
                    *k = false;
                    continue;
                };
                let last = end
                    .filter(|a| a.is_valid(i))
                    .map_or(start, |a| a.value(i).max(start));
                *k = to.is_none_or(|to| start <= to) && from.is_none_or(|from| last >= from);
            }
        }
        if let Some(max_cloud) = self.max_cloud {
            let cf = match batch.column_by_name(col::CLOUD_FRACTION) {
                None => None,
                Some(c) => Some(
                    c.as_any()
                        .downcast_ref::<Float32Array>()
                        .ok_or_else(|| Error::column(uri, col::CLOUD_FRACTION, "float32"))?,
                ),
            };
            for (i, k) in keep.iter_mut().enumerate().filter(|(_, k)| **k) {
                match cf.filter(|a| a.is_valid(i)) {
                    // A NaN is not <= anything: out, as a value, not as missing.
                    Some(a) => *k = a.value(i) <= max_cloud,
                    None => {
                        missing.cloud_fraction += 1;
                        *k = false;
                    }
                }
            }
        }
        Ok(keep)
    }
}

/// The `datetime` or `end_datetime` column of a batch, when the file has it.
fn timestamps<'a>(
    batch: &'a RecordBatch,
    name: &str,
    uri: &str,
) -> Result<Option<&'a TimestampMicrosecondArray>> {
    match batch.column_by_name(name) {
        None => Ok(None),
        Some(c) => Ok(Some(
            c.as_any()
                .downcast_ref::<TimestampMicrosecondArray>()
                .ok_or_else(|| Error::column(uri, name, "timestamp[µs, UTC]"))?,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_are_in_the_unit_interval() {
        assert_eq!(parse_fraction("0.1"), Ok(0.1));
        assert_eq!(parse_fraction("0"), Ok(0.0));
        assert_eq!(parse_fraction("1"), Ok(1.0));
        assert!(parse_fraction("1.5").is_err());
        assert!(parse_fraction("-0.1").is_err());
        assert!(parse_fraction("NaN").is_err());
        assert!(parse_fraction("ten").is_err());
        assert!(parse_datetime("2024-06-01T00:00:00Z/..").is_ok());
        // A date is that whole day, as for `run --datetime`.
        assert!(parse_datetime("2024-06-01").is_ok());
        assert!(parse_datetime("2024-06-01/2024-08-31").is_ok());
        assert!(parse_datetime("June").is_err());
    }

    #[test]
    fn rows_lacking_a_property_are_excluded_and_counted_once() {
        use arrow_array::{ArrayRef, Float32Array};
        use arrow_schema::{DataType, Field, Schema};
        use std::sync::Arc;
        let ts = TimestampMicrosecondArray::from(vec![
            Some(100),
            None,
            Some(300),
            Some(50),
            None,
            Some(200),
        ])
        .with_timezone("UTC");
        let end = TimestampMicrosecondArray::from(vec![None, None, None, Some(150), None, None])
            .with_timezone("UTC");
        let cf = Float32Array::from(vec![
            Some(0.05),
            None,
            Some(0.0),
            None,
            Some(0.5),
            Some(f32::NAN),
        ]);
        let schema = Schema::new(vec![
            Field::new(col::DATETIME, ts.data_type().clone(), true),
            Field::new(col::END_DATETIME, end.data_type().clone(), true),
            Field::new(col::CLOUD_FRACTION, DataType::Float32, true),
        ]);
        let b = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(ts) as ArrayRef,
                Arc::new(end) as ArrayRef,
                Arc::new(cf) as ArrayRef,
            ],
        )
        .unwrap();
        let f = Filters {
            bbox: None,
            datetime: Some((Some(120), Some(250))),
            max_cloud: Some(0.1),
        };
        let mut m = Missing::default();
        // 100: before; null: missing dt; 300: after; 50..150 overlaps but has no
        // cloud; null dt (counted once, as dt); 200 in range but NaN cloud.
        assert_eq!(
            f.mask(&b, "t", &mut m).unwrap(),
            [false, false, false, false, false, false]
        );
        assert_eq!(
            m,
            Missing {
                datetime: 2,
                cloud_fraction: 1
            }
        );
        let f = Filters {
            datetime: Some((None, Some(100))),
            ..Filters::default()
        };
        let mut m = Missing::default();
        assert_eq!(
            f.mask(&b, "t", &mut m).unwrap(),
            [true, false, false, true, false, false]
        );
        assert_eq!(m.datetime, 2);
        // A batch without the columns (schema version 1): every row lacks them.
        let v1 = RecordBatch::new_empty(Arc::new(Schema::empty()));
        let v1 = RecordBatch::try_new_with_options(
            v1.schema(),
            vec![],
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(4)),
        )
        .unwrap();
        let f = Filters {
            max_cloud: Some(1.0),
            ..Filters::default()
        };
        let mut m = Missing::default();
        assert_eq!(f.mask(&v1, "t", &mut m).unwrap(), [false; 4]);
        assert_eq!(m.cloud_fraction, 4);
    }
}
