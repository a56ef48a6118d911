#!/usr/bin/env python3
"""Whole-pipeline benchmark: rsembed against the Python baseline, in one run.

Baseline = what a Git-RSCLIP user writes by hand: PIL decode, Hugging Face
SiglipImageProcessor (the PIL-based one, the reference rsembed matches), an
onnxruntime InferenceSession on the same vision graph, L2 normalization.

Measures, on the same generated images:
  1. preprocessing per image (decode + resize + normalize), ours from the
     criterion bench `worker/benches/preprocess.rs`, theirs timed here;
  2. end-to-end images/s over a folder, ours = `rsembed run` wall time,
     theirs = the baseline script's wall time; both include model loading.
Prints a table of ratios (ours / baseline for time; baseline / ours for speed).

Run from the repository root with the tools venv:
  .cache/tools-venv/bin/python bench/compare.py [--images 400] [--threads 2]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "fixtures", "models", "tiny-siglip")


def pattern(w, h):
    """The pattern worker/benches/preprocess.rs draws."""
    x = np.arange(w, dtype=np.int64)[None, :]
    y = np.arange(h, dtype=np.int64)[:, None]
    v = (x * 7 + y * 13) ^ (x * y // 5)
    r = v % 256
    g = np.broadcast_to((x * 3) % 256, v.shape)
    b = (y * 5 + v // 3) % 256
    return Image.fromarray(np.stack([r, g, b], axis=-1).astype(np.uint8), "RGB")


def make_images(dir_, n):
    os.makedirs(dir_, exist_ok=True)
    png, jpg = pattern(256, 256), pattern(512, 384)
    for i in range(n):
        if i % 2 == 0:
            png.save(os.path.join(dir_, f"img{i:05d}.png"))
        else:
            jpg.save(os.path.join(dir_, f"img{i:05d}.jpg"), quality=90)
    return png, jpg


def processor_class():
    """The PIL-based processor: SiglipImageProcessorPil in transformers 5, SiglipImageProcessor in 4."""
    try:
        from transformers import SiglipImageProcessorPil as cls
    except ImportError:
        from transformers import SiglipImageProcessor as cls
    return cls


def processor():
    return processor_class().from_pretrained(MODEL)


def time_per_image(fn, min_seconds=2.0):
    fn()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_seconds:
        fn()
        n += 1
    return (time.perf_counter() - start) / n


def criterion_medians():
    """Runs our criterion bench and returns {name: seconds} (median estimate)."""
    out = subprocess.run(
        ["cargo", "bench", "-p", "rsembed-worker", "--bench", "preprocess", "--", "--noplot"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    units = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    res = {}
    for m in re.finditer(r"^(\S+)\s+time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", out, re.M):
        res[m.group(1)] = float(m.group(2)) * units[m.group(3)]
    return res


BASELINE = r"""
import os, sys, time, json
import numpy as np
from PIL import Image
import onnxruntime as ort
try:
    from transformers import SiglipImageProcessorPil as SiglipImageProcessor
except ImportError:
    from transformers import SiglipImageProcessor
t0 = time.perf_counter()
model, folder, threads, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
spec = json.load(open(os.path.join(model, "rsembed-model.json")))
so = ort.SessionOptions(); so.intra_op_num_threads = threads
sess = ort.InferenceSession(os.path.join(model, spec["vision"]["file"]), so, providers=["CPUExecutionProvider"])
proc = SiglipImageProcessor.from_pretrained(model)
files = sorted(os.listdir(folder))
n = 0
for i in range(0, len(files), batch):
    imgs = [Image.open(os.path.join(folder, f)).convert("RGB") for f in files[i:i + batch]]
    px = proc(images=imgs, return_tensors="np")["pixel_values"].astype(np.float32)
    e = sess.run([spec["vision"]["output"]], {spec["vision"]["input"]: px})[0]
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    n += len(imgs)
print(json.dumps({"images": n, "seconds": time.perf_counter() - t0}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()

    ort_lib = os.path.join(ROOT, ".cache", "ort", "libonnxruntime.so.1.31.1")
    if not os.path.isfile(ort_lib):
        sys.exit("run scripts/setup-ort.sh first")
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "rsembed-coordinator"], cwd=ROOT, check=True)
    rsembed = os.path.join(ROOT, "target", "release", "rsembed")

    tmp = tempfile.mkdtemp(prefix="rsembed-bench-")
    try:
        folder = os.path.join(tmp, "in")
        png, jpg = make_images(folder, args.images)
        proc = processor()
        png_path = os.path.join(folder, "img00000.png")
        jpg_path = os.path.join(folder, "img00001.jpg")
        theirs = {
            "png_256_no_resize": time_per_image(
                lambda: proc(images=Image.open(png_path).convert("RGB"), return_tensors="np")),
            "jpeg_512x384_resize": time_per_image(
                lambda: proc(images=Image.open(jpg_path).convert("RGB"), return_tensors="np")),
        }
        ours = criterion_medians()

        t0 = time.perf_counter()
        r = subprocess.run(
            [rsembed, "run", "--json", "--ort-lib", ort_lib, "--input", folder,
             "--output", os.path.join(tmp, "out"), "--model", MODEL,
             "--batch-size", str(args.batch), "--intra-threads", str(args.threads)],
            capture_output=True, text=True)
        ours_s = time.perf_counter() - t0
        if r.returncode != 0:
            sys.exit(f"rsembed run failed: {r.stderr}")
        summary = json.loads(r.stdout)
        assert summary["chips"] == args.images, summary

        t0 = time.perf_counter()
        b = subprocess.run(
            [sys.executable, "-c", BASELINE, MODEL, folder, str(args.threads), str(args.batch)],
            capture_output=True, text=True, check=True)
        base_s = time.perf_counter() - t0
        base = json.loads(b.stdout)
        assert base["images"] == args.images

        print(f"machine: {os.cpu_count()} cores; images: {args.images} "
              f"(half 256x256 PNG, half 512x384 JPEG); batch {args.batch}; intra threads {args.threads}")
        print(f"{'measure':<40}{'rsembed':>12}{'baseline':>12}{'ratio':>10}")
        for k in ("png_256_no_resize", "jpeg_512x384_resize"):
            if k in ours:
                print(f"{'preprocess ' + k + ' (ms/img)':<40}{ours[k] * 1e3:>12.3f}{theirs[k] * 1e3:>12.3f}"
                      f"{ours[k] / theirs[k]:>10.3f}")
        if "resize_normalize_only_512x384" in ours:
            print(f"{'resize+normalize only 512x384 (ms/img)':<40}{ours['resize_normalize_only_512x384'] * 1e3:>12.3f}")
        ours_ips, base_ips = args.images / ours_s, args.images / base_s
        print(f"{'end-to-end (images/s, process wall)':<40}{ours_ips:>12.1f}{base_ips:>12.1f}{ours_ips / base_ips:>10.2f}")
        # In-process: rsembed's own run time; the baseline's time after its imports
        # (importing transformers alone takes seconds and says nothing about the GPU-feeding loop).
        ours_in, base_in = args.images / summary["seconds"], args.images / base["seconds"]
        print(f"{'end-to-end (images/s, after start-up)':<40}{ours_in:>12.1f}{base_in:>12.1f}{ours_in / base_in:>10.2f}")
        print("ratio: time rows are ours/baseline (lower is better); images/s is ours/baseline (higher is better)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
