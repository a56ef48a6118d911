#!/usr/bin/env python3
"""Add the uint8 entries to an rsembed model directory: vision graphs that take the
8-bit resized image, NHWC, and do the preprocessor's rescaling and normalisation in
the graph (DESIGN.md, "Contract: model directory"; docs/decisions.md, "uint8 over
the bus").

    python tools/uint8_entry.py models/git-rsclip

For `vision` (and `vision_fp16` when the manifest has it) it writes
`<graph>_u8.onnx` and the manifest entry `vision_u8` (`vision_fp16_u8`):

    uint8 [N,H,W,3] -> Transpose -> int32 + 256*channel -> Gather(LUT[768] float32)
                    -> the float graph's nodes, unchanged

The LUT is the Rust preprocessor's own (worker/src/preprocess/mod.rs): for each
channel c and 8-bit value v, float32((float32(v * rescale_factor) - mean[c]) /
std[c]), computed in float64 then float32 exactly as it does. So both entries
see bit-identical float32 pixels. The fp16 graph's Cast to float16 comes after it.

The wrapper shares the float graph's weights: each initializer is an ONNX
external-data reference (location, offset, length) to the bytes of that
initializer inside the float graph's own file (or to the float graph's external
data file when it has one). The wrapper holds only the graph structure and the
LUT, and the float graph's file is not changed, so the job's identity (the float
graph's sha256) is the same with or without the entry. The entry records the
sha256 of the graph it wraps and of preprocessor_config.json; rsembed refuses a
wrapper whose record no longer matches (a re-exported graph moves the offsets).

Idempotent: a directory whose entries are up to date is left as it is. Needs
`onnx` and `numpy`; with `onnxruntime` it also checks that each wrapper gives the
float graph's outputs on random images (bit for bit on the CPU).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record_digests  # noqa: E402  (stdlib only)

MANIFEST = "rsembed-model.json"
PREPROCESSOR = "preprocessor_config.json"
U8_INPUT = "pixels_u8"
# Initializers smaller than this stay inline: not worth an external reference.
INLINE_BELOW = 1024
ENTRIES = (("vision", "vision_u8"), ("vision_fp16", "vision_fp16_u8"))


class Refused(Exception):
    """The directory is not one this tool can extend; the message says why."""


def sha256_file(path: str) -> str:
    return record_digests.sha256_file(path)


# ----------------------------------------------------------------- protobuf offsets


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf, start: int, end: int):
    """(field number, start, end) of each length-delimited field in buf[start:end]."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            n, pos = _varint(buf, pos)
            yield field, pos, pos + n
            pos += n
        else:
            raise Refused(f"unsupported protobuf wire type {wire}")
    if pos != end:
        raise Refused("truncated protobuf message")


def raw_data_offsets(path: str) -> dict[str, tuple[int, int]]:
    """{initializer name: (offset, length)} of each top-level initializer's raw_data
    inside the ONNX file at `path` (ModelProto.graph = 7, GraphProto.initializer = 5,
    TensorProto.name = 8, TensorProto.raw_data = 9)."""
    out: dict[str, tuple[int, int]] = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        for field, gs, ge in _fields(buf, 0, len(buf)):
            if field != 7:
                continue
            for gfield, ts, te in _fields(buf, gs, ge):
                if gfield != 5:
                    continue
                name, raw = None, None
                for tfield, s, e in _fields(buf, ts, te):
                    if tfield == 8:
                        name = bytes(buf[s:e]).decode()
                    elif tfield == 9:
                        raw = (s, e - s)
                if name is not None and raw is not None:
                    out[name] = raw
    return out


# ----------------------------------------------------------------------- the LUT


def lut(pre: dict):
    """[3*256] float32: channel c's table at [256c, 256c+256), as the Rust preprocessor builds it."""
    import numpy as np

    do_rescale = pre.get("do_rescale", True)
    factor = float(pre.get("rescale_factor", 1.0 / 255.0))
    do_normalize = pre.get("do_normalize", True)
    mean = pre.get("image_mean", [0.5, 0.5, 0.5])
    std = pre.get("image_std", [0.5, 0.5, 0.5])
    if do_normalize and (len(mean) != 3 or len(std) != 3 or any(s == 0 for s in std)):
        raise Refused(f"{PREPROCESSOR}: image_mean and image_std need 3 values, std non-zero")
    v = np.arange(256, dtype=np.float64)
    # HF rescales in float64 and casts to float32; normalisation is float32.
    x = (v * factor).astype(np.float32) if do_rescale else v.astype(np.float32)
    tables = []
    for c in range(3):
        y = x
        if do_normalize:
            y = (x - np.float32(mean[c])) / np.float32(std[c])
        tables.append(y.astype(np.float32))
    return np.concatenate(tables)


# --------------------------------------------------------------------- the wrapper


def _check_input(graph, name: str, h: int, w: int, path: str):
    import onnx

    found = [i for i in graph.input if i.name == name]
    if not found:
        raise Refused(f"{path}: no graph input `{name}` (rsembed-model.json names it)")
    t = found[0].type.tensor_type
    if t.elem_type != onnx.TensorProto.FLOAT:
        raise Refused(f"{path}: input `{name}` is not float32")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    if len(dims) != 4 or dims[1] != 3 or dims[2] not in (None, h) or dims[3] not in (None, w):
        raise Refused(f"{path}: input `{name}` is {dims}, not [N,3,{h},{w}]")
    if any(i.name == U8_INPUT for i in graph.input):
        raise Refused(f"{path}: already has an input named `{U8_INPUT}`")
    return found[0]


def build_wrapper(model_dir: str, spec: dict, pre: dict) -> "onnx.ModelProto":  # noqa: F821
    """The uint8 wrapper of the graph `spec` names, its weights referring to that graph's file."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    src = os.path.join(model_dir, spec["file"])
    if not os.path.isfile(src):
        raise Refused(f"{src}: named by {MANIFEST} but missing")
    h, w = pre["size"]["height"], pre["size"]["width"]
    model = onnx.load(src, load_external_data=False)
    g = model.graph
    old = _check_input(g, spec["input"], h, w, src)
    if len(g.sparse_initializer):
        raise Refused(f"{src}: sparse initializers are not supported")
    offsets = raw_data_offsets(src)
    base = os.path.basename(spec["file"])
    for t in g.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            # Already external (a graph over 2 GB): the wrapper reads the same file.
            loc = next((e.value for e in t.external_data if e.key == "location"), "")
            if not loc or os.path.isabs(loc) or ".." in loc.replace("\\", "/").split("/"):
                raise Refused(f"{src}: external data {loc!r} of {t.name} is not beside the graph")
            continue
        if len(t.raw_data) < INLINE_BELOW:
            continue
        where = offsets.get(t.name)
        if where is None or where[1] != len(t.raw_data):
            raise Refused(f"{src}: cannot locate the bytes of initializer {t.name}")
        offset, length = where
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        del t.external_data[:]
        for k, v in (("location", base), ("offset", str(offset)), ("length", str(length))):
            e = t.external_data.add()
            e.key, e.value = k, v

    # The float input becomes an internal value produced by the preprocessing nodes.
    g.input.remove(old)
    batch = old.type.tensor_type.shape.dim[0]
    u8 = helper.make_tensor_value_info(U8_INPUT, TensorProto.UINT8, [None, h, w, 3])
    u8.type.tensor_type.shape.dim[0].CopyFrom(batch)
    g.input.insert(0, u8)
    table = numpy_helper.from_array(lut(pre), "rsembed_u8_lut")
    offs = numpy_helper.from_array(np.array([0, 256, 512], dtype=np.int32).reshape(1, 3, 1, 1), "rsembed_u8_channel")
    g.initializer.extend([table, offs])
    pre_nodes = [
        helper.make_node("Transpose", [U8_INPUT], ["rsembed_u8_nchw"], perm=[0, 3, 1, 2], name="rsembed_u8_transpose"),
        helper.make_node("Cast", ["rsembed_u8_nchw"], ["rsembed_u8_int"], to=TensorProto.INT32, name="rsembed_u8_cast"),
        helper.make_node("Add", ["rsembed_u8_int", "rsembed_u8_channel"], ["rsembed_u8_index"], name="rsembed_u8_index"),
        helper.make_node("Gather", ["rsembed_u8_lut", "rsembed_u8_index"], [spec["input"]], axis=0,
                         name="rsembed_u8_normalize"),
    ]
    nodes = list(g.node)
    del g.node[:]
    g.node.extend(pre_nodes + nodes)
    del model.metadata_props[:]
    for k, v in (("rsembed.wraps", spec["file"]), ("rsembed.wraps_sha256", sha256_file(src)),
                 ("rsembed.preprocessor_sha256", sha256_file(os.path.join(model_dir, PREPROCESSOR)))):
        p = model.metadata_props.add()
        p.key, p.value = k, v
    return model


def u8_file(float_file: str) -> str:
    stem, ext = os.path.splitext(float_file)
    return f"{stem}_u8{ext or '.onnx'}"


def _up_to_date(model_dir: str, manifest: dict, key: str, want: dict) -> bool:
    have = manifest.get(key)
    if have != want:
        return False
    path = os.path.join(model_dir, want["file"])
    rec = manifest.get("files", {}).get(want["file"])
    return os.path.isfile(path) and (rec is None or rec["sha256"] == sha256_file(path))


def check_parity(model_dir: str, float_spec: dict, u8_spec: dict, pre: dict, n: int = 3) -> float:
    """Max |float - uint8| of the two graphs' outputs on random images (onnxruntime, CPU)."""
    import numpy as np
    import onnxruntime as ort

    h, w = pre["size"]["height"], pre["size"]["width"]
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size=(n, h, w, 3), dtype=np.uint8)
    table = lut(pre).reshape(3, 256)
    chw = np.stack([table[c][img[..., c]] for c in range(3)], axis=1).astype(np.float32)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3

    def run(spec, x):
        s = ort.InferenceSession(os.path.join(model_dir, spec["file"]), opts, providers=["CPUExecutionProvider"])
        return s.run([spec["output"]], {spec["input"]: x})[0]

    return float(np.abs(run(float_spec, chw) - run(u8_spec, img)).max())


def add_entries(model_dir: str, verify: bool = True) -> list[str]:
    """Writes the uint8 entries of `model_dir`; returns what it did, one line each."""
    import onnx

    mpath = os.path.join(model_dir, MANIFEST)
    try:
        with open(mpath) as f:
            manifest = json.load(f)
        with open(os.path.join(model_dir, PREPROCESSOR)) as f:
            pre = json.load(f)
    except (OSError, ValueError) as e:
        raise Refused(f"{model_dir} is not an rsembed model directory: {e}") from e
    if manifest.get("format") != 1 or "vision" not in manifest:
        raise Refused(f"{mpath}: not an rsembed model manifest of format 1")
    if "size" not in pre:
        raise Refused(f"{PREPROCESSOR}: no size")
    pre_sha = sha256_file(os.path.join(model_dir, PREPROCESSOR))
    done, changed = [], False
    for src_key, key in ENTRIES:
        spec = manifest.get(src_key)
        if spec is None:
            continue
        want = {
            "file": u8_file(spec["file"]),
            "input": U8_INPUT,
            "output": spec["output"],
            "wraps_sha256": sha256_file(os.path.join(model_dir, spec["file"])),
            "preprocessor_sha256": pre_sha,
        }
        if _up_to_date(model_dir, manifest, key, want):
            done.append(f"{key}: up to date ({want['file']})")
            continue
        wrapper = build_wrapper(model_dir, spec, pre)
        out = os.path.join(model_dir, want["file"])
        onnx.save(wrapper, out)
        onnx.checker.check_model(out)
        manifest[key] = want
        changed = True
        line = f"{key}: wrote {want['file']} ({os.path.getsize(out)} bytes), wrapping {spec['file']}"
        if verify:
            try:
                diff = check_parity(model_dir, spec, want, pre)
            except ImportError:
                line += "; onnxruntime not installed, parity not checked"
            else:
                if diff != 0.0:
                    raise Refused(f"{want['file']}: max |float - uint8| = {diff}, expected 0 on the CPU")
                line += "; parity on the CPU: identical"
        done.append(line)
    if not done:
        raise Refused(f"{mpath}: no vision graph to wrap")
    if changed:
        with open(mpath, "w") as f:
            json.dump(manifest, f, indent=2)
            f.write("\n")
        if manifest.get("files"):
            record_digests.record(model_dir)
    return done


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", help="an rsembed model directory (tools/export_onnx.py's output)")
    p.add_argument("--no-verify", action="store_true", help="skip the onnxruntime parity check")
    args = p.parse_args(argv)
    try:
        for line in add_entries(args.model_dir, verify=not args.no_verify):
            print(line)
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
