"""GeoTIFF scene throughput: rsembed vs rasterio, and COG read economy.

Usage, from the repository root:

    .cache/tools-venv/bin/python -m pip install rasterio   # once; the wheel bundles GDAL
    .cache/tools-venv/bin/python bench/geotiff.py [--secs 2] [--no-cog] [--keep-cog DIR]

(1) Read + chip + scale + preprocess throughput, chips/s on one core, for every
shared GeoTIFF (../shared/data/geotiff/**/*.tif; the Landsat band files are each a
one-band scene, band 1 replicated to RGB). rsembed's side is
`cargo bench -p rsembed-worker --bench scene` (worker/benches/scene.rs), run by
this script so both sides are measured in the same run. The rasterio side does
what a careful Python user would, single-threaded (GDAL_NUM_THREADS=1): per pass,
open the file once; for non-uint8 data compute scene-level 2nd-98th percentiles
per band from the smallest overview with at least 256x256 pixels, or a decimated
read (out_shape) when there is none; then for every 256x256 window of the grid
(x, y in range(0, W, 256)) read the bands and the dataset mask, skip chips with
no valid pixel, stretch to uint8 (invalid pixels 0) and normalise to float32 CHW
as the tiny model's preprocessor_config says ((v/255 - 0.5)/0.5). Two variants:
`rasterio` reads edge windows with boundless=True, fill_value=0 (what the docs
suggest), `rasterio-clip` clips the window to the raster and pads with numpy (a
faster idiom, the stronger baseline). Each file is timed for >= --secs seconds
on each side, after one warm-up pass. The ratio is ours / baseline.

(2) Bytes fetched for a task that covers one 1024x1024 window (the 4x4-chip
block at chip column 8, row 8) of an 8192x8192 3-band tiled COG (DEFLATE,
512x512 blocks, overviews), generated here with the GDAL CLI from a scaled-up
shared file, as a fraction of the object size. Counted by the worker's
StoreRange: header, IFDs and tiles; a uint16 COG is measured too, whose count
also includes the overview read for the scene stretch.
"""

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["GDAL_NUM_THREADS"] = "1"
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

try:
    import rasterio  # noqa: E402
    from rasterio.windows import Window  # noqa: E402
except ImportError:
    sys.exit("rasterio missing: .cache/tools-venv/bin/python -m pip install rasterio")

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("RSEMBED_BENCH_DATA", REPO.parent / "shared" / "data" / "geotiff"))
CHIP = 256
STRIDE = 256
MEAN = STD = 0.5  # fixtures/models/tiny-siglip/preprocessor_config.json


def scene_stretch(src, idx):
    """Per-band (lo, hi) from the 2nd and 98th percentiles of valid pixels."""
    h, w = src.height, src.width
    factor = 1
    # The smallest overview with at least 256*256 pixels, as the worker picks.
    for f in sorted(src.overviews(1)):
        if (w // f) * (h // f) >= CHIP * CHIP:
            factor = f
    if factor == 1:
        # No overview: a decimated read of about 1024x1024.
        factor = max(1, math.ceil(max(w, h) / 1024))
    oh, ow = max(1, h // factor), max(1, w // factor)
    data = src.read(idx, out_shape=(len(idx), oh, ow))
    valid = src.dataset_mask(out_shape=(oh, ow)) > 0
    out = []
    for b in range(len(idx)):
        v = data[b][valid]
        v = v[~np.isnan(v)] if v.dtype.kind == "f" else v
        if v.size == 0:
            out.append(None)
            continue
        lo, hi = np.percentile(v, [2, 98], method="nearest").astype(np.float64)
        out.append((lo, hi if hi > lo else lo + 1.0))
    return out


def read_clipped(src, idx, x, y):
    """Bands and mask of a CHIP x CHIP window, the part outside the raster zero."""
    x1, y1 = min(x + CHIP, src.width), min(y + CHIP, src.height)
    win = Window(x, y, x1 - x, y1 - y)
    part = src.read(idx, window=win)
    mpart = src.dataset_mask(window=win)
    if part.shape[1:] == (CHIP, CHIP):
        return part, mpart
    data = np.zeros((len(idx), CHIP, CHIP), dtype=part.dtype)
    mask = np.zeros((CHIP, CHIP), dtype=mpart.dtype)
    data[:, : y1 - y, : x1 - x] = part
    mask[: y1 - y, : x1 - x] = mpart
    return data, mask


def read_boundless(src, idx, x, y):
    win = Window(x, y, CHIP, CHIP)
    data = src.read(idx, window=win, boundless=True, fill_value=0)
    mask = src.dataset_mask(window=win, boundless=True)
    return data, mask


def one_pass(path, reader):
    """Open, stretch, every chip to float32 CHW. Returns (windows, chips kept)."""
    windows = kept = 0
    with rasterio.open(path) as src:
        # One band: read it once and replicate, as the worker does.
        idx = [1, 2, 3] if src.count >= 3 else [1]
        u8 = all(src.dtypes[i - 1] == "uint8" for i in idx)
        stretch = None if u8 else scene_stretch(src, idx)
        for y in range(0, src.height, STRIDE):
            for x in range(0, src.width, STRIDE):
                windows += 1
                data, mask = reader(src, idx, x, y)
                valid = mask > 0
                if not valid.any():
                    continue
                if stretch is None:
                    rgb = data.astype(np.uint8, copy=False)
                else:
                    rgb = np.empty(data.shape, np.uint8)
                    for b, s in enumerate(stretch):
                        v = data[b].astype(np.float64)
                        if s is not None:
                            lo, hi = s
                            v = (v - lo) * (255.0 / (hi - lo))
                        rgb[b] = np.clip(np.rint(np.nan_to_num(v, nan=0.0)), 0, 255)
                rgb = rgb * valid  # invalid pixels are 0
                if rgb.shape[0] == 1:
                    rgb = np.repeat(rgb, 3, axis=0)
                chw = rgb.astype(np.float32)
                chw *= np.float32(1.0 / 255.0)
                chw -= np.float32(MEAN)
                chw /= np.float32(STD)
                kept += 1
    return windows, kept


def time_baseline(path, reader, secs):
    one_pass(path, reader)  # warm-up: page cache, GDAL drivers
    passes = chips = 0
    t0 = time.perf_counter()
    while passes == 0 or time.perf_counter() - t0 < secs:
        windows, k = one_pass(path, reader)
        chips += k
        passes += 1
    dt = time.perf_counter() - t0
    return {
        "windows": windows,
        "chips_per_pass": chips // passes,
        "passes": passes,
        "seconds": dt,
        "chips_per_s": chips / dt,
        "s_per_pass": dt / passes,
    }


def make_cogs(tmp):
    """An 8192x8192 3-band uint8 and a uint16 tiled COG, from scaled-up shared files."""
    out = []
    for name, src in (("big_u8.tif", "rasterio/RGB.byte.tif"), ("big_u16.tif", "rio-color/rgb16.tif")):
        src = DATA / src
        if not src.exists():
            print(f"SKIPPED {name}: {src} is absent")
            continue
        mid = tmp / ("mid_" + name)
        dst = tmp / name
        t0 = time.perf_counter()
        subprocess.run(
            ["gdal_translate", "-q", "-b", "1", "-b", "2", "-b", "3", "-outsize", "8192", "8192",
             "-r", "bilinear", "-co", "TILED=YES", str(src), str(mid)],
            check=True,
        )
        subprocess.run(
            ["gdal_translate", "-q", "-of", "COG", "-co", "COMPRESS=DEFLATE", "-co", "BLOCKSIZE=512",
             "-co", "NUM_THREADS=ALL_CPUS", str(mid), str(dst)],
            check=True,
        )
        mid.unlink()
        print(f"generated {dst} ({dst.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")
        out.append(dst)
    return out


def parse_results(text):
    rows = []
    for line in text.splitlines():
        if line.startswith("RESULT "):
            rows.append(dict(kv.split("=", 1) for kv in line.split()[1:]))
        elif line.startswith("SKIPPED"):
            print(line)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--secs", type=float, default=2.0, help="minimum seconds per file per side")
    ap.add_argument("--no-cog", action="store_true", help="skip generating and measuring the COGs")
    ap.add_argument("--keep-cog", type=Path, help="generate the COGs here and keep them")
    ap.add_argument("--no-boundless", action="store_true", help="skip the boundless=True variant")
    args = ap.parse_args()

    if not DATA.is_dir():
        print(f"SKIPPED: {DATA} is absent")
    tmp = Path(tempfile.mkdtemp(prefix="rsembed-cog-")) if args.keep_cog is None else args.keep_cog
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        cogs = [] if args.no_cog or not DATA.is_dir() else make_cogs(tmp)
        env = dict(os.environ, RSEMBED_BENCH_SECS=str(args.secs))
        if cogs:
            env["RSEMBED_BENCH_COG"] = ",".join(str(c) for c in cogs)
        print("running cargo bench -p rsembed-worker --bench scene ...", flush=True)
        p = subprocess.run(
            ["cargo", "bench", "-q", "-p", "rsembed-worker", "--bench", "scene"],
            cwd=REPO, env=env, capture_output=True, text=True,
        )
        if p.returncode != 0:
            sys.stderr.write(p.stderr)
            sys.exit(f"cargo bench failed ({p.returncode})")
        results = parse_results(p.stdout)
    finally:
        if args.keep_cog is None:
            shutil.rmtree(tmp, ignore_errors=True)

    ours = {r["file"]: r for r in results if "file" in r and r["file"] != "ALL"}
    cog_rows = [r for r in results if "cog" in r]
    variants = [("rasterio-clip", read_clipped)]
    if not args.no_boundless:
        variants.insert(0, ("rasterio", read_boundless))

    base = {v: {} for v, _ in variants}
    for name in sorted(ours):
        for v, reader in variants:
            print(f"timing {v} on {name} ...", flush=True)
            base[v][name] = time_baseline(DATA / name, reader, args.secs)

    # Table.
    hdr = f"{'file':<44} {'chips r/b':>9} {'rsembed':>9}"
    for v, _ in variants:
        hdr += f" {v:>13} {'ratio':>6}"
    print()
    print("chips/s on one core (chips r/b: chips per pass, rsembed / baseline)")
    print(hdr)
    print("-" * len(hdr))
    tot_ours = [0, 0.0]
    tot = {v: [0, 0.0] for v, _ in variants}
    ratios = {v: [] for v, _ in variants}
    mismatch = []
    for name in sorted(ours):
        o = ours[name]
        oc = int(o["chips_per_pass"])
        o_spp = float(o["seconds"]) / int(o["passes"])
        tot_ours[0] += oc
        tot_ours[1] += o_spp
        bc = base[variants[-1][0]][name]["chips_per_pass"]
        line = f"{name[-44:]:<44} {f'{oc}/{bc}':>9} {float(o['chips_per_s']):>9.1f}"
        for v, _ in variants:
            b = base[v][name]
            tot[v][0] += b["chips_per_pass"]
            tot[v][1] += b["s_per_pass"]
            if b["chips_per_pass"] != oc:
                mismatch.append((name, v, oc, b["chips_per_pass"]))
            # Pass time ratio: equals the chips/s ratio when both cut the same
            # chips, and still means something for a file with none.
            r = b["s_per_pass"] / o_spp
            ratios[v].append(r)
            shown = f"{b['chips_per_s']:.1f}" if b["chips_per_pass"] else f"({b['s_per_pass'] * 1e3:.0f}ms)"
            line += f" {shown:>13} {r:>5.2f}x"
        if oc == 0:
            line += f"   [no chips: rsembed {o_spp * 1e3:.0f} ms/pass; ratio of pass times]"
        print(line)
    print("-" * len(hdr))
    ours_all = tot_ours[0] / tot_ours[1]
    line = f"{'ALL (each file once)':<44} {f'{tot_ours[0]}/{tot[variants[-1][0]][0]}':>9} {ours_all:>9.1f}"
    for v, _ in variants:
        b_all = tot[v][0] / tot[v][1]
        line += f" {b_all:>13.1f} {ours_all / b_all:>5.2f}x"
    print(line)
    line = f"{'geometric mean of per-file ratios':<44} {'':>9} {'':>9}"
    for v, _ in variants:
        g = math.exp(sum(math.log(r) for r in ratios[v]) / len(ratios[v]))
        line += f" {'':>13} {g:>5.2f}x"
    print(line)
    if mismatch:
        print("\nchip count differences (rsembed vs baseline, per pass):")
        for name, v, a, b in mismatch:
            print(f"  {name} [{v}]: {a} vs {b}")
    else:
        print("\nboth sides cut the same number of chips on every file")

    if cog_rows:
        print("\nbytes fetched for one 1024x1024-window task (4x4 chips at column 8, row 8) of an 8192x8192 COG")
        print("(StoreRange's count: header + IFDs + tiles, + the overview read of the stretch for non-8-bit data)")
        for r in cog_rows:
            print(
                f"RESULT cog={r['cog']} chips={r['chips']} cog_bytes_read={r['cog_bytes_read']} "
                f"open_bytes={r['open_bytes']} cog_size={r['cog_size']} fraction={r['fraction']}"
            )


if __name__ == "__main__":
    main()
