//! GeoTIFFs made for a test by GDAL (`gdal_translate`), the reference writer:
//! deterministic pixels from NumPy, the layout and georeferencing from flags.

use std::path::Path;
use std::process::Command;

use crate::{fixture_images, python};

/// How a generated 16-bit scene is stored.
#[derive(Debug, Clone, Copy)]
pub struct Scene16 {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Tile side.
    pub tile: u32,
    /// Zero the bottom-right region from this (x, y) on and a top-left corner
    /// of this (width, height), and tag 0 as nodata; no nodata when `None`.
    pub nodata: Option<((u32, u32), (u32, u32))>,
}

/// `gdal_translate -q <args> <src> <dst>`, failing the test when GDAL does.
pub fn gdal_translate<S: AsRef<std::ffi::OsStr>>(args: &[S], src: &Path, dst: &Path) {
    let st = Command::new("gdal_translate")
        .arg("-q")
        .args(args)
        .arg(src)
        .arg(dst)
        .status()
        .expect("gdal_translate runs (scripts/setup-test-env.sh installs gdal-bin)");
    assert!(st.success(), "gdal_translate made {}", dst.display());
}

/// A 3-band UInt16 GeoTIFF in UTM (EPSG:32633, 10 m pixels), tiled, LZW with
/// the horizontal predictor, no overviews: gradients plus seeded noise, values
/// in the thousands as in reflectance products.
pub fn make_geotiff16(dst: &Path, s: Scene16) {
    let raw = dst.with_extension("envi");
    let script = r#"
import sys
import numpy as np
raw, w, h, nd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = np.random.default_rng(20240611)
y, x = np.mgrid[0:h, 0:w]
a = np.stack([300 + 9 * x + (b + 2) * 5 * y + rng.integers(0, 2000, size=(h, w)) for b in range(3)])
a = a.astype("<u2")
if nd != "-":
    bx, by, cw, ch = map(int, nd.split(","))
    a[:, by:, bx:] = 0
    a[:, :ch, :cw] = 0
a.tofile(raw)
with open(raw[: -len(".envi")] + ".hdr", "w") as f:
    f.write(f"ENVI\nsamples = {w}\nlines = {h}\nbands = 3\nheader offset = 0\n"
            "file type = ENVI Standard\ndata type = 12\ninterleave = bsq\nbyte order = 0\n")
"#;
    let nd = match s.nodata {
        Some(((bx, by), (cw, ch))) => format!("{bx},{by},{cw},{ch}"),
        None => "-".into(),
    };
    let st = Command::new(python())
        .args(["-c", script])
        .arg(&raw)
        .args([s.width.to_string(), s.height.to_string(), nd])
        .status()
        .expect("python starts");
    assert!(st.success(), "numpy wrote {}", raw.display());
    let (x0, y0) = (400_000.0, 5_000_000.0);
    let mut args: Vec<String> = ["-of", "GTiff", "-co", "TILED=YES", "-co", "COMPRESS=LZW"]
        .map(String::from)
        .to_vec();
    args.extend(["-co", "PREDICTOR=2", "-a_srs", "EPSG:32633"].map(String::from));
    args.extend([
        "-co".into(),
        format!("BLOCKXSIZE={}", s.tile),
        "-co".into(),
        format!("BLOCKYSIZE={}", s.tile),
        "-a_ullr".into(),
    ]);
    args.extend(
        [
            x0,
            y0,
            x0 + 10.0 * f64::from(s.width),
            y0 - 10.0 * f64::from(s.height),
        ]
        .map(|v| v.to_string()),
    );
    if s.nodata.is_some() {
        args.extend(["-a_nodata", "0"].map(String::from));
    }
    gdal_translate(&args, &raw, dst);
    let _ = std::fs::remove_file(&raw);
    let _ = std::fs::remove_file(dst.with_extension("hdr"));
}

/// An 8-bit RGB GeoTIFF of `size`² pixels (EPSG:32618) with YCbCr JPEG tiles
/// of 256², resampled from the committed aerial image.
pub fn make_jpeg_geotiff(dst: &Path, size: u32) {
    let (x0, y0) = (500_000.0, 4_200_000.0);
    let extent = 10.0 * f64::from(size);
    let mut args: Vec<String> = [
        "-of",
        "GTiff",
        "-co",
        "TILED=YES",
        "-co",
        "COMPRESS=JPEG",
        "-co",
        "PHOTOMETRIC=YCBCR",
        "-r",
        "cubic",
        "-a_srs",
        "EPSG:32618",
        "-outsize",
    ]
    .map(String::from)
    .to_vec();
    args.extend([size.to_string(), size.to_string(), "-a_ullr".into()]);
    args.extend([x0, y0, x0 + extent, y0 - extent].map(|v| v.to_string()));
    gdal_translate(&args, &fixture_images().join("aerial_256.png"), dst);
}
