#!/usr/bin/env python3
"""Regenerate fixtures/tiff: small GeoTIFFs written by GDAL plus GDAL's own decode of them.

Needs only the python3 standard library and the GDAL CLI tools (gdal_translate,
gdaladdo, gdalinfo; tested with GDAL 3.6.2). Deterministic: the source rasters
come from a fixed LCG, so rerunning yields the same pixels (file bytes may vary
with the GDAL version, expected values may not for lossless codecs).

Outputs:
  fixtures/tiff/*.tif            the fixtures
  fixtures/tiff/expected/*.raw   GDAL's decode (band-sequential, little endian),
                                 deduplicated by content hash
  fixtures/tiff/cases.txt        one line per check:
      tif level expected_raw dtype width height bands mask_raw|- tolerance
  fixtures/tiff/real_windows.txt windows of /work/shared/data/geotiff files:
      relpath level x y w h dtype expected_raw mask_raw|- tolerance
      (expected covers the part of the window inside the raster)
"""
import hashlib
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fixtures", "tiff")
EXP = os.path.join(OUT, "expected")
SHARED = os.path.join(ROOT, "..", "shared", "data", "geotiff")
TMP = tempfile.mkdtemp(prefix="tifffix")

FMT = {"Byte": "B", "UInt16": "H", "Int16": "h", "UInt32": "I", "Float32": "f", "Float64": "d"}


def run(*args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    subprocess.run(list(args), check=True, env=e, stdout=subprocess.DEVNULL)


def lcg(seed):
    s = seed
    while True:
        s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        yield s >> 33


def make_source(name, dtype, w, h, bands, nodata_box=False, nan_box=False, alpha=False):
    """Smooth gradient plus noise (so codecs see both runs and entropy)."""
    rnd = lcg(len(name) * 7919 + w * h)
    vals = []
    for b in range(bands):
        for y in range(h):
            for x in range(w):
                r = next(rnd)
                if dtype == "Byte":
                    v = (x * 3 + y * 5 + b * 40 + (r & 7)) % 256
                    if v == 0:
                        v = 1
                elif dtype == "UInt16":
                    v = (x * 397 + y * 1013 + b * 7919 + (r & 255)) % 65536
                    if v == 0:
                        v = 1
                elif dtype == "Int16":
                    v = (x * 397 + y * 1013 + b * 7919 + (r & 255)) % 65536 - 32768
                elif dtype == "UInt32":
                    v = (x * 100003 + y * 7000003 + b * 999999937 + (r & 0xFFFF)) % (1 << 32)
                elif dtype == "Float32":
                    v = struct.unpack("f", struct.pack("f", (x - 20) * 0.37 + y * 1.5e3 - b * 2.5 + (r & 1023) / 1024.0))[0]
                else:
                    v = (x - 20) * 0.37e-3 + y * 1.5e9 - b * 2.5 + (r & 0xFFFFF) / 3.0
                if nodata_box and 10 <= x < 30 and 5 <= y < 20:
                    v = 0
                if nan_box and 3 <= x < 9 and 4 <= y < 11:
                    v = float("nan")
                if alpha and b == bands - 1:
                    v = 0 if (x + y) % 5 == 0 else 255
                vals.append(v)
    raw = os.path.join(TMP, name + ".bsq")
    with open(raw, "wb") as f:
        f.write(struct.pack("<%d%s" % (len(vals), FMT[dtype]), *vals))
    envi_type = {"Byte": 1, "Int16": 2, "UInt16": 12, "UInt32": 13, "Float32": 4, "Float64": 5}[dtype]
    with open(os.path.join(TMP, name + ".hdr"), "w") as f:
        f.write("ENVI\nsamples = %d\nlines = %d\nbands = %d\nheader offset = 0\n"
                "file type = ENVI Standard\ndata type = %d\ninterleave = bsq\nbyte order = 0\n"
                "map info = {UTM, 1, 1, 500000, 4100000, 10, 10, 18, North, WGS-84}\n"
                % (w, h, bands, envi_type))
    return raw


def gdal_decode(src, extra=()):
    """Returns (raw bytes path in expected/, name) for GDAL's decode of src."""
    tmp = os.path.join(TMP, "dec.bsq")
    run("gdal_translate", "-q", "-of", "ENVI", "-co", "INTERLEAVE=BSQ", *extra, src, tmp)
    with open(tmp, "rb") as f:
        data = f.read()
    hdr = open(tmp[:-4] + ".hdr").read()
    if "byte order = 1" in hdr:
        sys.exit("unexpected big-endian ENVI output")
    name = hashlib.sha256(data).hexdigest()[:16] + ".raw"
    with open(os.path.join(EXP, name), "wb") as f:
        f.write(data)
    return name


cases = []


def add(tif, dtype, w, h, bands, tol=0, mask=False, levels=1):
    path = os.path.join(OUT, tif)
    for level in range(levels):
        oo = () if level == 0 else ("-oo", "OVERVIEW_LEVEL=%d" % (level - 1))
        lw, lh = w, h
        if level:
            info = subprocess.run(["gdalinfo", path], check=True, capture_output=True, text=True).stdout
            ov = [l for l in info.splitlines() if "Overviews:" in l and "Mask" not in l][0]
            lw, lh = map(int, ov.split(":")[1].split(",")[level - 1].strip().split("x"))
        exp = gdal_decode(path, oo)
        m = gdal_decode(path, oo + ("-b", "mask")) if mask else "-"
        cases.append("%s %d %s %s %d %d %d %s %g" % (tif, level, exp, dtype, lw, lh, bands, m, tol))


def tr(src, tif, *co, env=None, extra=()):
    args = ["gdal_translate", "-q", *extra]
    for c in co:
        args += ["-co", c]
    run(*args, src, os.path.join(OUT, tif), env=env)


def main():
    os.makedirs(EXP, exist_ok=True)
    for f in os.listdir(EXP):
        os.remove(os.path.join(EXP, f))
    for f in os.listdir(OUT):
        if f.endswith(".tif"):
            os.remove(os.path.join(OUT, f))

    W, H = 45, 37
    u8 = make_source("u8", "Byte", W, H, 3)
    layouts = {
        "tp": ["TILED=YES", "BLOCKXSIZE=16", "BLOCKYSIZE=16", "INTERLEAVE=PIXEL"],
        "tb": ["TILED=YES", "BLOCKXSIZE=32", "BLOCKYSIZE=16", "INTERLEAVE=BAND"],
        "sp": ["BLOCKYSIZE=7", "INTERLEAVE=PIXEL"],
        "sb": ["BLOCKYSIZE=9", "INTERLEAVE=BAND"],
    }
    for comp in ["NONE", "LZW", "DEFLATE", "PACKBITS", "ZSTD"]:
        for lay, co in layouts.items():
            tif = "u8_%s_%s.tif" % (comp.lower(), lay)
            tr(u8, tif, "COMPRESS=" + comp, *co)
            add(tif, "Byte", W, H, 3)
    tr(u8, "u8_lzw_pred2_tp.tif", "COMPRESS=LZW", "PREDICTOR=2", *layouts["tp"])
    add("u8_lzw_pred2_tp.tif", "Byte", W, H, 3)
    tr(u8, "u8_deflate_pred2_sb.tif", "COMPRESS=DEFLATE", "PREDICTOR=2", *layouts["sb"])
    add("u8_deflate_pred2_sb.tif", "Byte", W, H, 3)
    tr(u8, "u8_webp_tp.tif", "COMPRESS=WEBP", "WEBP_LOSSLESS=YES", *layouts["tp"])
    add("u8_webp_tp.tif", "Byte", W, H, 3)
    tr(u8, "u8_jpeg_ycbcr_tp.tif", "COMPRESS=JPEG", "PHOTOMETRIC=YCBCR", "JPEG_QUALITY=90", "TILED=YES",
       "BLOCKXSIZE=32", "BLOCKYSIZE=32")
    add("u8_jpeg_ycbcr_tp.tif", "Byte", W, H, 3)
    tr(u8, "u8_jpeg_ycbcr_sp.tif", "COMPRESS=JPEG", "PHOTOMETRIC=YCBCR", "JPEG_QUALITY=90", "BLOCKYSIZE=16")
    add("u8_jpeg_ycbcr_sp.tif", "Byte", W, H, 3)
    # JPEG stored as RGB (no colour transform): libtiff passes it through as is.
    tr(u8, "u8_jpeg_rgb_tp.tif", "COMPRESS=JPEG", "PHOTOMETRIC=RGB", "JPEG_QUALITY=90", "TILED=YES",
       "BLOCKXSIZE=32", "BLOCKYSIZE=32")
    add("u8_jpeg_rgb_tp.tif", "Byte", W, H, 3)
    # Greyscale JPEG.
    tr(u8, "u8_jpeg_gray_sp.tif", "COMPRESS=JPEG", "JPEG_QUALITY=75", "BLOCKYSIZE=16", extra=("-b", "1"))
    add("u8_jpeg_gray_sp.tif", "Byte", W, H, 1)
    tr(u8, "u8_none_be_tp.tif", "ENDIANNESS=BIG", *layouts["tp"])
    add("u8_none_be_tp.tif", "Byte", W, H, 3)
    tr(u8, "u8_lzw_bigtiff_tp.tif", "BIGTIFF=YES", "COMPRESS=LZW", *layouts["tp"])
    add("u8_lzw_bigtiff_tp.tif", "Byte", W, H, 3)

    # nodata: a box of zeros in every band.
    u8n = make_source("u8n", "Byte", W, H, 3, nodata_box=True)
    tr(u8n, "u8_nodata_deflate_tb.tif", "COMPRESS=DEFLATE", *layouts["tb"], extra=("-a_nodata", "0"))
    add("u8_nodata_deflate_tb.tif", "Byte", W, H, 3)

    # alpha band (ExtraSamples = unassociated alpha).
    u8a = make_source("u8a", "Byte", W, H, 4, alpha=True)
    tr(u8a, "u8_alpha_deflate_tp.tif", "COMPRESS=DEFLATE", "ALPHA=YES", *layouts["tp"])
    add("u8_alpha_deflate_tp.tif", "Byte", W, H, 4)

    # internal mask + overviews (mask from band 4 of a 4-band source).
    u8m = make_source("u8m", "Byte", W, H, 4, alpha=True)
    mtif = os.path.join(OUT, "u8_mask_ovr_deflate_tp.tif")
    run("gdal_translate", "-q", "-b", "1", "-b", "2", "-b", "3", "-mask", "4", "-co", "COMPRESS=DEFLATE",
        *sum([["-co", c] for c in layouts["tp"]], []), u8m, mtif, env={"GDAL_TIFF_INTERNAL_MASK": "YES"})
    run("gdaladdo", "-q", "-r", "nearest", mtif, "2", "4", env={"GDAL_TIFF_INTERNAL_MASK": "YES",
        "COMPRESS_OVERVIEW": "DEFLATE"})
    add("u8_mask_ovr_deflate_tp.tif", "Byte", W, H, 3, mask=True, levels=3)
    jtif = os.path.join(OUT, "u8_mask_ovr_jpeg_tp.tif")
    run("gdal_translate", "-q", "-b", "1", "-b", "2", "-b", "3", "-mask", "4", "-co", "COMPRESS=JPEG",
        "-co", "PHOTOMETRIC=YCBCR", *sum([["-co", c] for c in layouts["tp"]], []), u8m, jtif,
        env={"GDAL_TIFF_INTERNAL_MASK": "YES"})
    run("gdaladdo", "-q", "-r", "nearest", jtif, "2", env={"GDAL_TIFF_INTERNAL_MASK": "YES",
        "COMPRESS_OVERVIEW": "JPEG", "PHOTOMETRIC_OVERVIEW": "YCBCR"})
    add("u8_mask_ovr_jpeg_tp.tif", "Byte", W, H, 3, mask=True, levels=2)

    w2, h2 = 37, 23
    u16 = make_source("u16", "UInt16", w2, h2, 2)
    for comp, lay in [("NONE", "sp"), ("LZW", "tp"), ("DEFLATE", "sb"), ("PACKBITS", "tb"), ("ZSTD", "tp")]:
        tif = "u16_%s_%s.tif" % (comp.lower(), lay)
        tr(u16, tif, "COMPRESS=" + comp, *layouts[lay])
        add(tif, "UInt16", w2, h2, 2)
    for comp, lay in [("LZW", "tp"), ("DEFLATE", "sb"), ("ZSTD", "tb")]:
        tif = "u16_%s_pred2_%s.tif" % (comp.lower(), lay)
        tr(u16, tif, "COMPRESS=" + comp, "PREDICTOR=2", *layouts[lay])
        add(tif, "UInt16", w2, h2, 2)
    tr(u16, "u16_deflate_pred2_be_tp.tif", "COMPRESS=DEFLATE", "PREDICTOR=2", "ENDIANNESS=BIG", *layouts["tp"])
    add("u16_deflate_pred2_be_tp.tif", "UInt16", w2, h2, 2)
    tr(u16, "u16_lzw_bigtiff_be_sb.tif", "COMPRESS=LZW", "BIGTIFF=YES", "ENDIANNESS=BIG", *layouts["sb"])
    add("u16_lzw_bigtiff_be_sb.tif", "UInt16", w2, h2, 2)

    i16 = make_source("i16", "Int16", w2, h2, 2)
    tr(i16, "i16_deflate_pred2_tp.tif", "COMPRESS=DEFLATE", "PREDICTOR=2", *layouts["tp"])
    add("i16_deflate_pred2_tp.tif", "Int16", w2, h2, 2)
    u32 = make_source("u32", "UInt32", w2, h2, 2)
    tr(u32, "u32_lzw_pred2_sb.tif", "COMPRESS=LZW", "PREDICTOR=2", *layouts["sb"])
    add("u32_lzw_pred2_sb.tif", "UInt32", w2, h2, 2)
    tr(u32, "u32_none_be_tp.tif", "ENDIANNESS=BIG", *layouts["tp"])
    add("u32_none_be_tp.tif", "UInt32", w2, h2, 2)

    f32 = make_source("f32", "Float32", w2, h2, 2, nan_box=True)
    tr(f32, "f32_deflate_pred3_tp.tif", "COMPRESS=DEFLATE", "PREDICTOR=3", *layouts["tp"],
       extra=("-a_nodata", "nan"))
    add("f32_deflate_pred3_tp.tif", "Float32", w2, h2, 2)
    tr(f32, "f32_lzw_pred3_sb.tif", "COMPRESS=LZW", "PREDICTOR=3", *layouts["sb"])
    add("f32_lzw_pred3_sb.tif", "Float32", w2, h2, 2)
    tr(f32, "f32_zstd_pred3_be_tb.tif", "COMPRESS=ZSTD", "PREDICTOR=3", "ENDIANNESS=BIG", *layouts["tb"])
    add("f32_zstd_pred3_be_tb.tif", "Float32", w2, h2, 2)
    tr(f32, "f32_deflate_pred2_tp.tif", "COMPRESS=DEFLATE", "PREDICTOR=2", *layouts["tp"])
    add("f32_deflate_pred2_tp.tif", "Float32", w2, h2, 2)
    f64 = make_source("f64", "Float64", w2, h2, 2)
    tr(f64, "f64_zstd_pred3_tp.tif", "COMPRESS=ZSTD", "PREDICTOR=3", *layouts["tp"])
    add("f64_zstd_pred3_tp.tif", "Float64", w2, h2, 2)
    tr(f64, "f64_none_be_sp.tif", "ENDIANNESS=BIG", *layouts["sp"])
    add("f64_none_be_sp.tif", "Float64", w2, h2, 2)

    with open(os.path.join(OUT, "cases.txt"), "w") as f:
        f.write("# tif level expected_raw dtype width height bands mask_raw tolerance\n")
        f.write("\n".join(cases) + "\n")
    real_windows()


def real_windows():
    if not os.path.isdir(SHARED):
        print("shared data absent; real_windows.txt left unchanged")
        return
    rows = []
    # (relpath, dtype, level, windows); windows may cross the right/bottom edge.
    specs = [
        ("rasterio/RGB.byte.tif", "Byte", 0, [(0, 0, 24, 24), (300, 200, 24, 24), (780, 710, 24, 24)]),
        ("rasterio/rgb_lzw.tif", "Byte", 0, [(250, 250, 24, 24), (780, 710, 24, 24)]),
        ("rasterio/rgb_deflate.tif", "Byte", 0, [(300, 200, 24, 24), (780, 710, 24, 24)]),
        ("rasterio/cogeo.tif", "Byte", 0, [(500, 500, 24, 24), (1010, 1012, 24, 24)]),
        ("rasterio/cogeo.tif", "Byte", 1, [(100, 100, 24, 24)]),
        ("rasterio/goes.tif", "Byte", 0, [(260, 260, 24, 24), (530, 530, 24, 24), (0, 0, 24, 24)]),
        ("rasterio/all-nodata.tif", "UInt16", 0, [(60, 2460, 24, 24)]),
        ("rio-color/rgb16.tif", "UInt16", 0, [(0, 0, 24, 24), (200, 250, 24, 24), (430, 490, 24, 24)]),
        ("opengeos-data/m_4709963_se_14_1_20200831.tif", "Byte", 0, [(500, 500, 24, 24), (920, 710, 24, 24)]),
        ("opengeos-data/m_4709963_se_14_1_20200831.tif", "Byte", 1, [(100, 100, 24, 24)]),
        ("rio-pansharpen/LC81070352015122LGN00/LC81070352015122LGN00_B2.tif", "UInt16", 0,
         [(700, 700, 24, 24), (1540, 1570, 24, 24)]),
    ]
    for rel, dtype, level, wins in specs:
        path = os.path.join(SHARED, rel)
        info = subprocess.run(["gdalinfo", path], check=True, capture_output=True, text=True).stdout
        size = [l for l in info.splitlines() if l.startswith("Size is")][0]
        W, H = map(int, size[8:].split(","))
        if level:
            ov = [l for l in info.splitlines() if "Overviews:" in l and "Mask" not in l][0]
            W, H = map(int, ov.split(":")[1].split(",")[level - 1].strip().split("x"))
        has_mask = "PER_DATASET" in info and "Mask Flags: PER_DATASET" in info
        oo = () if level == 0 else ("-oo", "OVERVIEW_LEVEL=%d" % (level - 1))
        for (x, y, w, h) in wins:
            cw, ch = min(w, W - x), min(h, H - y)
            win = ("-srcwin", str(x), str(y), str(cw), str(ch))
            exp = gdal_decode(path, oo + win)
            m = gdal_decode(path, oo + win + ("-b", "mask")) if has_mask else "-"
            tol = 0  # JPEG (cogeo, goes) included: the decoder is libjpeg-exact
            rows.append("%s %d %d %d %d %d %s %s %s %d" % (rel, level, x, y, w, h, dtype, exp, m, tol))
    with open(os.path.join(OUT, "real_windows.txt"), "w") as f:
        f.write("# relpath level x y w h dtype expected_raw mask_raw tolerance\n")
        f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
