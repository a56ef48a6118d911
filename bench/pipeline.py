#!/usr/bin/env python3
"""Pipeline efficiency and rsembed against a PyTorch pipeline, in one run.

On the same generated images (--chips 256x256 PNGs of synthetic aerial scenes, the
model's input size, so a chip needs no resize) it runs, back to back, per round:

  raw      `worker/examples/session_throughput.rs`: OrtVision (session.run + L2
           normalisation) alone on whole batches of --batch, --threads intra-op threads;
  fixed    `rsembed run --batch-size <--batch> --intra-threads <--threads>`;
  fixed2x  the same on twice the chips (each image twice, under two names): the
           difference of the two runs is the steady-state rate, free of start-up
           (model load, probe run, first-run allocations, planning, manifest);
  auto     `rsembed run --batch-size auto --intra-threads <--threads>`;
  torch    `bench/torch_pipeline.py`: DataLoader (--workers), PIL + SiglipImageProcessor,
           transformers SiglipModel.get_image_features, L2, Parquet via pyarrow.

on a model big enough that inference dominates (a random SigLIP of width 384, 6 layers,
MLP 1536, made by tools/make_test_model.py under .cache/bench-models/ when missing, fp32),
then the first three on the committed tiny model, where decoding dominates.

Pipeline efficiency = rsembed chips/s ÷ raw chips/s of the same round. Each rsembed
figure is given for the whole process (wall time around the command) and after start-up
(the `seconds` of its own summary, which includes loading the model); the torch
pipeline's "after start-up" excludes its Python imports and includes loading the model.
Rounds alternate the sides so that load from other processes spreads over both; besides
each round's ratio it prints best ÷ best, each side's fastest round (on a shared machine
the least disturbed one, as worker/examples/arena_shrink.rs reports).

Run from the repository root with the tools venv:
  .cache/tools-venv/bin/python -m pip install pyarrow   # once, for the torch side
  .cache/tools-venv/bin/python bench/pipeline.py [--chips 300] [--rounds 2] [--threads 2] \\
      [--batch 16] [--workers 1] [--no-torch] [--no-tiny]
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
ORT_LIB = os.path.join(ROOT, ".cache", "ort", "libonnxruntime.so.1.31.1")
TINY = os.path.join(ROOT, "fixtures", "models", "tiny-siglip")
BENCH_MODELS = os.path.join(ROOT, ".cache", "bench-models")
SIZE = ["--hidden", "384", "--layers", "6", "--heads", "6", "--intermediate", "1536"]
BIG = os.path.join(BENCH_MODELS, "siglip-w384-l6")
BIG_HF = BIG + "-hf"


def ensure_big_model():
    if os.path.isfile(os.path.join(BIG, "rsembed-model.json")) and os.path.isfile(os.path.join(BIG_HF, "config.json")):
        return
    print(f"generating {BIG} with tools/make_test_model.py", flush=True)
    subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "make_test_model.py"), *SIZE, "--no-fp16",
         "--out", BIG, "--images", os.path.join(BENCH_MODELS, "images"), "--checkpoint", BIG_HF],
        cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def make_images(folder, n):
    """n distinct 256x256 synthetic aerial scenes (make_test_model's generator)."""
    from make_test_model import _scene

    os.makedirs(folder, exist_ok=True)
    for i in range(n):
        _scene(256, 256, 1000 + i).save(os.path.join(folder, f"chip{i:05d}.png"))


def raw(model, args):
    r = subprocess.run(
        [os.path.join(ROOT, "target", "release", "examples", "session_throughput"), "--model", model,
         "--batch", str(args.batch), "--threads", str(args.threads), "--chips", str(args.chips)],
        env={**os.environ, "ORT_DYLIB_PATH": ORT_LIB}, capture_output=True, text=True, check=True)
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    fields = dict(kv.split("=") for kv in line.split()[1:])
    return {"chips_per_s": float(fields["chips_per_s"]), "ms_per_batch": float(fields["ms_per_batch"])}


def doubled(folder, dst):
    """Every image of folder twice, as hard links under two names."""
    os.makedirs(dst)
    for f in sorted(os.listdir(folder)):
        for p in ("a", "b"):
            os.link(os.path.join(folder, f), os.path.join(dst, p + f))


def rsembed(model, folder, out, batch, args, chips=None):
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    r = subprocess.run(
        [os.path.join(ROOT, "target", "release", "rsembed"), "run", "--json", "--ort-lib", ORT_LIB,
         "--input", folder, "--output", out, "--model", model, "--batch-size", batch,
         "--intra-threads", str(args.threads)],
        capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"rsembed run failed (exit {r.returncode}): {r.stdout}{r.stderr}")
    s = json.loads(r.stdout)
    n = chips or args.chips
    assert s["chips"] == n and s["failed_inputs"] == 0, s
    return {"whole": n / wall, "after": n / s["seconds"], "wall": wall, "seconds": s["seconds"]}


def torch_side(folder, out, args):
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "torch_pipeline.py"), "--checkpoint", BIG_HF,
         "--input", folder, "--output", out, "--batch", str(args.batch), "--workers", str(args.workers),
         "--threads", str(args.threads)],
        capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"torch pipeline failed (exit {r.returncode}): {r.stderr}")
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["images"] == args.chips, s
    return {"whole": args.chips / wall, "after": args.chips / s["seconds"], "wall": wall, "detail": s}


def same_embeddings(rsembed_out, torch_out):
    """Min cosine between the two pipelines' embeddings of each image (same model weights)."""
    import pyarrow.parquet as pq

    ours = {}
    for f in glob.glob(os.path.join(rsembed_out, "chips", "*.parquet")):
        t = pq.read_table(f, columns=["source_uri", "embedding"]).to_pydict()
        for uri, e in zip(t["source_uri"], t["embedding"]):
            ours[os.path.basename(uri)] = np.asarray(e, np.float64)
    t = pq.read_table(torch_out).to_pydict()
    cos = [float(np.dot(ours[os.path.basename(p)], np.asarray(e, np.float64))) for p, e in zip(t["path"], t["embedding"])]
    return min(cos), len(cos)


def spread(xs):
    return f"{statistics.median(xs):.3f} (rounds: {', '.join(f'{x:.3f}' for x in xs)})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chips", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=1, help="torch DataLoader workers")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-tiny", action="store_true")
    args = ap.parse_args()
    if not os.path.isfile(ORT_LIB):
        sys.exit("run scripts/setup-ort.sh first")

    for cmd in (["-p", "rsembed-coordinator"], ["-p", "rsembed-worker", "--example", "session_throughput"]):
        subprocess.run(["cargo", "build", "--release", "--quiet", *cmd], cwd=ROOT, check=True)
    ensure_big_model()

    tmp = tempfile.mkdtemp(prefix="rsembed-pipeline-")
    try:
        folder = os.path.join(tmp, "in")
        make_images(folder, args.chips)
        folder2 = os.path.join(tmp, "in2x")
        doubled(folder, folder2)
        b = str(args.batch)
        res = {k: [] for k in ("raw", "fixed", "fixed2x", "auto", "torch", "tiny_raw", "tiny_fixed", "tiny_auto")}
        for rnd in range(args.rounds):
            # Alternate the order so a slow patch of the machine does not always hit one side.
            steps = [
                ("raw", lambda: raw(BIG, args)),
                ("fixed", lambda: rsembed(BIG, folder, os.path.join(tmp, "out-fixed"), b, args)),
                ("fixed2x", lambda: rsembed(BIG, folder2, os.path.join(tmp, "out-2x"), b, args, 2 * args.chips)),
                ("auto", lambda: rsembed(BIG, folder, os.path.join(tmp, "out-auto"), "auto", args)),
            ]
            if not args.no_torch:
                steps.append(("torch", lambda: torch_side(folder, os.path.join(tmp, "torch.parquet"), args)))
            if not args.no_tiny:
                steps += [
                    ("tiny_raw", lambda: raw(TINY, args)),
                    ("tiny_fixed", lambda: rsembed(TINY, folder, os.path.join(tmp, "out-tiny"), b, args)),
                    ("tiny_auto", lambda: rsembed(TINY, folder, os.path.join(tmp, "out-tiny"), "auto", args)),
                ]
            for name, fn in (steps if rnd % 2 == 0 else steps[::-1]):
                res[name].append(fn())
                print(f"round {rnd + 1} {name}: {res[name][-1]}", flush=True)

        print(f"\nmachine: {os.cpu_count()} cores; {args.chips} chips 256x256 PNG; batch {args.batch}; "
              f"intra threads {args.threads}; {args.rounds} rounds: median (each round); "
              "best ÷ best = fastest round of each side, the least disturbed by other load")
        r = res["raw"]
        rb = max(x["chips_per_s"] for x in r)
        print("| measure (w384 6-layer fp32) | chips/s | ÷ raw session.run, same round | best ÷ best |")
        print("| --- | ---: | ---: | ---: |")
        print(f"| raw session.run, batch {b} | {spread([x['chips_per_s'] for x in r])} | 1 | 1 |")
        for k, label in (("fixed", f"--batch-size {b}"), ("auto", "--batch-size auto")):
            for m, ml in (("whole", "whole process"), ("after", "after start-up")):
                v = [x[m] for x in res[k]]
                print(f"| rsembed run {label}, {ml} | {spread(v)} | "
                      f"{spread([a / x['chips_per_s'] for a, x in zip(v, r)])} | {max(v) / rb:.3f} |")
        steady = [args.chips / (d["seconds"] - f["seconds"]) for f, d in zip(res["fixed"], res["fixed2x"])]
        print(f"| rsembed run --batch-size {b}, steady state ({2 * args.chips} minus {args.chips} chips) | "
              f"{spread(steady)} | {spread([a / x['chips_per_s'] for a, x in zip(steady, r)])} | "
              f"{args.chips / (min(d['seconds'] for d in res['fixed2x']) - min(f['seconds'] for f in res['fixed'])) / rb:.3f} |")
        if res["torch"]:
            print("\n| end to end into Parquet (w384 6-layer) | rsembed images/s | PyTorch images/s "
                  "| ours ÷ PyTorch, same round | best ÷ best |")
            print("| --- | ---: | ---: | ---: | ---: |")
            for m, ml in (("whole", "whole process"), ("after", "after start-up")):
                o, t = [x[m] for x in res["fixed"]], [x[m] for x in res["torch"]]
                print(f"| {ml} | {spread(o)} | {spread(t)} | {spread([a / c for a, c in zip(o, t)])} "
                      f"| {max(o) / max(t):.3f} |")
            d = res["torch"][-1]["detail"]
            print(f"torch detail (last round): {d}")
            cos, n = same_embeddings(os.path.join(tmp, "out-fixed"), os.path.join(tmp, "torch.parquet"))
            print(f"same embeddings: min cosine rsembed vs PyTorch over {n} images = {cos:.6f}")
        if res["tiny_raw"]:
            cores = os.cpu_count()
            print(f"\n| tiny model (decode-bound) | chips/s | chips/s per core ({cores} cores) | ÷ raw | best ÷ best |")
            print("| --- | ---: | ---: | ---: | ---: |")
            tr = res["tiny_raw"]
            tb = max(x["chips_per_s"] for x in tr)
            print(f"| raw session.run, batch {b} | {spread([x['chips_per_s'] for x in tr])} | "
                  f"{spread([x['chips_per_s'] / cores for x in tr])} | 1 | 1 |")
            for k, label in (("tiny_fixed", f"--batch-size {b}"), ("tiny_auto", "--batch-size auto")):
                for m, ml in (("whole", "whole process"), ("after", "after start-up")):
                    v = [x[m] for x in res[k]]
                    print(f"| rsembed run {label}, {ml} | {spread(v)} | {spread([x / cores for x in v])} | "
                          f"{spread([a / x['chips_per_s'] for a, x in zip(v, tr)])} | {max(v) / tb:.3f} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
