#!/usr/bin/env python3
"""Lay out bench/gpu/payload/callN/ for the device's upload calls (run by prepare.sh).

    python3 bench/gpu/pack.py --work .cache/gpu-bench-work --payload bench/gpu/payload \
        --tree-bytes N [--limit-mib 64] [--margin-mib 6]

Inputs in --work: base.tar.xz (binaries, ONNX Runtime's small libraries, float16.py),
libonnxruntime_providers_cuda.so (to hash) and libonnxruntime_providers_cuda.so.zst, and
meta.json (what prepare.sh recorded). One device call carries at most --limit-mib of
working tree in all: the tree that always travels (--tree-bytes: tracked and untracked,
not ignored files) plus that call's folder. --margin-mib is left free for the tree to grow
between now and the device session. The fewest calls that hold everything are used, and
the compressed provider is split so that every call carries about the same.

Writes, per call N: bench/gpu/payload/callN/ with its files, manifest.json (the same in
every call) and SHA256SUMS (its own files, checked by `run.sh stage N` on arrival); and
bench/gpu/payload/CALLS.md, the sequence of device calls.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys

MIB = 1 << 20
CUDA = "libonnxruntime_providers_cuda.so"


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def plan(base: int, packed: int, tree: int, limit: int, margin: int) -> list[int]:
    """Chunk sizes of the compressed provider, one per call; call 1 also carries base."""
    cap = limit - margin - tree
    if cap <= base:
        raise SystemExit(f"a call holds {cap / MIB:.1f} MiB besides the working tree, less than base.tar.xz "
                         f"({base / MIB:.1f} MiB): shrink the tree or raise --limit-mib")
    calls = math.ceil((base + packed) / cap)
    per = math.ceil((base + packed) / calls)
    sizes = [per - base] + [per] * (calls - 1)
    sizes[-1] = packed - sum(sizes[:-1])
    assert all(s > 0 for s in sizes) and sum(sizes) == packed, sizes
    assert sizes[0] + base <= cap and all(s <= cap for s in sizes), (sizes, cap)
    return sizes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True)
    p.add_argument("--payload", required=True)
    p.add_argument("--tree-bytes", type=int, required=True)
    p.add_argument("--limit-mib", type=float, default=64)
    p.add_argument("--margin-mib", type=float, default=6)
    args = p.parse_args(argv)

    with open(os.path.join(args.work, "meta.json")) as f:
        meta = json.load(f)
    base = os.path.join(args.work, "base.tar.xz")
    zst = os.path.join(args.work, CUDA + ".zst")
    raw = os.path.join(args.work, CUDA)
    base_bytes, zst_bytes = os.path.getsize(base), os.path.getsize(zst)
    sizes = plan(base_bytes, zst_bytes, args.tree_bytes, int(args.limit_mib * MIB), int(args.margin_mib * MIB))

    for d in os.listdir(args.payload):
        if d.startswith("call") and os.path.isdir(os.path.join(args.payload, d)):
            shutil.rmtree(os.path.join(args.payload, d))
    chunks, calls = [], []
    with open(zst, "rb") as src:
        for i, size in enumerate(sizes):
            n = i + 1
            cdir = os.path.join(args.payload, f"call{n}")
            os.makedirs(cdir)
            name = f"{CUDA}.zst.{i:02d}"
            with open(os.path.join(cdir, name), "wb") as dst:
                left = size
                while left:
                    block = src.read(min(left, 1 << 20))
                    if not block:
                        raise SystemExit("compressed file ended early")
                    dst.write(block)
                    left -= len(block)
            chunks.append({"file": f"call{n}/{name}", "call": n, "bytes": size,
                           "sha256": sha256(os.path.join(cdir, name))})
            files = [name]
            if n == 1:
                shutil.copy(base, os.path.join(cdir, "base.tar.xz"))
                files.insert(0, "base.tar.xz")
            calls.append({"call": n, "carry": f"bench/gpu/payload/call{n}", "files": files,
                          "bytes": size + (base_bytes if n == 1 else 0)})
        if src.read(1):
            raise SystemExit("chunks do not cover the compressed file")

    manifest = {
        "format": 1,
        **meta,
        "base": {"file": "call1/base.tar.xz", "bytes": base_bytes, "sha256": sha256(base),
                 "contents": meta.get("base_contents", [])},
        "chunked": [{
            "name": CUDA,
            "bytes": os.path.getsize(raw),
            "sha256": sha256(raw),
            "compression": meta.get("compression", "zstd"),
            "compressed_bytes": zst_bytes,
            "compressed_sha256": sha256(zst),
            "chunks": chunks,
        }],
        "calls": calls,
        "tree_bytes_at_prepare": args.tree_bytes,
        "call_limit_bytes": int(args.limit_mib * MIB),
    }
    manifest.pop("base_contents", None)
    for c in calls:
        cdir = os.path.join(args.payload, f"call{c['call']}")
        with open(os.path.join(cdir, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=2)
            f.write("\n")
        with open(os.path.join(cdir, "SHA256SUMS"), "w") as f:
            for name in c["files"] + ["manifest.json"]:
                f.write(f"{sha256(os.path.join(cdir, name))}  {name}\n")

    k = len(calls)
    lines = [
        "# Device calls for this payload (written by bench/gpu/prepare.sh)",
        "",
        f"Prepared {meta.get('created', '?')} at {meta.get('git_head', '?')}; working tree "
        f"{args.tree_bytes / MIB:.1f} MiB, limit {args.limit_mib:g} MiB per call. Issue the calls back to back "
        "(the machine stays warm 30 s after each).",
        "",
        "| call | carry | MiB carried (+ tree) | command | timeout_s |",
        "| ---: | --- | ---: | --- | ---: |",
    ]
    for c in calls:
        n = c["call"]
        if n < k:
            cmd, timeout = f"bash bench/gpu/run.sh stage {n}", 120 if n == 1 else 60
        else:
            cmd, timeout = f"bash bench/gpu/run.sh stage {n} && bash bench/gpu/run.sh all", 420
        lines.append(f"| {n} | `[\"{c['carry']}\"]` | {c['bytes'] / MIB:.1f} (+{args.tree_bytes / MIB:.1f}) "
                     f"| `{cmd}` | {timeout} |")
    lines += ["", "A rerun (machine still warm): `bash bench/gpu/run.sh PART...` with no carry, e.g. "
              "`BUDGET_S=200 bash bench/gpu/run.sh sweep16 oom report`.", ""]
    with open(os.path.join(args.payload, "CALLS.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    total = sum(c["bytes"] for c in calls)
    print(f"{k} calls, {total / MIB:.1f} MiB payload; largest call "
          f"{max(c['bytes'] for c in calls) / MIB + args.tree_bytes / MIB:.1f} MiB with the tree", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
