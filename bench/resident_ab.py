#!/usr/bin/env python3
"""Resident searches of two or more (binary, index) configurations, in
alternating rounds, for ratios that survive a noisy machine.

Each session is `rsembed search --vectors -` answering the 50 queries of
`queries-head.json` (bench/ivf.py's data) one at a time, REPS times over; its
time is the median round trip after the first pass (which opens the index).
Every round runs every configuration once, in turn, at each nprobe; a
configuration's time is the median over the rounds.

    .cache/venv/bin/python bench/resident_ab.py --work /tmp/rsembed-ivf-1e6 \\
        --config old=/tmp/rsembed-old:ivf --config new=target/release/rsembed:ivf \\
        --nprobe 1,2,8,63 --rounds 5
    .cache/venv/bin/python bench/resident_ab.py ... --random 2000 --reps 1 --nprobe 1

`--random N --reps 1` asks N random unit vectors once each: lists all over the
index, more than a resident session keeps mapped.

The first configuration is the baseline of the printed ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path


def session(binary: str, index: Path, nprobe: str, queries: list[str], reps: int) -> float:
    p = subprocess.Popen([binary, "search", "--index", str(index), "--vectors", "-",
                          "--nprobe", nprobe, "--top-k", "10"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, bufsize=1)
    times = []
    for _ in range(reps):
        for q in queries:
            s = time.perf_counter()
            p.stdin.write(q + "\n")
            p.stdin.flush()
            if "results" not in p.stdout.readline():
                raise SystemExit(f"{binary} gave no results at nprobe {nprobe}")
            times.append(time.perf_counter() - s)
    p.stdin.close()
    if p.wait() != 0:
        raise SystemExit(f"{binary} failed")
    # Without repeats: every answer but the first (which opens the index).
    return statistics.median(times[len(queries):] if reps > 1 else times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/rsembed-ivf-1e6"))
    ap.add_argument("--config", action="append", required=True,
                    help="NAME=BINARY:INDEX (INDEX a folder under --work)")
    ap.add_argument("--nprobe", default="1,2,8,63")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--random", type=int, default=0,
                    help="ask N random unit vectors (once each with --reps 1) instead of "
                         "queries-head.json")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    configs = []
    for c in args.config:
        name, rest = c.split("=", 1)
        binary, index = rest.rsplit(":", 1)
        configs.append((name, binary, args.work / index))
    if args.random:
        # Unit vectors drawn at random: they probe lists all over the
        # index, more than a session keeps mapped, so most lists are read
        # for the first time (the cold side of a resident session).
        import random
        rng = random.Random(args.seed)
        dim = len(json.loads((args.work / "queries-head.json").read_text())[0])
        queries = []
        for _ in range(args.random):
            v = [rng.gauss(0.0, 1.0) for _ in range(dim)]
            n = sum(x * x for x in v) ** 0.5
            queries.append(json.dumps([x / n for x in v]))
    else:
        queries = [json.dumps(q) for q in json.loads((args.work / "queries-head.json").read_text())]
    probes = [p.strip() for p in args.nprobe.split(",") if p.strip()]
    got: dict = {p: {n: [] for n, _, _ in configs} for p in probes}
    for p in probes:
        for _ in range(args.rounds):
            for name, binary, index in configs:
                got[p][name].append(session(binary, index, p, queries, args.reps))
    base = configs[0][0]
    names = [n for n, _, _ in configs]
    print(f"| nprobe | {' | '.join(f'{n} ms' for n in names)} | "
          f"{' | '.join(f'{n} ÷ {base}' for n in names[1:])} |")
    print("| ---: |" + " ---: |" * (2 * len(names) - 1))
    for p in probes:
        med = {n: statistics.median(v) for n, v in got[p].items()}
        cells = [f"{med[n] * 1e3:.3f}" for n in names]
        ratios = [f"{med[n] / med[base]:.3f}" for n in names[1:]]
        print(f"| {p} | {' | '.join(cells)} | {' | '.join(ratios)} |")
    (args.work / "resident-ab.json").write_text(json.dumps(got, indent=1))


if __name__ == "__main__":
    main()
