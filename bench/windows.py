"""A window job against the same scenes embedded one by one (issue 31).

Usage, from the repository root (after scripts/setup-test-env.sh, whose venv has
numpy, and GDAL's command line tools on the PATH):

    cargo build --release -p rsembed-coordinator --bin rsembed
    .cache/venv/bin/python bench/windows.py [--size 1536] [--scenes 12] [--reps 3]

A year of one Sentinel-2-like ground: `--scenes` acquisitions spread over 2024
(one a month by default), each a set of Earth Search-shaped COGs (red, green,
blue: uint16 DN = 10 v + 1000 with scale 1e-4 and offset -0.1; scl at 20 m with
a different cloud in each), every other one cropped at a pixel offset so the
corners differ, all on the 10 m lattice of UTM 33N. The items (Earth Search's
asset keys, `proj:epsg`, `proj:shape`, `proj:transform`) are one local
FeatureCollection file, so no server shares the two cores.

Two jobs over the same items, with the tiny model, alternating, each in a fresh
output, --reps times after one warm-up of each:

- window:   run --windows P3M --datetime 2024-01-01/2024-12-31 (one row per
            quarter and cell, `--composite best`);
- window in blocks: the same with --task-chips (default 16: blocks of 4 x 4
            cells, tasks a fraction of a scene, to show what block edges cost);
- one by one: run --align crs --datetime 2024-01-01/2024-12-31 (every chip of
            every acquisition, each scene on its own, as without windows).

Both read every acquisition's pixels once. Reported: median wall time, bytes read
(the run's `bytes_read`), chips embedded, and the ratios window / one by one.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("RSEMBED_BIN", REPO / "target" / "release" / "rsembed"))
MODEL = REPO / "fixtures" / "models" / "tiny-siglip"
# On the 10 m lattice and the 256-pixel chip grid: cells line up exactly.
X0, Y0 = 399_360.0, 5_898_240.0


def cog(path, arr, res, x0, y0, dtype, nodata=None):
    bands, h, w = arr.shape
    raw = path.with_suffix(".envi")
    arr.tofile(raw)
    code = {"uint8": 1, "uint16": 12}[dtype]
    raw.with_suffix(".hdr").write_text(
        f"ENVI\nsamples = {w}\nlines = {h}\nbands = {bands}\nheader offset = 0\n"
        f"file type = ENVI Standard\ndata type = {code}\ninterleave = bsq\nbyte order = 0\n"
    )
    args = ["gdal_translate", "-q", "-of", "COG", "-co", "COMPRESS=DEFLATE", "-co", "BLOCKSIZE=512",
            "-co", "OVERVIEWS=NONE", "-a_srs", "EPSG:32633",
            "-a_ullr", str(x0), str(y0), str(x0 + res * w), str(y0 - res * h)]
    if nodata is not None:
        args += ["-a_nodata", str(nodata)]
    subprocess.run(args + [str(raw), str(path)], check=True)
    raw.unlink()
    raw.with_suffix(".hdr").unlink()


def make_items(root, size, scenes):
    rng = np.random.default_rng(31)
    y, x = np.mgrid[0:size, 0:size]
    ground = np.stack([(x // 7 + y // 5 + b * 40) % 200 + 20 for b in range(3)]).astype(np.uint16)
    items = []
    for k in range(scenes):
        d = root / f"a{k:02d}"
        d.mkdir()
        # Every other acquisition starts 64 or 128 pixels in: another corner.
        off = (k % 2) * (64 * (1 + k % 3))
        sub = ground[:, off:, off:]
        n = size - off
        noise = rng.integers(0, 8, size=sub.shape, dtype=np.uint16)
        dn = (sub + noise) * 10 + 1000
        x0, y0 = X0 + off * 10.0, Y0 - off * 10.0
        for b, key in enumerate(["red", "green", "blue"]):
            cog(d / f"{key}.tif", dn[b:b + 1].copy(), 10.0, x0, y0, "uint16", nodata=0)
        half = n // 2
        scl = np.full((1, half, half), 4, dtype=np.uint8)
        c = rng.integers(0, max(1, half - half // 3))
        scl[:, c:c + half // 3, c:c + half // 3] = 9
        cog(d / "scl.tif", scl, 20.0, x0, y0, "uint8")
        month = 1 + (k * 12 // scenes)
        lon, lat = 13.6, 53.2
        assets = {}
        for key in ["red", "green", "blue"]:
            assets[key] = {
                "href": f"file://{d / (key + '.tif')}",
                "type": "image/tiff; application=geotiff; profile=cloud-optimized",
                "roles": ["data"], "file:size": (d / f"{key}.tif").stat().st_size,
                "proj:shape": [n, n], "proj:transform": [10.0, 0.0, x0, 0.0, -10.0, y0],
                "eo:bands": [{"name": key, "common_name": key}],
                "raster:bands": [{"nodata": 0, "scale": 0.0001, "offset": -0.1}],
            }
        assets["scl"] = {
            "href": f"file://{d / 'scl.tif'}", "roles": ["data"],
            "file:size": (d / "scl.tif").stat().st_size,
            "proj:shape": [half, half], "proj:transform": [20.0, 0.0, x0, 0.0, -20.0, y0],
        }
        items.append({
            "type": "Feature", "stac_version": "1.0.0", "id": f"S2A_33UUV_2024{month:02d}{10 + k % 15:02d}_0_L2A",
            "collection": "sentinel-2-l2a",
            "geometry": {"type": "Polygon", "coordinates": [[[lon, lat], [lon + .2, lat], [lon + .2, lat + .2],
                                                             [lon, lat + .2], [lon, lat]]]},
            "bbox": [lon, lat, lon + .2, lat + .2],
            "properties": {"datetime": f"2024-{month:02d}-{10 + k % 15:02d}T10:00:00Z",
                           "eo:cloud_cover": float(rng.integers(0, 60)), "proj:epsg": 32633},
            "links": [], "assets": assets,
        })
    f = root / "items.json"
    f.write_text(json.dumps({"type": "FeatureCollection", "features": items}))
    return f


def run(items, out, windows, task_chips=None):
    cmd = [str(BIN), "run", "--input", str(items), "--output", str(out), "--model", str(MODEL),
           "--datetime", "2024-01-01/2024-12-31", "--assets", "red,green,blue", "--cloud-mask", "scl",
           "--scale", "0:0.3", "--json"]
    cmd += ["--windows", "P3M"] if windows else ["--align", "crs"]
    if task_chips:
        cmd += ["--task-chips", str(task_chips)]
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{cmd} exited {p.returncode}:\n{p.stderr.decode()[-3000:]}")
    s = json.loads(p.stdout)
    return wall, s["bytes_read"], s["chips_embedded"], s.get("unclear_cells", 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=1536)
    ap.add_argument("--scenes", type=int, default=12)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--block-cells", type=int, default=16,
                    help="a third job: the window job in blocks of about this many cells (--task-chips)")
    a = ap.parse_args()
    if not BIN.exists():
        sys.exit(f"build it first: cargo build --release -p rsembed-coordinator --bin rsembed ({BIN})")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        items = make_items(root, a.size, a.scenes)
        on_disk = sum(f.stat().st_size for f in root.rglob("*.tif"))
        blocks = f"window_blocks_{a.block_cells}"
        results = {"window": [], blocks: [], "one_by_one": []}
        for rep in range(a.reps + 1):
            for name, windows, tc in (("window", True, None), (blocks, True, a.block_cells),
                                      ("one_by_one", False, None)):
                r = run(items, root / f"out-{name}", windows, tc)
                if rep > 0:
                    results[name].append(r)
        med = {k: statistics.median(w for w, *_ in v) for k, v in results.items()}
        rng = {k: (min(w for w, *_ in v), max(w for w, *_ in v)) for k, v in results.items()}
        print(f"{a.scenes} acquisitions of {a.size}² px (every other cropped), {on_disk / 2**20:.1f} MiB of COGs")
        print("| job | wall (median of %d) | bytes read | chips embedded | unclear cells |" % a.reps)
        print("| --- | ---: | ---: | ---: | ---: |")
        for k in ("window", blocks, "one_by_one"):
            _, b, c, u = results[k][0]
            lo, hi = rng[k]
            print(f"| {k} | {med[k]:.2f} s ({lo:.2f}–{hi:.2f}) | {b / 2**20:.2f} MiB | {c} | {u} |")
        bw, bo = results["window"][0][1], results["one_by_one"][0][1]
        print(f"window ÷ one by one: time {med['window'] / med['one_by_one']:.3f}, bytes read {bw / bo:.4f}")
        bb = results[blocks][0][1]
        print(f"{blocks} ÷ one by one: time {med[blocks] / med['one_by_one']:.3f}, bytes read {bb / bo:.4f}")
        if bw > bo:
            sys.exit("the window job read more bytes than the one-by-one job")


if __name__ == "__main__":
    main()
