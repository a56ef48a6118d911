"""int8 embeddings: which scalar quantisation keeps the top-10 (issue 16, item 1).

Usage, from the repository root (numpy only):

    .cache/venv/bin/python bench/quant.py [--n 50000] [--dim 768] [--queries 200] [--seed 1]

Measures recall@10 (the share of the exact float32 top-10 by cosine that each scheme's
top-10 keeps, the query in float32 against dequantised rows) and bytes per row, for:

- `f16`: IEEE half precision (the f16 storage type), the reference for "lossy but safe";
- `int8 per-vector`: q = round(x / s), s = max|x| / 127 per row, s stored as a float32
  beside the row (4 bytes);
- `int8 per-dimension`: s_d = max over the rows of |x_d| / 127, one float32 per dimension
  stored once per file (the file's own rows), nothing per row;
- `int8 global 1/127`: s = 1/127 for every component of a unit vector, no metadata;
- `int8 signed sqrt (AEF)`: AlphaEarth Foundations' scheme, q = round(127.5 * sign(x) *
  sqrt(|x|)) clipped to ±127, x = sign(q) (q / 127.5)^2;

on three kinds of unit vectors at D dimensions:

- `clustered`: 1000 random unit centres, rows = normalise(centre + N(0, 0.2^2 / D)),
  queries are perturbed rows (the benchmark data of the IVF work);
- `anisotropic`: normalise(mu + A z): a shared mean direction (|mu| = 0.8 of the norm) and
  per-dimension standard deviations falling as a power law (k^-0.7), the shape real
  contrastive image embeddings have (a dominant common direction, a few strong axes);
- `uniform`: isotropic random unit vectors (the worst case for any top-k).
"""

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402


def normalise(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def data(kind, n, d, q, rng):
    if kind == "clustered":
        centres = normalise(rng.standard_normal((1000, d)))
        rows = normalise(centres[rng.integers(0, 1000, n)] + rng.standard_normal((n, d)) * (0.2 / np.sqrt(d)))
        pick = rng.integers(0, n, q)
        queries = normalise(rows[pick] + rng.standard_normal((q, d)) * (0.2 / np.sqrt(d)))
    elif kind == "anisotropic":
        std = (np.arange(1, d + 1) ** -0.7).astype(np.float32)
        std /= np.linalg.norm(std)
        mu = normalise(rng.standard_normal((1, d)))[0] * 0.8
        def draw(m):
            return normalise(mu + rng.standard_normal((m, d)).astype(np.float32) * std * 0.6)
        rows, queries = draw(n), draw(q)
    else:
        rows, queries = normalise(rng.standard_normal((n, d))), normalise(rng.standard_normal((q, d)))
    return rows, queries


def topk(queries, rows, k=10):
    s = queries @ rows.T
    idx = np.argpartition(-s, k, axis=1)[:, :k]
    return idx


def schemes(rows):
    d = rows.shape[1]
    out = {}
    out["f16"] = (rows.astype(np.float16).astype(np.float32), 2 * d)
    s = np.abs(rows).max(axis=1, keepdims=True) / 127.0
    out["int8 per-vector"] = (np.round(rows / s).clip(-127, 127).astype(np.int8) * s, d + 4)
    s = np.abs(rows).max(axis=0, keepdims=True) / 127.0
    out["int8 per-dimension"] = (np.round(rows / s).clip(-127, 127).astype(np.int8) * s, d)
    out["int8 global 1/127"] = (np.round(rows * 127.0).clip(-127, 127).astype(np.int8) / np.float32(127.0), d)
    q = np.round(127.5 * np.sign(rows) * np.sqrt(np.abs(rows))).clip(-127, 127).astype(np.int8)
    qf = q.astype(np.float32)
    out["int8 signed sqrt (AEF)"] = (np.sign(qf) * (qf / 127.5) ** 2, d)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    print(f"n={a.n} D={a.dim} queries={a.queries} seed={a.seed}; recall@10 against float32 exact")
    print("| data | scheme | bytes/row (embedding) | recall@10 | min over queries | recall@10, top-100 re-ranked with the float32 rows |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for kind in ("clustered", "anisotropic", "uniform"):
        rng = np.random.default_rng(a.seed)
        t = time.time()
        rows, queries = data(kind, a.n, a.dim, a.queries, rng)
        exact = topk(queries, rows)
        for name, (deq, nbytes) in schemes(rows).items():
            got = topk(queries, deq.astype(np.float32))
            per = [len(set(x) & set(y)) / 10 for x, y in zip(exact, got)]
            # If the float32 rows were kept beside the int8 ones: the quantised
            # scores pick 100 candidates, the exact rows decide the top-10.
            cand = topk(queries, deq.astype(np.float32), 100)
            rer = []
            for qi, c in enumerate(cand):
                sc = rows[c] @ queries[qi]
                rer.append(set(c[np.argsort(-sc)[:10]]))
            rr = np.mean([len(set(x) & y) / 10 for x, y in zip(exact, rer)])
            print(f"| {kind} | {name} | {nbytes} | {np.mean(per):.4f} | {min(per):.1f} | {rr:.4f} |", flush=True)
        print(f"<!-- {kind}: {time.time() - t:.1f} s -->", flush=True)


if __name__ == "__main__":
    main()
