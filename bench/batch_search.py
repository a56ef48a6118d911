#!/usr/bin/env python3
"""Cost per query of `rsembed search --vectors` (one pass for Q queries)
against single `--vector` searches, in one run.

Makes a synthetic finished job with `synth_index` (random unit vectors,
D = 768 by default), writes Q random unit query vectors as JSON Lines for
each Q of `--batches`, and times, each in a fresh process with warm page
caches, the sides alternating in every repetition after a warm-up:

- one `--vector` search (the single-query cost);
- `--vectors` with Q queries, whose wall time divided by Q is the cost per
  query in a batch.

It also checks that the batch's answer to its first query equals the
single search's.

    .cache/venv/bin/python bench/batch_search.py [--rows 200000] [--batches 10,100,1000]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search import med, rounds, search_json, synth  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def unit(rng: random.Random, d: int) -> list[float]:
    v = [rng.gauss(0.0, 1.0) for _ in range(d)]
    n = sum(x * x for x in v) ** 0.5
    return [x / n for x in v]


def write_queries(cfg: dict) -> None:
    rng = random.Random(cfg["seed"])
    vectors = [unit(rng, cfg["dim"]) for _ in range(max(cfg["batches"]))]
    work = Path(cfg["work"])
    (work / "q0.json").write_text(json.dumps(vectors[0]))
    for q in cfg["batches"]:
        (work / f"q{q}.jsonl").write_text("".join(json.dumps(v) + "\n" for v in vectors[:q]))


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--write-queries":
        write_queries(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--rows-per-file", type=int, default=20_000)
    ap.add_argument("--batches", default="10,100,1000")
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", default="/tmp/rsembed-bench-batch")
    ap.add_argument("--rsembed", default=str(ROOT / "target/release/rsembed"))
    ap.set_defaults(regen=True, synth_bin=None)
    args = ap.parse_args()

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    index = work / "index"
    synth(args, args.rows, index)

    batches = [int(b) for b in args.batches.split(",")]
    # The query files come from a child process, and each run keeps only its
    # first query's hits: this process forks every measured command, and a
    # forked child's peak RSS includes this one's (bench/search.py `measured`).
    subprocess.run([sys.executable, __file__, "--write-queries", json.dumps(
        {"seed": args.seed, "dim": args.dim, "batches": batches, "work": str(work)})], check=True)
    single = work / "q0.json"
    files = {q: work / f"q{q}.jsonl" for q in batches}

    def first_only(r: dict) -> dict:
        r["hits"] = [h for h in r["hits"] if h.get("query", 1) == 1]
        return r

    k = ["--top-k", str(args.top_k)]
    sides = {"single": lambda: search_json(args.rsembed, index, ["--vector", str(single)] + k)}
    for q in batches:
        sides[f"batch{q}"] = lambda q=q: first_only(
            search_json(args.rsembed, index, ["--vectors", str(files[q])] + k))
    runs = rounds(args.reps, sides)

    one = runs["single"][0]["hits"]
    for q in batches:
        first = [h for h in runs[f"batch{q}"][0]["hits"] if h["query"] == 1]
        assert [h["chip_id"] for h in first] == [h["chip_id"] for h in one], f"batch {q} query 1"

    s_wall, s_inner = med(runs["single"], "wall"), med(runs["single"], "inner")
    print(f"{args.rows} rows, D = {args.dim}, top-{args.top_k}, {args.reps} reps (median)")
    print("| queries | wall s | inside s | per query s | per query ÷ single | peak RSS MiB |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| 1 (`--vector`) | {s_wall:.3f} | {s_inner:.3f} | {s_wall:.3f} | 1.000 "
          f"| {med(runs['single'], 'rss_mib'):.0f} |")
    for q in batches:
        r = runs[f"batch{q}"]
        w = med(r, "wall")
        print(f"| {q} | {w:.3f} | {med(r, 'inner'):.3f} | {w / q:.4f} | {w / q / s_wall:.3f} "
              f"| {med(r, 'rss_mib'):.0f} |")


if __name__ == "__main__":
    main()
