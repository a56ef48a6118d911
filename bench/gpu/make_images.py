#!/usr/bin/env python3
"""Synthetic aerial-looking JPEG scenes for the end-to-end `rsembed run` on the GPU.

    python3 bench/gpu/make_images.py --out /tmp/rsembed-gpu/images/a --count 16 --size 2048

Each scene is --size x --size pixels, so at the model's 256x256 chips it gives
(size/256)^2 chips: 64 per 2048x2048 scene. Seeded; smooth fields, stripes and mild noise,
JPEG quality 90 (decode cost of a real aerial JPEG, not of incompressible noise).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--count", type=int, default=16)
    p.add_argument("--size", type=int, default=2048)
    p.add_argument("--unique", type=int, default=0,
                   help="draw only this many scenes and copy them to make up --count (0: all distinct)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    import numpy as np
    from PIL import Image

    os.makedirs(args.out, exist_ok=True)
    s = args.size
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32) / s
    unique = args.unique if 0 < args.unique < args.count else args.count
    for i in range(unique):
        rng = np.random.default_rng(args.seed * 100003 + i)
        f = rng.uniform(2, 12, size=3)
        ph = rng.uniform(0, 6.3, size=3)
        base = np.stack([
            110 + 60 * np.sin(f[0] * 6.28 * xx + ph[0]) * np.cos(f[1] * 3.14 * yy),
            120 + 50 * np.cos(f[1] * 6.28 * yy + ph[1]),
            90 + 40 * np.sin(f[2] * 6.28 * (xx + yy) + ph[2]),
        ], axis=-1)
        stripes = 12 * (np.floor(xx * s / rng.integers(3, 9)) % 2)[..., None]
        img = base + stripes + rng.normal(0, 6, size=(s, s, 3))
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB").save(
            os.path.join(args.out, f"scene_{i:04d}.jpg"), quality=90)
    for i in range(unique, args.count):  # same bytes, another name: the same decode cost
        shutil.copyfile(os.path.join(args.out, f"scene_{i % unique:04d}.jpg"), os.path.join(args.out, f"scene_{i:04d}.jpg"))
    print(f"{args.count} scenes ({unique} distinct) of {s}x{s} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
