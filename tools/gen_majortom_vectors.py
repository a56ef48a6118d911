#!/usr/bin/env python3
"""Regenerate fixtures/majortom/grid_cell_vectors.json: Major TOM cells of
points, as the reference `Grid(10).latlon2rowcol` gives them.

The reference is `MajorTOM/grid.py` of ESA-PhiLab/Major-TOM; it is imported
from the path given (not copied into this repository). Its module imports
`tqdm`, which it never uses for the grid; a stub stands in when tqdm is not
installed. Needs numpy, pandas, geopandas and shapely (the test venv has them):

    git -C <Major-TOM clone> show <commit>:MajorTOM/grid.py > /tmp/grid.py
    .cache/venv/bin/python tools/gen_majortom_vectors.py /tmp/grid.py \
        --commit <commit> [--out fixtures/majortom/grid_cell_vectors.json]

The points cover several latitudes on both sides of the equator and the prime
meridian, the edges of rows and columns (the edge itself and the next
representable number on either side), the grid's first and last rows, ±180°,
and a seeded random sample. A point at or south of the first row gets `null`:
the reference wraps there to the last row (a Python index of -1), rsembed
gives no cell; its answer is kept as `reference_wraps_to` for the record.
Coordinates are written as strings in Python's shortest round-trip form, so
that every reader gets the exact doubles the reference was given.
"""
import argparse
import importlib.util
import json
import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fixtures", "majortom", "grid_cell_vectors.json")


def load_reference(path):
    try:
        import tqdm  # noqa: F401
    except ImportError:
        stub = types.ModuleType("tqdm")
        stub.tqdm = lambda it=None, *a, **k: it
        sys.modules["tqdm"] = stub
    spec = importlib.util.spec_from_file_location("majortom_grid", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def points(grid, np):
    lats = grid.lats
    out = []
    # Latitudes across the grid, on both sides of the equator and of 0°.
    for lat in [0.0, 1e-9, -1e-9, 0.05, -0.05, 10.5, -10.5, 33.3, -33.9, 45.0, -45.0,
                51.4779, -51.4779, 60.0, -60.0, 75.5, -75.5, 84.9, -84.9]:
        for lon in [0.0, 1e-9, -1e-9, 0.001, -0.001, 2.35, -2.35, 90.0, -90.0, 139.7,
                    -122.4, 179.9999, -179.9999, 180.0, -180.0]:
            out.append((lat, lon))
    # The edges of some rows (the row's latitude itself and its neighbours
    # in floating point), at a column edge of that row and beside it.
    nrows = len(lats)
    zero = int(np.searchsorted(lats, 0.0))
    picks = sorted({0, 1, 2, zero - 2, zero - 1, zero, zero + 1, zero + 2,
                    nrows // 4, 3 * nrows // 4, nrows - 3, nrows - 2, nrows - 1})
    for r in picks:
        lat = float(lats[r])
        xs = grid.points_by_row[r].geometry.x.values
        ncol = len(xs)
        zc = int(np.where(xs == 0)[0][0])
        cpicks = sorted({0, 1, zc - 1, zc, zc + 1, ncol // 3, ncol - 2, ncol - 1})
        for la in [lat, float(np.nextafter(lat, 100.0)), float(np.nextafter(lat, -100.0))]:
            for c in cpicks:
                x = float(xs[c])
                for lo in [x, float(np.nextafter(x, 400.0)), float(np.nextafter(x, -400.0))]:
                    out.append((la, lo))
            # The middle of the row's second column.
            out.append((la, float((xs[1] + xs[2]) / 2)))
    # Just inside and outside the grid's first and last rows.
    for lat in [float(lats[0]) + 1e-7, float(lats[0]), float(lats[0]) - 1e-7, -85.0,
                float(lats[-1]), float(lats[-1]) + 0.05, 85.0, 85.1, 89.9]:
        for lon in [0.5, -0.5, 179.5, -179.5]:
            out.append((lat, lon))
    # A seeded sample over the whole grid.
    rng = np.random.default_rng(20260501)
    for lat, lon in zip(rng.uniform(-84.9, 84.9, 200), rng.uniform(-180, 180, 200)):
        out.append((float(lat), float(lon)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("grid_py", help="path of the reference MajorTOM/grid.py")
    ap.add_argument("--commit", required=True, help="the Major-TOM commit grid.py is from")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    import numpy as np

    mod = load_reference(args.grid_py)
    grid = mod.Grid(10)
    pts = points(grid, np)
    rows, cols = grid.latlon2rowcol([p[0] for p in pts], [p[1] for p in pts])
    first = float(grid.lats[0])
    vectors = []
    for (lat, lon), r, c in zip(pts, rows, cols):
        # As strings (Python's shortest round-trip form): a JSON reader need
        # not parse numbers to the nearest double, and edges differ in the
        # last bit.
        v = {"lat": repr(lat), "lon": repr(lon)}
        if lat <= first:
            v["cell"] = None
            v["reference_wraps_to"] = f"{r}_{c}"
        else:
            v["cell"] = f"{r}_{c}"
        vectors.append(v)
    doc = {
        "reference": {
            "repository": "https://github.com/ESA-PhiLab/Major-TOM",
            "path": "MajorTOM/grid.py",
            "commit": args.commit,
            "call": "Grid(10).latlon2rowcol(lats, lons)",
            "numpy": np.__version__,
        },
        "generator": "tools/gen_majortom_vectors.py",
        "vectors": vectors,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    # One vector a line: a diff of a regeneration reads point by point.
    head = json.dumps({k: v for k, v in doc.items() if k != "vectors"}, indent=1)
    body = ",\n".join("  " + json.dumps(v) for v in vectors)
    with open(args.out, "w") as f:
        f.write(head[:-2] + ',\n "vectors": [\n' + body + "\n ]\n}\n")
    print(f"{len(vectors)} vectors -> {args.out}")


if __name__ == "__main__":
    main()
