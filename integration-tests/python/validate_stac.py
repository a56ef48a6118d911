"""Checks `<output>/stac/` of an rsembed job, offline, and prints a JSON report.

- Every document validates against the STAC 1.1.0 core JSON schemas, twice:
  with pystac (`extensions=[]`) and with `rustac validate` (the document
  without its `stac_extensions`). Both bundle the core schemas; the
  extension schemas live on the web, and this test must not fetch (the
  network is refused to pystac below; rustac is given no extension to fetch).
- The embeddings extension (proposal, v0.0.1) rules are checked by hand from
  its README: required collection fields, the `emb:model` and
  `emb:source-data` links, an `embeddings` asset on every item, and no
  `emb:` field the proposal does not define.
- The collection's item links, and every item's links and asset hrefs,
  resolve to files that exist; the embeddings asset is a chip file.
- DuckDB reads every chip file's `bbox` and times: the item's bbox and
  datetime range must cover them, and the collection's extent every item.
- Shapely checks each item's geometry: valid (a MultiPolygon's parts do not
  overlap), and covering every chip's footprint (`geometry` WKB) within
  1e-9 degrees.

Usage: validate_stac.py OUTPUT_DIR. Exits non-zero with the reason on a failure.
"""

import json
import os
import socket
import subprocess
import sys

import duckdb
import pystac.errors
import pystac.validation
import shapely
from shapely.geometry import shape
from shapely.validation import explain_validity


def _no_network(*_a, **_k):
    raise RuntimeError("validate_stac.py must not use the network")


socket.socket.connect = _no_network
socket.create_connection = _no_network

EMB = "https://stac-extensions.github.io/embeddings/v0.0.1/schema.json"
COLLECTION_EMB = {
    "emb:type", "emb:dimensions", "emb:chip_layout", "emb:temporal_resolution",
    "emb:fit_for_use", "emb:uncertainty",
}
ITEM_EMB = {
    "emb:runtime_parameters", "emb:preprocessing", "emb:postprocessing",
    "emb:fit_for_use", "emb:spatial_coverage", "emb:uncertainty",
    "emb:quantization", "emb:energy",
}


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)


def load(path):
    with open(path) as f:
        return json.load(f)


def resolve(doc_path, href):
    if "://" in href:
        fail(f"{doc_path}: href {href} is not relative")
    return os.path.normpath(os.path.join(os.path.dirname(doc_path), href))


def core_valid(d, path):
    try:
        pystac.validation.validate_dict(d, extensions=[], href=path)
    except pystac.errors.STACValidationError as e:
        fail(f"{path}: not valid STAC core: {e} {getattr(e, 'source', '')}")


RUSTAC = os.environ.get("RSEMBED_TEST_RUSTAC") or os.path.join(os.path.dirname(sys.executable), "rustac")


def rustac_valid(d, path):
    core = {k: v for k, v in d.items() if k != "stac_extensions"}
    r = subprocess.run([RUSTAC, "validate", "-i", "json", "-"], input=json.dumps(core),
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        fail(f"{path}: rustac validate: {r.stdout}{r.stderr}")


def unknown_emb(fields, allowed, where):
    bad = [k for k in fields if k.startswith("emb:") and k not in allowed]
    if bad:
        fail(f"{where}: fields {bad} are not in the embeddings extension")


def ts(v):
    return None if v is None else v.replace("+00:00", "Z")


def main(out):
    cpath = os.path.join(out, "stac", "collection.json")
    c = load(cpath)
    core_valid(c, cpath)
    rustac_valid(c, cpath)
    if c.get("stac_version") != "1.1.0" or EMB not in c.get("stac_extensions", []):
        fail(f"{cpath}: stac_version {c.get('stac_version')}, extensions {c.get('stac_extensions')}")
    if c.get("emb:type") != "chip":
        fail(f"emb:type is {c.get('emb:type')}")
    if not isinstance(c.get("emb:dimensions"), int) or c["emb:dimensions"] < 1:
        fail(f"emb:dimensions is {c.get('emb:dimensions')}")
    if not isinstance(c.get("data_type"), str):
        fail("the collection has no data_type")
    unknown_emb(c, COLLECTION_EMB, cpath)
    rels = [l["rel"] for l in c["links"]]
    for rel in ("emb:model", "emb:source-data"):
        if rel not in rels:
            fail(f"{cpath}: no {rel} link")
    model = next(l for l in c["links"] if l["rel"] == "emb:model")
    if not os.path.isfile(resolve(cpath, model["href"])):
        fail(f"emb:model {model['href']} does not resolve")

    [[cx0, cy0, cx1, cy1]] = c["extent"]["spatial"]["bbox"]
    [[t0, t1]] = c["extent"]["temporal"]["interval"]
    items = []
    for link in (l for l in c["links"] if l["rel"] == "item"):
        ipath = resolve(cpath, link["href"])
        if not os.path.isfile(ipath):
            fail(f"item link {link['href']} does not resolve")
        it = load(ipath)
        core_valid(it, ipath)
        rustac_valid(it, ipath)
        if EMB not in it.get("stac_extensions", []) or it.get("collection") != c["id"]:
            fail(f"{ipath}: extensions {it.get('stac_extensions')}, collection {it.get('collection')}")
        unknown_emb(it["properties"], ITEM_EMB, ipath)
        for l in it["links"]:
            if l["rel"] in ("emb:source-data", "derived_from"):
                # The source items: URLs of the input, not of the output.
                if "://" not in l["href"]:
                    fail(f"{ipath}: {l['rel']} {l['href']} is not a URL")
                continue
            if not os.path.isfile(resolve(ipath, l["href"])):
                fail(f"{ipath}: link {l['rel']} {l['href']} does not resolve")
        asset = it["assets"].get("embeddings")
        if asset is None:
            fail(f"{ipath}: no embeddings asset")
        chips = resolve(ipath, asset["href"])
        if not os.path.isfile(chips) or os.path.dirname(chips) != os.path.join(os.path.normpath(out), "chips"):
            fail(f"{ipath}: embeddings {asset['href']} is not a chip file of the output")
        if os.path.getsize(chips) != asset.get("file:size"):
            fail(f"{ipath}: file:size {asset.get('file:size')} is not the file's")

        con = duckdb.connect()
        cols = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet('{chips}')").fetchall()}
        has_dt = "datetime" in cols
        ends = "coalesce(end_datetime, datetime)" if "end_datetime" in cols else "datetime"
        row = con.execute(
            "SELECT count(*), min(bbox.xmin), min(bbox.ymin), max(bbox.xmax), max(bbox.ymax), "
            + (f"strftime(min(datetime), '%Y-%m-%dT%H:%M:%SZ'), strftime(max({ends}), '%Y-%m-%dT%H:%M:%SZ') "
               if has_dt else "NULL, NULL ")
            + f"FROM read_parquet('{chips}')"
        ).fetchone()
        rows, x0, y0, x1, y1, dmin, dmax = row
        p = it["properties"]
        if p.get("rsembed:chips") != rows:
            fail(f"{ipath}: rsembed:chips {p.get('rsembed:chips')}, the file has {rows}")
        if x0 is None:
            if it.get("geometry") is not None or "bbox" in it:
                fail(f"{ipath}: chips without footprints, yet a geometry")
        else:
            ix0, iy0, ix1, iy1 = it["bbox"]
            if not (ix0 <= x0 and iy0 <= y0 and ix1 >= x1 and iy1 >= y1):
                fail(f"{ipath}: bbox {it['bbox']} does not cover the chips' {[x0, y0, x1, y1]}")
            if not (cx0 <= ix0 and cy0 <= iy0 and cx1 >= ix1 and cy1 >= iy1):
                fail(f"{ipath}: the collection's bbox does not cover {it['bbox']}")
        polygons = 0
        if it.get("geometry") is not None:
            g = shape(it["geometry"])
            if not g.is_valid:
                fail(f"{ipath}: the geometry is not valid: {explain_validity(g)}")
            polygons = len(getattr(g, "geoms", [g]))
            cover = g.buffer(1e-9)
            for (wkb,) in con.execute(
                f"SELECT geometry FROM read_parquet('{chips}') WHERE geometry IS NOT NULL"
            ).fetchall():
                chip = shapely.from_wkb(bytes(wkb))
                if not cover.covers(chip):
                    fail(f"{ipath}: the geometry does not cover the chip {chip.wkt}")
        start = ts(p.get("start_datetime") or p.get("datetime"))
        end = ts(p.get("end_datetime") or p.get("datetime"))
        if dmin is not None and not (start[:19] <= dmin[:19] and end[:19] >= dmax[:19]):
            fail(f"{ipath}: {start}..{end} does not cover the chips' {dmin}..{dmax}")
        if not (ts(t0) <= start and ts(t1) >= end):
            fail(f"{ipath}: the collection's interval {t0}..{t1} does not cover {start}..{end}")
        items.append({
            "id": it["id"],
            "chips": rows,
            "bbox": it.get("bbox"),
            "chips_bbox": None if x0 is None else [x0, y0, x1, y1],
            "geometry_type": None if it.get("geometry") is None else it["geometry"]["type"],
            "polygons": polygons,
            "derived_from": [l["href"] for l in it["links"] if l["rel"] == "derived_from"],
            "start": start,
            "end": end,
            "datetime_source": p.get("rsembed:datetime_source"),
            "href": asset["href"],
        })
    print(json.dumps({
        "collection": c["id"],
        "dimensions": c["emb:dimensions"],
        "data_type": c["data_type"],
        "source": next(l["href"] for l in c["links"] if l["rel"] == "emb:source-data"),
        "interval": [t0, t1],
        "items": items,
    }))


if __name__ == "__main__":
    main(sys.argv[1])
