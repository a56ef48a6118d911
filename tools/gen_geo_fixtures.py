#!/usr/bin/env python3
"""Regenerate fixtures/geo/*.json: GeoTIFF georeferencing tags plus GDAL's answers.

Needs only the Python standard library and the GDAL 3.6 command-line tools
(gdalinfo, gdaltransform, gdal_create, gdal_translate). Run from anywhere:

    python3 tools/gen_geo_fixtures.py [--data /work/shared/data/geotiff]

GDAL is the reference: each fixture holds the raw tag values (as the TIFF reader
hands them to worker/raster/src/geo), GDAL's geotransform and CRS, and
gdaltransform's lon/lat (OGC:CRS84) for points on the outline and the centre of a
few chip windows. The TIFFs made for the synthetic cases are temporary; their
tags live in the JSON.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fixtures", "geo")

TAGS = {33550: "model_pixel_scale", 33922: "model_tiepoint", 34264: "model_transformation",
        34735: "geo_key_directory", 34736: "geo_double_params", 34737: "geo_ascii_params"}
SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 16: 8, 17: 8, 18: 8}
FMT = {1: "B", 3: "H", 4: "I", 6: "b", 7: "B", 8: "h", 9: "i", 11: "f", 12: "d", 16: "Q", 17: "q", 18: "Q"}


def dump_tags(path):
    """GeoTIFF tags of the first IFD, classic or BigTIFF, either byte order."""
    with open(path, "rb") as f:
        d = f.read()
    bo = "<" if d[:2] == b"II" else ">"
    big = struct.unpack(bo + "H", d[2:4])[0] == 43
    if big:
        off = struct.unpack(bo + "Q", d[8:16])[0]
        n = struct.unpack(bo + "Q", d[off:off + 8])[0]
        p, esz, inl = off + 8, 20, 8
    else:
        off = struct.unpack(bo + "I", d[4:8])[0]
        n = struct.unpack(bo + "H", d[off:off + 2])[0]
        p, esz, inl = off + 2, 12, 4
    out = {}
    for i in range(n):
        e = d[p + i * esz:p + (i + 1) * esz]
        if big:
            tag, typ, cnt = struct.unpack(bo + "HHQ", e[:12])
            val = e[12:20]
        else:
            tag, typ, cnt = struct.unpack(bo + "HHI", e[:8])
            val = e[8:12]
        if tag not in TAGS:
            continue
        size = SIZES[typ] * cnt
        if size <= inl:
            raw = val[:size]
        else:
            o = struct.unpack(bo + ("Q" if big else "I"), val)[0]
            raw = d[o:o + size]
        if typ == 2:
            out[TAGS[tag]] = raw.decode("latin-1")
        else:
            out[TAGS[tag]] = list(struct.unpack(bo + FMT[typ] * cnt, raw))
    return out


def run(args, stdin=None):
    return subprocess.run(args, input=stdin, capture_output=True, text=True, check=True).stdout


def window_points(x, y, w, h, n=8):
    """Outline points (n per edge, corners included once) then the centre."""
    pts = []
    for k in range(n):
        pts.append((x + w * k / n, y))
    for k in range(n):
        pts.append((x + w, y + h * k / n))
    for k in range(n):
        pts.append((x + w - w * k / n, y + h))
    for k in range(n):
        pts.append((x, y + h - h * k / n))
    pts.append((x + w / 2, y + h / 2))
    return pts


def gdal_points(path, pts):
    """gdaltransform pixel/line -> OGC:CRS84; None where GDAL says it failed."""
    text = "".join("%r %r\n" % p for p in pts)
    lines = run(["gdaltransform", "-t_srs", "OGC:CRS84", "-output_xy", path], text).splitlines()
    assert len(lines) == len(pts), (path, len(lines), len(pts))
    out = []
    for (c, r), line in zip(pts, lines):
        if "failed" in line:
            out.append([c, r, None, None])
        else:
            lon, lat = (float(v) for v in line.split()[:2])
            out.append([c, r, lon, lat])
    return out


def grid_windows(width, height, chip):
    """First, last and one middle position of the chip grid (DESIGN.md: padding past the edge)."""
    xs = list(range(0, width, chip))
    ys = list(range(0, height, chip))
    wins = {(xs[0], ys[0]), (xs[-1], ys[-1]), (xs[len(xs) // 2], ys[len(ys) // 2]), (xs[-1], ys[0])}
    return [(x, y, chip, chip) for x, y in sorted(wins)]


def fixture(path, name, windows, note):
    info = json.loads(run(["gdalinfo", "-json", path]))
    epsg = info.get("stac", {}).get("proj:epsg")
    proj4 = run(["gdalsrsinfo", "-o", "proj4", path]).strip()
    fx = {
        "name": name,
        "note": note,
        "width": info["size"][0],
        "height": info["size"][1],
        "tags": dump_tags(path),
        "gdal_geotransform": info.get("geoTransform"),
        "gdal_epsg": epsg,
        "gdal_proj4": proj4,
        "gdal_area_or_point": info.get("metadata", {}).get("", {}).get("AREA_OR_POINT"),
        "windows": [],
    }
    for (x, y, w, h) in windows:
        fx["windows"].append({"x": x, "y": y, "w": w, "h": h,
                              "points": gdal_points(path, window_points(x, y, w, h))})
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(fx, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", name, file=sys.stderr)


REAL = [
    ("rasterio/RGB.byte.tif", "rgb_byte", 256, []),
    ("rasterio/cogeo.tif", "cogeo", 256, []),
    ("rasterio/all-nodata.tif", "all_nodata", 256, []),
    ("rio-color/rgb16.tif", "rgb16", 256, []),
    ("rio-pansharpen/LC81070352015122LGN00/LC81070352015122LGN00_B2.tif", "landsat8_b2", 256, []),
    ("opengeos-data/m_4709963_se_14_1_20200831.tif", "naip", 256, []),
    # Every 256 window of the disk has an off-Earth corner; the extra ones lie inside it.
    ("rasterio/goes.tif", "goes", 256, [(128, 128, 128, 128), (256, 256, 128, 128), (150, 200, 240, 140)]),
]

SYNTH = [
    # name, gdal_create/gdal_translate options, pixel size, note
    ("synth_aea", ["-a_srs", "+proj=aea +lat_1=29.5 +lat_2=45.5 +lat_0=23 +lon_0=-96 +x_0=0 +y_0=0 +datum=WGS84 +units=m +no_defs",
                   "-a_ullr", "-500000", "1500000", "-436000", "1436000"], "user-defined Albers"),
    ("synth_laea", ["-a_srs", "+proj=laea +lat_0=52 +lon_0=10 +x_0=4321000 +y_0=3210000 +ellps=GRS80 +units=m +no_defs",
                    "-a_ullr", "4000000", "3000000", "4064000", "2936000"], "user-defined LAEA, no datum (ballpark)"),
    ("synth_tmerc", ["-a_srs", "+proj=tmerc +lat_0=0 +lon_0=10.5 +k=0.9999 +x_0=300000 +y_0=-5000000 +datum=WGS84 +units=m +no_defs",
                     "-a_ullr", "250000", "600000", "314000", "536000"], "user-defined Transverse Mercator"),
    ("synth_lcc_ft", ["-a_srs", "+proj=lcc +lat_0=32 +lon_0=-100 +lat_1=33 +lat_2=45 +x_0=600000 +y_0=0 +datum=WGS84 +units=us-ft +no_defs",
                      "-a_ullr", "1000000", "1500000", "1064000", "1436000"], "user-defined LCC 2SP in US survey feet"),
    ("synth_polar_stere", ["-a_srs", "+proj=stere +lat_0=90 +lat_ts=70 +lon_0=-45 +x_0=0 +y_0=0 +datum=WGS84 +units=m +no_defs",
                           "-a_ullr", "-100000", "-1000000", "-36000", "-1064000"], "user-defined polar stereographic"),
    ("synth_sinu", ["-a_srs", "+proj=sinu +lon_0=0 +x_0=0 +y_0=0 +R=6371007.181 +units=m +no_defs",
                    "-a_ullr", "1000000", "5000000", "1064000", "4936000"], "user-defined sinusoidal sphere (MODIS)"),
    ("synth_longlat", ["-a_srs", "+proj=longlat +ellps=GRS80 +no_defs",
                       "-a_ullr", "10", "50", "10.64", "49.36"], "user-defined geographic"),
    ("synth_epsg4326", ["-a_srs", "EPSG:4326", "-a_ullr", "-120", "40", "-119.36", "39.36"], "EPSG geographic"),
    ("synth_point", ["-a_srs", "EPSG:32633", "-a_ullr", "500000", "4000000", "500640", "3999360",
                     "-mo", "AREA_OR_POINT=Point"], "PixelIsPoint: GDAL shifts the tiepoint by half a pixel"),
]


def synthetic(tmp):
    base = os.path.join(tmp, "base.tif")
    run(["gdal_create", "-of", "GTiff", "-outsize", "64", "64", "-bands", "1", "-ot", "Byte", base])
    wins = [(0, 0, 32, 32), (32, 32, 32, 32), (10, 20, 30, 40)]
    for name, opts, note in SYNTH:
        path = os.path.join(tmp, name + ".tif")
        run(["gdal_translate", "-q"] + opts + [base, path])
        fixture(path, name, wins, note)
    # Rotation/shear: a VRT carries the affine, gdal_translate writes ModelTransformation.
    for name, gt in [("synth_rotated", "500000,25,5,4000000,4,-25"), ("synth_rotated_point", "500000,25,5,4000000,4,-25")]:
        vrt = os.path.join(tmp, name + ".vrt")
        run(["gdal_translate", "-q", "-of", "VRT", "-a_srs", "EPSG:32633", base, vrt])
        with open(vrt) as f:
            text = f.read()
        text = text.replace("<SRS", "<GeoTransform>%s</GeoTransform>\n  <SRS" % gt, 1)
        with open(vrt, "w") as f:
            f.write(text)
        path = os.path.join(tmp, name + ".tif")
        extra = ["-mo", "AREA_OR_POINT=Point"] if name.endswith("point") else []
        run(["gdal_translate", "-q"] + extra + [vrt, path])
        fixture(path, name, wins, "ModelTransformation with rotation/shear" + (", PixelIsPoint" if extra else ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/work/shared/data/geotiff")
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    for rel, name, chip, extra in REAL:
        path = os.path.join(a.data, rel)
        info = json.loads(run(["gdalinfo", "-json", path]))
        w, h = info["size"]
        fixture(path, name, grid_windows(w, h, chip) + extra, "real file: " + rel)
    with tempfile.TemporaryDirectory() as tmp:
        synthetic(tmp)


if __name__ == "__main__":
    main()
