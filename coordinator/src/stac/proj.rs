//! Where an item's grid lies in its CRS, from STAC's projection extension:
//! what lets the planner place a window's acquisitions on the CRS lattice
//! (`--windows`) without reading a header.
//!
//! Read from the asset whose `proj:shape` is the scene's grid, else from the
//! item: `proj:code` (`EPSG:32633`, projection extension v2) or `proj:epsg`
//! (v1), and `proj:transform` (6 or 9 numbers, row-major: x = a·col + b·row +
//! c, y = d·col + e·row + f). Anything else, or anything odd, gives `None`:
//! the planner then keeps the window whole, and the worker, which reads the
//! file's own georeferencing, decides.

use rsembed_schemas::task::ItemProj;
use serde_json::{Map, Value};
use stac::{Asset, Item};

/// The placement of a scene of grid `grid` (width, height) of `item`, read
/// from `assets` (the selected ones) or the item.
pub(super) fn scene_proj<'a>(
    item: &Item,
    assets: impl IntoIterator<Item = &'a Asset>,
    grid: [u32; 2],
) -> Option<ItemProj> {
    let props = &item.properties.additional_fields;
    let is_grid =
        |m: &Map<String, Value>| shape(m) == Some(Some((u64::from(grid[1]), u64::from(grid[0]))));
    // The asset that gives the grid is the one whose transform is the grid's.
    let on_grid = assets
        .into_iter()
        .map(|a| &a.additional_fields)
        .find(|m| is_grid(m) && m.contains_key("proj:transform"));
    let (transform, epsg) = match on_grid {
        Some(m) => (transform(m)?, epsg(m).or_else(|| epsg(props))?),
        None if shape(props).is_none() || is_grid(props) => (transform(props)?, epsg(props)?),
        None => return None,
    };
    Some(ItemProj { epsg, transform })
}

/// `proj:shape` of `m` as (rows, columns): `None` without one, `Some(None)`
/// when it is not two whole numbers.
pub(super) fn shape(m: &Map<String, Value>) -> Option<Option<(u64, u64)>> {
    let v = m.get("proj:shape")?;
    Some(v.as_array().and_then(|a| match a.as_slice() {
        [h, w] => Some((h.as_u64()?, w.as_u64()?)),
        _ => None,
    }))
}

/// `proj:code` `EPSG:<n>`, else `proj:epsg` `<n>`.
fn epsg(m: &Map<String, Value>) -> Option<u32> {
    if let Some(code) = m.get("proj:code").and_then(Value::as_str) {
        return code.strip_prefix("EPSG:")?.parse().ok().filter(|c| *c > 0);
    }
    m.get("proj:epsg")
        .and_then(Value::as_u64)
        .and_then(|c| u32::try_from(c).ok())
        .filter(|c| *c > 0)
}

/// `proj:transform` in GDAL's order.
fn transform(m: &Map<String, Value>) -> Option<[f64; 6]> {
    let v = m.get("proj:transform")?.as_array()?;
    if v.len() != 6 && v.len() != 9 {
        return None;
    }
    let n: Vec<f64> = v.iter().map(Value::as_f64).collect::<Option<_>>()?;
    if !n.iter().all(|x| x.is_finite()) {
        return None;
    }
    let [a, b, c, d, e, f] = [n[0], n[1], n[2], n[3], n[4], n[5]];
    Some([c, a, b, f, d, e])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(props: Value, assets: Value) -> Item {
        serde_json::from_value(json!({
            "type": "Feature", "stac_version": "1.1.0", "id": "x",
            "geometry": null, "properties": props, "links": [], "assets": assets
        }))
        .unwrap()
    }

    #[test]
    fn from_the_asset_on_the_grid_else_the_item() {
        let it = item(
            json!({"datetime": "2024-01-01T00:00:00Z", "proj:code": "EPSG:32633"}),
            json!({
                "B04": {"href": "b04.tif", "proj:shape": [10980, 10980],
                        "proj:transform": [10, 0, 399960, 0, -10, 5900040]},
                "SCL": {"href": "scl.tif", "proj:shape": [5490, 5490],
                        "proj:transform": [20, 0, 399960, 0, -20, 5900040]}
            }),
        );
        let assets: Vec<&Asset> = it.assets.values().collect();
        let p = scene_proj(&it, assets.iter().copied(), [10980, 10980]).unwrap();
        assert_eq!(p.epsg, 32633);
        assert_eq!(p.transform, [399960.0, 10.0, 0.0, 5900040.0, 0.0, -10.0]);
        // The item's own, v1 style, 9 numbers.
        let it = item(
            json!({"datetime": "2024-01-01T00:00:00Z", "proj:epsg": 32618,
                   "proj:shape": [100, 200],
                   "proj:transform": [30, 0, 300000, 0, -30, 4000000, 0, 0, 1]}),
            json!({"red": {"href": "r.tif"}}),
        );
        let assets: Vec<&Asset> = it.assets.values().collect();
        let p = scene_proj(&it, assets.iter().copied(), [200, 100]).unwrap();
        assert_eq!((p.epsg, p.transform[0]), (32618, 300000.0));
        // The item's shape is another grid's: no placement.
        assert!(scene_proj(&it, assets.iter().copied(), [100, 100]).is_none());
    }

    #[test]
    fn odd_values_place_nothing() {
        for (props, why) in [
            (
                json!({"proj:code": "WKT:x", "proj:transform": [1, 0, 0, 0, -1, 0]}),
                "code",
            ),
            (
                json!({"proj:epsg": 0, "proj:transform": [1, 0, 0, 0, -1, 0]}),
                "zero",
            ),
            (
                json!({"proj:epsg": 4326, "proj:transform": [1, 0, 0, 0, -1]}),
                "5 numbers",
            ),
            (
                json!({"proj:epsg": 4326, "proj:transform": [1, 0, 0, 0, "x", 0]}),
                "text",
            ),
            (json!({"proj:epsg": 4326}), "no transform"),
        ] {
            let it = item(props, json!({"red": {"href": "r.tif"}}));
            let assets: Vec<&Asset> = it.assets.values().collect();
            assert!(
                scene_proj(&it, assets.iter().copied(), [1, 1]).is_none(),
                "{why}"
            );
        }
    }
}
