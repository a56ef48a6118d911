"""Checks `rsembed search` and `rsembed classify` against an independent
computation in numpy: the chip embeddings read from the Parquet files with
PyArrow, and the Hugging Face text embeddings of the test model
(fixtures/models/tiny-siglip/reference.json, made by transformers).

Usage: check_query.py <dataset> <model dir> <results dir>

The results dir holds what tests/query.rs ran (see there); `cases.json`
says which query each file answers.
"""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq

# ONNX Runtime's text embeddings differ from transformers' by < 1e-6 a
# component on the test model; cosines of unit vectors then differ by less.
COS_TOL = 1e-5

dataset, model_dir, results = (Path(a) for a in sys.argv[1:4])
model = json.loads((model_dir / "rsembed-model.json").read_text())
ref = json.loads((model_dir / "reference.json").read_text())
hf = {t["text"]: np.array(t["text_embeds"], dtype=np.float64) for t in ref["texts"]}
scale, bias = math.exp(model["logit_scale"]), model["logit_bias"]
cases = json.loads((results / "cases.json").read_text())

table = ds.dataset(dataset / "chips", format="parquet").to_table()
ids = table["chip_id"].to_pylist()
row_of = {c: i for i, c in enumerate(ids)}
assert len(row_of) == len(ids), "chip ids are unique"
dim = model["embed_dim"]
E = table["embedding"].combine_chunks().flatten().to_numpy().astype(np.float64).reshape(-1, dim)
assert np.allclose(np.linalg.norm(E, axis=1), 1.0, atol=1e-5), "embeddings are unit vectors"
bbox = table["bbox"].combine_chunks()
has_bbox = ~np.array(bbox.is_null().to_pylist())
bx = {f: np.nan_to_num(bbox.field(f).to_numpy(zero_copy_only=False).astype(np.float64)) for f in ("xmin", "ymin", "xmax", "ymax")}


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def check_ranking(name, got, q, k, mask=None, scored=True):
    """Every rank holds a chip exactly as good as numpy's chip of that rank
    (which allows reordering of exact ties and nothing else), and the
    printed cosine and score are numpy's."""
    cos = E @ q
    valid = np.ones(len(ids), dtype=bool) if mask is None else mask
    expected = np.sort(cos[valid])[::-1][:k]
    assert len(got) == len(expected), f"{name}: {len(got)} results, numpy has {len(expected)}"
    seen = set()
    for i, r in enumerate(got):
        assert r["rank"] == i + 1, f"{name}: rank {r['rank']} at position {i}"
        j = row_of[r["chip_id"]]
        assert valid[j], f"{name}: rank {i + 1} {r['chip_id']} is outside the filter"
        assert r["chip_id"] not in seen, f"{name}: {r['chip_id']} twice"
        seen.add(r["chip_id"])
        assert abs(r["cosine"] - cos[j]) < COS_TOL, f"{name}: rank {i + 1} cosine {r['cosine']} vs numpy {cos[j]}"
        assert abs(cos[j] - expected[i]) < COS_TOL, f"{name}: rank {i + 1} has cosine {cos[j]}, numpy's rank {i + 1} {expected[i]}"
        if scored:
            want = sigmoid(scale * cos[j] + bias)
            assert abs(r["score"] - want) <= 1e-4 * want + 1e-9, f"{name}: score {r['score']} vs {want}"
        else:
            assert r["score"] is None
        assert r["source_uri"] == table["source_uri"][j].as_py()
        assert [r["x"], r["y"], r["width"], r["height"]] == [table[c][j].as_py() for c in ("x", "y", "width", "height")]
    # The best numpy chip is not missing (no chip better than the last rank left out).
    if len(expected):
        better = np.where(valid & (cos > expected[-1] + COS_TOL))[0]
        missing = {ids[j] for j in better} - seen
        assert not missing, f"{name}: numpy ranks {missing} above the last result"
    print(f"ok  {name}: {len(got)} results match numpy (top cosine {expected[0] if len(expected) else None:.6f})")


def read_jsonl(p):
    return [json.loads(l) for l in (results / p).read_text().splitlines() if l.strip()]


for c in cases["search"]:
    got = read_jsonl(c["file"])
    mask = None
    if c.get("bbox"):
        w, s, e, n = c["bbox"]
        mask = has_bbox & (bx["xmax"] >= w) & (bx["xmin"] <= e) & (bx["ymax"] >= s) & (bx["ymin"] <= n)
        assert mask.sum() < len(ids), "the bbox case filters something"
    if "texts" in c:
        q = unit(np.mean([unit(hf[t]) for t in c["texts"]], axis=0))
        check_ranking(c["file"], got, q, c["k"], mask)
    elif "like" in c:
        j = row_of[c["like"]]
        m = np.ones(len(ids), dtype=bool) if mask is None else mask.copy()
        m[j] = False
        check_ranking(c["file"], got, unit(E[j]), c["k"], m, scored=c.get("scored", False))
    elif "vector" in c:
        check_ranking(c["file"], got, unit(json.loads((results / c["vector"]).read_text())), c["k"], mask, scored=False)

# GeoJSON: the same ranking, with the files' footprints.
gj = json.loads((results / cases["geojson"]["file"]).read_text())
assert gj["type"] == "FeatureCollection"
feats = gj["features"]
assert len(feats) == cases["geojson"]["k"]
geom = table["geometry"]
import struct


def wkb_ring(b):
    order = "<" if b[0] == 1 else ">"
    (typ, nrings, npts) = struct.unpack(order + "III", b[1:13])
    assert typ == 3 and nrings == 1
    return [list(struct.unpack(order + "dd", b[13 + 16 * i: 29 + 16 * i])) for i in range(npts)]


for f in feats:
    j = row_of[f["properties"]["chip_id"]]
    want = wkb_ring(geom[j].as_py())
    assert f["geometry"]["type"] == "Polygon"
    assert f["geometry"]["coordinates"][0] == want, "GeoJSON ring equals the WKB ring"
print(f"ok  geojson: {len(feats)} features with the files' footprints")

# classify: top-N labels per chip, against numpy over the HF label embeddings.
for c in cases["classify"]:
    out = pq.read_table(results / c["file"])
    meta = json.loads(pq.read_metadata(results / c["file"]).metadata[b"rsembed"])
    assert meta["labels"] == c["labels"] and meta["template"] == c["template"]
    assert out.num_rows == len(ids), f"{c['file']}: {out.num_rows} rows for {len(ids)} chips"
    L = np.stack([unit(hf[c["template"].replace("{}", l)]) for l in c["labels"]])
    top = min(c["top"], len(c["labels"]))
    chip_ids = out["chip_id"].to_pylist()
    assert sorted(chip_ids) == sorted(ids), "every chip once"
    tops = out["top_labels"].to_pylist()
    best = out["label"].to_pylist()
    for cid, t, b, sc in zip(chip_ids, tops, best, out["score"].to_pylist()):
        cos = L @ E[row_of[cid]]
        order = np.sort(cos)[::-1][:top]
        assert len(t) == top
        assert t[0]["label"] == b and abs(t[0]["score"] - sc) < 1e-12
        for i, e in enumerate(t):
            li = c["labels"].index(e["label"])
            assert abs(e["cosine"] - cos[li]) < COS_TOL, f"{cid}: {e['label']} cosine {e['cosine']} vs {cos[li]}"
            assert abs(cos[li] - order[i]) < COS_TOL, f"{cid}: rank {i + 1} label {e['label']} is not numpy's"
            want = sigmoid(scale * cos[li] + bias)
            assert abs(e["score"] - want) <= 1e-4 * want + 1e-9, f"{cid}: score {e['score']} vs {want}"
    print(f"ok  {c['file']}: top-{top} of {len(c['labels'])} labels for {len(ids)} chips match numpy")
