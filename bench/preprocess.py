#!/usr/bin/env python3
"""Preprocessing per core: rsembed's `Preprocessor::run_into` against Hugging Face's
PIL-based SiglipImageProcessor, on already decoded images, in one run.

Cases (both sides start from decoded RGB pixels; no file decoding is timed):
  normalize_only_256              a 256x256 image, the model's size: no resize, only
                                  rescale + normalize to CHW float32 (a GeoTIFF chip)
  resize_normalize_only_512x384   a 512x384 image: Pillow-exact bicubic resize to
                                  256x256, then rescale + normalize
and, for context, the same two with the file decode included (a 256x256 PNG and a
512x384 JPEG; the processor is then given Image.open(...).convert("RGB")).

Ours comes from the criterion bench `worker/benches/preprocess.rs`; theirs is timed
here, for single-image calls and for calls on a list of 16 images (the faster is the
baseline). Both run pinned to one core (sched_setaffinity, OMP/OpenBLAS threads 1), so
the figures are per core. Images are the deterministic pattern both sides draw; the
decoded 512x384 image is the pattern itself on the Python side and the decoded JPEG of
it on ours (resize cost does not depend on pixel values).

Run from the repository root with the tools venv:
  .cache/tools-venv/bin/python bench/preprocess.py [--cpu 1] [--secs 3]
"""

import argparse
import io
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (pattern, processor and the criterion runner)

from PIL import Image  # noqa: E402

CASES = [
    # (criterion name, label, image size, decoded?, encoded format)
    ("normalize_only_256", "256x256, no resize, decoded", (256, 256), True, None),
    ("resize_normalize_only_512x384", "512x384, bicubic resize, decoded", (512, 384), True, None),
    ("png_256_no_resize", "256x256 PNG, decode included", (256, 256), False, "PNG"),
    ("jpeg_512x384_resize", "512x384 JPEG, decode included", (512, 384), False, "JPEG"),
]


def time_theirs(proc, make_image, secs):
    """Seconds per image: the best of single-image calls and 16-image list calls."""
    single = compare.time_per_image(lambda: proc(images=make_image(), return_tensors="np"), secs)
    batch16 = compare.time_per_image(
        lambda: proc(images=[make_image() for _ in range(16)], return_tensors="np"), secs) / 16
    return min(single, batch16), single, batch16


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)), help="core to pin both sides to")
    ap.add_argument("--secs", type=float, default=3.0, help="seconds per Python measurement")
    args = ap.parse_args()

    # Build first, unpinned, so that a stale build does not run on one core.
    subprocess.run(["cargo", "bench", "-p", "rsembed-worker", "--bench", "preprocess", "--no-run"],
                   cwd=compare.ROOT, check=True, stdout=subprocess.DEVNULL)
    os.sched_setaffinity(0, {args.cpu})
    ours = compare.criterion_medians()  # the child inherits the affinity

    proc = compare.processor()
    rows = []
    for name, label, (w, h), decoded, fmt in CASES:
        img = compare.pattern(w, h)
        if decoded:
            make = lambda img=img: img  # noqa: E731  (the processor does not modify its input)
        else:
            buf = io.BytesIO()
            img.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
            data = buf.getvalue()
            make = lambda data=data: Image.open(io.BytesIO(data)).convert("RGB")  # noqa: E731
        best, single, batch16 = time_theirs(proc, make, args.secs)
        rows.append((label, ours[name], best, single, batch16))

    print(f"one core (cpu {args.cpu}); processor: {type(proc).__name__}; ours: criterion medians")
    print("| case | rsembed chips/s | HF chips/s | ours ÷ HF | HF single / list-of-16 (ms/image) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, o, t, single, batch16 in rows:
        print(f"| {label} | {1 / o:.0f} | {1 / t:.0f} | {t / o:.2f} | {single * 1e3:.3f} / {batch16 * 1e3:.3f} |")
    print("RESULT " + " ".join(f"{n}={t / o:.2f}" for (n, *_), (_, o, t, _, _) in zip(CASES, rows)))


if __name__ == "__main__":
    main()
