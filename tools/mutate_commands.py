#!/usr/bin/env python3
"""Flip bytes in a chip file and run the query commands on it: a crash hunt.

Makes a small synthetic job (examples/synth_index), then N times: copies it,
sets one to eight random bytes of its first chip file (its manifest entry
agreeing: see below), and runs
`search --nprobe all` and `compact` on the copy. Any exit but 0 (done) and 1
(an error) is a crash; the first copy of each kind is kept under WORK for a
regression test. The fuzz targets (fuzz/) cover our own decoders; this covers
what the commands hand to parquet-rs.

    cargo build --release --bin rsembed --example synth_index
    python3 tools/mutate_commands.py --runs 1500 --seed 4

Seed 4 found the `peek_next_page` panic of docs/decisions.md ("A panic inside
parquet-rs is an error for its file") at run 1121.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", type=Path, default=Path("/tmp/rsembed-mutate"))
    ap.add_argument("--bin", type=Path, default=ROOT / "target/release/rsembed")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    job = args.work / "job"
    if not (job / "manifest.json").exists():
        subprocess.run([ROOT / "target/release/examples/synth_index", "--output", job,
                        "--rows", "2000", "--dim", "64", "--rows-per-file", "1000",
                        "--planted", "0", "--seed", "3"], check=True, stdout=subprocess.DEVNULL)
    exits: dict[tuple[str, int | str], int] = {}
    kept: set[tuple[str, int | str]] = set()
    for run in range(args.runs):
        d = args.work / "mutated"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(job, d)
        name = sorted(p.name for p in (d / "chips").iterdir())[0]
        path = d / "chips" / name
        b = bytearray(path.read_bytes())
        for _ in range(rng.choice([1, 2, 4, 8])):
            b[rng.randrange(4, len(b) - 8)] = rng.randrange(256)
        path.write_bytes(b)
        # A format 1 manifest lists the file in its JSON; a format 2 list
        # (manifest/files.parquet) keeps the old sha256, which neither
        # command checks of a chip file, and its size, which flips keep.
        m = json.loads((d / "manifest.json").read_text())
        for e in m.get("files", []):
            if e["path"].endswith(name):
                e["sha256"], e["bytes"] = hashlib.sha256(b).hexdigest(), len(b)
        (d / "manifest.json").write_text(json.dumps(m))
        commands = {
            "search": [args.bin, "search", "--index", d, "--vector", job / "query.json",
                       "--nprobe", "all", "--json"],
            "compact": [args.bin, "compact", "--index", d, "--output", args.work / "out",
                        "--overwrite"],
        }
        for what, cmd in commands.items():
            try:
                code: int | str = subprocess.run(cmd, capture_output=True, timeout=60).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
            exits[(what, code)] = exits.get((what, code), 0) + 1
            if code not in (0, 1) and (what, code) not in kept:
                kept.add((what, code))
                keep = args.work / f"crash-{what}-{run}"
                shutil.rmtree(keep, ignore_errors=True)
                shutil.copytree(d, keep)
                print(f"run {run}: {what} exited {code}; kept {keep}")
    print(json.dumps({f"{w} {c}": n for (w, c), n in sorted(exits.items(), key=str)}))
    if kept:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
