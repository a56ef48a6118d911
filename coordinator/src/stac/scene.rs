//! One STAC item as one scene of the plan: which assets give R, G and B, in
//! which units, where its cloud mask is, when it was acquired.
//!
//! Everything a worker needs is resolved here, once, into the task input
//! (`ItemInfo`), so a worker reads the task and never the item. What cannot
//! be resolved (an asset the item lacks) becomes `ItemInfo::error`, which the
//! worker writes as the item's error record: the item is reported, not skipped.

use rsembed_schemas::task::{BandFile, CloudMask, ItemInfo, ItemProj, MaskKind, TaskInput, Units};
use serde_json::{Map, Value};
use stac::{Asset, Item};
use url::Url;

/// The asset selection of a job: `--assets` and `--cloud-mask`.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// `--assets`; `None` is `visual`, else red, green, blue by common name.
    pub assets: Option<Vec<String>>,
    /// `--cloud-mask`, parsed.
    pub mask: Option<(String, MaskKind)>,
    /// The largest scene the reader opens (pixels), so a `proj:shape` that
    /// names a bigger one is not trusted to split the scene.
    pub max_pixels: u64,
}

/// One channel's source: an asset and the 1-based band of it.
struct Pick<'a> {
    key: &'a str,
    asset: &'a Asset,
    band: u32,
}

/// The task input of one item, whose document was read at `base`.
pub fn scene_of(href: &str, base: &Url, item: &Item, sel: &Selection) -> TaskInput {
    let mut info = ItemInfo {
        id: item.id.clone(),
        collection: item.collection.clone(),
        datetime: None,
        end_datetime: None,
        cloud_cover: None,
        units: vec![],
        mask: None,
        grid: None,
        proj: None,
        error: None,
    };
    let p = &item.properties;
    info.datetime = p
        .datetime
        .or(p.start_datetime)
        .map(|t| t.timestamp_micros());
    info.end_datetime = p.end_datetime.map(|t| t.timestamp_micros());
    info.cloud_cover = p
        .additional_fields
        .get("eo:cloud_cover")
        .and_then(Value::as_f64)
        .filter(|c| c.is_finite());
    let mut input = TaskInput {
        uri: href.to_owned(),
        size: 0,
        version: None,
        chips: None,
        parts: vec![],
        item: None,
    };
    match resolve(base, item, sel) {
        Ok((parts, units, mask, grid, proj)) => {
            input.size = parts.iter().map(|p| p.size).sum();
            input.version = Some(version(item, &parts, mask.as_ref()));
            input.parts = parts;
            info.units = if units.iter().any(Option::is_some) {
                units
            } else {
                vec![]
            };
            info.mask = mask;
            info.grid = grid;
            info.proj = proj;
        }
        Err(reason) => {
            info.error = Some(format!("STAC item {}: {reason}", item.id));
            input.version = p.updated.clone();
        }
    }
    input.item = Some(Box::new(info));
    input
}

type Resolved = (
    Vec<BandFile>,
    Vec<Option<Units>>,
    Option<CloudMask>,
    Option<[u32; 2]>,
    Option<ItemProj>,
);

fn resolve(base: &Url, item: &Item, sel: &Selection) -> Result<Resolved, String> {
    let picks = pick_channels(item, sel.assets.as_deref())?;
    let mut parts: Vec<BandFile> = Vec::new();
    let mut units = Vec::with_capacity(3);
    for pk in &picks {
        units.push(band_units(pk.asset, pk.band));
        // Channels of one asset are one part with several bands, so a
        // `visual` asset is opened once.
        match parts.last_mut() {
            Some(last) if last.suffix == pk.key => last.bands.push(pk.band),
            _ => parts.push(BandFile {
                suffix: pk.key.to_owned(),
                uri: href_of(base, pk.key, &pk.asset.href)?,
                size: file_size(pk.asset),
                version: asset_version(pk.asset),
                bands: vec![pk.band],
            }),
        }
    }
    for p in &mut parts {
        // A one-band file read as band 1 is what `--band-files` reads: leave
        // it implicit, so both paths share one reader.
        if p.bands == [1] {
            p.bands.clear();
        }
    }
    let mask = match &sel.mask {
        None => None,
        Some((key, kind)) => {
            let asset = item.assets.get(key).ok_or_else(|| {
                format!(
                    "has no asset `{key}` for --cloud-mask (its assets: {})",
                    asset_keys(item)
                )
            })?;
            Some(CloudMask {
                kind: *kind,
                file: BandFile {
                    suffix: key.clone(),
                    uri: href_of(base, key, &asset.href)?,
                    size: file_size(asset),
                    version: asset_version(asset),
                    bands: vec![],
                },
            })
        }
    };
    let grid = scene_shape(item, &picks, sel.max_pixels)?;
    // A PNG or JPEG asset is one whole-image chip (the worker tells it by its
    // name or bytes): a grid would split it into blocks it does not have.
    let image = parts.len() == 1 && picks.iter().all(|p| is_image_type(p.asset));
    let grid = grid.filter(|_| !image);
    let proj = grid.and_then(|g| super::proj::scene_proj(item, picks.iter().map(|p| p.asset), g));
    Ok((parts, units, mask, grid, proj))
}

/// Whether an asset's media type is a whole image's (PNG, JPEG).
fn is_image_type(asset: &Asset) -> bool {
    asset.r#type.as_deref().is_some_and(|t| {
        let t = t.trim().to_ascii_lowercase();
        ["image/png", "image/jpeg", "image/jpg"]
            .iter()
            .any(|m| t == *m || t.starts_with(&format!("{m};")))
    })
}

/// The assets and bands of R, G and B.
fn pick_channels<'a>(item: &'a Item, asked: Option<&'a [String]>) -> Result<Vec<Pick<'a>>, String> {
    match asked {
        Some([one]) => three_band(item, one),
        Some(names) => names.iter().map(|n| pick_one(item, n)).collect(),
        None if item.assets.contains_key("visual") => three_band(item, "visual"),
        None => ["red", "green", "blue"]
            .iter()
            .map(|n| pick_one(item, n))
            .collect(),
    }
}

/// One asset that holds all three channels (`visual`): its bands named red,
/// green and blue in that order, else its bands 1, 2, 3.
fn three_band<'a>(item: &'a Item, key: &'a str) -> Result<Vec<Pick<'a>>, String> {
    let (k, asset) = item.assets.get_key_value(key).ok_or_else(|| {
        format!(
            "has no asset `{key}` (its assets: {}); name three with --assets R,G,B",
            asset_keys(item)
        )
    })?;
    let bands = band_list(asset);
    let by_name = |n: &str| {
        bands
            .iter()
            .position(|b| common_name(b) == Some(n))
            .map(|i| i as u32 + 1)
    };
    let rgb = match (by_name("red"), by_name("green"), by_name("blue")) {
        (Some(r), Some(g), Some(b)) => [r, g, b],
        _ => {
            if !bands.is_empty() && bands.len() < 3 {
                return Err(format!(
                    "asset `{key}` has {} band(s); one asset for R,G,B needs three",
                    bands.len()
                ));
            }
            [1, 2, 3]
        }
    };
    Ok(rgb
        .into_iter()
        .map(|band| Pick {
            key: k.as_str(),
            asset,
            band,
        })
        .collect())
}

/// An asset key, else the asset with a band of that common name.
fn pick_one<'a>(item: &'a Item, name: &str) -> Result<Pick<'a>, String> {
    if let Some((k, asset)) = item.assets.get_key_value(name) {
        return Ok(Pick {
            key: k.as_str(),
            asset,
            band: 1,
        });
    }
    for (k, asset) in &item.assets {
        if let Some(i) = band_list(asset)
            .iter()
            .position(|b| common_name(b) == Some(name))
        {
            return Ok(Pick {
                key: k.as_str(),
                asset,
                band: i as u32 + 1,
            });
        }
    }
    Err(format!(
        "has no asset `{name}` and no band whose common name is `{name}` (its assets: {})",
        asset_keys(item)
    ))
}

/// An asset's bands as JSON objects: STAC 1.1 `bands`, else STAC 1.0
/// `eo:bands`, with 1.0's `raster:bands` (scale, offset) merged in by position.
fn band_list(asset: &Asset) -> Vec<Map<String, Value>> {
    if !asset.bands.is_empty() {
        return asset
            .bands
            .iter()
            .map(|b| match serde_json::to_value(b) {
                Ok(Value::Object(m)) => m,
                _ => Map::new(),
            })
            .collect();
    }
    let list = |k: &str| {
        asset
            .additional_fields
            .get(k)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (eo, raster) = (list("eo:bands"), list("raster:bands"));
    (0..eo.len().max(raster.len()))
        .map(|i| {
            let mut m = Map::new();
            if let Some(Value::Object(e)) = eo.get(i) {
                for (k, v) in e {
                    // 1.0 names it `common_name` inside `eo:bands`.
                    let k = if k == "common_name" {
                        "eo:common_name"
                    } else {
                        k
                    };
                    m.insert(k.to_owned(), v.clone());
                }
            }
            if let Some(Value::Object(r)) = raster.get(i) {
                for (k, v) in r {
                    let k = match k.as_str() {
                        "scale" => "raster:scale",
                        "offset" => "raster:offset",
                        other => other,
                    };
                    m.insert(k.to_owned(), v.clone());
                }
            }
            m
        })
        .collect()
}

fn common_name(band: &Map<String, Value>) -> Option<&str> {
    band.get("eo:common_name").and_then(Value::as_str)
}

/// `raster:scale` and `raster:offset` of band `band` (1-based) of an asset:
/// on the band, else (a one-band asset in STAC 1.1) on the asset itself.
fn band_units(asset: &Asset, band: u32) -> Option<Units> {
    let bands = band_list(asset);
    let num = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_f64);
    let from = |m: &Map<String, Value>| {
        let (s, o) = (num(m, "raster:scale"), num(m, "raster:offset"));
        (s.is_some() || o.is_some()).then(|| Units {
            scale: s.unwrap_or(1.0),
            offset: o.unwrap_or(0.0),
        })
    };
    let on_band = bands.get(band as usize - 1).and_then(from);
    let units = on_band.or_else(|| from(&asset.additional_fields))?;
    // A zero or non-finite scale has no inverse: `--scale MIN:MAX` could not
    // be mapped back to stored numbers. Treat the band as unitless.
    (units.scale.is_finite() && units.scale != 0.0 && units.offset.is_finite()).then_some(units)
}

/// The scene's grid (width, height) from `proj:shape` ([rows, columns]) of the
/// selected assets (the largest is the finest grid, which the scene takes),
/// else of the item. `None` when no shape is given: the planner reads headers.
fn scene_shape(
    item: &Item,
    picks: &[Pick<'_>],
    max_pixels: u64,
) -> Result<Option<[u32; 2]>, String> {
    let shape_of = |m: &Map<String, Value>| -> Option<Result<[u32; 2], String>> {
        Some(match super::proj::shape(m)? {
            Some((h, w)) if h > 0 && w > 0 && h.saturating_mul(w) <= max_pixels => {
                Ok([w as u32, h as u32])
            }
            Some((h, w)) if h > 0 && w > 0 => Err(format!(
                "proj:shape {h}x{w} is larger than the reader's {max_pixels} pixels"
            )),
            _ => Err(format!(
                "proj:shape {} is not [rows, columns]",
                m["proj:shape"]
            )),
        })
    };
    let mut best: Option<[u32; 2]> = None;
    let mut all = true;
    for pk in picks {
        match shape_of(&pk.asset.additional_fields) {
            Some(s) => {
                let s = s?;
                if best.is_none_or(|b| {
                    u64::from(s[0]) * u64::from(s[1]) > u64::from(b[0]) * u64::from(b[1])
                }) {
                    best = Some(s);
                }
            }
            None => all = false,
        }
    }
    if best.is_some() && all {
        return Ok(best);
    }
    if best.is_none() {
        if let Some(s) = shape_of(&item.properties.additional_fields) {
            return s.map(Some);
        }
    }
    // Some assets give a shape and some do not: the finest grid is not known.
    Ok(None)
}

/// An asset href as an absolute URL the stores open: relative hrefs resolve
/// against the document the item was read from.
fn href_of(base: &Url, key: &str, href: &str) -> Result<String, String> {
    if href.is_empty() {
        return Err(format!("asset `{key}` has an empty href"));
    }
    let url = Url::parse(href)
        .or_else(|_| base.join(href))
        .map_err(|e| format!("asset `{key}` href `{href}` does not resolve against {base}: {e}"))?;
    Ok(url.to_string())
}

fn file_size(asset: &Asset) -> u64 {
    asset
        .additional_fields
        .get("file:size")
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// What changes when an asset's bytes change: its checksum, else its `updated`.
fn asset_version(asset: &Asset) -> Option<String> {
    asset
        .additional_fields
        .get("file:checksum")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| asset.updated.clone())
}

/// `source_version`: the item's `updated` and each asset's version, so a
/// reprocessed item (a new baseline) gives new chip ids.
fn version(item: &Item, parts: &[BandFile], mask: Option<&CloudMask>) -> String {
    let updated = item.properties.updated.as_deref().unwrap_or("");
    let files = parts
        .iter()
        .chain(mask.map(|m| &m.file))
        .map(|p| p.version.as_deref().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(",");
    format!("{updated};{files}")
}

fn asset_keys(item: &Item) -> String {
    let keys: Vec<&str> = item.assets.keys().map(String::as_str).take(32).collect();
    if keys.is_empty() {
        "none".into()
    } else {
        keys.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(v: Value) -> Item {
        serde_json::from_value(v).expect("a valid item")
    }

    fn base() -> Url {
        Url::parse("s3://bucket/catalog/items/x.json").unwrap()
    }

    fn sel(assets: Option<&[&str]>) -> Selection {
        Selection {
            assets: assets.map(|a| a.iter().map(|s| s.to_string()).collect()),
            mask: None,
            max_pixels: 1 << 32,
        }
    }

    fn s2_v11() -> Value {
        let band = |name: &str, cn: &str| {
            json!({"href": format!("./{name}.tif"), "type": "image/tiff; application=geotiff",
                "bands": [{"name": name, "eo:common_name": cn, "raster:scale": 0.0001, "raster:offset": -0.1}],
                "proj:shape": [10980, 10980], "file:size": 100})
        };
        json!({"type": "Feature", "stac_version": "1.1.0", "id": "S2A_1",
            "collection": "sentinel-2-l2a", "geometry": null,
            "properties": {"datetime": "2024-06-01T10:20:30Z", "updated": "2024-06-02T00:00:00Z"},
            "links": [], "assets": {"B04": band("B04", "red"), "B03": band("B03", "green"),
            "B02": band("B02", "blue"),
            "SCL": {"href": "s3://other/SCL.tif", "proj:shape": [5490, 5490]}}})
    }

    #[test]
    fn stac_1_1_bands_by_common_name_with_units() {
        let it = item(s2_v11());
        let t = scene_of("s3://bucket/catalog/items/x.json", &base(), &it, &sel(None));
        let info = t.item.as_ref().unwrap();
        assert_eq!(info.error, None);
        let keys: Vec<&str> = t.parts.iter().map(|p| p.suffix.as_str()).collect();
        assert_eq!(keys, ["B04", "B03", "B02"]);
        assert_eq!(t.parts[0].uri, "s3://bucket/catalog/items/B04.tif");
        assert!(t.parts.iter().all(|p| p.bands.is_empty()));
        assert_eq!(t.size, 300);
        assert_eq!(
            info.units,
            vec![
                Some(Units {
                    scale: 0.0001,
                    offset: -0.1
                });
                3
            ]
        );
        assert_eq!(info.grid, Some([10980, 10980]));
        assert_eq!(info.datetime, Some(1_717_237_230_000_000));
        assert_eq!(info.collection.as_deref(), Some("sentinel-2-l2a"));
        assert!(t.version.unwrap().starts_with("2024-06-02T00:00:00Z;"));
        assert_eq!(info.cloud_cover, None, "no eo:cloud_cover");
        // eo:cloud_cover ranks a full window's acquisitions; a value that is
        // no number is no cover.
        for (v, cover) in [(json!(12.5), Some(12.5)), (json!("12"), None)] {
            let mut doc = s2_v11();
            doc["properties"]["eo:cloud_cover"] = v;
            let t = scene_of("s3://b/x.json", &base(), &item(doc), &sel(None));
            assert_eq!(t.item.unwrap().cloud_cover, cover);
        }
    }

    #[test]
    fn stac_1_0_eo_and_raster_bands() {
        let it = item(
            json!({"type": "Feature", "stac_version": "1.0.0", "id": "LC09",
            "geometry": null, "properties": {"start_datetime": "2023-01-01T00:00:00Z",
            "end_datetime": "2023-01-02T00:00:00Z", "datetime": null},
            "links": [], "assets": {
              "rgb": {"href": "/data/rgb.tif",
                "eo:bands": [{"name": "b", "common_name": "blue"}, {"name": "g", "common_name": "green"},
                             {"name": "r", "common_name": "red"}],
                "raster:bands": [{"scale": 2.75e-5, "offset": -0.2}, {"scale": 2.75e-5, "offset": -0.2},
                                 {"scale": 2.75e-5, "offset": -0.2}]}}}),
        );
        let t = scene_of("file:///data/item.json", &base(), &it, &sel(Some(&["rgb"])));
        let info = t.item.as_ref().unwrap();
        assert_eq!(info.error, None);
        assert_eq!(t.parts.len(), 1);
        assert_eq!(t.parts[0].bands, [3, 2, 1], "R,G,B by common name");
        assert_eq!(t.parts[0].uri, "s3://bucket/data/rgb.tif");
        assert_eq!(
            info.units[0],
            Some(Units {
                scale: 2.75e-5,
                offset: -0.2
            })
        );
        assert_eq!(info.datetime, Some(1_672_531_200_000_000));
        assert_eq!(info.end_datetime, Some(1_672_617_600_000_000));
        // Common names pick bands of a multi-band asset too.
        let t = scene_of("x", &base(), &it, &sel(Some(&["red", "green", "blue"])));
        assert_eq!(t.parts.len(), 1);
        assert_eq!(t.parts[0].bands, [3, 2, 1]);
    }

    #[test]
    fn visual_is_the_default_and_missing_assets_are_errors() {
        let mut v = s2_v11();
        v["assets"]["visual"] = json!({"href": "https://h/visual.tif"});
        let t = scene_of("x", &base(), &item(v), &sel(None));
        assert_eq!(t.parts.len(), 1);
        assert_eq!(t.parts[0].suffix, "visual");
        assert_eq!(t.parts[0].bands, [1, 2, 3]);
        assert_eq!(
            t.parts[0].size, 0,
            "no file:size: the worker asks the store"
        );

        let t = scene_of(
            "x",
            &base(),
            &item(s2_v11()),
            &sel(Some(&["B08", "B03", "B02"])),
        );
        let err = t.item.unwrap().error.unwrap();
        assert!(err.contains("S2A_1") && err.contains("`B08`"), "{err}");
        assert!(t.parts.is_empty());

        let mut s = sel(None);
        s.mask = Some(("CLD".into(), MaskKind::Scl));
        let t = scene_of("x", &base(), &item(s2_v11()), &s);
        assert!(t.item.unwrap().error.unwrap().contains("--cloud-mask"));
    }

    #[test]
    fn cloud_mask_and_hostile_shapes() {
        let mut s = sel(None);
        s.mask = Some(("SCL".into(), MaskKind::Scl));
        let t = scene_of("x", &base(), &item(s2_v11()), &s);
        let m = t.item.unwrap().mask.unwrap();
        assert_eq!(m.file.uri, "s3://other/SCL.tif");
        assert_eq!(m.kind, MaskKind::Scl);

        let mut v = s2_v11();
        v["assets"]["B04"]["proj:shape"] = json!([4_000_000_000u64, 4_000_000_000u64]);
        let t = scene_of("x", &base(), &item(v), &sel(None));
        assert!(t.item.unwrap().error.unwrap().contains("proj:shape"));

        let mut v = s2_v11();
        v["assets"]["B04"]["proj:shape"] = json!("big");
        let t = scene_of("x", &base(), &item(v), &sel(None));
        assert!(t
            .item
            .unwrap()
            .error
            .unwrap()
            .contains("not [rows, columns]"));
    }
}
