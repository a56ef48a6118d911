#!/usr/bin/env python3
"""PyTorch images/s on the same checkpoint as the ONNX graphs: the ceiling for rsembed's
engine, per batch bucket.

    python3 bench/gpu/torch_bench.py --checkpoint /tmp/rsembed-gpu/models/vitl-hf \
        --dtype fp16 --attn sdpa --json /tmp/rsembed-gpu/results/torch_fp16.json

The model is transformers' SiglipModel loaded with attn_implementation=--attn ("sdpa":
torch.nn.functional.scaled_dot_product_attention, which picks flash/memory-efficient
kernels on a GPU) in --dtype (fp16 is model.half(): weights and activations in float16,
the usual "fp16" of the seed articles; no autocast). Per bucket, two timings:

- device input: pixel_values already on the GPU in --dtype; only get_image_features runs.
  The ceiling.
- host input: float32 pixels in ordinary (pageable) host memory are copied to the GPU,
  cast, run, and the float32 features copied back -- what rsembed's ONNX Runtime session
  does per run (it also feeds float32 and reads float32).

Timing: warm runs, then runs until --bucket-seconds (at least --min-runs, at most
--max-runs), torch.cuda.synchronize() around each; the fastest run counts (as in rsembed's
probe). Memory: torch.cuda.max_memory_allocated / max_memory_reserved over the timed runs,
and device-wide used memory (cudaMemGetInfo) after them. A bucket that runs out of memory
ends the sweep. On a machine without CUDA, --device cpu runs the same code (no memory
figures), for testing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--dtype", choices=["fp16", "bf16", "fp32"], default="fp16")
    p.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa, eager, ...)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--warm-runs", type=int, default=2)
    p.add_argument("--min-runs", type=int, default=2)
    p.add_argument("--max-runs", type=int, default=10)
    p.add_argument("--bucket-seconds", type=float, default=1.5)
    p.add_argument("--deadline-seconds", type=float, default=120.0)
    p.add_argument("--no-host-input", dest="host_input", action="store_false",
                   help="time only the device-input case")
    p.add_argument("--tf32", action="store_true", help="allow TF32 in fp32 matmuls")
    p.add_argument("--json")
    args = p.parse_args(argv)

    import torch
    from transformers import SiglipModel

    OOM = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    import logging

    # The default text config's CLIP-era token ids draw a warning nobody can act on.
    logging.getLogger("transformers.configuration_utils").addFilter(
        lambda record: "an integer within the vocabulary" not in record.getMessage())
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print("torch_bench.py: FATAL: CUDA is not available to torch", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    t = time.time()
    model = SiglipModel.from_pretrained(args.checkpoint, attn_implementation=args.attn, dtype=dtype)
    model = model.to(dev).eval()
    load_s = time.time() - t
    cfg = model.config.vision_config
    size = int(cfg.image_size)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def features(x):
        out = model.get_image_features(pixel_values=x)
        return out if hasattr(out, "shape") else out.pooler_output

    buckets = []
    b = 1
    while b <= args.max_batch:
        buckets.append(b)
        b *= 2

    gen = torch.Generator().manual_seed(0)
    host_all = torch.rand(args.max_batch, 3, size, size, generator=gen) * 2 - 1  # float32, pageable
    rows = []
    t_sweep = time.time()
    with torch.inference_mode():
        for b in buckets:
            if time.time() - t_sweep > args.deadline_seconds:
                rows.append({"bucket": b, "status": "skipped (deadline)"})
                continue
            row = {"bucket": b, "status": "ok"}
            host = host_all[:b].contiguous()
            try:
                x = host.to(dev, dtype)
                cases = [("device", lambda: features(x))]
                if args.host_input:
                    cases.append(("host", lambda: features(host.to(dev).to(dtype)).float().cpu()))
                for name, fn in cases:
                    for _ in range(args.warm_runs):
                        fn()
                    sync()
                    if cuda:
                        torch.cuda.reset_peak_memory_stats()
                    times = []
                    t_bucket = time.time()
                    while len(times) < args.max_runs and (
                            len(times) < args.min_runs or time.time() - t_bucket < args.bucket_seconds):
                        t0 = time.perf_counter()
                        fn()
                        sync()
                        times.append(time.perf_counter() - t0)
                    best = min(times)
                    times.sort()
                    row[f"{name}_images_per_s"] = b / best
                    row[f"{name}_images_per_s_median"] = b / times[len(times) // 2]
                    row[f"{name}_best_ms"] = best * 1e3
                    row[f"{name}_runs"] = len(times)
                    if cuda:
                        row[f"{name}_max_allocated"] = torch.cuda.max_memory_allocated()
                        row[f"{name}_max_reserved"] = torch.cuda.max_memory_reserved()
                        free, total = torch.cuda.mem_get_info()
                        row[f"{name}_device_used"] = total - free
                del x
            except OOM as e:
                row["status"] = "oom"
                row["error"] = str(e).splitlines()[0]
                rows.append(row)
                break
            rows.append(row)

    mib = lambda v: "-" if v is None else f"{v / 2**20:.0f}"  # noqa: E731
    fmt = lambda v, f="{:.1f}": "-" if v is None else f.format(v)  # noqa: E731
    print(f"## torch {args.dtype} {args.attn} on {dev} ({torch.cuda.get_device_name(dev) if cuda else 'cpu'}), "
          f"torch {torch.__version__}, load {load_s:.1f} s, sweep {time.time() - t_sweep:.1f} s")
    print("| bucket | images/s, input on device | images/s, float32 input from host | ms/run (device) "
          "| max allocated MiB | max reserved MiB | status |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['bucket']} | {fmt(r.get('device_images_per_s'))} | {fmt(r.get('host_images_per_s'))} | "
              f"{fmt(r.get('device_best_ms'), '{:.2f}')} | {mib(r.get('device_max_allocated'))} | "
              f"{mib(r.get('device_max_reserved'))} | {r['status']} |")
    result = {
        "part": "torch",
        "dtype": args.dtype,
        "attn": args.attn,
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "torch": torch.__version__,
        "load_seconds": load_s,
        "tf32": args.tf32,
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
