"""Gives three chip files of a dataset the STAC values of schema version 2.

    python stamp_stac.py DATASET

The dataset is an `rsembed run` output of GeoTIFFs, whose STAC columns are
null. The three largest chip files get an item id, collection, acquisition
time and cloud fractions, as if their scenes were STAC items (two of summer
2024, one of 2023 with an acquisition range), so that the queries of
docs/querying.md on those columns have rows to return. Each file is rewritten
with its own Arrow schema and metadata (`geo`, `rsembed`), and the dataset's
manifest (its files list, or the JSON list of a format 1 manifest) is updated
to the new sizes and digests. tests/readers.rs runs it.
"""

import datetime as dt
import glob
import hashlib
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

ITEMS = [
    ("S2B_14TNT_20240712_0_L2A", "sentinel-2-l2a", dt.datetime(2024, 7, 12, 17, 30, 19), None, 20),
    ("LC09_L2SP_031027_20240805_02_T1", "landsat-c2-l2", dt.datetime(2024, 8, 5, 17, 5, 11), None, 10),
    ("S2A_14TNT_20230602_0_L2A", "sentinel-2-l2a", dt.datetime(2023, 6, 2, 17, 20), dt.datetime(2023, 6, 4), 5),
]


def stamp(path, item):
    item_id, collection, start, end, steps = item
    t = pq.read_table(path)
    n = t.num_rows
    utc = dt.timezone.utc
    values = {
        "item_id": pa.array([item_id] * n, pa.string()),
        "collection": pa.array([collection] * n, pa.string()),
        "datetime": pa.array([start.replace(tzinfo=utc)] * n, pa.timestamp("us", tz="UTC")),
        "end_datetime": pa.array([end.replace(tzinfo=utc) if end else None] * n, pa.timestamp("us", tz="UTC")),
        "cloud_fraction": pa.array([(i % steps) / steps for i in range(n)], pa.float32()),
    }
    for name, arr in values.items():
        i = t.schema.get_field_index(name)
        assert i >= 0, f"{path}: no {name} column (not schema version 2)"
        t = t.set_column(i, t.schema.field(i), arr.cast(t.schema.field(i).type))
    # arrow-rs names list items `item`; keep it, so every file has one schema.
    pq.write_table(t, path, use_compliant_nested_type=False, compression="zstd")
    return n


def main():
    main_for(sys.argv[1])


def main_for(root):
    """Stamps the dataset at `root` (see the module's doc)."""
    files = sorted(glob.glob(os.path.join(root, "chips", "*.parquet")), key=lambda f: -pq.ParquetFile(f).metadata.num_rows)
    assert len(files) >= len(ITEMS), files
    for f, item in zip(files, ITEMS):
        print(f"{os.path.basename(f)}: {stamp(f, item)} chips of {item[0]}")
    mpath = os.path.join(root, "manifest.json")
    with open(mpath) as f:
        manifest = json.load(f)
    if "lists" in manifest:
        restamp_list(root, manifest["lists"]["files"])
    for entry in manifest.get("files", []):
        entry.update(digest(os.path.join(root, entry["path"])))
    with open(mpath, "w") as f:
        json.dump(manifest, f, indent=2)


def digest(path):
    with open(path, "rb") as f:
        data = f.read()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def restamp_list(root, entry):
    """The sizes and digests of a format 2 manifest's files list
    (`manifest/files.parquet`), and the list's own in `entry`. The list keeps
    its Arrow schema (rsembed's reader wants its own) and metadata."""
    lpath = os.path.join(root, entry["path"])
    t = pq.read_table(lpath)
    new = [digest(os.path.join(root, p)) for p in t.column("path").to_pylist()]
    for name in ("bytes", "sha256"):
        i = t.schema.get_field_index(name)
        t = t.set_column(i, t.schema.field(i), pa.array([d[name] for d in new], t.schema.field(i).type))
    pq.write_table(t, lpath, use_compliant_nested_type=False, compression="zstd")
    entry.update(digest(lpath))


if __name__ == "__main__":
    main()
