#!/usr/bin/env python3
"""A resident search (`rsembed search --vectors -`) against FAISS IVF-Flat, one
query at a time, in one run.

Both sides hold their index open and answer one query before the next is
asked: rsembed reads each query's row groups from the files (the OS page
cache, after the first touch) and returns whole results (chip id, footprint,
source...); FAISS scores vectors it holds in memory and returns row numbers.
Per query, the median and 90th percentile of the round trip (write a line,
read the answer) for rsembed, of `index.search` for FAISS; peak RSS of each
process (rsembed's VmHWM, FAISS's maxrss); recall@10 of both against the
exact answer (rsembed's `--nprobe all` session).

Uses the data of bench/ivf.py (`--work`: `ivf/` and `queries-head.json`);
run that first. Needs faiss-cpu, numpy and pyarrow (the venv of .ci/run).

    .cache/venv/bin/python bench/resident.py --work /tmp/rsembed-ivf-1e6 --nprobe 2,63
    .cache/venv/bin/python bench/resident.py --work /tmp/rsembed-ivf-1e6 --nprobe 1,2,8 --passes 4

`--index ivf8` searches another compaction of the same chips (int8, say) against
the same truth and the same FAISS; `--baseline BIN` runs an older binary's
sessions alternately with ours; `--baseline-index ivf-old` runs our binary on another
layout of the same chips alternately instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ivf import FAISS_CHILD, recall  # noqa: E402
from search import measured  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def vm_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def session(args, nprobe: str, queries: list[str], index: str = "ivf",
            rsembed: Path | None = None) -> dict:
    """One resident search answering `queries` (JSON lines) one at a time,
    `args.passes` times over."""
    cmd = [str(rsembed or args.rsembed), "search", "--index", str(args.work / index), "--vectors",
           "-", "--nprobe", nprobe, "--top-k", "10"]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, bufsize=1)
    times, hits = [], []
    for _ in range(args.passes):
        for q in queries:
            s = time.perf_counter()
            p.stdin.write(q + "\n")
            p.stdin.flush()
            line = p.stdout.readline()
            times.append(time.perf_counter() - s)
            a = json.loads(line)
            if "results" not in a:
                raise SystemExit(f"rsembed answered {line!r}")
            hits.append([r["chip_id"] for r in a["results"]])
    later = times[len(queries):]
    times, hits = times[:len(queries)], hits[:len(queries)]
    rss = vm_hwm_mib(p.pid)
    p.stdin.close()
    err = p.stderr.read()
    if p.wait() != 0:
        raise SystemExit(f"rsembed failed: {err}")
    # The first answer includes opening the index (footers, centroids).
    rest = sorted(times[1:])
    return {"nprobe": nprobe, "first_s": times[0], "median_s": statistics.median(rest),
            "again_s": statistics.median(later) if later else None,
            "p90_s": rest[int(0.9 * (len(rest) - 1))], "rss_mib": rss,
            "wall": time.perf_counter() - t0, "hits": hits, "closing": err.strip().splitlines()[-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/rsembed-ivf-bench"))
    ap.add_argument("--nprobe", default="2,63")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-faiss", action="store_true")
    ap.add_argument("--rsembed", type=Path, default=ROOT / "target/release/rsembed")
    ap.add_argument("--index", default="ivf",
                    help="the folder under --work the sessions search (e.g. an int8 compaction "
                         "of the same chips); recall is always against the exact answer of "
                         "`ivf`, and FAISS always reads `ivf`'s float32 chips")
    ap.add_argument("--passes", type=int, default=1,
                    help="answer the queries this many times in each session: the first pass "
                         "reads every list for the first time, later ones (the 'again' columns) "
                         "read lists the session has read before, as FAISS holds all of them")
    ap.add_argument("--baseline", type=Path,
                    help="another rsembed binary whose sessions run alternately with ours, "
                         "for ratios from the same run")
    ap.add_argument("--baseline-index",
                    help="the folder under --work the baseline sessions search (default --index): "
                         "with no --baseline, our binary on another layout of the same chips")
    args = ap.parse_args()
    compact = json.loads((args.work / "ivf" / "compact.json").read_text())
    head = args.work / "queries-head.json"
    queries = [json.dumps(q) for q in json.loads(head.read_text())]
    probes = [p.strip() for p in args.nprobe.split(",") if p.strip()]
    print(f"exact session, {len(queries)} queries ...", file=sys.stderr)
    exact = session(args, "all", queries)
    truth = exact["hits"]
    res = {"rows": compact["rows"], "lists": compact["ivf"]["lists"], "queries": len(queries),
           "exact": {k: v for k, v in exact.items() if k != "hits"}, "rsembed": []}
    res["index"] = args.index
    for p in probes:
        print(f"nprobe {p} ...", file=sys.stderr)
        s = session(args, p, queries, args.index)
        s["recall"] = recall(s.pop("hits"), truth)
        if args.baseline or args.baseline_index:
            b = session(args, p, queries, args.baseline_index or args.index, args.baseline)
            s["baseline"] = {"median_s": b["median_s"], "rss_mib": b["rss_mib"],
                             "recall": recall(b.pop("hits"), truth)}
        res["rsembed"].append(s)
    if not args.no_faiss:
        print("faiss ...", file=sys.stderr)
        cfg = {"chips": str(args.work / "ivf" / "chips"), "dim": len(json.loads(queries[0])),
               "lists": compact["ivf"]["lists"], "sample": int(compact["ivf"]["sample"]),
               "threads": args.threads, "queries": str(head), "batch": [], "batch_nprobe": [],
               "head": len(queries), "batch_queries": "", "nprobe": [int(p) for p in probes]}
        r = measured([sys.executable, "-c", FAISS_CHILD, json.dumps(cfg)])
        if r["rc"] != 0:
            raise SystemExit(f"faiss failed: {r['stderr']}")
        f = json.loads(r["stdout"].strip().splitlines()[-1])
        res["faiss"] = {"load_s": f["load_s"], "build_s": f["build_s"], "rss_mib": r["rss_mib"],
                        "sweep": [{"nprobe": s["nprobe"], "median_s": s["median_s"],
                                   "recall": recall(s["hits"], truth)} for s in f["sweep"]]}
    (args.work / f"resident-bench-{args.index}.json").write_text(json.dumps(res, indent=1))

    print(f"\n{res['rows']:,} rows, {res['lists']} lists, {len(queries)} queries one at a time, "
          f"searching {args.index}")
    e = res["exact"]
    print(f"exact session: first answer {e['first_s'] * 1e3:.1f} ms, then median "
          f"{e['median_s'] * 1e3:.1f} ms, {e['rss_mib']:.0f} MiB")
    fs = {s["nprobe"]: s for s in res.get("faiss", {}).get("sweep", [])}
    print("| nprobe | rsembed first ms | rsembed median ms | p90 ms | FAISS median ms | ours / FAISS "
          "| recall ours | recall FAISS | RSS MiB | RSS / FAISS's |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s in res["rsembed"]:
        f = fs.get(int(s["nprobe"]))
        fm = f"{f['median_s'] * 1e3:.2f}" if f else "-"
        ratio = f"{s['median_s'] / f['median_s']:.2f}" if f else "-"
        fr = f"{f['recall']:.3f}" if f else "-"
        rr = f"{s['rss_mib'] / res['faiss']['rss_mib']:.3f}" if f else "-"
        print(f"| {s['nprobe']} | {s['first_s'] * 1e3:.1f} | {s['median_s'] * 1e3:.2f} | "
              f"{s['p90_s'] * 1e3:.2f} | {fm} | {ratio} | {s['recall']:.3f} | {fr} | "
              f"{s['rss_mib']:.0f} | {rr} |")
    if args.passes > 1:
        print(f"\nPasses 2-{args.passes} (lists read before):")
        print("| nprobe | rsembed again ms | FAISS median ms | again / FAISS |")
        print("| ---: | ---: | ---: | ---: |")
        for s in res["rsembed"]:
            f = fs.get(int(s["nprobe"]))
            fm = f"{f['median_s'] * 1e3:.2f}" if f else "-"
            ratio = f"{s['again_s'] / f['median_s']:.2f}" if f else "-"
            print(f"| {s['nprobe']} | {s['again_s'] * 1e3:.2f} | {fm} | {ratio} |")
    if args.baseline or args.baseline_index:
        print("| nprobe | baseline median ms | ours median ms | ours / baseline | baseline RSS MiB |")
        print("| ---: | ---: | ---: | ---: | ---: |")
        for s in res["rsembed"]:
            b = s["baseline"]
            print(f"| {s['nprobe']} | {b['median_s'] * 1e3:.2f} | {s['median_s'] * 1e3:.2f} | "
                  f"{s['median_s'] / b['median_s']:.3f} | {b['rss_mib']:.0f} |")
    if "faiss" in res:
        f = res["faiss"]
        print(f"FAISS: load {f['load_s']:.1f} s, build {f['build_s']:.1f} s, peak {f['rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
