#!/usr/bin/env python3
"""`rsembed search` against DuckDB over the same synthetic index, in one run.

Makes the datasets with `cargo run --release --example synth_index` (the
workers' own Parquet writer: task-sized chip files of one scene each, random
unit embeddings, a query vector with planted winners), then, with warm page
caches and alternating the order in every repetition:

1. top-K over the whole index: `rsembed search --vector q.json --top-k K`
   against DuckDB's `ORDER BY array_cosine_similarity(...) DESC LIMIT K`
   (plus the `list_cosine_similarity` and `array_inner_product` spellings);
   each in a fresh process, so whole-process wall time and peak RSS are
   comparable; the time inside (rsembed's own closing line; DuckDB's connect
   to fetchall, after `import duckdb`) is reported too. Both top-K lists must
   agree. rsembed also runs under GLIBC_TUNABLES that make malloc keep freed
   memory (`--no-tunables` to skip): a diagnostic, not a product setting,
   of how much of its time is page faults on fresh allocations.
2. peak RSS at `--rows` and `--mem-rows` rows: bounded memory is flat.
3. `--bbox` over `--bbox-frac` of the region, on the task-file layout and on
   the `rsembed compact` layout when compaction works: rows scored, row
   groups read, bytes fetched, time; DuckDB with the equivalent `WHERE` on
   the bbox struct for comparison.

Standard library only; DuckDB runs under `--duckdb-python` (an interpreter
with duckdb installed, default this one). Peak RSS comes from wait4(2)'s
ru_maxrss of each child; DuckDB's bytes are the rchar delta of
/proc/self/io around its query, rsembed's its own counter.

    .cache/venv/bin/python bench/search.py --reps 9
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REGION = (-10.0, 35.0, 30.0, 60.0)  # W, S, E, N of synth_index's scenes

DUCK_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import duckdb
def io():
    with open('/proc/self/io') as f:
        return {k: int(v) for k, v in (l.split(':') for l in f)}
cfg = json.loads(sys.argv[1])
with open(cfg['query']) as f:
    q = json.load(f)
t1 = time.perf_counter()
io0 = io()
con = duckdb.connect()
for stmt in cfg['setup']:
    con.execute(stmt)
rows = con.execute(cfg['sql'], {'q': q}).fetchall()
t2 = time.perf_counter()
io1 = io()
print(json.dumps({'ids': [r[0] for r in rows], 'scores': [r[1] for r in rows],
                  'import_s': t1 - t0, 'query_s': t2 - t1,
                  'rchar': io1['rchar'] - io0['rchar'],
                  'threads': con.execute("select current_setting('threads')").fetchone()[0],
                  'version': duckdb.__version__}))
"""

STATS = re.compile(
    r"scored (\d+) of (\d+) rows; read (\d+) of (\d+) row groups.*?; ([\d.]+) MiB fetched; ([\d.]+) s"
)


def measured(cmd: list[str], env: dict | None = None) -> dict:
    """Runs cmd; wall seconds, peak RSS (MiB, from wait4), stdout, stderr, rc.

    Linux carries a forked child's resident set from before its exec into
    its peak: a child of a parent holding 400 MiB reports at least that.
    Keep this process small (big inputs go through files and child
    processes); it says so on stderr when it is not.
    """
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if own > 64:
        print(f"measured: this process has peaked at {own:.0f} MiB, which the child's "
              "peak RSS may include", file=sys.stderr)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {
            "wall": wall,
            "rss_mib": ru.ru_maxrss / 1024,
            "stdout": out.read().decode(),
            "stderr": err.read().decode(),
            "rc": p.returncode,
        }


def synth(args, rows: int, out: Path, scenes_per_file: int = 1) -> dict:
    summary = out / "synth.json"
    if summary.exists() and not args.regen:
        return json.loads(summary.read_text())
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if args.synth_bin:
        cmd = [args.synth_bin]
    else:
        cmd = ["cargo", "run", "--quiet", "--release", "-p", "rsembed-coordinator",
               "--example", "synth_index", "--"]
    cmd += [
        "--output", str(out), "--rows", str(rows), "--dim", str(args.dim),
        "--rows-per-file", str(args.rows_per_file), "--seed", str(args.seed),
        "--scenes-per-file", str(scenes_per_file),
    ]
    print("+", " ".join(cmd), file=sys.stderr)
    r = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    s = json.loads(r.stdout.strip().splitlines()[-1])
    summary.write_text(json.dumps(s))
    return s


# glibc malloc settings under which freed memory is kept for reuse instead of
# being returned to the kernel (large blocks are mmap'ed and unmapped per
# allocation by default): a diagnostic of how much of a scan is page faults.
TUNABLES = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=4294967296"


def ours(args, index: Path, query: str, bbox=None, tunables=False) -> dict:
    cmd = [args.rsembed, "search", "--index", str(index), "--vector", query,
           "--top-k", str(args.top_k), "--json"]
    if bbox:
        cmd += ["--bbox", ",".join(f"{v:.6f}" for v in bbox)]
    env = dict(os.environ, GLIBC_TUNABLES=TUNABLES) if tunables else None
    r = measured(cmd, env)
    if r["rc"] != 0:
        raise SystemExit(f"rsembed search failed: {r['stderr']}")
    hits = [json.loads(l) for l in r["stdout"].splitlines() if l.strip()]
    m = STATS.search(r["stderr"])
    if not m:
        raise SystemExit(f"no statistics line in: {r['stderr']}")
    return {
        "wall": r["wall"], "rss_mib": r["rss_mib"],
        "ids": [h["chip_id"] for h in hits], "scores": [h["cosine"] for h in hits],
        "scored": int(m[1]), "rows": int(m[2]), "groups_read": int(m[3]),
        "groups": int(m[4]), "mib": float(m[5]), "inner": float(m[6]),
    }


def search_json(rsembed: str, index: Path, extra: list[str]) -> dict:
    """`rsembed search --index INDEX --json EXTRA` in a fresh process: wall
    seconds, peak RSS, the closing line's seconds and MiB, and the hits."""
    r = measured([rsembed, "search", "--index", str(index), "--json"] + extra)
    if r["rc"] != 0:
        raise SystemExit(f"search failed: {r['stderr']}")
    m = STATS.search(r["stderr"])
    if not m:
        raise SystemExit(f"no statistics line in: {r['stderr']}")
    hits = [json.loads(line) for line in r["stdout"].splitlines() if line.strip()]
    return {"wall": r["wall"], "rss_mib": r["rss_mib"], "inner": float(m[6]),
            "mib": float(m[5]), "hits": hits}


def duck_sql(variant: str, glob: str, dim: int, k: int, bbox=None) -> str:
    expr = {
        "array": f"array_cosine_similarity(embedding::FLOAT[{dim}], $q::FLOAT[{dim}])",
        "list": "list_cosine_similarity(embedding, $q::FLOAT[])",
        "inner": f"array_inner_product(embedding::FLOAT[{dim}], $q::FLOAT[{dim}])",
    }[variant]
    where = ""
    if bbox:
        w, s, e, n = bbox
        where = (f" WHERE bbox.xmin <= {e} AND bbox.xmax >= {w}"
                 f" AND bbox.ymin <= {n} AND bbox.ymax >= {s}")
    return (f"SELECT chip_id, {expr} AS s FROM read_parquet('{glob}'){where}"
            f" ORDER BY s DESC LIMIT {k}")


def duck(args, index: Path, query: str, variant: str, bbox=None) -> dict:
    glob = str(index / "chips" / "*.parquet")
    # DuckDB 2.0.0 fails on a top-N whose scan filters a struct field under
    # late materialization ("Vector::Reference used on vector of different
    # type"; duckdb/duckdb#24252): the bbox queries run without it.
    setup = ["SET disabled_optimizers = 'late_materialization'"] if bbox else []
    cfg = {"query": query, "setup": setup,
           "sql": duck_sql(variant, glob, args.dim, args.top_k, bbox)}
    r = measured([args.duckdb_python, "-c", DUCK_CHILD, json.dumps(cfg)])
    if r["rc"] != 0:
        raise SystemExit(f"duckdb failed: {r['stderr']}")
    d = json.loads(r["stdout"].strip().splitlines()[-1])
    d.update(wall=r["wall"], rss_mib=r["rss_mib"], mib=d["rchar"] / 2**20, inner=d["query_s"])
    return d


def agree(a: dict, b: dict, what: str) -> str:
    """Same chip ids in the same order, or only swapped within float noise."""
    if a["ids"] == b["ids"]:
        return "same"
    if set(a["ids"]) == set(b["ids"]):
        return "same set, order differs (ties)"
    # Differences only at the tail may be ties of the K-th score.
    diff = [i for i, (x, y) in enumerate(zip(a["ids"], b["ids"])) if x != y]
    tail = min(diff)
    if abs(a["scores"][tail] - b["scores"][tail]) < 1e-5:
        return f"same to rank {tail}, tie at the tail"
    raise SystemExit(f"{what}: top-K lists disagree:\n{a['ids']}\n{b['ids']}")


def rounds(n: int, sides: dict) -> dict:
    """Runs each side once per repetition, alternating the order; a warm-up
    round first (discarded) so both read from the page cache."""
    names = list(sides)
    for name in names:
        sides[name]()
    runs = {name: [] for name in names}
    for rep in range(n):
        order = names if rep % 2 == 0 else names[::-1]
        for name in order:
            runs[name].append(sides[name]())
    return runs


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def bbox_of(planted: list[dict], frac: float) -> list[float]:
    """A box over `frac` of the region, centred on the second planted chip
    (clamped into the region), so the filtered top-K holds a planted winner."""
    w0, s0, e0, n0 = REGION
    bw, bh = (e0 - w0) * math.sqrt(frac), (n0 - s0) * math.sqrt(frac)
    cx, cy = planted[min(1, len(planted) - 1)]["centre"]
    x = min(max(cx - bw / 2, w0), e0 - bw)
    y = min(max(cy - bh / 2, s0), n0 - bh)
    return [x, y, x + bw, y + bh]


def compact(args, src: Path, dst: Path) -> dict:
    if (dst / "manifest.json").exists() and not args.regen:
        return {"ok": True, "reused": True}
    shutil.rmtree(dst, ignore_errors=True)
    r = measured([args.rsembed, "compact", "--index", str(src), "--output", str(dst),
                  "--target-size", args.target_size])
    ok = r["rc"] == 0 and (dst / "manifest.json").exists()
    msg = (r["stderr"].strip().splitlines() or [""])[-1]
    return {"ok": ok, "wall": r["wall"], "rss_mib": r["rss_mib"], "message": msg}


def fmt_row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--mem-rows", type=int, default=300_000,
                    help="second index size for the memory check (0: skip)")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--rows-per-file", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--bbox-frac", type=float, default=0.05)
    ap.add_argument("--target-size", default="256MB")
    ap.add_argument("--variants", default="array,list,inner",
                    help="DuckDB spellings for the whole-index comparison")
    ap.add_argument("--work", type=Path, default=ROOT / ".cache" / "bench-search")
    ap.add_argument("--rsembed", default=str(ROOT / "target" / "release" / "rsembed"))
    ap.add_argument("--synth-bin", help="a built synth_index example (default: cargo run it)")
    ap.add_argument("--duckdb-python", default=sys.executable)
    ap.add_argument("--no-compact", action="store_true")
    ap.add_argument("--mixed-scenes", type=int, default=8,
                    help="scenes per file of the mixed layout (1: skip it)")
    ap.add_argument("--tunables", action=argparse.BooleanOptionalAction, default=True,
                    help="also time rsembed under GLIBC_TUNABLES that keep freed memory")
    ap.add_argument("--regen", action="store_true", help="rebuild datasets even if present")
    args = ap.parse_args()
    variants = args.variants.split(",")

    idx = args.work / f"idx-{args.rows}-d{args.dim}-f{args.rows_per_file}"
    s = synth(args, args.rows, idx)
    q = s["query"]
    print(f"index: {s['rows']} rows in {s['files']} files, {s['bytes'] / 2**20:.1f} MiB",
          file=sys.stderr)
    results: dict = {"synth": s, "machine": {
        "nproc": os.cpu_count(),
        "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                     if l.startswith("model name")), "?"),
        "loadavg_start": os.getloadavg(),
    }}

    # 1. whole index, top-K.
    sides = {"rsembed": lambda: ours(args, idx, q)}
    if args.tunables:
        sides["rsembed, GLIBC_TUNABLES"] = lambda: ours(args, idx, q, tunables=True)
    for v in variants:
        sides[f"duckdb-{v}"] = (lambda v=v: duck(args, idx, q, v))
    runs = rounds(args.reps, sides)
    for name, rs in runs.items():
        if name.startswith("duckdb"):
            results.setdefault("agreement", {})[name] = agree(runs["rsembed"][0], rs[0], name)
    planted = {p["chip_id"] for p in s["planted"]}
    assert planted <= set(runs["rsembed"][0]["ids"]), "planted winners missing from the top-K"
    results["whole"] = runs

    print(f"\n## Whole index: {s['rows']} rows, D = {args.dim}, top-{args.top_k}, "
          f"{args.reps} reps (median; per-rep ratio median in brackets)\n")
    print(fmt_row(["side", "wall s (process)", "inside s", "peak RSS MiB", "MiB read"]))
    print(fmt_row(["---"] + ["---:"] * 4))
    for name, rs in runs.items():
        print(fmt_row([name, f"{med(rs, 'wall'):.3f}", f"{med(rs, 'inner'):.3f}",
                       f"{med(rs, 'rss_mib'):.0f}", f"{med(rs, 'mib'):.0f}"]))
    ours_sides = [n for n in runs if n.startswith("rsembed")]
    print("\nSpeed ratio = DuckDB time ÷ rsembed time (above 1: rsembed faster); ratio of "
          "the medians, and in brackets the median of the per-repetition ratios.\n")
    print(fmt_row(["DuckDB"] + [f"÷ {o}, {w}" for o in ours_sides for w in ("process", "inside")]))
    print(fmt_row(["---"] + ["---:"] * (2 * len(ours_sides))))
    for name, rs in runs.items():
        if not name.startswith("duckdb"):
            continue
        cells = [name]
        for o in ours_sides:
            base = runs[o]
            for key in ("wall", "inner"):
                per = statistics.median(r[key] / b[key] for r, b in zip(rs, base))
                cells.append(f"{med(rs, key) / med(base, key):.2f} ({per:.2f})")
        print(fmt_row(cells))
    print(f"\nagreement with rsembed's top-{args.top_k}: {results['agreement']}")
    imp = statistics.median(r["import_s"] for r in runs[f"duckdb-{variants[0]}"])
    print(f"python + import duckdb: {imp:.3f} s; DuckDB threads: "
          f"{runs[f'duckdb-{variants[0]}'][0]['threads']}, version "
          f"{runs[f'duckdb-{variants[0]}'][0]['version']}")

    # 2. memory against rows.
    if args.mem_rows:
        big = args.work / f"idx-{args.mem_rows}-d{args.dim}-f{args.rows_per_file}"
        sb = synth(args, args.mem_rows, big)
        mem_sides = {"rsembed": lambda: ours(args, big, sb["query"])}
        if args.tunables:
            mem_sides["rsembed, GLIBC_TUNABLES"] = (
                lambda: ours(args, big, sb["query"], tunables=True))
        mem_sides["duckdb-array"] = lambda: duck(args, big, sb["query"], "array")
        mem = rounds(max(3, args.reps // 2), mem_sides)
        results["agreement"]["mem_rows"] = agree(mem["rsembed"][0], mem["duckdb-array"][0], "big")
        results["mem"] = mem
        print(f"\n## Peak RSS against rows (median of {len(mem['rsembed'])})\n")
        print(fmt_row(["side", f"{args.rows} rows MiB", f"{args.mem_rows} rows MiB",
                       f"wall s at {args.mem_rows}", f"inside s at {args.mem_rows}"]))
        print(fmt_row(["---"] + ["---:"] * 4))
        for name in mem:
            print(fmt_row([name, f"{med(runs[name], 'rss_mib'):.0f}",
                           f"{med(mem[name], 'rss_mib'):.0f}", f"{med(mem[name], 'wall'):.3f}",
                           f"{med(mem[name], 'inner'):.3f}"]))

    # 3. --bbox, task files and compacted.
    box = bbox_of(s["planted"], args.bbox_frac)
    results["bbox"] = box
    layouts = {"task files": idx}
    # Tasks of unrelated inputs: each file holds --mixed-scenes scenes at
    # independent places, so its extent is wide and a bbox prunes little
    # until compaction sorts the rows.
    mixed = None
    if args.mixed_scenes > 1:
        mixed = args.work / f"idx-{args.rows}-d{args.dim}-f{args.rows_per_file}-s{args.mixed_scenes}"
        synth(args, args.rows, mixed, args.mixed_scenes)
        layouts["mixed task files"] = mixed
    if not args.no_compact:
        for src, name in [(idx, "compacted"), (mixed, "mixed compacted")]:
            if src is None:
                continue
            c = compact(args, src, args.work / (src.name + "-compact"))
            results.setdefault("compacts", {})[name] = c
            if name == "compacted":
                results["compact"] = c
            if c["ok"]:
                layouts[name] = args.work / (src.name + "-compact")
            else:
                print(f"\nrsembed compact did not work: {c['message']}", file=sys.stderr)
    table = []
    for lname, path in layouts.items():
        br = rounds(args.reps, {
            "rsembed": lambda: ours(args, path, q),
            "rsembed --bbox": lambda: ours(args, path, q, box),
            "duckdb": lambda: duck(args, path, q, "array"),
            "duckdb WHERE bbox": lambda: duck(args, path, q, "array", box),
        })
        results.setdefault("agreement", {})[f"bbox {lname}"] = agree(
            br["rsembed --bbox"][0], br["duckdb WHERE bbox"][0], f"bbox {lname}")
        results.setdefault("layouts", {})[lname] = br
        table.append((lname, br))
    print(f"\n## --bbox {','.join(f'{v:.3f}' for v in box)} ({args.bbox_frac:.0%} of the region), "
          f"{args.reps} reps (median)\n")
    print(fmt_row(["layout", "side", "files", "rows scored", "row groups read", "MiB read",
                   "wall s", "inside s", "peak RSS MiB"]))
    print(fmt_row(["---", "---"] + ["---:"] * 7))
    for lname, br in table:
        m = json.loads((layouts[lname] / "manifest.json").read_text())
        # Format 2 counts its chip files; format 1 lists them.
        files = m.get("chip_file_count", len(m.get("files", [])))
        for name, rs in br.items():
            r0 = rs[0]
            scored = r0.get("scored", "")
            groups = f"{r0['groups_read']} of {r0['groups']}" if "groups" in r0 else ""
            print(fmt_row([lname, name, files, scored, groups, f"{med(rs, 'mib'):.1f}",
                           f"{med(rs, 'wall'):.3f}", f"{med(rs, 'inner'):.3f}",
                           f"{med(rs, 'rss_mib'):.0f}"]))
    for name, c in results.get("compacts", {}).items():
        if c.get("ok") and not c.get("reused"):
            print(f"\nrsembed compact ({name}): {c['wall']:.1f} s, peak RSS {c['rss_mib']:.0f} MiB")
    print(f"\nagreement: {results['agreement']}")
    results["machine"]["loadavg_end"] = os.getloadavg()
    print(f"load average at start {results['machine']['loadavg_start']}, "
          f"at end {results['machine']['loadavg_end']}")
    (args.work / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
