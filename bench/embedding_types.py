#!/usr/bin/env python3
"""Bytes per row, search time and recall of `--embedding-type f32|f16|int8`, in one run.

Makes a synthetic finished job with `synth_index` (the workers' own writer;
random unit vectors, D = 768 by default), converts it with `rsembed compact
--embedding-type` to each type (f32 too, so every side has the same layout),
then for each type:

1. bytes per row: compressed Parquet bytes of the `embedding` column (and the
   `embedding_scale` of int8), and of the whole file, per row (DuckDB's
   parquet_metadata);
2. `rsembed search --vector q.json --top-k K` over the whole dataset, each in a
   fresh process, the types alternating in every repetition after a warm-up:
   wall time, the time on search's own closing line, peak RSS;
3. recall@K of `--like CHIP` for `--queries` chips sampled from the data,
   against the f32 top-K.

Ratios are against f32 from the same run.

    .cache/venv/bin/python bench/embedding_types.py [--rows 200000] [--dim 768] [--reps 7]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search import measured, med, rounds, search_json, synth  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TYPES = ["f32", "f16", "int8"]


def bytes_per_row(ds: Path) -> dict:
    glob = f"{ds}/chips/*.parquet"
    con = duckdb.connect()
    n = con.execute(f"SELECT count(*) FROM '{glob}'").fetchone()[0]
    emb, total = con.execute(
        f"SELECT sum(total_compressed_size) FILTER (WHERE path_in_schema LIKE 'embedding%'), "
        f"sum(total_compressed_size) FROM parquet_metadata('{glob}')"
    ).fetchone()
    files = sum(p.stat().st_size for p in (ds / "chips").glob("*.parquet"))
    return {"rows": n, "embedding": emb / n, "columns": total / n, "file": files / n}


def search(rsembed: str, ds: Path, args: list[str]) -> dict:
    r = search_json(rsembed, ds, args)
    return {**r, "ids": [h["chip_id"] for h in r["hits"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--rows-per-file", type=int, default=20_000)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", default="/tmp/rsembed-bench-types")
    ap.add_argument("--rsembed", default=str(ROOT / "target/release/rsembed"))
    ap.set_defaults(regen=True, synth_bin=None)
    args = ap.parse_args()

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    src = work / "src"
    synth(args, args.rows, src)
    query = str(src / "query.json")

    out, sets = {}, {}
    for t in TYPES:
        ds = work / t
        r = measured([args.rsembed, "compact", "--index", str(src), "--output", str(ds),
                      "--embedding-type", t])
        if r["rc"] != 0:
            raise SystemExit(f"compact {t} failed: {r['stderr']}")
        sets[t] = ds
        out[t] = {"compact_s": r["wall"], "compact_rss_mib": r["rss_mib"], **bytes_per_row(ds)}

    runs = rounds(args.reps, {t: (lambda t=t: search(args.rsembed, sets[t],
                                                      ["--vector", query, "--top-k", str(args.top_k)]))
                              for t in TYPES})
    for t in TYPES:
        out[t].update({k: med(runs[t], k) for k in ("wall", "inner", "rss_mib", "mib")})

    con = duckdb.connect()
    ids = [r[0] for r in con.execute(
        f"SELECT chip_id FROM '{sets['f32']}/chips/*.parquet' ORDER BY chip_id").fetchall()]
    rng = random.Random(args.seed)
    sample = rng.sample(ids, args.queries)
    exact = {c: set(search(args.rsembed, sets["f32"], ["--like", c, "--top-k", str(args.top_k)])["ids"])
             for c in sample}
    for t in TYPES:
        hits = 0
        for c in sample:
            got = search(args.rsembed, sets[t], ["--like", c, "--top-k", str(args.top_k)])["ids"]
            hits += len(exact[c] & set(got))
        out[t]["recall"] = hits / (args.top_k * len(sample))

    base = out["f32"]
    print(f"{args.rows} rows, D = {args.dim}, top-{args.top_k}, {args.reps} reps, "
          f"recall over {args.queries} --like queries")
    print("| type | embedding B/row | all columns B/row | file B/row | ÷ f32 (file) "
          "| search wall s | ÷ f32 | inside s | peak RSS MiB | recall@10 vs f32 | compact s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for t in TYPES:
        o = out[t]
        print(f"| {t} | {o['embedding']:.1f} | {o['columns']:.1f} | {o['file']:.1f} "
              f"| {o['file'] / base['file']:.3f} | {o['wall']:.3f} | {o['wall'] / base['wall']:.2f} "
              f"| {o['inner']:.3f} | {o['rss_mib']:.0f} | {o['recall']:.3f} | {o['compact_s']:.1f} |")
    (work / "result.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
