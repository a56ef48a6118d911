#!/usr/bin/env python3
"""One-shot searches of two or more rsembed binaries, run alternately, for
ratios of wall time and peak RSS that survive a noisy machine.

Each round runs every (index, probe, binary) once, in turn: `rsembed search
--index INDEX --vector QUERY [--nprobe all]`. A configuration's wall time and
peak RSS (the child's own `ru_maxrss`, from `wait4`) are medians over the
rounds; ratios are against the first binary.

    .cache/venv/bin/python bench/oneshot_ab.py --rounds 7 \\
        --binary base=/tmp/rsembed-old --binary new=target/release/rsembed \\
        --index 1e6=/tmp/rss/1e6/ivf:/tmp/rss/q-1e6.json \\
        --index 1e7=/tmp/rss/1e7/ivf:/tmp/rss/q-1e7.json --probe default,all

The indexes are `synth_index` + `compact --lists` outputs (docs/benchmarks.md says
which); QUERY is a JSON array of D floats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time


def one(binary: str, index: str, query: str, probe: str) -> tuple[float, float]:
    cmd = [binary, "search", "--index", index, "--vector", query]
    if probe != "default":
        cmd += ["--nprobe", probe]
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    secs = time.perf_counter() - t
    err = p.stderr.read().decode()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {err}")
    return secs, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", action="append", required=True, help="NAME=PATH")
    ap.add_argument("--index", action="append", required=True, help="NAME=INDEX:QUERY")
    ap.add_argument("--probe", default="default,all", help="default, all or a number, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    binaries = [b.split("=", 1) for b in args.binary]
    indexes = [(n, *rest.rsplit(":", 1)) for n, rest in (i.split("=", 1) for i in args.index)]
    probes = [p.strip() for p in args.probe.split(",") if p.strip()]
    got: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for name, index, query in indexes:
            for probe in probes:
                for b, path in binaries:
                    got.setdefault((name, probe, b), []).append(one(path, index, query, probe))
    base = binaries[0][0]
    print(f"{args.rounds} alternating rounds; medians; ratios against {base}")
    print("| index | probe | binary | wall ms | ÷ base | peak RSS MiB | RSS runs |")
    print("| --- | --- | --- | ---: | ---: | ---: | --- |")
    for name, _, _ in indexes:
        for probe in probes:
            t0 = statistics.median(s for s, _ in got[(name, probe, base)])
            for b, _ in binaries:
                runs = got[(name, probe, b)]
                t = statistics.median(s for s, _ in runs)
                rss = statistics.median(r for _, r in runs)
                print(f"| {name} | {probe} | {b} | {t * 1e3:.1f} | {t / t0:.3f} | {rss:.1f} | "
                      f"{', '.join(f'{r:.0f}' for _, r in runs)} |")


if __name__ == "__main__":
    main()
