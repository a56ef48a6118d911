"""The output dataset read as users read it: GeoPandas, DuckDB, Polars, PyArrow.

    python test_readers.py --dataset DIR --split-dataset DIR --model DIR \
        --query FILE --manifest FILE

--dataset is an `rsembed run` output of ../shared/data/geotiff; --split-dataset
one with one task per input (`--task-files 1`), whose files and row groups a
bbox filter can skip; --query is the output of `rsembed text` (one JSON array);
--manifest is ../shared/data/MANIFEST.txt, whose GDAL pixel sizes are the
reference for the footprint areas. Every check runs, failures are listed at the
end, and the exit status is 1 when any failed. tests/readers.rs runs it.
"""

import argparse
import glob
import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
import traceback

import duckdb
import geopandas as gpd
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pyproj
import shapely

import stamp_stac

# parquet-rs statistics (DuckDB's parquet_metadata() view names).
STATS_COLUMNS = [
    "bbox, xmin",
    "bbox, ymin",
    "bbox, xmax",
    "bbox, ymax",
    "centre_lon",
    "centre_lat",
]
ROW_GROUP_ROWS = 8192
CHIP_SIZE = 256


class Ctx:
    """What every check reads: paths, the model, the job and the query vector."""

    def __init__(self, args):
        self.dataset = os.path.abspath(args.dataset)
        self.split = os.path.abspath(args.split_dataset)
        self.model = os.path.abspath(args.model)
        with open(os.path.join(self.model, "rsembed-model.json")) as f:
            self.model_json = json.load(f)
        self.dim = self.model_json["embed_dim"]
        with open(os.path.join(self.dataset, "job.json")) as f:
            self.job = json.load(f)
        with open(args.query) as f:
            self.q = np.array(json.loads(f.readline()), dtype=np.float64)
        self.manifest = args.manifest
        self.files = sorted(glob.glob(os.path.join(self.dataset, "chips", "*.parquet")))
        self.split_files = sorted(glob.glob(os.path.join(self.split, "chips", "*.parquet")))
        self.glob = os.path.join(self.dataset, "chips", "*.parquet")
        self.split_glob = os.path.join(self.split, "chips", "*.parquet")
        self.table = pa.concat_tables(pq.read_table(f) for f in self.files)
        self.ids = self.table["chip_id"].to_pylist()
        self.emb = (
            self.table["embedding"].combine_chunks().flatten().to_numpy().astype(np.float64)
        ).reshape(-1, self.dim)


def expected_schema(dim):
    """The chip schema of ../shared/DESIGN.md, "Contract: output dataset",
    version 3: the 14 columns of version 1, the five STAC ones version 2
    appended, and the grid and window ones of version 3 ("Contract: time
    windows, grids and change")."""
    f64 = lambda n: pa.field(n, pa.float64(), nullable=False)  # noqa: E731
    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            pa.field("chip_id", pa.string(), nullable=False),
            pa.field("source_uri", pa.string(), nullable=False),
            pa.field("source_version", pa.string(), nullable=True),
            pa.field("x", pa.int32(), nullable=False),
            pa.field("y", pa.int32(), nullable=False),
            pa.field("width", pa.int32(), nullable=False),
            pa.field("height", pa.int32(), nullable=False),
            pa.field("valid_fraction", pa.float32(), nullable=False),
            pa.field("crs", pa.string(), nullable=True),
            pa.field("geometry", pa.binary(), nullable=True),
            pa.field(
                "bbox",
                pa.struct([f64("xmin"), f64("ymin"), f64("xmax"), f64("ymax")]),
                nullable=True,
            ),
            pa.field("centre_lon", pa.float64(), nullable=True),
            pa.field("centre_lat", pa.float64(), nullable=True),
            pa.field(
                "embedding",
                pa.list_(pa.field("item", pa.float32(), nullable=False), dim),
                nullable=False,
            ),
            pa.field("item_id", pa.string(), nullable=True),
            pa.field("collection", pa.string(), nullable=True),
            pa.field("datetime", ts, nullable=True),
            pa.field("cloud_fraction", pa.float32(), nullable=True),
            pa.field("end_datetime", ts, nullable=True),
            pa.field("cell", pa.string(), nullable=True),
            pa.field("grid_cell", pa.string(), nullable=True),
            pa.field("window_start", ts, nullable=True),
            pa.field("window_end", ts, nullable=True),
            pa.field("scenes", pa.int32(), nullable=True),
        ]
    )


def describe_field(f):
    """A field as text, children and their nullability included."""
    t = f.type
    if pa.types.is_struct(t):
        inner = ", ".join(describe_field(t.field(i)) for i in range(t.num_fields))
        ty = f"struct<{inner}>"
    elif pa.types.is_fixed_size_list(t):
        ty = f"fixed_size_list<{describe_field(t.value_field)}>[{t.list_size}]"
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        ty = f"{t.__class__.__name__}<{describe_field(t.value_field)}>"
    else:
        ty = str(t)
    return f"{f.name}: {ty}{'' if f.nullable else ' not null'}"


def ranked(ctx, got, what, k=5, tol=1e-5):
    """Asserts `got` ([(chip_id, score)]) is the top-k of the numpy ranking.

    Chips with equal pixels (three encodings of one Landsat scene) have equal
    embeddings, so ties are allowed: each returned chip's score must match
    numpy's, be no lower than numpy's k-th best, and every chip strictly better
    than the k-th must be returned."""
    ref = ctx.emb @ ctx.q / np.linalg.norm(ctx.q)
    order = np.argsort(-ref, kind="stable")
    kth = ref[order[k - 1]]
    index = {c: i for i, c in enumerate(ctx.ids)}
    assert len(got) == k, f"{what}: {len(got)} rows, want {k}"
    scores = [s for _, s in got]
    assert all(a >= b - tol for a, b in zip(scores, scores[1:])), f"{what}: not sorted: {scores}"
    for cid, s in got:
        assert abs(ref[index[cid]] - s) < tol, f"{what}: {cid} score {s} vs numpy {ref[index[cid]]}"
        assert ref[index[cid]] >= kth - tol, f"{what}: {cid} ({s}) is below numpy's top {k} ({kth})"
    must = {ctx.ids[i] for i in order[:k] if ref[i] > kth + tol}
    missing = must - {c for c, _ in got}
    assert not missing, f"{what}: missing {missing}"
    print(f"  {what}: {[(c[:8], round(s, 5)) for c, s in got]}")


# --------------------------------------------------------------------- PyArrow


def check_pyarrow_schema(ctx):
    """The Arrow schema stored in every file is the contract, field by field."""
    want = expected_schema(ctx.dim)
    for path in ctx.files + ctx.split_files:
        got = pq.read_schema(path)
        assert got.names == want.names, f"{path}: columns {got.names}"
        for g, w in zip(got, want):
            assert describe_field(g) == describe_field(w), (
                f"{os.path.basename(path)}: {describe_field(g)} != {describe_field(w)}"
            )
            assert g.type.equals(w.type), f"{g.name}: {g.type} != {w.type}"
    print(f"  {len(ctx.files) + len(ctx.split_files)} files: {len(want)} fields as in DESIGN.md")


def file_kv(path):
    md = pq.ParquetFile(path).metadata.metadata or {}
    return {k.decode(): v.decode() for k, v in md.items()}


def check_pyarrow_metadata(ctx):
    """`geo` (GeoParquet 1.1) and `rsembed` key-value metadata, with their values."""
    vision = ctx.model_json["vision_fp16" if ctx.job["model"].get("fp16") else "vision"]
    with open(os.path.join(ctx.model, vision["file"]), "rb") as f:
        vision_sha = hashlib.sha256(f.read()).hexdigest()
    assert ctx.job["model"]["sha256"] == vision_sha, "job.json model sha256 is the vision graph's"
    for path in ctx.files:
        kv = file_kv(path)
        assert "geo" in kv and "rsembed" in kv, f"{path}: keys {sorted(kv)}"
        geo = json.loads(kv["geo"])
        assert geo["version"] == "1.1.0", geo
        assert geo["primary_column"] == "geometry", geo
        assert list(geo["columns"]) == ["geometry"], geo
        col = geo["columns"]["geometry"]
        assert col["encoding"] == "WKB", col
        assert col["geometry_types"] == ["Polygon"], col
        assert "crs" not in col, "no crs key: GeoParquet's default, OGC:CRS84"
        assert col["covering"] == {
            "bbox": {k: ["bbox", k] for k in ("xmin", "ymin", "xmax", "ymax")}
        }, col["covering"]
        t = pq.read_table(path, columns=["bbox"])
        b = t["bbox"].combine_chunks()
        b = b.filter(b.is_valid())  # the children of a null struct hold zeros
        extent = [
            pc.min(b.field("xmin")).as_py(),
            pc.min(b.field("ymin")).as_py(),
            pc.max(b.field("xmax")).as_py(),
            pc.max(b.field("ymax")).as_py(),
        ]
        assert col["bbox"] == extent, f"geo bbox {col['bbox']} != extent of the rows {extent}"

        meta = json.loads(kv["rsembed"])
        assert meta["schema_version"] == 3, meta
        assert meta["job_id"] == ctx.job["job_id"], meta
        assert meta["job_fingerprint"] == ctx.job["fingerprint"], meta
        assert len(meta["job_fingerprint"]) == 32, meta
        assert meta["model_sha256"] == vision_sha, meta
        assert meta["model_name"] == ctx.model_json["name"], meta
        assert meta["embed_dim"] == ctx.dim, meta
        assert meta["tiling"] == ctx.job["tiling"], meta
        assert meta["task_id"] == os.path.basename(path)[: -len(".parquet")], meta
    print(f"  geo 1.1.0 with bbox covering, no crs; rsembed fingerprint {meta['job_fingerprint']}")


def check_pyarrow_schema_metadata(ctx):
    """PyArrow's schema (what GeoPandas reads `geo` from) carries both entries.

    Where a file holds ARROW:schema, Arrow C++ takes the schema metadata from
    it, not from the Parquet key-value list (parquet/arrow/schema.cc,
    FromParquetSchema), so the writer must put them in both."""
    for path in ctx.files:
        md = pq.read_schema(path).metadata or {}
        kv = file_kv(path)
        for key in ("geo", "rsembed"):
            assert key.encode() in md, (
                f"{os.path.basename(path)}: pyarrow schema metadata lacks {key!r} "
                f"(has {sorted(k.decode() for k in md)}); the key-value entries are not in "
                "the ARROW:schema the writer stores"
            )
            assert md[key.encode()].decode() == kv[key], key


def check_row_groups(ctx):
    """8192-row groups, with statistics on bbox and centre_* that match the rows."""
    con = duckdb.connect()
    for path in ctx.files + ctx.split_files:
        md = pq.ParquetFile(path).metadata
        sizes = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
        assert md.num_row_groups == math.ceil(md.num_rows / ROW_GROUP_ROWS), sizes
        assert all(s == ROW_GROUP_ROWS for s in sizes[:-1]) and all(
            0 < s <= ROW_GROUP_ROWS for s in sizes
        ), sizes
        stats = con.execute(
            "SELECT row_group_id, path_in_schema, stats_min_value, stats_max_value, stats_null_count "
            "FROM parquet_metadata(?)",
            [path],
        ).fetchall()
        by = {(rg, p): (lo, hi, nulls) for rg, p, lo, hi, nulls in stats}
        pf = pq.ParquetFile(path)
        for rg in range(md.num_row_groups):
            t = pf.read_row_group(rg, columns=["bbox", "centre_lon", "centre_lat"])
            b = t["bbox"].combine_chunks()
            cols = {
                "bbox, xmin": b.field("xmin").filter(b.is_valid()),
                "bbox, ymin": b.field("ymin").filter(b.is_valid()),
                "bbox, xmax": b.field("xmax").filter(b.is_valid()),
                "bbox, ymax": b.field("ymax").filter(b.is_valid()),
                "centre_lon": t["centre_lon"].drop_null(),
                "centre_lat": t["centre_lat"].drop_null(),
            }
            for name in STATS_COLUMNS:
                lo, hi, nulls = by[(rg, name)]
                vals = cols[name]
                assert nulls == t.num_rows - len(vals), f"{path} rg {rg} {name}: null count {nulls}"
                if len(vals) == 0:
                    assert lo is None and hi is None, f"{name}: stats on an all-null chunk"
                    continue
                assert lo is not None and hi is not None, f"{path} rg {rg} {name}: no min/max"
                assert float(lo) == pc.min(vals).as_py(), f"{name}: min {lo}"
                assert float(hi) == pc.max(vals).as_py(), f"{name}: max {hi}"
    # What PyArrow makes of those statistics (see docs/querying.md, "Notes").
    s = pq.ParquetFile(ctx.files[0]).metadata.row_group(0).column(10).statistics
    print(f"  statistics present (DuckDB); pyarrow {pa.__version__} has_min_max on bbox.xmin: {s.has_min_max}")


# -------------------------------------------------------------------- GeoPandas


def manifest_pixel_sizes(path):
    """{relative path: (x size, y size)} from MANIFEST.txt's GDAL `pixel [x, y]`."""
    sizes, current = {}, None
    with open(path) as f:
        for line in f:
            m = re.match(r"^- (\S+)", line)
            if m:
                current = m.group(1)
            m = re.search(r"pixel \[([-0-9.e]+), ([-0-9.e]+)\]", line)
            if m and current:
                sizes[current] = (abs(float(m.group(1))), abs(float(m.group(2))))
    return sizes


def check_geopandas(ctx):
    """read_parquet: CRS84 polygons whose areas are the chip windows'."""
    gdf = gpd.read_parquet(os.path.join(ctx.dataset, "chips"))
    assert len(gdf) == ctx.table.num_rows, len(gdf)
    assert gdf.geometry.name == "geometry", gdf.geometry.name
    assert gdf.crs == pyproj.CRS("OGC:CRS84"), gdf.crs
    assert gdf.crs.equals("EPSG:4326", ignore_axis_order=True), gdf.crs
    geo = gdf[gdf.geometry.notna()]
    nogeo = gdf[gdf.geometry.isna()]
    # Every EPSG-referenced chip has a footprint; the GOES scene (geostationary,
    # corners off the Earth) has none, and no bbox.
    assert geo["crs"].str.startswith("EPSG:").all(), set(geo["crs"])
    assert len(nogeo) > 0 and (~nogeo["crs"].str.startswith("EPSG:")).all(), set(nogeo["crs"])
    # GeoPandas drops the covering column it knows from `geo`; read it with pyarrow.
    assert "bbox" not in gdf.columns, gdf.columns
    cover = dict(zip(ctx.ids, ctx.table["bbox"].to_pylist()))
    assert all(cover[c] is None for c in nogeo["chip_id"])
    assert (geo.geom_type == "Polygon").all(), geo.geom_type.value_counts()
    assert geo.is_valid.all()
    # The covering is the geometry's bounds; the centre lies inside.
    bounds = geo.bounds
    for k, b in zip(("xmin", "ymin", "xmax", "ymax"), ("minx", "miny", "maxx", "maxy")):
        cov = np.array([cover[c][k] for c in geo["chip_id"]])
        assert np.array_equal(cov, bounds[b].to_numpy()), k
    # read_parquet(bbox=...) filters through the covering: the chips whose bbox
    # intersects the box, no more.
    box = (-99.2, 47.0, -99.15, 47.05)
    part = gpd.read_parquet(os.path.join(ctx.dataset, "chips"), bbox=box)
    want = {
        c
        for c, v in cover.items()
        if v and v["xmax"] >= box[0] and v["xmin"] <= box[2] and v["ymax"] >= box[1] and v["ymin"] <= box[3]
    }
    assert 0 < len(want) < len(geo) and set(part["chip_id"]) == want, (len(part), len(want))
    centres = gpd.points_from_xy(geo["centre_lon"], geo["centre_lat"], crs="OGC:CRS84")
    assert geo.geometry.contains(gpd.GeoSeries(centres, index=geo.index)).all()

    pixel = manifest_pixel_sizes(ctx.manifest)
    checked = 0
    geod = pyproj.Geod(ellps="WGS84")
    for uri, rows in geo.groupby("source_uri"):
        rel = [p for p in pixel if uri.endswith("/" + p)]
        assert len(rel) == 1, f"{uri}: not in MANIFEST.txt"
        px, py = pixel[rel[0]]
        crs = rows["crs"].iloc[0]
        assert (rows["crs"] == crs).all()
        assert (rows["width"] == CHIP_SIZE).all() and (rows["height"] == CHIP_SIZE).all()
        want_w, want_h = CHIP_SIZE * px, CHIP_SIZE * py
        # Back in the source CRS each footprint is the window's rectangle.
        src = rows.to_crs(crs)
        b = src.bounds
        w, h = (b.maxx - b.minx).to_numpy(), (b.maxy - b.miny).to_numpy()
        assert np.allclose(w, want_w, rtol=2e-4), f"{rel[0]}: widths {w[:3]} vs {want_w}"
        assert np.allclose(h, want_h, rtol=2e-4), f"{rel[0]}: heights {h[:3]} vs {want_h}"
        assert np.allclose(src.area, w * h, rtol=1e-6), f"{rel[0]}: footprints are not rectangles"
        # On the ellipsoid, UTM scale (0.9996 to 1.001 here) keeps areas within 0.5 %.
        if pyproj.CRS(crs).utm_zone:
            areas = np.array([abs(geod.geometry_area_perimeter(g)[0]) for g in rows.geometry])
            assert np.allclose(areas, want_w * want_h, rtol=5e-3), f"{rel[0]}: geodesic {areas[:3]}"
        checked += len(rows)
    assert checked == len(geo)
    print(f"  {len(geo)} polygons in OGC:CRS84, areas of {geo['source_uri'].nunique()} sources checked")


# ---------------------------------------------------------------------- DuckDB


def check_duckdb_types(ctx):
    """DuckDB 2.x reads `geometry` as GEOMETRY (no extension), `embedding` as FLOAT[]."""
    con = duckdb.connect()
    types = dict(
        con.execute(
            "SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM read_parquet(?))",
            [ctx.glob],
        ).fetchall()
    )
    assert types["geometry"] == "GEOMETRY('OGC:CRS84')", types["geometry"]
    assert types["embedding"] == "FLOAT[]", types["embedding"]
    assert types["bbox"] == "STRUCT(xmin DOUBLE, ymin DOUBLE, xmax DOUBLE, ymax DOUBLE)", types["bbox"]
    for c in ("datetime", "end_datetime"):
        assert types[c] == "TIMESTAMP WITH TIME ZONE", (c, types[c])
    assert types["cloud_fraction"] == "FLOAT" and types["item_id"] == "VARCHAR", types
    (t,) = con.execute(
        "SELECT DISTINCT typeof(geometry) FROM read_parquet(?) WHERE geometry IS NOT NULL", [ctx.glob]
    ).fetchone()
    assert t.startswith("GEOMETRY"), t
    # WKT of the first footprint equals shapely's reading of the same WKB.
    wkt, wkb = con.execute(
        "SELECT ST_AsText(geometry), geometry::BLOB FROM read_parquet(?) WHERE geometry IS NOT NULL "
        "ORDER BY chip_id LIMIT 1",
        [ctx.glob],
    ).fetchone()
    assert shapely.from_wkt(wkt).equals_exact(shapely.from_wkb(bytes(wkb)), 1e-9)
    spatial = con.execute(
        "SELECT installed FROM duckdb_extensions() WHERE extension_name = 'spatial'"
    ).fetchone()
    if spatial and spatial[0]:
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("LOAD spatial")
        (bad,) = con.execute(
            "SELECT count(*) FROM read_parquet(?) WHERE geometry IS NOT NULL AND NOT ST_IsValid(geometry)",
            [ctx.glob],
        ).fetchone()
        assert bad == 0, bad
    print(f"  geometry {types['geometry']}, embedding {types['embedding']}; spatial installed: {bool(spatial and spatial[0])}")


def check_duckdb_similarity(ctx):
    """array_cosine_similarity and list_cosine_similarity rank as numpy does."""
    con = duckdb.connect()
    d = ctx.dim
    q = ctx.q.tolist()
    got = con.execute(
        f"SELECT chip_id, array_cosine_similarity(embedding::FLOAT[{d}], $q::FLOAT[{d}]) AS score "
        f"FROM read_parquet($path) ORDER BY array_cosine_similarity(embedding::FLOAT[{d}], $q::FLOAT[{d}]) DESC LIMIT 5",
        {"q": q, "path": ctx.glob},
    ).fetchall()
    ranked(ctx, got, "array_cosine_similarity")
    got = con.execute(
        "SELECT chip_id, list_cosine_similarity(embedding, $q) AS score FROM read_parquet($path) "
        "ORDER BY score DESC LIMIT 5",
        {"q": q, "path": ctx.glob},
    ).fetchall()
    ranked(ctx, got, "list_cosine_similarity")
    norms = np.linalg.norm(ctx.emb, axis=1)
    assert np.allclose(norms, 1, atol=1e-5), "embeddings are L2-normalised"
    assert abs(np.linalg.norm(ctx.q) - 1) < 1e-5, "rsembed text prints a normalised vector"


def scanned_row_groups(con, sql, params):
    plan = "\n".join(r[1] for r in con.execute("EXPLAIN ANALYZE " + sql, params).fetchall())
    m = re.search(r"Row Groups Scanned:\s*(\d+)\s*/\s*(\d+)", plan)
    assert m, f"no 'Row Groups Scanned' in the plan:\n{plan}"
    return int(m.group(1)), int(m.group(2))


def check_duckdb_bbox_pruning(ctx):
    """A filter on the bbox covering skips the row groups whose statistics miss it."""
    con = duckdb.connect()
    t = pa.concat_tables(pq.read_table(f, columns=["source_uri", "bbox"]) for f in ctx.split_files)
    df = t.to_pandas()
    naip = df[df["source_uri"].str.contains("m_4709963_se_14_1_20200831")]
    assert len(naip) > 0
    b = naip["bbox"]
    cx = (min(v["xmin"] for v in b) + max(v["xmax"] for v in b)) / 2
    cy = (min(v["ymin"] for v in b) + max(v["ymax"] for v in b)) / 2
    box = [cx - 0.01, cy - 0.01, cx + 0.01, cy + 0.01]
    where = "bbox.xmax >= $xmin AND bbox.xmin <= $xmax AND bbox.ymax >= $ymin AND bbox.ymin <= $ymax"
    params = dict(zip(("xmin", "ymin", "xmax", "ymax"), box), path=ctx.split_glob)
    sql = f"SELECT chip_id, source_uri FROM read_parquet($path) WHERE {where}"
    rows = con.execute(sql, params).fetchall()
    want = [
        v is not None and v["xmax"] >= box[0] and v["xmin"] <= box[2] and v["ymax"] >= box[1] and v["ymin"] <= box[3]
        for v in df["bbox"]
    ]
    assert len(rows) == sum(want) > 0, f"{len(rows)} rows, numpy {sum(want)}"
    assert all("m_4709963" in r[1] for r in rows), rows
    # Row groups whose statistics overlap the box, from the footers.
    stats = con.execute(
        "SELECT file_name, row_group_id, path_in_schema, stats_min_value, stats_max_value "
        "FROM parquet_metadata(?) WHERE path_in_schema LIKE 'bbox, %'",
        [ctx.split_glob],
    ).fetchall()
    groups = {}
    for f, rg, p, lo, hi in stats:
        groups.setdefault((f, rg), {})[p.split(", ")[1]] = (lo, hi)
    overlap = sum(
        1
        for s in groups.values()
        if s["xmin"][0] is not None
        and float(s["xmax"][1]) >= box[0]
        and float(s["xmin"][0]) <= box[2]
        and float(s["ymax"][1]) >= box[1]
        and float(s["ymin"][0]) <= box[3]
    )
    scanned, total = scanned_row_groups(con, sql, params)
    assert total == len(groups) > 1, (total, len(groups))
    assert scanned == overlap == 1, f"scanned {scanned} of {total}, {overlap} overlap the box"
    all_scanned, _ = scanned_row_groups(con, "SELECT count(*) FROM read_parquet($path)", {"path": ctx.split_glob})
    assert all_scanned == total, all_scanned
    print(f"  bbox filter: {len(rows)} rows, row groups scanned {scanned} / {total} (unfiltered {all_scanned} / {total})")


# ---------------------------------------------------------------------- Polars


def check_polars(ctx):
    """embedding is Array(Float32, D); a dot-product expression ranks as numpy."""
    lf = pl.scan_parquet(ctx.glob)
    schema = lf.collect_schema()
    assert schema["embedding"] == pl.Array(pl.Float32, ctx.dim), schema["embedding"]
    assert schema["bbox"] == pl.Struct(
        {"xmin": pl.Float64, "ymin": pl.Float64, "xmax": pl.Float64, "ymax": pl.Float64}
    ), schema["bbox"]
    assert schema["geometry"] == pl.Binary and schema["x"] == pl.Int32, schema
    assert schema["datetime"] == pl.Datetime("us", "UTC"), schema["datetime"]
    assert schema["cloud_fraction"] == pl.Float32, schema["cloud_fraction"]
    q = pl.lit(pl.Series([ctx.q.tolist()], dtype=pl.Array(pl.Float32, ctx.dim)))
    top = (
        lf.select("chip_id", score=(pl.col("embedding") * q).arr.sum())
        .sort("score", descending=True)
        .head(5)
        .collect()
    )
    ranked(ctx, list(zip(top["chip_id"], top["score"])), "polars arr dot product")
    # The list form of the same expression, for Polars code that has List columns.
    top = (
        lf.select("chip_id", score=(pl.col("embedding").arr.to_list() * q.arr.to_list()).list.sum())
        .sort("score", descending=True)
        .head(5)
        .collect()
    )
    ranked(ctx, list(zip(top["chip_id"], top["score"])), "polars list dot product")


# ------------------------------------------------------------- schema versions


def as_version_1(path):
    """Rewrites a chip file as schema version 1 wrote it: its first 14 columns,
    `schema_version` 1 in its `rsembed` metadata."""
    t = pq.read_table(path)
    t = t.select(t.schema.names[:14])
    md = dict(t.schema.metadata)
    meta = json.loads(md[b"rsembed"])
    meta["schema_version"] = 1
    md[b"rsembed"] = json.dumps(meta).encode()
    pq.write_table(t.replace_schema_metadata(md), path, use_compliant_nested_type=False)


def check_mixed_schema_versions(ctx):
    """A folder of version 1 and 3 files reads whole the ways docs/querying.md
    says ("Files of schema version 1"): version 1 rows null in the new columns."""
    work = tempfile.mkdtemp(prefix="rsembed-mixed-")
    try:
        shutil.copytree(os.path.join(ctx.split), os.path.join(work, "out"))
        stamp_stac.main_for(os.path.join(work, "out"))
        files = sorted(glob.glob(os.path.join(work, "out", "chips", "*.parquet")))
        # The first file (the one every reader takes its schema from) is version 1.
        v1 = files[0]
        v1_rows = pq.ParquetFile(v1).metadata.num_rows
        as_version_1(v1)
        assert len(pq.read_schema(v1)) == 14 and len(pq.read_schema(files[1])) == 24
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        with_dt = sum(pc.count(pq.read_table(f, columns=["datetime"])["datetime"]).as_py() for f in files[1:])
        assert with_dt > 0, "the stamped files have datetimes"
        glob_ = os.path.join(work, "out", "chips", "*.parquet")
        con = duckdb.connect()
        got = con.execute(
            "SELECT count(*), count(datetime), count(*) FILTER (WHERE filename = ? AND datetime IS NULL "
            "AND item_id IS NULL AND cloud_fraction IS NULL) "
            "FROM read_parquet(?, union_by_name = true, filename = true)",
            [v1, glob_],
        ).fetchone()
        assert got == (rows, with_dt, v1_rows), (got, rows, with_dt, v1_rows)
        # Without union_by_name, DuckDB keeps the first file's columns.
        cols = [r[0] for r in con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [glob_]).fetchall()]
        assert "datetime" not in cols, cols
        schema = pa.unify_schemas([pq.read_schema(f) for f in files])
        table = pq.read_table(os.path.join(work, "out", "chips"), schema=schema)
        assert table.num_rows == rows and pc.count(table["datetime"]).as_py() == with_dt
        gdf = gpd.read_parquet(os.path.join(work, "out", "chips"), schema=schema)
        assert len(gdf) == rows and gdf["datetime"].notna().sum() == with_dt
        assert gdf.crs == pyproj.CRS("OGC:CRS84")
        plain = gpd.read_parquet(os.path.join(work, "out", "chips"))
        assert "datetime" not in plain.columns, "without the schema, the first file's columns"
        chips = pl.concat([pl.scan_parquet(f) for f in files], how="diagonal")
        n, dts = chips.select(pl.len(), pl.col("datetime").count()).collect().row(0)
        assert (n, dts) == (rows, with_dt), (n, dts)
        print(f"  {rows} chips, {v1_rows} of version 1, {with_dt} with a datetime: DuckDB, PyArrow, GeoPandas, Polars")
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------- runner


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for a in ("--dataset", "--split-dataset", "--model", "--query", "--manifest"):
        ap.add_argument(a, required=True)
    ctx = Ctx(ap.parse_args())
    print(
        f"duckdb {duckdb.__version__}, pyarrow {pa.__version__}, polars {pl.__version__}, "
        f"geopandas {gpd.__version__}, shapely {shapely.__version__}, pyproj {pyproj.__version__}"
    )
    print(f"{ctx.table.num_rows} chips in {len(ctx.files)} files, {len(ctx.split_files)} split files, D={ctx.dim}")
    checks = [(n, f) for n, f in globals().items() if n.startswith("check_")]
    failed = []
    for name, f in checks:
        try:
            f(ctx)
            print(f"ok   {name}")
        except Exception:  # noqa: BLE001 - every check runs and reports
            failed.append(name)
            print(f"FAIL {name}\n{traceback.format_exc()}")
    print(f"{len(checks) - len(failed)} passed, {len(failed)} failed: {failed}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
