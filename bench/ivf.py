#!/usr/bin/env python3
"""The IVF layout (`compact --lists`, `search --nprobe`) against the exact scan,
DuckDB and FAISS IVF-Flat, on synthetic clustered D=768 data, in one run.

    .cache/venv/bin/python bench/ivf.py [--rows 1000000] [--lists 1000] [--queries 50]

Steps (each command a fresh process; wall time and peak RSS from wait4(2)):

1. `synth_index --clusters C --spread S --queries Q` (release build): the
   clustered data of bench/quant.py (C random unit centres, rows
   normalise(centre + N(0, S^2/D)), queries = rows perturbed by the same
   noise), streamed file by file into task-sized chip files; and the same at
   `--small-rows` for the row-count independence of search's memory.
2. `rsembed compact --lists N` of each: time, peak RSS.
3. Exact top-10 of every query: `rsembed search --nprobe all` on the IVF
   dataset (the exact scan: every row group, the same files).
4. `rsembed search --nprobe P` for a sweep of P (the default included):
   recall@10 against step 3, median latency, MiB fetched, row groups read,
   peak RSS; ratios against the exact scan of the same queries.
5. DuckDB on the same files: the exact top-10 (`list_dot_product ... ORDER BY
   ... LIMIT 10`) and the documented probe of docs/querying.md at the
   default P, on `--duck-queries` queries: time, peak RSS, recall.
6. FAISS IndexIVFFlat (inner product, N lists, trained on as many rows as
   `compact` samples) over the embeddings read from the same files: build
   time, peak RSS, and query time and recall@10 per nprobe, one query at a
   time as `rsembed search` answers them; the nprobe where recall first
   reaches rsembed's default recall is the comparison row.
7. Batches (`--batch`): the first B queries of a larger draw (`--queries`
   is its head) as one `rsembed search --vectors` of B lines, and the same B
   queries as one FAISS `index.search` of B rows, at the nprobe values of
   `--batch-nprobe`: wall time per query (rsembed: the whole process; FAISS:
   the search call, its index already built), peak RSS, and recall@10 of the
   first `--queries` of them against step 3's exact answers (a query in a
   batch gets the answer it gets alone).

Results go to WORK/ivf-bench.json and a table on stdout. Needs numpy, duckdb,
pyarrow and faiss-cpu in the interpreter (`pip install faiss-cpu`); --no-faiss
skips step 6.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search import DUCK_CHILD, STATS, measured  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

FAISS_CHILD = r"""
import json, sys, time, os
cfg = json.loads(sys.argv[1])
import numpy as np, pyarrow.parquet as pq, pyarrow.dataset as ds, faiss
faiss.omp_set_num_threads(cfg['threads'])
t0 = time.perf_counter()
d = ds.dataset(cfg['chips'], format='parquet')
# Filled in place: a concatenation would hold the embeddings twice.
x = np.empty((d.count_rows(), cfg['dim']), dtype=np.float32)
ids, n = [], 0
for b in d.to_batches(columns=['chip_id', 'embedding'], batch_size=65536):
    ids.extend(b.column(0).to_pylist())
    v = b.column(1).values.to_numpy(zero_copy_only=False).reshape(-1, cfg['dim'])
    x[n:n + len(v)] = v
    n += len(v)
t1 = time.perf_counter()
q = faiss.IndexFlatIP(cfg['dim'])
index = faiss.IndexIVFFlat(q, cfg['dim'], cfg['lists'], faiss.METRIC_INNER_PRODUCT)
index.cp.niter = 20
rng = np.random.default_rng(0)
sample = x[rng.choice(len(x), size=min(cfg['sample'], len(x)), replace=False)]
index.train(sample)
index.add(x)
del x, sample
t2 = time.perf_counter()
queries = np.array(json.load(open(cfg['queries'])), dtype=np.float32)
out = {'load_s': t1 - t0, 'build_s': t2 - t1, 'rows': n, 'sweep': []}
for p in cfg['nprobe']:
    index.nprobe = p
    times, hits = [], []
    for qv in queries:
        s = time.perf_counter()
        _, I = index.search(qv[None, :], 10)
        times.append(time.perf_counter() - s)
        hits.append([ids[i] for i in I[0] if i >= 0])
    out['sweep'].append({'nprobe': p, 'median_s': sorted(times)[len(times) // 2], 'hits': hits})
out['batches'] = []
if cfg['batch']:
    many = np.array(json.load(open(cfg['batch_queries'])), dtype=np.float32)
    for b in cfg['batch']:
        for p in cfg['batch_nprobe']:
            index.nprobe = p
            s = time.perf_counter()
            _, I = index.search(many[:b], 10)
            t = time.perf_counter() - s
            hits = [[ids[i] for i in row if i >= 0] for row in I[:cfg['head']]]
            out['batches'].append({'queries': b, 'nprobe': p, 'wall': t, 'hits': hits})
print(json.dumps(out))
"""


SPLIT_CHILD = r"""
import json, sys
cfg = json.loads(sys.argv[1])
drawn = json.load(open(cfg['drawn']))
need = max([cfg['head']] + cfg['batches'])
if len(drawn) < need:
    sys.exit(f"{len(drawn)} queries drawn, {need} needed")
json.dump(drawn[:cfg['head']], open(f"{cfg['work']}/queries-head.json", 'w'))
for b in cfg['batches']:
    with open(f"{cfg['work']}/vectors-{b}.jsonl", 'w') as f:
        f.writelines(json.dumps(q) + '\n' for q in drawn[:b])
"""


def batches(args) -> list[int]:
    return [int(b) for b in args.batch.split(",") if b.strip()]


def rss_line(r: dict) -> str:
    return f"{r['wall']:.2f} s, {r['rss_mib']:.0f} MiB"


def synth(args, rows: int, out: Path) -> dict:
    summary = out / "synth.json"
    if summary.exists() and not args.regen:
        return json.loads(summary.read_text())
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    cmd = [str(args.synth), "--output", str(out), "--rows", str(rows), "--dim", str(args.dim),
           "--rows-per-file", str(args.rows_per_file), "--clusters", str(args.clusters),
           "--spread", str(args.spread), "--queries", str(max([args.queries] + batches(args))),
           "--planted", "0",
           "--seed", str(args.seed), "--embedding-type", args.embedding_type]
    print("+", " ".join(cmd), file=sys.stderr)
    r = measured(cmd)
    if r["rc"] != 0:
        raise SystemExit(f"synth_index failed: {r['stderr']}")
    s = json.loads(r["stdout"].strip().splitlines()[-1])
    s["wall"] = r["wall"]
    summary.write_text(json.dumps(s))
    return s


def compact(args, src: Path, dst: Path, lists: int | None = None) -> dict:
    done = dst / "compact.json"
    if done.exists() and not args.regen:
        return json.loads(done.read_text())
    cmd = [str(args.rsembed), "compact", "--index", str(src), "--output", str(dst), "--json",
           "--overwrite", "--lists", str(lists or args.lists), "--seed", "0"]
    if args.spill_dir:
        cmd += ["--spill-dir", args.spill_dir]
    print("+", " ".join(cmd), file=sys.stderr)
    r = measured(cmd)
    if r["rc"] != 0:
        raise SystemExit(f"compact failed: {r['stderr']}")
    s = json.loads(r["stdout"])
    s.update(wall=r["wall"], rss_mib=r["rss_mib"])
    done.write_text(json.dumps(s))
    return s


def search(args, index: Path, query: list[float], nprobe: str, qfile: Path) -> dict:
    qfile.write_text(json.dumps(query))
    cmd = [str(args.rsembed), "search", "--index", str(index), "--vector", str(qfile),
           "--top-k", "10", "--json", "--nprobe", nprobe]
    r = measured(cmd)
    if r["rc"] != 0:
        raise SystemExit(f"search failed: {r['stderr']}")
    m = STATS.search(r["stderr"])
    hits = [json.loads(l)["chip_id"] for l in r["stdout"].splitlines() if l.strip()]
    return {"wall": r["wall"], "rss_mib": r["rss_mib"], "ids": hits,
            "scored": int(m[1]), "rows": int(m[2]), "groups_read": int(m[3]),
            "groups": int(m[4]), "mib": float(m[5]), "inner": float(m[6])}


def batch_search(args, index: Path, vectors: Path, nprobe: int) -> dict:
    cmd = [str(args.rsembed), "search", "--index", str(index), "--vectors", str(vectors),
           "--top-k", "10", "--json", "--nprobe", str(nprobe)]
    r = measured(cmd)
    if r["rc"] != 0:
        raise SystemExit(f"batch search failed: {r['stderr']}")
    m = STATS.search(r["stderr"])
    by_query: dict[int, list[str]] = {}
    for line in r["stdout"].splitlines():
        if line.strip():
            hit = json.loads(line)
            by_query.setdefault(hit["query"], []).append(hit["chip_id"])
    return {"wall": r["wall"], "rss_mib": r["rss_mib"], "by_query": by_query,
            "groups_read": int(m[3]), "mib": float(m[5]), "inner": float(m[6])}


def recall(got: list[list[str]], exact: list[list[str]]) -> float:
    return sum(len(set(g) & set(e)) for g, e in zip(got, exact)) / (10 * len(exact))


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def duck(args, index: Path, qfile: Path, sql: str) -> dict:
    cfg = {"query": str(qfile), "setup": [f"SET threads = {args.threads}"], "sql": sql}
    r = measured([sys.executable, "-c", DUCK_CHILD, json.dumps(cfg)])
    if r["rc"] != 0:
        raise SystemExit(f"duckdb failed: {r['stderr']}")
    d = json.loads(r["stdout"].strip().splitlines()[-1])
    d.update(wall=r["wall"], rss_mib=r["rss_mib"])
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/rsembed-ivf-bench"))
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--small-rows", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--lists", type=int, default=1000)
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--spread", type=float, default=0.2)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--duck-queries", type=int, default=5)
    ap.add_argument("--rows-per-file", type=int, default=10_000)
    ap.add_argument("--nprobe", default="1,2,4,8,16,32,63,128")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--spill-dir")
    ap.add_argument("--regen", action="store_true", help="remake the data and the compactions")
    ap.add_argument("--no-faiss", action="store_true")
    ap.add_argument("--batch", default="1000,10000",
                    help="batch sizes B (queries per process; empty: no batches)")
    ap.add_argument("--batch-nprobe", default="2,DEFAULT",
                    help="nprobe values of the batches (DEFAULT: rsembed's default)")
    ap.add_argument("--embedding-type", default="f32", choices=["f32", "f16", "int8"],
                    help="stored type of the synthetic data (int8: the 10^7-row run on a small disk)")
    ap.add_argument("--rsembed", type=Path, default=ROOT / "target/release/rsembed")
    ap.add_argument("--synth", type=Path, default=ROOT / "target/release/examples/synth_index")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    res: dict = {"args": {k: str(v) for k, v in vars(args).items()}}

    big, small = args.work / "job", args.work / "job-small"
    res["synth"] = synth(args, args.rows, big)
    res["synth_small"] = synth(args, args.small_rows, small)
    ivf, ivf_small = args.work / "ivf", args.work / "ivf-small"
    res["compact"] = compact(args, big, ivf)
    res["compact_small"] = compact(args, small, ivf_small)
    # The same rows per list as the big dataset, so the same row-group size:
    # what search's memory depends on, the row count aside.
    small_lists = max(1, round(args.lists * args.small_rows / args.rows))
    ivf_small_eq = args.work / f"ivf-small-{small_lists}"
    res["compact_small_eq"] = compact(args, small, ivf_small_eq, small_lists)
    # The draw is split in a child process: this one forks every measured
    # command, and Linux keeps a child's peak RSS from before its exec, so
    # 10^4 queries held here as Python floats would show in every number.
    split = subprocess.run([sys.executable, "-c", SPLIT_CHILD, json.dumps({
        "drawn": str(big / "queries.json"), "head": args.queries, "batches": batches(args),
        "work": str(args.work)})], capture_output=True, text=True)
    if split.returncode != 0:
        raise SystemExit(f"{big}/queries.json: {split.stderr.strip()}: rerun with --regen")
    queries = json.loads((args.work / "queries-head.json").read_text())
    qfile = args.work / "q.json"
    default = min(args.lists, max(8, math.ceil(args.lists / 16)))

    print(f"exact scans of {len(queries)} queries ...", file=sys.stderr)
    exact = [search(args, ivf, q, "all", qfile) for q in queries]
    truth = [e["ids"] for e in exact]
    sweep = []
    for p in sorted({int(p) for p in args.nprobe.split(",")} | {default}):
        print(f"nprobe {p} ...", file=sys.stderr)
        runs = [search(args, ivf, q, str(p), qfile) for q in queries]
        sweep.append({"nprobe": p, "recall": recall([r["ids"] for r in runs], truth),
                      "median_s": med(runs, "wall"), "inner_s": med(runs, "inner"),
                      "mib": med(runs, "mib"), "groups_read": med(runs, "groups_read"),
                      "groups": runs[0]["groups"], "scored": med(runs, "scored"),
                      "rss_mib": max(r["rss_mib"] for r in runs)})
    res["exact"] = {"median_s": med(exact, "wall"), "inner_s": med(exact, "inner"),
                    "mib": med(exact, "mib"), "groups": exact[0]["groups"],
                    "rss_mib": max(r["rss_mib"] for r in exact)}
    res["sweep"] = sweep
    # Row-count independence of search's memory: the default probe and the
    # exact scan on the small dataset, same queries.
    qs = queries[: min(10, len(queries))]
    small_default = min(small_lists, max(8, math.ceil(small_lists / 16)))
    res["small"] = {
        "default_rss_mib": max(search(args, ivf_small, q, str(default), qfile)["rss_mib"] for q in qs),
        "exact_rss_mib": max(search(args, ivf_small, q, "all", qfile)["rss_mib"] for q in qs),
        "lists_eq": small_lists,
        "default_eq_rss_mib": max(search(args, ivf_small_eq, q, str(small_default), qfile)["rss_mib"]
                                  for q in qs),
        "exact_eq_rss_mib": max(search(args, ivf_small_eq, q, "all", qfile)["rss_mib"] for q in qs),
    }

    # DuckDB: exact, and the documented probe, on the same files.
    chips = f"{ivf}/chips/*.parquet"
    # int8 rows rank by dot(i, q) / |i|: the per-row scale cancels in the cosine.
    score = ("list_dot_product(embedding, $q::FLOAT[])" if args.embedding_type != "int8" else
             "list_dot_product(embedding::FLOAT[], $q::FLOAT[]) / "
             "sqrt(list_dot_product(embedding::FLOAT[], embedding::FLOAT[]))")
    exact_sql = (f"SELECT chip_id, {score} AS s "
                 f"FROM read_parquet('{chips}') ORDER BY s DESC LIMIT 10")
    probe_sql = (f"WITH probed AS (SELECT list FROM '{ivf}/centroids.parquet' "
                 f"ORDER BY list_dot_product(centroid, $q::FLOAT[]) DESC LIMIT {default}) "
                 f"SELECT c.chip_id, {score.replace('embedding', 'c.embedding')} AS s "
                 f"FROM read_parquet('{chips}') c SEMI JOIN probed p ON c.list = p.list "
                 f"ORDER BY s DESC LIMIT 10")
    dq = queries[: args.duck_queries]
    de, dp = [], []
    for q in dq:
        qfile.write_text(json.dumps(q))
        de.append(duck(args, ivf, qfile, exact_sql))
        dp.append(duck(args, ivf, qfile, probe_sql))
    res["duckdb"] = {
        "exact": {"median_s": med(de, "wall"), "query_s": med(de, "query_s"),
                  "rss_mib": max(d["rss_mib"] for d in de),
                  "recall": recall([d["ids"] for d in de], truth[: len(dq)])},
        "probe": {"nprobe": default, "median_s": med(dp, "wall"), "query_s": med(dp, "query_s"),
                  "rss_mib": max(d["rss_mib"] for d in dp),
                  "recall": recall([d["ids"] for d in dp], truth[: len(dq)])},
    }

    batch_nprobe = sorted({default if p == "DEFAULT" else int(p)
                           for p in args.batch_nprobe.split(",") if p.strip()})
    res["batches"] = []
    for b in batches(args):
        vectors = args.work / f"vectors-{b}.jsonl"
        for p in batch_nprobe:
            print(f"batch of {b}, nprobe {p} ...", file=sys.stderr)
            r = batch_search(args, ivf, vectors, p)
            head = [r["by_query"].get(i + 1, []) for i in range(len(queries))]
            res["batches"].append({"queries": b, "nprobe": p, "wall": r["wall"],
                                   "per_query_s": r["wall"] / b, "rss_mib": r["rss_mib"],
                                   "inner_s": r["inner"], "mib": r["mib"],
                                   "groups_read": r["groups_read"],
                                   "recall": recall(head, truth)})

    if not args.no_faiss:
        print("faiss ...", file=sys.stderr)
        cfg = {"chips": f"{ivf}/chips", "dim": args.dim, "lists": args.lists,
               "sample": int(res["compact"]["ivf"]["sample"]), "threads": args.threads,
               "queries": str(args.work / "queries-head.json"),
               "batch": batches(args), "batch_nprobe": batch_nprobe, "head": len(queries),
               "batch_queries": str(big / "queries.json"),
               "nprobe": sorted({int(p) for p in args.nprobe.split(",")} | {default})}
        r = measured([sys.executable, "-c", FAISS_CHILD, json.dumps(cfg)])
        if r["rc"] != 0:
            raise SystemExit(f"faiss failed: {r['stderr']}")
        f = json.loads(r["stdout"].strip().splitlines()[-1])
        res["faiss"] = {"load_s": f["load_s"], "build_s": f["build_s"], "rss_mib": r["rss_mib"],
                        "wall": r["wall"],
                        "sweep": [{"nprobe": s["nprobe"], "median_s": s["median_s"],
                                   "recall": recall(s["hits"], truth)} for s in f["sweep"]],
                        "batches": [{"queries": b["queries"], "nprobe": b["nprobe"],
                                     "wall": b["wall"], "per_query_s": b["wall"] / b["queries"],
                                     "recall": recall(b["hits"], truth)}
                                    for b in f["batches"]]}

    (args.work / "ivf-bench.json").write_text(json.dumps(res, indent=1))
    report(res, default)


def report(res: dict, default: int) -> None:
    s, c, e = res["synth"], res["compact"], res["exact"]
    print(f"\n{s['rows']:,} rows, D={s['dim']}, {s['files']} files, {s['bytes'] / 2**30:.2f} GiB; "
          f"{len(res['sweep'])} nprobe values")
    print(f"compact --lists {c['ivf']['lists']}: {c['wall']:.1f} s, peak RSS {c['rss_mib']:.0f} MiB "
          f"(k-means on {c['ivf']['sample']} rows, {c['ivf']['iterations']} iterations, "
          f"{c['ivf']['empty_lists']} empty lists; {c['row_groups']} row groups); "
          f"at {res['synth_small']['rows']:,} rows: {res['compact_small']['wall']:.1f} s, "
          f"{res['compact_small']['rss_mib']:.0f} MiB")
    print(f"\n{'search':<22} {'recall@10':>9} {'median s':>9} {'x exact':>8} {'MiB':>8} "
          f"{'of exact':>8} {'groups':>11} {'RSS MiB':>8}")
    print(f"{'exact (--nprobe all)':<22} {1.0:>9.3f} {e['median_s']:>9.3f} {1.0:>8.2f} "
          f"{e['mib']:>8.1f} {1.0:>8.3f} {e['groups']:>5}/{e['groups']:<5} {e['rss_mib']:>8.0f}")
    for r in res["sweep"]:
        name = f"--nprobe {r['nprobe']}" + (" (default)" if r["nprobe"] == default else "")
        print(f"{name:<22} {r['recall']:>9.3f} {r['median_s']:>9.3f} "
              f"{e['median_s'] / r['median_s']:>8.2f} {r['mib']:>8.1f} {r['mib'] / e['mib']:>8.3f} "
              f"{int(r['groups_read']):>5}/{r['groups']:<5} {r['rss_mib']:>8.0f}")
    sm = res["small"]
    d = next(r for r in res["sweep"] if r["nprobe"] == default)
    print(f"\npeak RSS of search, {res['synth_small']['rows']:,} -> {s['rows']:,} rows: "
          f"default {sm['default_rss_mib']:.0f} -> {d['rss_mib']:.0f} MiB, "
          f"exact {sm['exact_rss_mib']:.0f} -> {e['rss_mib']:.0f} MiB (same lists: row groups "
          f"{res['synth_small']['rows'] // c['ivf']['lists']} -> {s['rows'] // c['ivf']['lists']} rows)")
    print(f"  at the same rows per list ({sm['lists_eq']} lists at {res['synth_small']['rows']:,} rows): "
          f"default {sm['default_eq_rss_mib']:.0f} -> {d['rss_mib']:.0f} MiB, "
          f"exact {sm['exact_eq_rss_mib']:.0f} -> {e['rss_mib']:.0f} MiB")
    dd = res["duckdb"]
    print(f"\nDuckDB exact:            {dd['exact']['median_s']:.2f} s (query {dd['exact']['query_s']:.2f} s), "
          f"RSS {dd['exact']['rss_mib']:.0f} MiB, recall {dd['exact']['recall']:.3f}")
    print(f"DuckDB probe (P={default}):    {dd['probe']['median_s']:.2f} s (query {dd['probe']['query_s']:.2f} s), "
          f"RSS {dd['probe']['rss_mib']:.0f} MiB, recall {dd['probe']['recall']:.3f}")
    if "faiss" in res:
        f = res["faiss"]
        print(f"\nFAISS IVF-Flat: load {f['load_s']:.1f} s, build {f['build_s']:.1f} s, "
              f"peak RSS {f['rss_mib']:.0f} MiB (in memory)")
        for r in f["sweep"]:
            print(f"  nprobe {r['nprobe']:>4}: recall@10 {r['recall']:.3f}, {r['median_s'] * 1e3:.2f} ms/query")
    if res.get("batches"):
        fb = {(b["queries"], b["nprobe"]): b for b in res.get("faiss", {}).get("batches", [])}
        print(f"\n{'batch':>6} {'nprobe':>6} {'recall':>7} {'ms/query':>9} {'RSS MiB':>8} "
              f"{'FAISS recall':>12} {'FAISS ms/query':>14} {'ours / FAISS':>12}")
        for b in res["batches"]:
            f = fb.get((b["queries"], b["nprobe"]))
            tail = (f"{f['recall']:>12.3f} {f['per_query_s'] * 1e3:>14.3f} "
                    f"{b['per_query_s'] / f['per_query_s']:>12.2f}") if f else ""
            print(f"{b['queries']:>6} {b['nprobe']:>6} {b['recall']:>7.3f} "
                  f"{b['per_query_s'] * 1e3:>9.3f} {b['rss_mib']:>8.0f} {tail}")


if __name__ == "__main__":
    main()
