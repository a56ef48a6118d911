#!/usr/bin/env python3
"""Build the tiny random-weight SigLIP test model, the test images and reference outputs.

    .cache/tools-venv/bin/python tools/make_test_model.py

Writes (paths relative to the repository root):
  fixtures/models/tiny-siglip/   model directory made by tools/export_onnx.py (--fp16),
                                 plus reference.json with Hugging Face outputs
  fixtures/images/               small deterministic synthetic images

The model has Git-RSCLIP's architecture (SiglipModel: vision tower with attention-pooling
head, text tower with last-token pooling and head) at tiny widths, and its own
sentencepiece unigram vocabulary trained here on generated captions. Everything is seeded:
running the script twice gives byte-identical files.

Size options make larger random models of the same architecture for benchmarks (never
committed), e.g. a ViT-S-shaped one for bench/pipeline.py:

    .cache/tools-venv/bin/python tools/make_test_model.py --hidden 384 --layers 6 --heads 6 \
        --intermediate 1536 --no-fp16 --out .cache/bench-models/siglip-w384-l6 \
        --images .cache/bench-models/images --checkpoint .cache/bench-models/siglip-w384-l6-hf

Without them the output is the committed tiny model, byte for byte.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_onnx  # noqa: E402  (the same exporter users run on real checkpoints)
import record_digests  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 20240517
MODEL_NAME = "tiny-siglip"
IMAGE_SIZE = 256
MAX_LENGTH = 64
VOCAB_SIZE = 400
FIXTURE_LIMIT = 3 * 1024 * 1024
IMAGES_LIMIT = 600 * 1024

# Captions for reference.json: upper case, punctuation, extra spaces, empty, too long.
REFERENCE_TEXTS = [
    "an aerial image of a river next to farmland",
    "Many PLANES are parked at the AIRPORT.",
    "a dense residential area,   with red-roofed houses; and trees!",
    "   storage tanks near the port   ",
    "",
    "a baseball field next to a school",
    "Satellite view of São Paulo in 2024",
    "a remote sensing image of a large industrial area with many storage tanks, factories, "
    "warehouses, parking lots full of trucks, railway lines, a river with two bridges, green "
    "farmland to the north and a dense residential area with hundreds of small houses to the south",
]


# --------------------------------------------------------------------------- corpus


def caption_corpus(rng: random.Random, n: int = 6000) -> list[str]:
    """Remote-sensing style captions, already in SiglipTokenizer's canonical form
    (lower case, no punctuation), since that is all the sentencepiece model ever sees."""
    scenes = (
        "airport baseball field bare land beach bridge center church commercial area dense residential "
        "desert farmland forest industrial area meadow medium residential mountain park parking lot "
        "playground pond port railway station resort river school sparse residential square stadium "
        "storage tanks viaduct harbor highway intersection golf course island lake wetland glacier "
        "vineyard orchard quarry mine solar farm wind farm dam reservoir canal runway terminal"
    ).split()
    scenes = [s.replace("_", " ") for s in scenes]
    objects = (
        "planes cars trucks ships boats buildings houses trees roads rivers fields tanks containers "
        "cranes bridges towers roofs pools tennis courts greenhouses warehouses factories tracks "
        "trains lanes clouds shadows dunes rocks waves piers docks terraces crops"
    ).split()
    adjectives = (
        "large small many several few dense sparse green brown white red blue gray dark bright "
        "rectangular circular curved straight long narrow wide old new irrigated dry flooded snowy"
    ).split()
    relations = [
        "next to", "near", "beside", "surrounded by", "between", "along", "across", "in front of",
        "behind", "on the left of", "on the right of", "to the north of", "to the south of", "around",
    ]
    openers = [
        "an aerial image of", "a satellite image of", "a remote sensing image of", "an overhead view of",
        "a high resolution image showing", "this image shows", "there is", "there are", "a photo of",
        "a top down view of", "a drone image of",
    ]
    # Extra vocabulary so the unigram trainer can reach VOCAB_SIZE pieces.
    extras = (
        "agricultural urban suburban rural coastal inland northern southern eastern western central "
        "aircraft helicopter vehicle vessel tanker freighter ferry yacht container terminal warehouse "
        "skyscraper apartment cottage villa barn silo greenhouse pavilion monument cathedral temple "
        "mosque pagoda castle fortress lighthouse windmill chimney pipeline powerline substation "
        "transformer roundabout overpass underpass tunnel embankment levee breakwater jetty marina "
        "shipyard dockyard airfield heliport hangar taxiway apron checkpoint toll plaza motorway "
        "boulevard avenue street alley footpath cycleway sidewalk crosswalk fountain garden lawn "
        "hedge shrub grassland savanna tundra steppe marsh swamp mangrove lagoon estuary peninsula "
        "archipelago plateau valley canyon ridge cliff volcano crater sandbank shoreline riverbank "
        "floodplain terrace paddy plantation cornfield wheat rice cotton sugarcane olive citrus "
        "cemetery hospital university campus library museum theater stadium arena racetrack "
        "velodrome swimming basketball football soccer cricket hockey volleyball badminton "
        "construction demolition excavation landfill scrapyard refinery smelter brewery sawmill "
        "quarry gravel asphalt concrete brick timber steel glass solar panels turbines reflective "
        "shadowed cloudy hazy foggy sunny winter summer autumn spring morning evening nighttime"
    ).split()
    scenes += extras[: len(extras) // 2]
    objects += extras[len(extras) // 2 :]
    places = [
        "são paulo", "zürich", "kraków", "malmö", "québec", "reykjavík", "córdoba", "düsseldorf",
        "北京", "上海", "东京", "서울", "river delta", "the alps",
        # Greek with both sigma forms (σ, word-final ς), Turkish dotless ı, German ß: the
        # tokenizer probe's lower-casing edge cases only bite if these are in the vocabulary.
        "θεσσαλονίκη", "οδός", "νήσος", "σοφία", "straße", "ılıca",
    ]
    lines = []
    for _ in range(n):
        k = rng.random()
        if k < 0.45:
            s = f"{rng.choice(openers)} {rng.choice(adjectives)} {rng.choice(scenes)}"
            if rng.random() < 0.7:
                s += f" {rng.choice(relations)} {rng.choice(adjectives)} {rng.choice(objects)}"
        elif k < 0.75:
            s = f"{rng.randint(2, 120)} {rng.choice(adjectives)} {rng.choice(objects)} {rng.choice(relations)} a {rng.choice(scenes)}"
        elif k < 0.9:
            s = f"{rng.choice(scenes)} in {rng.choice(places)} {rng.randint(1990, 2030)}"
        else:
            s = " ".join(rng.choice(adjectives + objects + scenes) for _ in range(rng.randint(3, 12)))
        lines.append(s)
    return lines


def train_sentencepiece(path: str) -> None:
    import sentencepiece as spm

    spm.set_random_generator_seed(SEED)
    lines = caption_corpus(random.Random(SEED))
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=buf,
        model_type="unigram",
        vocab_size=VOCAB_SIZE,
        # SigLIP's special-token layout: <pad>=0, </s>=1 (eos and pad in HF), <unk>=2, no <s>.
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
        # Default nmt_nfkc rule: embeds a precompiled charsmap, which tokenizer.json must
        # carry over (the real SigLIP vocabulary has one too).
        normalization_rule_name="nmt_nfkc",
        character_coverage=1.0,
        # Determinism: single thread, no sampling of input sentences.
        num_threads=1,
        shuffle_input_sentence=False,
        input_sentence_size=0,
        minloglevel=2,
    )
    with open(path, "wb") as f:
        f.write(buf.getvalue())


# --------------------------------------------------------------------------- model


class Size:
    """Tower sizes; the defaults are the committed tiny model's. Both towers get the same
    sizes, and the text head projects to the vision width, as in SigLIP."""

    def __init__(self, hidden: int = 64, layers: int = 2, heads: int = 4, intermediate: int | None = None):
        if hidden % heads:
            raise SystemExit(f"--hidden {hidden} is not a multiple of --heads {heads}")
        self.hidden, self.layers, self.heads = hidden, layers, heads
        self.intermediate = intermediate if intermediate is not None else 2 * hidden

    def is_tiny(self) -> bool:
        return (self.hidden, self.layers, self.heads, self.intermediate) == (64, 2, 4, 128)


def build_checkpoint(ckpt_dir: str, size: Size | None = None):
    import torch
    from transformers import SiglipConfig, SiglipModel, SiglipTokenizer

    try:
        from transformers import SiglipImageProcessorPil as ImageProcessor
    except ImportError:
        from transformers import SiglipImageProcessor as ImageProcessor

    export_onnx.silence_default_config_warning()
    spm_path = os.path.join(ckpt_dir, "spiece.model")
    train_sentencepiece(spm_path)
    tokenizer = SiglipTokenizer(vocab_file=spm_path, model_max_length=MAX_LENGTH)

    size = size or Size()
    tower = dict(
        hidden_size=size.hidden, intermediate_size=size.intermediate, num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
    )
    config = SiglipConfig(
        text_config=dict(
            vocab_size=tokenizer.vocab_size, **tower, max_position_embeddings=MAX_LENGTH,
            projection_size=size.hidden,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        ),
        vision_config=dict(**tower, image_size=IMAGE_SIZE, patch_size=16, num_channels=3),
    )
    torch.manual_seed(SEED)
    model = SiglipModel(config).eval()
    with torch.no_grad():
        # SigLIP's init is meant for training: with it the random towers map every input to
        # nearly the same vector (cosine ~1). Larger patch, token and position weights make
        # the content dominate the biases, so tests can tell images and texts apart.
        model.vision_model.embeddings.patch_embedding.weight.mul_(4.0)
        model.vision_model.embeddings.position_embedding.weight.mul_(2.0)
        model.text_model.embeddings.token_embedding.weight.mul_(20.0)
        # Sharper attention and a stronger attention branch: otherwise the pooled token
        # (the last one, nearly always padding) is mostly its own residual stream.
        for layer in (*model.vision_model.encoder.layers, *model.text_model.encoder.layers):
            attn = layer.self_attn
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
                proj.weight.mul_(3.0)
        # Trained-like values (SigLIP learns log(scale) ~ 4.7, bias ~ -12) instead of the
        # init values, so scores computed from the manifest look realistic.
        model.logit_scale.fill_(float(np.log(10.0)))
        model.logit_bias.fill_(-10.0)

    model.save_pretrained(ckpt_dir)
    tokenizer.save_pretrained(ckpt_dir)
    # SigLIP's real defaults at Git-RSCLIP's 256x256 input.
    ImageProcessor(
        do_resize=True, size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, resample=3,
        do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    ).save_pretrained(ckpt_dir)


# --------------------------------------------------------------------------- images


def _scene(w: int, h: int, seed: int):
    """An aerial-looking synthetic scene: field patches, crop stripes, a river, roads,
    buildings, a smooth illumination gradient and mild noise. Mild noise keeps PNGs small
    while still exercising every pixel of the resampler."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    base = np.stack(
        [90 + 60 * xx / w, 110 + 50 * yy / h, 60 + 40 * (xx + yy) / (w + h)], axis=-1
    )
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB")
    d = ImageDraw.Draw(img)
    palette = [(134, 160, 70), (190, 170, 100), (90, 130, 60), (160, 120, 80), (200, 190, 150), (70, 100, 50)]
    for _ in range(int(rng.integers(5, 10))):
        x0, y0 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
        x1, y1 = min(w, x0 + int(rng.integers(w // 8, w // 2))), min(h, y0 + int(rng.integers(h // 8, h // 2)))
        color = palette[int(rng.integers(len(palette)))]
        d.rectangle([x0, y0, x1, y1], fill=color)
        step = int(rng.integers(3, 7))
        darker = tuple(max(0, c - 25) for c in color)
        for x in range(x0, x1, step):  # crop rows
            d.line([x, y0, x, y1], fill=darker)
    pts = [(0, int(h * rng.uniform(0.2, 0.8)))]
    for i in range(1, 9):
        pts.append((int(w * i / 8), int(np.clip(pts[-1][1] + rng.integers(-h // 6, h // 6), 0, h - 1))))
    d.line(pts, fill=(40, 80, 150), width=max(3, w // 30))  # river
    d.line([(int(w * rng.uniform(0.1, 0.9)), 0), (int(w * rng.uniform(0.1, 0.9)), h)], fill=(120, 120, 120), width=3)
    d.line([(0, int(h * rng.uniform(0.1, 0.9))), (w, int(h * rng.uniform(0.1, 0.9)))], fill=(150, 150, 150), width=2)
    for _ in range(int(rng.integers(8, 20))):  # buildings
        x0, y0 = int(rng.integers(0, w - 6)), int(rng.integers(0, h - 6))
        s = int(rng.integers(3, 10))
        d.rectangle([x0, y0, x0 + s, y0 + s], fill=(200, 60, 50) if rng.random() < 0.5 else (220, 220, 215))
    cx, cy, r = int(rng.integers(w // 4, 3 * w // 4)), int(rng.integers(h // 4, 3 * h // 4)), min(w, h) // 8
    d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=(60, 110, 160), outline=(30, 60, 90))  # pond
    arr = np.asarray(img).astype(np.int16) + rng.integers(-4, 5, size=(h, w, 3), dtype=np.int16)
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")


def write_images(images_dir: str) -> list[str]:
    """Writes the test images; returns their paths relative to fixtures/."""
    from PIL import Image

    os.makedirs(images_dir, exist_ok=True)
    out = []

    def save(img, name, **kw):
        img.save(os.path.join(images_dir, name), **kw)
        out.append(f"images/{name}")

    # Model-sized, lossless: the processor's resize is a no-op, so pixel values are exact.
    save(_scene(256, 256, 1), "aerial_256.png", optimize=False)
    save(_scene(256, 256, 2), "aerial_256_lzw.tif", compression="tiff_lzw")
    # 4:4:4 so that decoders differ only by IDCT rounding, not by chroma upsampling.
    save(_scene(64, 64, 3), "small_64.jpg", quality=92, subsampling=0)
    save(_scene(300, 200, 4), "wide_300x200.png", optimize=False)
    # The common 4:2:0 JPEG layout, odd dimensions.
    save(_scene(511, 383, 5), "odd_511x383.jpg", quality=85, subsampling=2)
    save(_scene(128, 128, 6).convert("L"), "gray_128.png", optimize=False)
    rgba = _scene(200, 300, 7).convert("RGBA")
    alpha = np.tile(np.linspace(255, 0, 200).astype(np.uint8), (300, 1))
    alpha[100:200, 50:150] = 0  # fully transparent block: RGB must still be used as is
    rgba.putalpha(Image.fromarray(alpha, "L"))
    save(rgba, "rgba_200x300.png", optimize=False)
    return out


# --------------------------------------------------------------------------- reference


def _floats(a) -> list[float]:
    # float() of a float32 is exact; json writes repr(), the shortest exact decimal.
    return [float(x) for x in np.asarray(a, dtype=np.float32).reshape(-1)]


def _to_json(value, indent: str = "") -> str:
    """JSON with one line per array of numbers: readable diffs, a fraction of indent=1's size."""
    inner = indent + "  "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {_to_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        return "[\n" + ",\n".join(inner + _to_json(v, inner) for v in value) + "\n" + indent + "]"
    return json.dumps(value, ensure_ascii=False)


def write_reference(ckpt_dir: str, fixtures_dir: str, image_files: list[str], ref_path: str,
                    name: str = MODEL_NAME) -> None:
    import PIL
    import torch
    import transformers
    from PIL import Image

    model, tokenizer, processor = export_onnx.load_checkpoint(ckpt_dir)
    rng = np.random.default_rng(SEED)
    positions = [[int(rng.integers(3)), int(rng.integers(IMAGE_SIZE)), int(rng.integers(IMAGE_SIZE))] for _ in range(64)]

    images = []
    for rel in image_files:
        with Image.open(os.path.join(fixtures_dir, rel)) as im:
            width, height = im.size
            rgb = im.convert("RGB")
        pv = processor(images=rgb, return_tensors="pt")["pixel_values"].to(torch.float32)
        with torch.no_grad():
            emb = export_onnx.features(model.get_image_features(pixel_values=pv))[0].numpy()
        pv0 = pv[0].numpy()
        images.append(
            {
                "file": rel,
                "width": width,
                "height": height,
                "resized": (width, height) != (IMAGE_SIZE, IMAGE_SIZE),
                "pixel_values_mean": [float(pv0[c].astype(np.float64).mean()) for c in range(3)],
                "pixel_values_sample": [[c, y, x, float(pv0[c, y, x])] for c, y, x in positions],
                "image_embeds": _floats(emb),
            }
        )

    texts = []
    for text in REFERENCE_TEXTS:
        ids = export_onnx.slow_ids(tokenizer, text, MAX_LENGTH)
        with torch.no_grad():
            emb = export_onnx.features(model.get_text_features(input_ids=torch.tensor([ids])))[0].numpy()
        texts.append({"text": text, "input_ids": ids, "text_embeds": _floats(emb)})

    reference = {
        "model": name,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "pillow_version": PIL.__version__,
        "images": images,
        "texts": texts,
        "tokenizer_probe": [
            {"text": t, "input_ids": export_onnx.slow_ids(tokenizer, t, MAX_LENGTH)}
            for t in export_onnx.reference_probe_texts()
        ],
    }
    with open(ref_path, "w", encoding="utf-8") as f:
        f.write(_to_json(reference) + "\n")

    # Sanity check that the random towers separate inputs (cosines well below 1).
    img = np.array([i["image_embeds"] for i in images])
    txt = np.array([t["text_embeds"] for t in texts])
    for label, m in (("image", img), ("text", txt)):
        m = m / np.linalg.norm(m, axis=1, keepdims=True)
        sim = m @ m.T
        off = sim[~np.eye(len(m), dtype=bool)]
        print(f"{label} cosine similarity (off-diagonal min {off.min():.3f}, max {off.max():.3f}, mean {off.mean():.3f}):")
        for row in sim:
            print("   " + " ".join(f"{v:6.3f}" for v in row))


def dir_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(REPO, "fixtures", "models", MODEL_NAME), help="model directory to write")
    p.add_argument("--images", default=os.path.join(REPO, "fixtures", "images"), help="image directory to write")
    p.add_argument("--checkpoint", help="also keep the Hugging Face checkpoint in this directory "
                   "(e.g. to run tools/export_onnx.py on it by hand); default: a temporary directory")
    size = p.add_argument_group("model size (defaults: the committed tiny model; other sizes skip the fixture size limit)")
    size.add_argument("--hidden", type=int, default=64, help="width of both towers (default 64)")
    size.add_argument("--layers", type=int, default=2, help="encoder layers per tower (default 2)")
    size.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    size.add_argument("--intermediate", type=int, help="MLP width (default 2 x --hidden)")
    p.add_argument("--name", help=f"model name in rsembed-model.json (default {MODEL_NAME!r} at the default "
                   "size, otherwise siglip-w<hidden>-l<layers>)")
    p.add_argument("--no-fp16", dest="fp16", action="store_false",
                   help="skip vision_model_fp16.onnx: at larger widths the amplified random weights push "
                   "float16 past the exporter's cosine bound (0.998 at width 384)")
    args = p.parse_args(argv)
    size = Size(args.hidden, args.layers, args.heads, args.intermediate)
    name = args.name or (MODEL_NAME if size.is_tiny() else f"siglip-w{size.hidden}-l{size.layers}")
    fixtures_dir = os.path.dirname(os.path.abspath(args.images))

    for d in (args.out, args.images):  # stale files must not survive a regeneration
        if os.path.isdir(d):
            shutil.rmtree(d)

    with tempfile.TemporaryDirectory(prefix="tiny-siglip-") as tmp:
        ckpt = args.checkpoint or tmp
        os.makedirs(ckpt, exist_ok=True)
        build_checkpoint(ckpt, size)
        if not export_onnx.export(ckpt, args.out, fp16=args.fp16, name=name):
            print("export FAILED", file=sys.stderr)
            return 1
        image_files = write_images(args.images)
        write_reference(ckpt, fixtures_dir, image_files, os.path.join(args.out, "reference.json"), name)
        # reference.json is written after the export: record it as well, so the
        # committed manifest describes every file of the fixture.
        record_digests.record(args.out)

    model_bytes, image_bytes = dir_size(args.out), dir_size(args.images)
    print(f"{args.out}: {model_bytes} bytes; {args.images}: {image_bytes} bytes")
    for name in sorted(os.listdir(args.out)):
        print(f"   {os.path.getsize(os.path.join(args.out, name)):>9}  {name}")
    for name in sorted(os.listdir(args.images)):
        print(f"   {os.path.getsize(os.path.join(args.images, name)):>9}  images/{name}")
    if size.is_tiny() and (model_bytes > FIXTURE_LIMIT or image_bytes > IMAGES_LIMIT):
        print(f"fixtures too large (limits {FIXTURE_LIMIT} and {IMAGES_LIMIT} bytes)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
