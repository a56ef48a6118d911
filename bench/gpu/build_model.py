#!/usr/bin/env python3
"""Build a random-weight SigLIP of Git-RSCLIP-L's shape and export it as an rsembed model
directory, with the project's exporter (tools/export_onnx.py) doing the ONNX work.

    python3 bench/gpu/build_model.py --out /tmp/rsembed-gpu/models/vitl \
        --checkpoint /tmp/rsembed-gpu/models/vitl-hf            # Git-RSCLIP-L shape
    python3 bench/gpu/build_model.py --out /tmp/m --hidden 64 --layers 2 --heads 4 \
        --intermediate 256 --ort-cpu-parity                       # small, to test on a CPU

Vision tower (the benchmark): --hidden/--layers/--heads/--intermediate/--patch at --image
pixels; the defaults are siglip-large-patch16-256, Git-RSCLIP-L's base: width 1024, 24
layers, 16 heads, MLP 4096, patch 16, 256x256 (about 316M parameters). Weights are
SigLIP's default initialisation (no amplification as in make_test_model.py: at this depth
that pushes float16 out of range), seeded.

Text tower: tiny (--text-hidden, --text-layers) with projection to the vision width, so the
manifest's embed_dim is right; rsembed's vision path never runs it. Its vocabulary and
tokenizer.json are the committed tiny model's (fixtures/models/tiny-siglip, verified against
SiglipTokenizer by make_test_model.py), so this script needs no sentencepiece and runs no
tokenizer verification. preprocessor_config.json is copied from there too (256x256,
SigLIP's defaults); --image other than 256 rewrites its size.

What tools/export_onnx.py's export() does and this script does too: eager-attention
checkpoint, export_graph() (TorchScript exporter, opset 17, dynamic batch) for both
towers, convert_fp16() (keep_io_types), config.json, the same rsembed-model.json fields.
What it does not do by default: ORT parity (export_onnx.check_parity, run with onnxruntime
on the CPU) -- too slow for a 316M-parameter fp16 graph within the device budget; pass
--ort-cpu-parity to run it (it is skipped, and says so, when onnxruntime is missing).
Instead it writes bench_parity.json: a few seeded images and PyTorch's float32 embeddings
of them, which `gpu_bench sweep` compares with what ONNX Runtime's CUDA provider gives.

convert_fp16 needs onnxruntime.transformers.float16; without onnxruntime, the copy of
float16.py that bench/gpu/prepare.sh takes from the onnxruntime-gpu wheel is used
(--float16-py, or $RSEMBED_FLOAT16_PY).

Writes build_info.json beside the model: sizes, versions, timings, what was skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURE = os.path.join(REPO, "fixtures", "models", "tiny-siglip")
SEED = 20240517


def fail(msg: str) -> None:
    print(f"build_model.py: FATAL: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def preflight() -> dict:
    missing = [m for m in ("numpy", "torch", "transformers", "onnx") if importlib.util.find_spec(m) is None]
    if missing:
        fail(f"python modules missing: {missing} (python {sys.executable})")
    for f in ("tokenizer.json", "preprocessor_config.json", "rsembed-model.json"):
        if not os.path.isfile(os.path.join(FIXTURE, f)):
            fail(f"{FIXTURE}/{f} missing (the working tree did not travel?)")
    if not os.path.isfile(os.path.join(REPO, "tools", "export_onnx.py")):
        fail("tools/export_onnx.py missing")
    import onnx
    import torch
    import transformers

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": _version_of("onnxruntime"),
        "cuda_available": bool(torch.cuda.is_available()),
    }


def _version_of(mod: str):
    if importlib.util.find_spec(mod) is None:
        return None
    try:
        return __import__(mod).__version__
    except Exception as e:  # a broken install is as good as none here
        return f"unusable: {e}"


def load_float16_converter(float16_py: str | None):
    """onnxruntime's converter, or the standalone copy of float16.py."""
    try:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        return convert_float_to_float16, "onnxruntime.transformers.float16"
    except Exception as e:  # ImportError, or an onnxruntime that fails to load
        why = f"{type(e).__name__}: {e}"
    path = float16_py or os.environ.get("RSEMBED_FLOAT16_PY")
    if not path or not os.path.isfile(path):
        fail(f"no float16 converter: onnxruntime.transformers.float16 ({why}) and no --float16-py file ({path})")
    spec = importlib.util.spec_from_file_location("ort_float16_standalone", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.convert_float_to_float16, f"{path} (onnxruntime not importable: {why})"


def convert_fp16(converter, src: str, dst: str) -> None:
    """model_format.convert_fp16 (tools/) with the converter passed in."""
    import model_format
    import onnx

    model = onnx.load(src)
    fp16 = converter(model, keep_io_types=True)
    model_format.topological_sort(fp16.graph)
    onnx.save(fp16, dst)
    onnx.checker.check_model(dst)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="model directory to write (replaced)")
    p.add_argument("--checkpoint", help="Hugging Face checkpoint directory to keep (default: <out>-hf)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--intermediate", type=int, default=4096)
    p.add_argument("--patch", type=int, default=16)
    p.add_argument("--image", type=int, default=256)
    p.add_argument("--text-hidden", type=int, default=64)
    p.add_argument("--text-layers", type=int, default=1)
    p.add_argument("--text-heads", type=int, default=4)
    p.add_argument("--name", help="manifest name (default siglip-w<hidden>-l<layers>-random)")
    p.add_argument("--no-fp16", dest="fp16", action="store_false")
    p.add_argument("--init-device", default="auto", help="where weights are initialised: auto (cuda if there), cuda, cpu")
    p.add_argument("--parity-n", type=int, default=4, help="images in bench_parity.json (0: none)")
    p.add_argument("--ort-cpu-parity", action="store_true",
                   help="also run export_onnx.check_parity (onnxruntime on the CPU; slow at full size)")
    p.add_argument("--float16-py", help="standalone float16.py, used when onnxruntime is missing")
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--no-fuse", action="store_true", help="the graph as exported, without tools/fuse_graph.py")
    args = p.parse_args(argv)
    t_start = time.time()
    info = {"versions": preflight(), "skipped": [], "seconds": {}}
    if args.hidden % args.heads or args.text_hidden % args.text_heads:
        fail("widths must be multiples of the head counts")

    sys.path.insert(0, os.path.join(REPO, "tools"))
    import export_onnx  # the project's exporter: the same export_graph / fp16 / manifest logic
    import numpy as np
    import torch
    from transformers import SiglipConfig, SiglipModel

    converter, converter_from = (None, None)
    if args.fp16:
        converter, converter_from = load_float16_converter(args.float16_py)
    info["float16_converter"] = converter_from

    export_onnx.silence_default_config_warning()
    with open(os.path.join(FIXTURE, "tokenizer.json"), encoding="utf-8") as f:
        vocab_size = len(json.load(f)["model"]["vocab"])
    with open(os.path.join(FIXTURE, "rsembed-model.json"), encoding="utf-8") as f:
        max_length = int(json.load(f)["text"]["max_length"])

    out = os.path.abspath(args.out)
    ckpt = os.path.abspath(args.checkpoint or out.rstrip("/") + "-hf")
    for d in (out, ckpt):
        if os.path.isdir(d):
            shutil.rmtree(d)
        os.makedirs(d)

    config = SiglipConfig(
        text_config=dict(
            vocab_size=vocab_size, hidden_size=args.text_hidden, intermediate_size=2 * args.text_hidden,
            num_hidden_layers=args.text_layers, num_attention_heads=args.text_heads,
            max_position_embeddings=max_length, projection_size=args.hidden,
            pad_token_id=0, eos_token_id=1, bos_token_id=None,
        ),
        vision_config=dict(
            hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
            num_attention_heads=args.heads, image_size=args.image, patch_size=args.patch, num_channels=3,
        ),
    )
    init_dev = args.init_device
    if init_dev == "auto":
        init_dev = "cuda" if torch.cuda.is_available() else "cpu"
    t = time.time()
    torch.manual_seed(SEED)
    with torch.device(init_dev):
        model = SiglipModel(config).eval()
    n_vision = sum(p.numel() for p in model.vision_model.parameters())
    n_all = sum(p.numel() for p in model.parameters())
    model.save_pretrained(ckpt)
    del model
    info["seconds"]["init_and_save_checkpoint"] = time.time() - t
    print(f"checkpoint {ckpt}: vision {n_vision / 1e6:.1f}M parameters, all {n_all / 1e6:.1f}M "
          f"(initialised on {init_dev}), {info['seconds']['init_and_save_checkpoint']:.1f} s", flush=True)

    # As export_onnx.load_checkpoint: eager attention (plain MatMul/Softmax), float32.
    t = time.time()
    model = SiglipModel.from_pretrained(ckpt, attn_implementation="eager", dtype=torch.float32).eval()
    h, w = export_onnx.image_hw(model)
    length = export_onnx.text_max_length(model)
    VisionTower, TextTower = export_onnx._towers()
    export_onnx.export_graph(VisionTower(model), torch.zeros(1, 3, h, w), os.path.join(out, "vision_model.onnx"),
                             "pixel_values", "image_embeds", args.opset)
    info["seconds"]["export_vision_fp32"] = time.time() - t
    print(f"vision_model.onnx: {info['seconds']['export_vision_fp32']:.1f} s", flush=True)
    t = time.time()
    export_onnx.export_graph(TextTower(model), torch.zeros(1, length, dtype=torch.int64),
                             os.path.join(out, "text_model.onnx"), "input_ids", "text_embeds", args.opset)
    info["seconds"]["export_text"] = time.time() - t
    if not args.no_fuse:
        # As export_onnx.export: attention and GELU fused before the fp16 conversion.
        import fuse_graph

        t = time.time()
        vision = os.path.join(out, "vision_model.onnx")
        info["fused"] = fuse_graph.fuse(vision, vision, args.heads, args.hidden)
        info["seconds"]["fuse"] = time.time() - t
        print(f"fused {info['fused']}: {info['seconds']['fuse']:.1f} s", flush=True)
    else:
        info["skipped"].append("attention/GELU fusion (tools/fuse_graph.py): --no-fuse")
    if args.fp16:
        t = time.time()
        convert_fp16(converter, os.path.join(out, "vision_model.onnx"),
                     os.path.join(out, "vision_model_fp16.onnx"))
        info["seconds"]["convert_fp16"] = time.time() - t
        print(f"vision_model_fp16.onnx: {info['seconds']['convert_fp16']:.1f} s ({converter_from})", flush=True)

    shutil.copy(os.path.join(FIXTURE, "tokenizer.json"), out)
    with open(os.path.join(FIXTURE, "preprocessor_config.json"), encoding="utf-8") as f:
        pre = json.load(f)
    pre["size"] = {"height": h, "width": w}
    with open(os.path.join(out, "preprocessor_config.json"), "w", encoding="utf-8") as f:
        json.dump(pre, f, indent=2)
        f.write("\n")
    model.config.save_pretrained(out)
    info["skipped"].append("tokenizer verification: tokenizer.json is the committed tiny model's (already verified)")

    with torch.no_grad():
        embed_dim = int(export_onnx.features(
            model.get_text_features(input_ids=torch.zeros(1, length, dtype=torch.int64))).shape[-1])
    import transformers

    manifest = {
        "format": export_onnx.FORMAT_VERSION,
        "name": args.name or f"siglip-w{args.hidden}-l{args.layers}-random",
        "embed_dim": embed_dim,
        "vision": {"file": "vision_model.onnx", "input": "pixel_values", "output": "image_embeds"},
        "text": {"file": "text_model.onnx", "input": "input_ids", "output": "text_embeds", "max_length": length},
        "logit_scale": float(model.logit_scale.detach().reshape(-1)[0]),
        "logit_bias": float(model.logit_bias.detach().reshape(-1)[0]),
    }
    if args.fp16:
        manifest["vision_fp16"] = {"file": "vision_model_fp16.onnx", "input": "pixel_values", "output": "image_embeds"}
    manifest.update({
        "image_size": [h, w],
        "opset": args.opset,
        "exporter_version": export_onnx.EXPORTER_VERSION,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
    })
    with open(os.path.join(out, "rsembed-model.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")

    # PyTorch's float32 embeddings of a few seeded images (TF32 off), for gpu_bench's parity check.
    if args.parity_n > 0:
        t = time.time()
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        rng = np.random.default_rng(SEED)
        x = rng.uniform(-1.0, 1.0, size=(args.parity_n, 3, h, w)).astype(np.float32)
        tower = VisionTower(model).to(dev)
        with torch.no_grad():
            ref = tower(torch.from_numpy(x).to(dev)).double().cpu().numpy()
        model.to("cpu")
        ref = (ref / np.linalg.norm(ref, axis=1, keepdims=True)).astype(np.float32)
        x.astype("<f4").tofile(os.path.join(out, "bench_parity_input.f32"))
        ref.astype("<f4").tofile(os.path.join(out, "bench_parity_ref.f32"))
        cos = ref @ ref.T
        off = cos[~np.eye(len(ref), dtype=bool)]
        with open(os.path.join(out, "bench_parity.json"), "w") as f:
            json.dump({"n": args.parity_n, "dim": int(ref.shape[1]), "input": "bench_parity_input.f32",
                       "reference": "bench_parity_ref.f32", "reference_device": dev,
                       "max_cosine_between_images": float(off.max()) if off.size else None}, f, indent=2)
            f.write("\n")
        info["seconds"]["parity_reference"] = time.time() - t
        print(f"bench_parity.json: {args.parity_n} images, PyTorch fp32 on {dev}; cosine between different "
              f"images up to {float(off.max()) if off.size else float('nan'):.4f}", flush=True)

    ok = True
    if args.ort_cpu_parity:
        try:
            import onnxruntime  # noqa: F401
            why = None
        except Exception as e:  # missing, or installed but broken
            why = f"{type(e).__name__}: {e}"
        if why:
            info["skipped"].append(f"ORT CPU parity: onnxruntime is not importable ({why})")
            print(f"ORT CPU parity: SKIPPED (onnxruntime is not importable: {why})", flush=True)
        else:
            t = time.time()
            ok = export_onnx.check_parity(out, model, args.fp16)
            info["seconds"]["ort_cpu_parity"] = time.time() - t
            info["ort_cpu_parity"] = "ok" if ok else "FAILED"
    else:
        info["skipped"].append("ORT CPU parity (export_onnx.check_parity): not asked for (--ort-cpu-parity); "
                               "gpu_bench checks the CUDA provider against bench_parity.json instead")

    info["config"] = {k: getattr(args, k) for k in ("hidden", "layers", "heads", "intermediate", "patch", "image",
                                                   "text_hidden", "text_layers", "fp16")}
    info["parameters"] = {"vision": n_vision, "all": n_all}
    info["files"] = {f: os.path.getsize(os.path.join(out, f)) for f in sorted(os.listdir(out))}
    info["checkpoint"] = ckpt
    info["seconds"]["total"] = time.time() - t_start
    with open(os.path.join(out, "build_info.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    for f, n in info["files"].items():
        print(f"   {n:>12}  {f}")
    print(f"built {out} in {info['seconds']['total']:.1f} s; skipped: {'; '.join(info['skipped']) or 'nothing'}",
          flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
