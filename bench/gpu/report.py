#!/usr/bin/env python3
"""Merge bench/gpu's result files into one Markdown report and one JSON file.

    python3 bench/gpu/report.py --results /tmp/rsembed-gpu/results --out $OUT/report.md \
        --json $OUT/results.json

Reads what exists of: steps.tsv, gpu.txt, build_info.json, sweep_fp32.json, sweep_fp16.json,
torch_fp16.json, torch_fp32.json, oom.json, shrink.json, copies.json, e2e_small.json, e2e_large.json,
e2e_params.json; a missing part is reported as missing, never an error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

MIB = 1 << 20


def load(d: str, name: str):
    p = os.path.join(d, name)
    if not os.path.isfile(p):
        return None
    try:
        with open(p) as f:
            return json.load(f)
    except ValueError as e:
        return {"error": f"{name} does not parse: {e}"}


def mib(v) -> str:
    return "-" if v is None else f"{v / MIB:,.0f}"


def num(v, fmt="{:,.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def rows_by_bucket(part) -> dict:
    if not part or "rows" not in part:
        return {}
    return {r["bucket"]: r for r in part["rows"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--json")
    args = p.parse_args(argv)
    d = args.results
    names = ["build_info", "sweep_fp32", "sweep_fp16", "torch_fp16", "torch_fp32", "oom", "shrink", "copies",
             "e2e_small", "e2e_large", "e2e_auto_small", "e2e_auto_large",
             "e2e_tiny_small", "e2e_tiny_large", "e2e_float_small", "e2e_float_large", "e2e_params"]
    r = {n: load(d, n + ".json") for n in names}
    steps = []
    if os.path.isfile(os.path.join(d, "steps.tsv")):
        for line in open(os.path.join(d, "steps.tsv")):
            f = line.rstrip("\n").split("\t")
            if len(f) == 4:
                steps.append({"step": f[0], "status": f[1], "rc": f[2], "seconds": f[3]})
    gpu = open(os.path.join(d, "gpu.txt")).read().strip() if os.path.isfile(os.path.join(d, "gpu.txt")) else None
    fatal = open(os.path.join(d, "fatal.txt")).read().strip() if os.path.isfile(os.path.join(d, "fatal.txt")) else None

    L = []
    add = L.append
    add(f"# rsembed GPU benchmark, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    add("")
    b = r["build_info"] or {}
    v = b.get("versions", {})
    t16 = r["torch_fp16"] or {}
    add(f"- device: {gpu or (r['sweep_fp16'] or {}).get('device') or '?'}")
    if b:
        c = b.get("config", {})
        add(f"- model: random-weight SigLIP, vision width {c.get('hidden')}, {c.get('layers')} layers, "
            f"{c.get('heads')} heads, MLP {c.get('intermediate')}, patch {c.get('patch')}, {c.get('image')}x"
            f"{c.get('image')} ({b.get('parameters', {}).get('vision', 0) / 1e6:.1f}M vision parameters); "
            f"built in {b.get('seconds', {}).get('total', 0):.0f} s")
        add(f"- python {v.get('python')}, torch {v.get('torch')}, transformers {v.get('transformers')}, "
            f"onnx {v.get('onnx')}, python onnxruntime {v.get('onnxruntime')}; fp16 converter: "
            f"{b.get('float16_converter')}")
        for s in b.get("skipped", []):
            add(f"- exporter step skipped: {s}")
    add("- ONNX Runtime 1.31.1 (onnxruntime-gpu wheel, CUDA 13) through rsembed's engine "
        "(`OrtVision`, default session settings: same-as-requested arena, heuristic cuDNN search, no TF32)")
    if fatal:
        add(f"- **FATAL**: {fatal}")
    if steps:
        add("- steps: " + ", ".join(f"{s['step']} {s['status']}"
                                    + (f" ({s['seconds']} s)" if s["status"] != "skipped" else "")
                                    + (f" rc={s['rc']}" if s["status"] == "failed" else "") for s in steps))
    add("")

    s32, s16 = rows_by_bucket(r["sweep_fp32"]), rows_by_bucket(r["sweep_fp16"])
    tt16, tt32 = rows_by_bucket(r["torch_fp16"]), rows_by_bucket(r["torch_fp32"])
    buckets = sorted(set(s32) | set(s16) | set(tt16) | set(tt32))
    add("## Images/s and peak memory per batch bucket")
    add("")
    add("ORT: fastest of the timed runs (float32 pixels in host memory in, float32 embeddings out, "
        "L2 normalisation included); peak = NVML device memory in use, sampled every 2 ms during the "
        "timed runs after a shrink, so each bucket's own arena plus the CUDA context. torch: "
        "SiglipModel.get_image_features, `attn_implementation=\"sdpa\"`, `.half()`; \"GPU in\" has "
        "the input on the GPU already, \"host in\" copies float32 pixels in and features out as ORT "
        "does; memory = max_memory_allocated (no context).")
    add("")
    add("| bucket | ORT fp32 img/s | ORT fp32 peak MiB | ORT fp16 img/s | ORT fp16 peak MiB "
        "| torch fp16 SDPA img/s, GPU in | torch fp16, host in | torch fp16 alloc MiB | ORT fp16 / torch fp16 host in "
        "| torch fp32 SDPA img/s, host in |")
    add("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for bk in buckets:
        a, h, t, u = s32.get(bk, {}), s16.get(bk, {}), tt16.get(bk, {}), tt32.get(bk, {})
        ratio = None
        if h.get("images_per_s") and t.get("host_images_per_s"):
            ratio = h["images_per_s"] / t["host_images_per_s"]

        def cell(row, key, fmt="{:,.1f}"):
            if row.get(key) is not None:
                return num(row[key], fmt)
            st = row.get("status")
            return st if st and st != "ok" else "-"

        add(f"| {bk} | {cell(a, 'images_per_s')} | {mib(a.get('memory_peak'))} | {cell(h, 'images_per_s')} | "
            f"{mib(h.get('memory_peak'))} | {cell(t, 'device_images_per_s')} | {cell(t, 'host_images_per_s')} | "
            f"{mib(t.get('host_max_allocated') or t.get('device_max_allocated'))} | {num(ratio, '{:.2f}')} | "
            f"{cell(u, 'host_images_per_s')} |")
    add("")
    for name in ("sweep_fp32", "sweep_fp16"):
        s = r[name]
        if not s:
            add(f"- {name}: missing")
            continue
        if "error" in s:
            add(f"- {name}: {s['error']}")
            continue
        add(f"- {name}: session open {s['open_seconds']:.1f} s; device memory before open "
            f"{mib(s.get('memory_before_open'))} MiB, after open {mib(s.get('memory_loaded'))} MiB of "
            f"{mib(s.get('memory_total'))} MiB")
    add("")

    add("## Parity with PyTorch float32 (bench_parity.json, L2-normalized embeddings)")
    add("")
    for name in ("sweep_fp32", "sweep_fp16"):
        s = r[name] or {}
        par = s.get("parity")
        add(f"- {name}: " + (f"min cosine {par['min_cosine']:.7f}, max abs diff {par['max_abs_diff_normalized']:.2e} "
                             f"over {par['n']} images" if par else "not run"))
    add("")

    add("## Adaptive warm-up probe (`--batch-size auto`)")
    add("")
    for name in ("sweep_fp32", "sweep_fp16"):
        pr = (r[name] or {}).get("probe")
        if not pr:
            add(f"- {name}: not run")
        elif "error" in pr:
            add(f"- {name}: probe failed: {pr['error']}")
        else:
            rows = ", ".join(f"{x['bucket']}: {x['images_per_s']:,.0f}"
                             + ("" if x["outcome"] == "measured" else f" ({x['outcome']})") for x in pr["rows"])
            add(f"- {name}: chose **{pr['chosen']}** (ceiling {pr['ceiling']}, --max-batch {pr['max_batch']}), "
                f"probe {pr['seconds']:.1f} s; images/s per bucket: {rows}")
    add("")

    add("## Out-of-memory recovery under `--gpu-mem-limit`")
    add("")
    o = r["oom"]
    if not o:
        add("not run")
    elif "error" in o and "ooms" not in o:
        add(o["error"])
    else:
        add(f"{o['precision']}, limit {o['gpu_mem_limit'] / MIB:,.0f} MiB, {o['requests']} requests of "
            f"{o['request_size']} distinct images, controller unprobed at bucket {o['start_bucket']} "
            f"(--max-batch {o['max_batch']}).")
        add("")
        add("| OOMs | runs | shrink runs | final bucket | ceiling | hard limit | chips in | chips out | lost "
            "| misplaced | min cosine to own reference | images/s | peak MiB | result |")
        add("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        add(f"| {o['ooms']} | {o['runs']} | {o['shrink_runs']} | {o['final_bucket']} | {o['ceiling']} | "
            f"{o['hard_limit'] if o['hard_limit'] is not None else '-'} | {o['chips_in']} | {o['chips_out']} | "
            f"{o['lost']} | {o['misplaced']} | {o['min_cosine_own']:.6f} | {o['images_per_s']:,.1f} | "
            f"{mib(o['memory_peak'])} | {'ok' if o['ok'] else 'FAILED'} |")
        per = "; ".join(f"request {x['request']}: {x.get('ooms', '?')} OOMs, {x.get('runs', '?')} runs, "
                        f"{x.get('seconds', 0):.2f} s" if "error" not in x else f"request {x['request']}: {x['error']}"
                        for x in o.get("per_request", []))
        add("")
        add(f"Per request: {per}.")
        if o.get("last_oom"):
            add(f"Last OOM message: `{o['last_oom'].splitlines()[0][:300]}`")
    add("")

    add("## Engine time per chip: copy in, compute, copy out (fp16)")
    add("")
    cp = r["copies"]
    if cp:
        add("The same batch four ways (`gpu_bench copies`, median of the timed runs): input and output "
            "on the device (compute), output copied to pinned host memory (+ copy out), input from pinned "
            "host memory as the worker binds it on CUDA (+ copy in by DMA), input from pageable memory, "
            "unbound (+ staging). ms per chip; the copy columns are differences, so noise can make them "
            "negative. \"engine\" is the pinned-input run: what the worker's engine thread spends a chip "
            "(docs/gpu-memory.md, \"Engine time\").")
        add("")
        add("| entry | bucket | input bytes/chip | compute | copy out | copy in (pinned) | copy in (pageable) "
            "| engine (pinned) | engine (pageable) |")
        add("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for row in cp.get("rows", []):
            if "error" in row:
                add(f"| {row['entry']} | error: {row['error']} | | | | | | | |")
                continue
            m = row["ms_per_chip"]
            add(f"| {row['entry']} | {row['bucket']} | {row['input_bytes_per_chip']:,} | "
                f"{row['compute_ms_per_chip']:.4f} | {row['copy_out_ms_per_chip']:.4f} | "
                f"{row['copy_in_pinned_ms_per_chip']:.4f} | {row['copy_in_pageable_ms_per_chip']:.4f} | "
                f"{m['pinned_input']:.4f} | {m['pageable_input']:.4f} |")
        add("")
        for pp in cp.get("bound_parity", []):
            q = pp["parity"]
            add(f"- {pp['entry']}: bound runs against plain ones on {q['images']} images: own buffer max |Δ| "
                f"{q['own_buffer']['max_abs_diff']:.2e}, min cosine {q['own_buffer']['min_cosine']:.7f}; "
                f"lent (pinned) buffer max |Δ| {q['lent_buffer']['max_abs_diff']:.2e}, min cosine "
                f"{q['lent_buffer']['min_cosine']:.7f}")
    else:
        add("(not run)")
    add("")

    add("## Arena shrinking after a large batch")
    add("")
    sh = r["shrink"]
    if not sh:
        add("not run")
    else:
        add(f"{sh['precision']}, {sh['big_runs']} batches of {sh['big']}, then {sh['small_runs']} of {sh['small']} "
            f"(the first with the shrink hint), one process per mode; memory = {sh['memory_source']}.")
        add("")
        add("| --arena-shrink | loaded MiB | after big | after 1st small | after small | peak | returned MiB "
            "| ms/run big | ms small #1 (shrink) | ms small #2 | ms/run small (median) |")
        add("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for m in sh["modes"]:
            ret = None
            if m.get("memory_after_big") is not None and m.get("memory_after_small") is not None:
                ret = m["memory_after_big"] - m["memory_after_small"]
            add(f"| {m['mode']} | {mib(m.get('memory_loaded'))} | {mib(m.get('memory_after_big'))} | "
                f"{mib(m.get('memory_after_first_small'))} | {mib(m.get('memory_after_small'))} | "
                f"{mib(m.get('memory_peak'))} | {mib(ret)} | {m['big_ms']:.2f} | {m['small_first_ms']:.2f} | "
                f"{m['small_second_ms']:.2f} | {m['small_ms']:.2f} |")
    add("")

    add("## End to end: `rsembed run --fp16` on JPEG scenes")
    add("")
    ep = r["e2e_params"] or {}
    e2e = None
    for mode, es, el in (("fixed", r["e2e_small"], r["e2e_large"]), ("auto", r["e2e_auto_small"], r["e2e_auto_large"]),
                         ("tiny", r["e2e_tiny_small"], r["e2e_tiny_large"]),
                         ("float", r["e2e_float_small"], r["e2e_float_large"])):
        if not (es and el and "chips_embedded" in es and "chips_embedded" in el):
            add(f"{mode}: not run")
            add("")
            continue
        dc, dt = el["chips_embedded"] - es["chips_embedded"], el["seconds"] - es["seconds"]
        rate = dc / dt if dt > 0 else None
        raw = s16.get(ep.get("batch_size"), {}).get("images_per_s")
        one = {"chips_per_s_marginal": rate, "raw_images_per_s_at_batch": raw,
               "efficiency": rate / raw if rate and raw else None,
               "engine_busy_small": es.get("engine_busy"), "engine_busy_large": el.get("engine_busy"),
               "engine_seconds_large": el.get("engine_seconds")}
        if mode == "fixed":
            e2e = {**(e2e or {}), **one}
        else:
            e2e = {**(e2e or {}), mode: one}
        flag = {"fixed": f"fixed `--batch-size {ep.get('batch_size')}` (the fp16 probe's choice)",
                "auto": f"`--batch-size auto --max-batch {ep.get('batch_size')}`",
                "tiny": f"the committed tiny model (readers and writers alone), fixed `--batch-size {ep.get('batch_size')}`",
                "float": f"fixed `--batch-size {ep.get('batch_size')}`, `--input-dtype float` (float32 pixels; "
                         f"the other modes feed the uint8 entry when part `copies` added it)"}[mode]
        add(f"{mode}: two runs, {es['chips_embedded']} and {el['chips_embedded']} chips ({ep.get('scene_size')}x"
            f"{ep.get('scene_size')} JPEGs, one chip each), {flag}: {es['seconds']:.1f} s and {el['seconds']:.1f} s "
            f"wall, failed inputs {es['failed_inputs']} + {el['failed_inputs']}; engine busy "
            f"{num(es.get('engine_busy'), '{:.2f}')} and {num(el.get('engine_busy'), '{:.2f}')} "
            f"({num(el.get('engine_seconds'), '{:.1f}')} s running batches in the large run). The difference cancels "
            f"start-up (model hashing, session open, probe): **{num(rate)} chips/s** marginal, against {num(raw)} "
            f"images/s of the raw fp16 session at that bucket: efficiency **{num(one['efficiency'], '{:.2f}')}**.")
        add("")

    text = "\n".join(L) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    if args.json:
        everything = {"steps": steps, "gpu": gpu, "fatal": fatal, "e2e_summary": e2e, **r}
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
