#!/usr/bin/env python3
"""Record the SHA-256 and size of every file of an rsembed model directory in
its rsembed-model.json, under "files" (DESIGN.md, "Contract: model directory").

`rsembed fetch-model` checks each file it copies against this record, so a
graph corrupted in storage or in transit is refused instead of reported ready.
`tools/export_onnx.py` writes the record itself; run this script on a directory
made by an older exporter, or after adding files (ONNX external data) by hand:

    python3 tools/record_digests.py models/git-rsclip

Only the standard library is needed. Keys are paths relative to the directory,
`/`-separated; the manifest itself is not recorded (it holds the record).
Other keys and their order are kept.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

MANIFEST = "rsembed-model.json"


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_digests(model_dir: str, skip: tuple[str, ...] = ()) -> dict:
    """{relative path: {"sha256", "bytes"}} for every file below `model_dir`
    except the manifest and `skip`, sorted by path."""
    out = {}
    for root, dirs, files in os.walk(model_dir):
        dirs.sort()
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, model_dir).replace(os.sep, "/")
            if rel == MANIFEST or rel in skip:
                continue
            out[rel] = {"sha256": sha256_file(path), "bytes": os.path.getsize(path)}
    return dict(sorted(out.items()))


def record(model_dir: str, skip: tuple[str, ...] = ()) -> dict:
    """Rewrites `model_dir`/rsembed-model.json with a fresh "files" record."""
    path = os.path.join(model_dir, MANIFEST)
    with open(path) as f:
        manifest = json.load(f)
    manifest["files"] = file_digests(model_dir, skip)
    with open(path, "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    return manifest["files"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", help="directory holding rsembed-model.json")
    p.add_argument("--skip", action="append", default=[],
                   help="relative path not to record (repeatable), e.g. a test reference file")
    args = p.parse_args(argv)
    if not os.path.isfile(os.path.join(args.model_dir, MANIFEST)):
        print(f"{args.model_dir}: no {MANIFEST}", file=sys.stderr)
        return 1
    files = record(args.model_dir, tuple(args.skip))
    for rel, d in files.items():
        print(f"{d['sha256']}  {d['bytes']:>12}  {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
