//! The search of a STAC input, as flags give it: checked once, and applied
//! on the client to whatever a catalog, an item collection or an API returns.
//!
//! The client filters judge an item's JSON, so one code path serves every
//! source; an item they cannot judge (no geometry under `--bbox`, a
//! non-numeric `eo:cloud_cover`) is reported, not dropped.

use std::collections::HashSet;

use rsembed_schemas::datetime::{date_only, range as datetime_range};
use rsembed_schemas::job::StacSearch;
use serde_json::Value;

/// Checks `--datetime`: an RFC 3339 instant, a date, or an interval `A/B`
/// of those whose open ends are `..` (or empty), with A <= B.
pub fn check_datetime(s: &str) -> Result<(), String> {
    datetime_range(s).map(|_| ())
}

/// The last microsecond of a day: a date-only end covers its whole day.
const DAY_END: &str = "T23:59:59.999999Z";

/// `--datetime` as RFC 3339 text, as STAC clients send it: a date-only start
/// is that day's first instant (`2024-01-01T00:00:00Z`), a date-only end its
/// last microsecond (`2024-03-31T23:59:59.999999Z`, inclusive), and a lone
/// date the interval of that day. Times are kept as written, so a search given
/// in RFC 3339 is the same text (and the same job) as before.
pub fn normalize_datetime(s: &str) -> Result<String, String> {
    datetime_range(s)?;
    let start = |p: &str| match date_only(p.trim()) {
        Some(_) => format!("{}T00:00:00Z", p.trim()),
        None => p.to_owned(),
    };
    let end = |p: &str| match date_only(p.trim()) {
        Some(_) => format!("{}{DAY_END}", p.trim()),
        None => p.to_owned(),
    };
    Ok(match s.split_once('/') {
        None if date_only(s.trim()).is_some() => format!("{}/{}", start(s), end(s)),
        None => s.to_owned(),
        Some((a, b)) => format!("{}/{}", start(a), end(b)),
    })
}

/// The CQL2 text that selects `eo:cloud_cover <= max`.
pub fn cloud_cover_text(max: f64) -> String {
    format!("\"eo:cloud_cover\" <= {max}")
}

/// `--filter` (CQL2 text), checked: the error names what the parser saw.
pub fn parse_filter(text: &str) -> Result<cql2::Expr, String> {
    cql2::parse_text(text).map_err(|e| format!("--filter `{text}` is not CQL2 text: {e}"))
}

/// What the client filters make of one item.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Selected.
    Keep,
    /// Not selected.
    Drop,
    /// Cannot be judged: reported as the item's error, so it is not lost.
    Bad(String),
}

/// The search applied on the client.
#[derive(Debug, Clone, Default)]
pub struct ClientFilter {
    collections: HashSet<String>,
    ids: HashSet<String>,
    bbox: Option<[f64; 4]>,
    time: Option<(Option<i64>, Option<i64>)>,
    cloud_max: Option<f64>,
    expr: Option<cql2::Expr>,
}

impl ClientFilter {
    /// The filters of `search`. `with_expr`: also evaluate `--filter` (a
    /// static source); an API has evaluated it already, with its own
    /// functions, and a second opinion could only disagree.
    pub fn new(search: &StacSearch, with_expr: bool) -> Result<ClientFilter, String> {
        if let Some(b) = search.bbox {
            check_bbox(b)?;
        }
        Ok(ClientFilter {
            collections: search.collections.iter().cloned().collect(),
            ids: search.ids.iter().cloned().collect(),
            bbox: search.bbox,
            time: search.datetime.as_deref().map(datetime_range).transpose()?,
            cloud_max: search.cloud_cover_max,
            expr: match (&search.filter, with_expr) {
                (Some(f), true) => Some(parse_filter(f)?),
                (Some(f), false) => {
                    parse_filter(f)?;
                    None
                }
                (None, _) => None,
            },
        })
    }

    /// Whether `item` (its JSON) is selected.
    pub fn judge(&self, item: &Value) -> Verdict {
        let props = item.get("properties");
        if !self.collections.is_empty() {
            let c = item.get("collection").and_then(Value::as_str);
            if !c.is_some_and(|c| self.collections.contains(c)) {
                return Verdict::Drop;
            }
        }
        if !self.ids.is_empty() {
            let id = item.get("id").and_then(Value::as_str);
            if !id.is_some_and(|id| self.ids.contains(id)) {
                return Verdict::Drop;
            }
        }
        if let Some(want) = self.bbox {
            match item_bbox(item) {
                Ok(have) => {
                    if !bboxes_intersect(want, have) {
                        return Verdict::Drop;
                    }
                }
                Err(why) => return Verdict::Bad(format!("{why}, so --bbox cannot select it")),
            }
        }
        if let Some((a, b)) = self.time {
            match item_time(props) {
                Ok((s, e)) => {
                    if a.is_some_and(|a| e < a) || b.is_some_and(|b| s > b) {
                        return Verdict::Drop;
                    }
                }
                Err(why) => return Verdict::Bad(format!("{why}, so --datetime cannot select it")),
            }
        }
        if let Some(max) = self.cloud_max {
            match props.and_then(|p| p.get("eo:cloud_cover")) {
                // As a server's `eo:cloud_cover <= X` does: an unknown cover
                // is not a match.
                None | Some(Value::Null) => return Verdict::Drop,
                Some(Value::Number(n)) => match n.as_f64() {
                    Some(c) if c <= max => {}
                    _ => return Verdict::Drop,
                },
                Some(other) => {
                    return Verdict::Bad(format!(
                        "eo:cloud_cover {} is not a number, so --cloud-cover-max cannot select it",
                        short(other)
                    ))
                }
            }
        }
        if let Some(expr) = &self.expr {
            match expr.clone().matches(Some(item)) {
                Ok(true) => {}
                Ok(false) => return Verdict::Drop,
                // A property the expression names is absent: not a match, as
                // on a server.
                Err(cql2::Error::NonReduced()) => return Verdict::Drop,
                Err(e) => return Verdict::Bad(format!("--filter cannot be evaluated on it: {e}")),
            }
        }
        Verdict::Keep
    }
}

/// A value shown in an error, cut to a readable length.
fn short(v: &Value) -> String {
    cut(&v.to_string())
}

/// Text shown in an error, cut to a readable length.
pub(crate) fn cut(s: &str) -> String {
    match s.char_indices().nth(60) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

/// The search as the flags that give it.
pub(crate) fn as_flags(s: &StacSearch) -> String {
    let mut f = Vec::new();
    if !s.collections.is_empty() {
        f.push(format!("--collections {}", s.collections.join(",")));
    }
    if let Some(b) = s.bbox {
        f.push(format!("--bbox={},{},{},{}", b[0], b[1], b[2], b[3]));
    }
    if let Some(d) = &s.datetime {
        f.push(format!("--datetime {d}"));
    }
    if !s.ids.is_empty() {
        f.push(format!("--ids {}", cut(&s.ids.join(","))));
    }
    if let Some(x) = &s.filter {
        f.push(format!("--filter '{}'", cut(x)));
    }
    if let Some(c) = s.cloud_cover_max {
        f.push(format!("--cloud-cover-max {c}"));
    }
    f.join(" ")
}

/// Checks `--bbox` W,S,E,N: latitudes in order, all in range. W > E is a
/// box that crosses the antimeridian.
pub fn check_bbox(b: [f64; 4]) -> Result<(), String> {
    let [w, s, e, n] = b;
    let lon = |v: f64| (-180.0..=180.0).contains(&v);
    let lat = |v: f64| (-90.0..=90.0).contains(&v);
    if !(lon(w) && lon(e) && lat(s) && lat(n)) {
        return Err(format!(
            "--bbox {w},{s},{e},{n}: longitudes must be within -180..180 and latitudes within -90..90"
        ));
    }
    if s > n {
        return Err(format!("--bbox {w},{s},{e},{n}: south is above north"));
    }
    Ok(())
}

/// An item's bbox as W,S,E,N: its `bbox`, else the extent of its geometry.
fn item_bbox(item: &Value) -> Result<[f64; 4], String> {
    match item.get("bbox") {
        Some(Value::Array(a)) => {
            let v: Option<Vec<f64>> = a.iter().map(Value::as_f64).collect();
            return match v.as_deref() {
                Some(&[w, s, e, n]) | Some(&[w, s, _, e, n, _]) => Ok([w, s, e, n]),
                _ => Err(format!(
                    "its bbox {} is not 4 or 6 numbers",
                    short(&item["bbox"])
                )),
            };
        }
        None | Some(Value::Null) => {}
        Some(other) => return Err(format!("its bbox {} is not an array", short(other))),
    }
    let geometry = match item.get("geometry") {
        None | Some(Value::Null) => return Err("it has no geometry and no bbox".into()),
        Some(g) => g,
    };
    let mut ext = [
        f64::INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NEG_INFINITY,
    ];
    extent(geometry, &mut ext);
    if ext[0] > ext[2] || ext[1] > ext[3] {
        return Err("its geometry has no coordinates and it has no bbox".into());
    }
    Ok(ext)
}

/// Grows `ext` by every position in a GeoJSON geometry (JSON nesting is
/// bounded by the parser's recursion limit).
fn extent(g: &Value, ext: &mut [f64; 4]) {
    if let Some(gs) = g.get("geometries").and_then(Value::as_array) {
        gs.iter().for_each(|g| extent(g, ext));
    } else if let Some(c) = g.get("coordinates") {
        positions(c, ext);
    }
}

fn positions(c: &Value, ext: &mut [f64; 4]) {
    let Some(a) = c.as_array() else { return };
    if let (Some(x), Some(y)) = (
        a.first().and_then(Value::as_f64),
        a.get(1).and_then(Value::as_f64),
    ) {
        ext[0] = ext[0].min(x);
        ext[1] = ext[1].min(y);
        ext[2] = ext[2].max(x);
        ext[3] = ext[3].max(y);
    } else {
        a.iter().for_each(|c| positions(c, ext));
    }
}

/// Whether two W,S,E,N boxes meet; a box whose W > E crosses the antimeridian
/// and is two boxes.
pub fn bboxes_intersect(a: [f64; 4], b: [f64; 4]) -> bool {
    fn parts(b: [f64; 4]) -> Vec<[f64; 4]> {
        if b[0] > b[2] {
            vec![[b[0], b[1], 180.0, b[3]], [-180.0, b[1], b[2], b[3]]]
        } else {
            vec![b]
        }
    }
    parts(a).iter().any(|p| {
        parts(b)
            .iter()
            .any(|q| p[0] <= q[2] && q[0] <= p[2] && p[1] <= q[3] && q[1] <= p[3])
    })
}

/// An item's time as an inclusive range of microseconds: `datetime`, else
/// `start_datetime`..`end_datetime` (an open end is unbounded).
fn item_time(props: Option<&Value>) -> Result<(i64, i64), String> {
    let get = |k: &str| -> Result<Option<i64>, String> {
        match props.and_then(|p| p.get(k)) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => {
                time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
                    .map(|t| Some((t.unix_timestamp_nanos() / 1000) as i64))
                    .map_err(|_| {
                        format!(
                            "its {k} `{}` is not an RFC 3339 time",
                            short(&Value::String(s.clone()))
                        )
                    })
            }
            Some(other) => Err(format!("its {k} {} is not a string", short(other))),
        }
    };
    if let Some(t) = get("datetime")? {
        return Ok((t, t));
    }
    match (get("start_datetime")?, get("end_datetime")?) {
        (None, None) => Err("it has no datetime, start_datetime or end_datetime".into()),
        (s, e) => Ok((s.unwrap_or(i64::MIN), e.unwrap_or(i64::MAX))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn search() -> StacSearch {
        StacSearch::default()
    }

    fn item(v: Value) -> Value {
        let mut base = json!({"type": "Feature", "id": "a", "collection": "c1",
            "geometry": {"type": "Point", "coordinates": [10.0, 20.0]},
            "properties": {"datetime": "2024-06-01T00:00:00Z", "eo:cloud_cover": 5}});
        for (k, v) in v.as_object().unwrap() {
            if k == "properties" {
                for (pk, pv) in v.as_object().unwrap() {
                    base["properties"][pk] = pv.clone();
                }
            } else {
                base[k] = v.clone();
            }
        }
        base
    }

    fn judge(s: StacSearch, i: Value) -> Verdict {
        ClientFilter::new(&s, true).unwrap().judge(&item(i))
    }

    #[test]
    fn collections_and_ids_select() {
        let s = StacSearch {
            collections: vec!["c1".into(), "c2".into()],
            ..search()
        };
        assert_eq!(judge(s.clone(), json!({})), Verdict::Keep);
        assert_eq!(judge(s.clone(), json!({"collection": "c3"})), Verdict::Drop);
        assert_eq!(judge(s, json!({"collection": null})), Verdict::Drop);
        let s = StacSearch {
            ids: vec!["b".into()],
            ..search()
        };
        assert_eq!(judge(s.clone(), json!({})), Verdict::Drop);
        assert_eq!(judge(s, json!({"id": "b"})), Verdict::Keep);
    }

    #[test]
    fn bbox_uses_the_item_bbox_else_its_geometry_and_crosses_the_antimeridian() {
        let s = |b| StacSearch {
            bbox: Some(b),
            ..search()
        };
        assert_eq!(judge(s([9.0, 19.0, 11.0, 21.0]), json!({})), Verdict::Keep);
        assert_eq!(judge(s([11.0, 19.0, 12.0, 21.0]), json!({})), Verdict::Drop);
        // The bbox wins over the geometry.
        assert_eq!(
            judge(
                s([11.0, 19.0, 12.0, 21.0]),
                json!({"bbox": [10.0, 19.0, 11.5, 21.0]})
            ),
            Verdict::Keep
        );
        // A 3D bbox.
        assert_eq!(
            judge(
                s([11.0, 19.0, 12.0, 21.0]),
                json!({"bbox": [10.0, 19.0, 0.0, 11.5, 21.0, 5.0]})
            ),
            Verdict::Keep
        );
        // A polygon's extent.
        let poly = json!({"geometry": {"type": "Polygon", "coordinates": [[[0.0, 0.0], [4.0, 0.0], [4.0, 3.0], [0.0, 0.0]]]}});
        assert_eq!(judge(s([3.5, 2.5, 5.0, 5.0]), poly.clone()), Verdict::Keep);
        assert_eq!(judge(s([4.5, 2.5, 5.0, 5.0]), poly), Verdict::Drop);
        // A search box over the antimeridian, and an item box over it.
        let fiji = json!({"geometry": {"type": "Point", "coordinates": [179.5, -17.0]}});
        assert_eq!(
            judge(s([170.0, -20.0, -170.0, -10.0]), fiji.clone()),
            Verdict::Keep
        );
        assert_eq!(
            judge(s([-175.0, -20.0, -170.0, -10.0]), fiji),
            Verdict::Drop
        );
        let across = json!({"bbox": [179.0, -18.0, -179.0, -16.0]});
        assert_eq!(
            judge(s([-179.5, -20.0, -170.0, -10.0]), across.clone()),
            Verdict::Keep
        );
        assert_eq!(judge(s([0.0, -20.0, 10.0, -10.0]), across), Verdict::Drop);
        // No geometry: reported, not dropped.
        let v = judge(s([0.0, 0.0, 1.0, 1.0]), json!({"geometry": null}));
        assert!(
            matches!(&v, Verdict::Bad(r) if r.contains("no geometry")),
            "{v:?}"
        );
        assert!(check_bbox([0.0, 10.0, 1.0, 5.0]).is_err());
        assert!(check_bbox([0.0, 0.0, 190.0, 5.0]).is_err());
        assert!(check_bbox([170.0, 0.0, -170.0, 5.0]).is_ok());
    }

    #[test]
    fn datetime_overlaps_instants_and_ranges() {
        let s = |d: &str| StacSearch {
            datetime: Some(d.into()),
            ..search()
        };
        assert_eq!(
            judge(s("2024-05-01T00:00:00Z/2024-06-01T00:00:00Z"), json!({})),
            Verdict::Keep
        );
        assert_eq!(
            judge(s("2024-06-01T00:00:01Z/.."), json!({})),
            Verdict::Drop
        );
        assert_eq!(judge(s("2024-06-01T00:00:00Z"), json!({})), Verdict::Keep);
        let range = json!({"properties": {"datetime": null,
            "start_datetime": "2024-01-01T00:00:00Z", "end_datetime": "2024-12-31T00:00:00Z"}});
        assert_eq!(
            judge(
                s("2024-06-01T00:00:00Z/2024-06-02T00:00:00Z"),
                range.clone()
            ),
            Verdict::Keep
        );
        assert_eq!(
            judge(s("../2023-12-31T00:00:00Z"), range.clone()),
            Verdict::Drop
        );
        assert_eq!(judge(s("2025-01-01T00:00:00Z/.."), range), Verdict::Drop);
        let v = judge(
            s("2024-01-01T00:00:00Z/.."),
            json!({"properties": {"datetime": null}}),
        );
        assert!(matches!(v, Verdict::Bad(_)), "{v:?}");
        let v = judge(
            s("2024-01-01T00:00:00Z/.."),
            json!({"properties": {"datetime": "June"}}),
        );
        assert!(matches!(v, Verdict::Bad(_)), "{v:?}");
    }

    #[test]
    fn cloud_cover_numbers_select_and_others_are_bad() {
        let s = StacSearch {
            cloud_cover_max: Some(10.0),
            ..search()
        };
        assert_eq!(judge(s.clone(), json!({})), Verdict::Keep);
        assert_eq!(
            judge(s.clone(), json!({"properties": {"eo:cloud_cover": 10.5}})),
            Verdict::Drop
        );
        assert_eq!(
            judge(s.clone(), json!({"properties": {"eo:cloud_cover": null}})),
            Verdict::Drop
        );
        let v = judge(s, json!({"properties": {"eo:cloud_cover": "cloudy"}}));
        assert!(
            matches!(&v, Verdict::Bad(r) if r.contains("\"cloudy\" is not a number")),
            "{v:?}"
        );
    }

    #[test]
    fn cql2_filters_evaluate_on_the_client() {
        let s = |f: &str| StacSearch {
            filter: Some(f.into()),
            ..search()
        };
        assert_eq!(
            judge(s("\"eo:cloud_cover\" < 6 AND collection = 'c1'"), json!({})),
            Verdict::Keep
        );
        assert_eq!(judge(s("\"eo:cloud_cover\" > 6"), json!({})), Verdict::Drop);
        assert_eq!(
            judge(s("platform = 'sentinel-2a'"), json!({})),
            Verdict::Drop
        );
        assert!(ClientFilter::new(&s("cloud <<< 3"), true).is_err());
        // Not evaluated for an API, but still checked.
        let f = ClientFilter::new(&s("\"eo:cloud_cover\" > 6"), false).unwrap();
        assert_eq!(f.judge(&item(json!({}))), Verdict::Keep);
        assert!(ClientFilter::new(&s("cloud <<< 3"), false).is_err());
        assert_eq!(cloud_cover_text(7.5), "\"eo:cloud_cover\" <= 7.5");
        assert!(parse_filter(&cloud_cover_text(7.5)).is_ok());
    }

    #[test]
    fn datetimes_are_instants_or_intervals() {
        assert!(check_datetime("2024-06-01T00:00:00Z").is_ok());
        assert!(check_datetime("2024-06-01T00:00:00Z/2024-08-31T23:59:59Z").is_ok());
        assert!(check_datetime("../2024-08-31T23:59:59Z").is_ok());
        assert!(check_datetime("2024-06-01T00:00:00+02:00/..").is_ok());
        assert!(check_datetime("2024-6-01").is_err());
        assert!(check_datetime("2024-02-30").is_err());
        assert!(check_datetime("../..").is_err());
        assert!(check_datetime("2024-09-01T00:00:00Z/2024-08-01T00:00:00Z").is_err());
        let (a, b) = datetime_range("2024-01-01T00:00:00Z/..").unwrap();
        assert_eq!((a, b), (Some(1_704_067_200_000_000), None));
    }

    #[test]
    fn dates_are_whole_days() {
        // 2024-03-31T23:59:59.999999Z is the last microsecond included.
        let end = 1_711_929_599_999_999;
        assert_eq!(
            datetime_range("2024-01-01/2024-03-31").unwrap(),
            (Some(1_704_067_200_000_000), Some(end))
        );
        assert_eq!(
            datetime_range("2024-01-01/2024-03-31").unwrap(),
            datetime_range("2024-01-01T00:00:00Z/2024-03-31T23:59:59.999999Z").unwrap()
        );
        assert_eq!(
            datetime_range("2024-03-31").unwrap(),
            (Some(end - 86_400_000_000 + 1), Some(end))
        );
        assert_eq!(datetime_range("../2024-03-31").unwrap(), (None, Some(end)));
        assert!(check_datetime("2024-03-31/2024-03-31").is_ok());
        assert!(check_datetime("2024-04-01/2024-03-31").is_err());
        assert_eq!(
            normalize_datetime("2024-01-01/2024-03-31").unwrap(),
            "2024-01-01T00:00:00Z/2024-03-31T23:59:59.999999Z"
        );
        assert_eq!(
            normalize_datetime("2024-03-31").unwrap(),
            "2024-03-31T00:00:00Z/2024-03-31T23:59:59.999999Z"
        );
        assert_eq!(
            normalize_datetime("2024-01-01/..").unwrap(),
            "2024-01-01T00:00:00Z/.."
        );
        // RFC 3339 text is kept as written: the same job as before.
        for s in [
            "2024-06-01T00:00:00Z/2024-08-31T23:59:59Z",
            "../2024-01-01T10:00:00+02:00",
            "2024-06-01T00:00:00Z",
        ] {
            assert_eq!(normalize_datetime(s).unwrap(), s);
        }
        assert!(normalize_datetime("June").is_err());
        // An item on the last day is in; one a microsecond later is not.
        let s = StacSearch {
            datetime: Some("2024-01-01/2024-03-31".into()),
            ..search()
        };
        let at = |t: &str| judge(s.clone(), json!({"properties": {"datetime": t}}));
        assert_eq!(at("2024-03-31T23:59:59.999999Z"), Verdict::Keep);
        assert_eq!(at("2024-04-01T00:00:00Z"), Verdict::Drop);
        assert_eq!(at("2024-01-01T00:00:00Z"), Verdict::Keep);
        assert_eq!(at("2023-12-31T23:59:59Z"), Verdict::Drop);
    }
}
