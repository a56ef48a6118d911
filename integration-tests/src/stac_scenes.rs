//! Sentinel-2-like scenes for the STAC tests, written by GDAL from NumPy: the
//! same 8-bit surface `v` (values 1..=255) stored three ways, so that chips
//! must come out equal whichever way a scene is read:
//!
//! - `visual.tif`: 3-band 8-bit (the original);
//! - `B04.tif`, `B03.tif`, `B02.tif` at the old processing baseline: DN = 10·v,
//!   `raster:scale` 1e-4, `raster:offset` 0 (reflectance v/1000);
//! - `o_B04.tif`, … at baseline 04.00: DN = 10·v + 1000, scale 1e-4, offset −0.1
//!   (the same reflectance);
//! - `SCL.tif` on a 2× coarser grid: class 4 (vegetation) with a block of
//!   class 9 (cloud, high probability) over the top-left quarter.
//!
//! With `--scale 0:0.255` (reflectance) both baselines map back to v exactly.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use crate::python;

/// Pixel size of the 10 m bands.
pub const PIXEL: f64 = 10.0;

/// One generated scene's files.
#[derive(Debug, Clone)]
pub struct SceneFiles {
    /// Folder holding the files.
    pub dir: PathBuf,
    /// Width = height in pixels of the 10 m grid.
    pub size: u32,
    /// Upper-left corner (UTM 33N metres).
    pub origin: (f64, f64),
}

impl SceneFiles {
    /// A file of the scene.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The scene's lon/lat bbox, roughly (for item geometry): UTM 33N near 15°E.
    pub fn lonlat_bbox(&self) -> [f64; 4] {
        // Good enough for search filters: the tests' boxes are far apart.
        let lon0 = 15.0 + (self.origin.0 - 500_000.0) / 70_000.0;
        let lat0 = self.origin.1 / 111_000.0;
        let d = f64::from(self.size) * PIXEL / 70_000.0;
        [lon0, lat0 - d, lon0 + d, lat0]
    }
}

const SCRIPT: &str = r#"
import sys, subprocess
import numpy as np
out, size, x0, y0, seed = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
rng = np.random.default_rng(seed)
y, x = np.mgrid[0:size, 0:size]
v = np.stack([(x * 3 + y + b * 40 + rng.integers(0, 60, size=(size, size))) % 255 + 1 for b in range(3)]).astype(np.uint8)

def write(name, arr, dtype_code, res, nodata=None):
    bands, h, w = arr.shape
    raw = f"{out}/{name}.envi"
    arr.tofile(raw)
    with open(f"{out}/{name}.hdr", "w") as f:
        f.write(f"ENVI\nsamples = {w}\nlines = {h}\nbands = {bands}\nheader offset = 0\n"
                f"file type = ENVI Standard\ndata type = {dtype_code}\ninterleave = bsq\nbyte order = 0\n")
    args = ["gdal_translate", "-q", "-of", "COG", "-co", "COMPRESS=DEFLATE", "-co", "BLOCKSIZE=256",
            "-co", "OVERVIEWS=NONE", "-a_srs", "EPSG:32633",
            "-a_ullr", str(x0), str(y0), str(x0 + res * w), str(y0 - res * h)]
    if nodata is not None:
        args += ["-a_nodata", str(nodata)]
    subprocess.run(args + [raw, f"{out}/{name}.tif"], check=True)
    import os
    os.remove(raw); os.remove(f"{out}/{name}.hdr")

write("visual", v, 1, 10.0)
for i, b in enumerate(["B04", "B03", "B02"]):
    write(b, (v[i:i+1].astype("<u2") * 10), 12, 10.0, nodata=0)
    write("o_" + b, (v[i:i+1].astype("<u2") * 10 + 1000), 12, 10.0, nodata=0)
half = size // 2
scl = np.full((1, half, half), 4, dtype=np.uint8)
scl[:, : half // 2, : half // 2] = 9
write("SCL", scl, 1, 20.0)
"#;

/// Writes one scene of `size`² pixels (a multiple of 4) into `dir`.
pub fn make_scene(dir: &Path, size: u32, origin: (f64, f64), seed: u64) -> SceneFiles {
    assert_eq!(
        size % 4,
        0,
        "the SCL grid is half the size, its cloud a quarter"
    );
    std::fs::create_dir_all(dir).expect("scene dir");
    let st = Command::new(python())
        .args(["-c", SCRIPT])
        .arg(dir)
        .args([
            size.to_string(),
            origin.0.to_string(),
            origin.1.to_string(),
            seed.to_string(),
        ])
        .status()
        .expect("python starts");
    assert!(
        st.success(),
        "numpy + gdal_translate wrote {}",
        dir.display()
    );
    SceneFiles {
        dir: dir.to_owned(),
        size,
        origin,
    }
}

/// How a test item describes its scene.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemStyle {
    /// STAC 1.1 `bands` with `eo:common_name`, `raster:scale`/`raster:offset`,
    /// `proj:shape` and `file:size`; the baseline-04.00 files (offset −0.1).
    V11Offset,
    /// STAC 1.0 `eo:bands` + `raster:bands`, no `proj:shape`, no `file:size`;
    /// the old-baseline files (offset 0).
    V10,
    /// Only a `visual` asset (8-bit), STAC 1.1.
    Visual,
    /// As Earth Search's `sentinel-2-l2a` items: STAC 1.0, assets `red`,
    /// `green`, `blue` and `scl` with `eo:bands`, `raster:bands` (scale 1e-4,
    /// offset −0.1: the baseline-04.00 files), `proj:shape` and
    /// `proj:transform`, and `proj:epsg` on the item.
    EarthSearch,
}

/// A STAC item for `scene`, whose asset hrefs are `href(file name)`.
pub fn item(
    scene: &SceneFiles,
    id: &str,
    collection: &str,
    datetime: &str,
    cloud_cover: Value,
    style: ItemStyle,
    href: &dyn Fn(&str) -> String,
) -> Value {
    let b = scene.lonlat_bbox();
    let geometry = json!({"type": "Polygon", "coordinates": [[
        [b[0], b[1]], [b[2], b[1]], [b[2], b[3]], [b[0], b[3]], [b[0], b[1]]]]});
    let size = |name: &str| {
        std::fs::metadata(scene.path(name))
            .map(|m| m.len())
            .unwrap_or(0)
    };
    let shape = json!([scene.size, scene.size]);
    let half = json!([scene.size / 2, scene.size / 2]);
    let names = [("B04", "red"), ("B03", "green"), ("B02", "blue")];
    let mut assets = serde_json::Map::new();
    let version = match style {
        ItemStyle::V11Offset => {
            for (key, cn) in names {
                let f = format!("o_{key}.tif");
                assets.insert(key.into(), json!({
                    "href": href(&f), "type": "image/tiff; application=geotiff; profile=cloud-optimized",
                    "roles": ["data"], "file:size": size(&f), "proj:shape": shape,
                    "bands": [{"name": key, "eo:common_name": cn, "nodata": 0,
                               "raster:scale": 0.0001, "raster:offset": -0.1}]}));
            }
            assets.insert(
                "SCL".into(),
                json!({"href": href("SCL.tif"), "roles": ["data"],
                "file:size": size("SCL.tif"), "proj:shape": half}),
            );
            "1.1.0"
        }
        ItemStyle::V10 => {
            for (key, cn) in names {
                let f = format!("{key}.tif");
                assets.insert(
                    key.into(),
                    json!({
                    "href": href(&f), "type": "image/tiff; application=geotiff",
                    "roles": ["data"],
                    "eo:bands": [{"name": key, "common_name": cn}],
                    "raster:bands": [{"scale": 0.0001, "offset": 0, "nodata": 0}]}),
                );
            }
            assets.insert(
                "SCL".into(),
                json!({"href": href("SCL.tif"), "roles": ["data"]}),
            );
            "1.0.0"
        }
        ItemStyle::EarthSearch => {
            let (x0, y0) = scene.origin;
            let transform = |res: f64| json!([res, 0.0, x0, 0.0, -res, y0]);
            for (key, cn) in names {
                let f = format!("o_{key}.tif");
                assets.insert(cn.into(), json!({
                    "href": href(&f), "type": "image/tiff; application=geotiff; profile=cloud-optimized",
                    "roles": ["data", "reflectance"], "file:size": size(&f),
                    "proj:shape": shape, "proj:transform": transform(PIXEL),
                    "eo:bands": [{"name": key, "common_name": cn}],
                    "raster:bands": [{"nodata": 0, "data_type": "uint16", "scale": 0.0001,
                                      "offset": -0.1}]}));
            }
            assets.insert(
                "scl".into(),
                json!({"href": href("SCL.tif"), "roles": ["data"],
                "file:size": size("SCL.tif"), "proj:shape": half,
                "proj:transform": transform(2.0 * PIXEL)}),
            );
            "1.0.0"
        }
        ItemStyle::Visual => {
            assets.insert(
                "visual".into(),
                json!({"href": href("visual.tif"),
                "roles": ["visual"], "file:size": size("visual.tif"), "proj:shape": shape,
                "bands": [{"eo:common_name": "red"}, {"eo:common_name": "green"},
                          {"eo:common_name": "blue"}]}),
            );
            "1.1.0"
        }
    };
    json!({
        "type": "Feature", "stac_version": version, "id": id, "collection": collection,
        "geometry": geometry, "bbox": b,
        "properties": properties(style, datetime, cloud_cover),
        "links": [], "assets": assets,
    })
}

fn properties(style: ItemStyle, datetime: &str, cloud_cover: Value) -> Value {
    let mut p = json!({"datetime": datetime, "eo:cloud_cover": cloud_cover,
                       "updated": "2024-09-01T00:00:00Z"});
    if style == ItemStyle::EarthSearch {
        p["proj:epsg"] = json!(32633);
    }
    p
}
