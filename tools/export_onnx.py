#!/usr/bin/env python3
"""Export a Hugging Face SigLIP checkpoint into an rsembed model directory.

    python tools/export_onnx.py --model /path/to/Git-RSCLIP --out models/git-rsclip --fp16

Works for any `SiglipModel` checkpoint (lcybuaa/Git-RSCLIP, lcybuaa/Git-RSCLIP-base,
google/siglip-*). Writes the files described in DESIGN.md "Contract: model directory",
then checks every graph against PyTorch and the generated tokenizer.json against the
sentencepiece-based SiglipTokenizer; any mismatch exits non-zero.

CPU only. The reference for every number is what transformers computes.
"""

from __future__ import annotations

import argparse
import json
import os
import string
import sys
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record_digests  # noqa: E402  (stdlib only; also a script of its own)
from model_format import EXPORTER_VERSION, FORMAT_VERSION, convert_fp16  # noqa: E402

DEFAULT_OPSET = 17

# fp32 graphs must match PyTorch to this absolute tolerance (brief: 1e-3).
FP32_MAX_ABS_DIFF = 1e-3
# A float16 graph cannot match absolutely on un-normalized features whose scale depends on
# the checkpoint, so it is judged on what rsembed uses: the direction of the embedding.
FP16_MIN_COSINE = 0.999

SPIECE_UNDERLINE = "\u2581"

# Texts on which tokenizer.json must give exactly SiglipTokenizer's ids. They cover every
# step of SiglipTokenizer: lower-casing, punctuation removal, whitespace collapsing and
# stripping, the sentencepiece normalizer (precompiled NFKC charsmap), unknown characters,
# truncation and padding. make_test_model.py stores their ids in reference.json.
PROBE_TEXTS = [
    "an aerial image of a river next to farmland",
    "An AERIAL Image Of A River NEXT TO Farmland",
    "many planes are parked next to the terminal building of an airport.",
    "Hello, World! (test) [brackets] {braces} <angle> \"double\" 'single' `back`",
    "~tilde @at #hash $dollar %percent ^caret &amp *star _under -dash +plus =eq |pipe \\ /slash :colon ;semi ?q .dot",
    "many    spaces\tand\t\ttabs\nand\n\nnewlines\r\nand\x0bvertical\x0cfeed",
    "   leading and trailing spaces   ",
    "\t\n leading tab and newline",
    "",
    " ",
    "...",
    "!?",
    ", leading punctuation then space",
    "trailing punctuation then space . ",
    "digits 0123456789, 2024-05-17 and 3.14159; 1st 2nd 3rd 100m 25km2",
    "café naïve résumé São Paulo Zürich Kraków Malmö",
    "decomposed cafe\u0301 nai\u0308ve",
    "北京 上海 东京の空港 서울",
    "emoji 🛰️🌍🚢 satellite 🛰 ",
    "fullwidth ＡＢＣ １２３ ｆｕｌｌ，ｗｉｄｔｈ！",
    "ligatures ﬁeld ﬂow ﬀ",
    "compatibility ™ ½ ① ㎞ Ⅻ ²",
    "Greek ΟΔΟΣ ΣΟΦΙΑ ΑΣΣ Σ",
    "Turkish İSTANBUL ılık",
    "German STRASSE straße ẞ",
    "non-breaking\u00a0space, ideographic\u3000space, thin\u2009space, nnbsp\u202fend",
    "zero\u200bwidth\u200b space and\u200djoiner\ufeffbom",
    "separators\x1cfile\x1dgroup\x1erecord\x1funit\x85nel\u2028line\u2029para",
    "controls\x00nul\x07bel\x7fdel",
    "the \u2581 metaspace char \u2581x and \u2581\u2581double",
    "acute ´ diaeresis ¨ macron ¯ cedilla ¸",
    "´leading acute",
    "tab\t",
    "a " * 40,
    "an extremely detailed high resolution remote sensing image showing a dense residential area "
    "with many red roofed buildings, several green trees, a wide river crossing from north to south, "
    "two bridges, a large parking lot with hundreds of cars and an industrial zone with storage tanks",
    "x" * 300,
]


def fuzz_texts(count: int, seed: int = 0) -> list[str]:
    """Seeded random strings mixing every character class the curated probes cover.

    Left out on purpose, because tokenizer.json cannot follow SiglipTokenizer there (see
    tools/README.md): capital sigma next to case-ignorable characters (Python's Final_Sigma
    rule looks further than a regex lookbehind can) and combining marks, ZWJ or variation
    selectors (the `tokenizers` Precompiled normalizer drops them after a character that
    NFKC rewrites)."""
    import random

    pools = [
        (10, string.ascii_letters),
        (2, string.digits),
        (3, string.punctuation),
        (3, " \t\n\r\x0b\x0c\x1c\x1f\x85\xa0\u2009\u3000\u200b\u2581"),
        (2, "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßÀÉÎÕÜẞİı"),
        (2, "ΑΒΓΔσςαβγδοΟ"),
        (1, "北京上海东京の空港서울"),
        (1, "ＡＢＣ１２３！，"),
        (1, "ﬁﬂﬀ™½①㎞Ⅻ²´¨¯¸"),
        (1, "🛰🌍🚢"),
    ]
    weights, chars = zip(*pools)
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        n = rng.randint(0, 90)  # up to past max_length, to exercise truncation too
        texts.append("".join(rng.choice(rng.choices(chars, weights=weights)[0]) for _ in range(n)))
    return texts


# Verified by the exporter (fatal on mismatch); the first REFERENCE_FUZZ of the fuzz texts
# also go into the test model's reference.json so rsembed's own tokenizer build is checked
# on them too.
FUZZ_COUNT = 2000
REFERENCE_FUZZ = 100


def reference_probe_texts() -> list[str]:
    return PROBE_TEXTS + fuzz_texts(REFERENCE_FUZZ)


# Inputs where tokenizer.json cannot reproduce SiglipTokenizer; reported, never fatal.
# - Literal special-token strings: the slow tokenizer splits them out of the raw text before
#   canonicalization, tokenizes the text after them without the leading "▁", and skips the
#   final </s> when the text already ends with one. tokenizer.json splits them too (same id
#   for the special token itself) but prefixes the following text with "▁" and always
#   appends </s>.
# - Text that NFKC turns into a control piece ("＜unk＞" -> "<unk>"): sentencepiece never
#   matches control pieces inside text, the `tokenizers` Unigram model does.
KNOWN_DIVERGENT_TEXTS = [
    "a river </s> next to farmland",
    "<unk> unknown marker",
    "ends with eos </s>",
    "fullwidth ＜unk＞ and ＜pad＞",
]


# --------------------------------------------------------------------------- loading


def load_checkpoint(model_path: str):
    """Loads model, slow tokenizer and PIL image processor, all as transformers defines them."""
    import torch
    from transformers import SiglipModel, SiglipTokenizer

    try:  # transformers >= 5: SiglipImageProcessor is torchvision-based, the PIL one is *Pil.
        from transformers import SiglipImageProcessorPil as ImageProcessor
    except ImportError:  # transformers 4.x: SiglipImageProcessor is the PIL-based one.
        from transformers import SiglipImageProcessor as ImageProcessor

    # Eager attention gives plain MatMul/Softmax graphs with no SDPA tracing special cases.
    model = SiglipModel.from_pretrained(model_path, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    tokenizer = SiglipTokenizer.from_pretrained(model_path)
    image_processor = ImageProcessor.from_pretrained(model_path)
    return model, tokenizer, image_processor


def silence_default_config_warning() -> None:
    """transformers validates a *default* SiglipTextConfig whenever it prints or saves a
    config; its CLIP-era bos/eos ids (49406/49407) lie outside the default vocabulary, so it
    warns about a config nobody uses. Only that message is dropped."""
    import logging

    logging.getLogger("transformers.configuration_utils").addFilter(
        lambda record: "an integer within the vocabulary" not in record.getMessage()
    )


def features(out):
    """get_*_features returns a tensor in transformers 4.x and a ModelOutput in 5.x."""
    return out if hasattr(out, "shape") else out.pooler_output


def _towers():
    import torch

    class VisionTower(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return features(self.model.get_image_features(pixel_values=pixel_values))

    class TextTower(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            # No attention mask: SigLIP is trained on max_length-padded ids and pools the last
            # token, which is exactly what transformers computes for input_ids alone.
            return features(self.model.get_text_features(input_ids=input_ids))

    return VisionTower, TextTower


def text_max_length(model) -> int:
    return int(model.config.text_config.max_position_embeddings)


def image_hw(model) -> tuple[int, int]:
    size = int(model.config.vision_config.image_size)
    return size, size


# --------------------------------------------------------------------------- ONNX export


def export_graph(module, example, path, input_name, output_name, opset):
    import torch

    # The TorchScript exporter (dynamo=False): deterministic output, no onnxscript
    # dependency, and SigLIP has no data-dependent control flow that would need dynamo.
    # Its warnings are expected: the deprecation notice, and TracerWarnings about shape
    # checks that are constant here (image size and max_length are fixed by design).
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            module,
            (example,),
            path,
            input_names=[input_name],
            output_names=[output_name],
            dynamic_axes={input_name: {0: "batch"}, output_name: {0: "batch"}},
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
    import onnx

    onnx.checker.check_model(path)


# --------------------------------------------------------------------------- tokenizer.json


def _char_class(chars) -> str:
    # \x{...} escapes are understood identically by Oniguruma (Python tokenizers) and
    # fancy-regex (the Rust crate as rsembed builds it), whatever the character.
    return "[" + "".join("\\x{%X}" % ord(c) for c in sorted(chars)) + "]"


def python_whitespace() -> list[str]:
    # SiglipTokenizer uses re.sub(r"\s+") and str.strip(): Python's notion of whitespace,
    # which includes \x1c-\x1f and differs from Rust's char::is_whitespace.
    return [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]


def load_spm_proto(slow_tok):
    from sentencepiece import sentencepiece_model_pb2

    return sentencepiece_model_pb2.ModelProto.FromString(slow_tok.sp_model.serialized_model_proto())


def build_tokenizer_json(slow_tok, max_length: int):
    """A `tokenizers` pipeline equivalent to SiglipTokenizer(..., padding="max_length",
    truncation=True, max_length=max_length).

    What SiglipTokenizer does (transformers tokenization_siglip.py):
      1. text = "▁" + text.replace("▁", " ")
      2. canonicalize: lower() if do_lower_case, drop string.punctuation,
         re.sub(r"\\s+", " "), strip()  -- the strip cannot remove the leading "▁", so only
         trailing whitespace goes and a leading space survives as " " after "▁".
      3. sp_model.encode("<unk>" + text) minus the pieces of "<unk>": the prefix keeps
         sentencepiece's dummy prefix away from the text; sentencepiece then applies its
         normalizer (charsmap, collapse of spaces, trailing-space removal, " " -> "▁").
      4. append </s>, truncate to max_length (keeping room for </s>), pad with pad_token.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    proto = load_spm_proto(slow_tok)
    tspec, nspec = proto.trainer_spec, proto.normalizer_spec
    if tspec.model_type != 1:  # UNIGRAM
        raise SystemExit(f"unsupported sentencepiece model type {tspec.model_type} (need unigram)")
    if tspec.treat_whitespace_as_suffix:
        raise SystemExit("unsupported sentencepiece option treat_whitespace_as_suffix")

    vocab = [(p.piece, p.score) for p in proto.pieces]
    model = models.Unigram(vocab, unk_id=tspec.unk_id, byte_fallback=tspec.byte_fallback)
    tok = Tokenizer(model)

    steps = [normalizers.Replace(SPIECE_UNDERLINE, " ")]
    if slow_tok.do_lower_case:
        # Python's str.lower() maps a word-final capital sigma to "ς" (Unicode Final_Sigma);
        # the Lowercase normalizer maps every "Σ" to "σ". Approximated with one cased
        # character of left context, which is all fancy-regex lookbehind allows.
        steps.append(normalizers.Replace(Regex(r"(?<=\p{Cased})\x{3A3}(?!\p{Case_Ignorable}*\p{Cased})"), "\u03c2"))
        steps.append(normalizers.Lowercase())
    steps += [
        normalizers.Replace(Regex(_char_class(string.punctuation)), ""),
        normalizers.Replace(Regex(_char_class(python_whitespace()) + "+"), " "),
        normalizers.Replace(Regex(r" \z"), ""),  # str.strip(), trailing side only (see 2.)
        # The "▁" of step 1 (Prepend skips empty strings). nmt_nfkc charsmaps map it to a space,
        # which is why a leading space then collapses into it, in both implementations.
        normalizers.Prepend(SPIECE_UNDERLINE),
    ]
    if nspec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(nspec.precompiled_charsmap))
    if nspec.remove_extra_whitespaces:
        steps += [
            normalizers.Replace(Regex(" {2,}"), " "),
            # sentencepiece strips trailing "▁" after escaping; the text is empty when
            # nothing but the prefix is left, exactly as SiglipTokenizer yields no pieces.
            normalizers.Replace(Regex("[ " + SPIECE_UNDERLINE + r"]+\z"), ""),
        ]
    tok.normalizer = normalizers.Sequence(steps)
    # split=False: one Viterbi pass over the whole text, as sentencepiece does (this also
    # keeps its fusion of consecutive unknown characters across words).
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPIECE_UNDERLINE, prepend_scheme="never", split=False)
    tok.decoder = decoders.Metaspace(replacement=SPIECE_UNDERLINE, prepend_scheme="always", split=False)

    # The special tokens the slow tokenizer splits out of raw text, with its strip flags.
    for idx, added in sorted(slow_tok.added_tokens_decoder.items()):
        if idx < len(vocab) and vocab[idx][0] != added.content:
            raise SystemExit(f"added token {added.content!r} has id {idx} but piece {vocab[idx][0]!r}")
        tok.add_special_tokens(
            [
                AddedToken(
                    added.content,
                    single_word=added.single_word,
                    lstrip=added.lstrip,
                    rstrip=added.rstrip,
                    normalized=added.normalized,
                    special=added.special,
                )
            ]
        )

    eos, eos_id = str(slow_tok.eos_token), slow_tok.eos_token_id
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {eos}:0", pair=f"$A:0 {eos}:0 $B:0 {eos}:0", special_tokens=[(eos, eos_id)]
    )
    # The slow tokenizer truncates the text ids to max_length - 1 and then appends </s>;
    # tokenizers reserves room for the template's special tokens the same way.
    tok.enable_truncation(max_length=max_length, strategy="longest_first", direction="right")
    tok.enable_padding(direction="right", length=max_length, pad_id=slow_tok.pad_token_id, pad_token=str(slow_tok.pad_token))
    return tok


def slow_ids(slow_tok, text: str, max_length: int) -> list[int]:
    return list(slow_tok(text, padding="max_length", truncation=True, max_length=max_length)["input_ids"])


def verify_tokenizer(tokenizer_json: str, slow_tok, max_length: int) -> bool:
    """Compares tokenizer.json (reloaded from disk, as rsembed does) with SiglipTokenizer."""
    from tokenizers import Tokenizer

    fast = Tokenizer.from_file(tokenizer_json)
    texts = PROBE_TEXTS + fuzz_texts(FUZZ_COUNT)
    failures = 0
    for text in texts:
        want = slow_ids(slow_tok, text, max_length)
        got = fast.encode(text, add_special_tokens=True).ids
        if got != want:
            failures += 1
            print(f"TOKENIZER MISMATCH for {text!r}\n  SiglipTokenizer: {want}\n  tokenizer.json:  {got}")
    with warnings.catch_warnings():  # SiglipTokenizer warns about the literal </s>
        warnings.simplefilter("ignore", UserWarning)
        n_div = sum(slow_ids(slow_tok, t, max_length) != fast.encode(t).ids for t in KNOWN_DIVERGENT_TEXTS)
    print(f"tokenizer probe: {len(PROBE_TEXTS)} curated + {FUZZ_COUNT} random texts, "
          f"{'ok' if not failures else f'{failures} MISMATCHES'}; {n_div}/{len(KNOWN_DIVERGENT_TEXTS)} texts "
          "with literal special tokens differ (known, not checked)")
    return failures == 0


# --------------------------------------------------------------------------- parity


def _ort_session(path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def check_parity(out_dir, model, fp16: bool) -> bool:
    """Runs every graph on random batches of 2 and 3 (the dynamic batch axis) against PyTorch."""
    import torch

    VisionTower, TextTower = _towers()
    h, w = image_hw(model)
    length = text_max_length(model)
    vocab_size = int(model.config.text_config.vocab_size)
    gen = torch.Generator().manual_seed(1234)
    batches = {
        n: (torch.randn(n, 3, h, w, generator=gen), torch.randint(0, vocab_size, (n, length), generator=gen))
        for n in (2, 3)
    }
    graphs = [("vision_model.onnx", VisionTower(model), 0), ("text_model.onnx", TextTower(model), 1)]
    if fp16:
        graphs.append(("vision_model_fp16.onnx", VisionTower(model), 0))

    ok = True
    for name, tower, which in graphs:
        sess = _ort_session(os.path.join(out_dir, name))
        in_name = sess.get_inputs()[0].name
        max_diff, min_cos = 0.0, 1.0
        for n, inputs in batches.items():
            x = inputs[which]
            with torch.no_grad():
                ref = tower(x).numpy().astype(np.float64)
            got = sess.run(None, {in_name: x.numpy()})[0]
            if got.shape != ref.shape or got.dtype != np.float32:
                print(f"{name}: batch {n} gave {got.dtype}{list(got.shape)}, expected float32{list(ref.shape)}")
                ok = False
                continue
            got = got.astype(np.float64)
            max_diff = max(max_diff, float(np.abs(got - ref).max()))
            cos = (got * ref).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(ref, axis=-1))
            min_cos = min(min_cos, float(cos.min()))
        if name.endswith("_fp16.onnx"):
            passed = min_cos >= FP16_MIN_COSINE
            bound = f"min cosine >= {FP16_MIN_COSINE}"
        else:
            passed = max_diff <= FP32_MAX_ABS_DIFF
            bound = f"max abs diff <= {FP32_MAX_ABS_DIFF:g}"
        ok &= passed
        print(f"parity {name:24s} batches 2,3: max abs diff {max_diff:.3e}, min cosine {min_cos:.8f} "
              f"[{bound}: {'ok' if passed else 'FAILED'}]")
    return ok


# --------------------------------------------------------------------------- main


def export(model_path: str, out_dir: str, fp16: bool = False, opset: int = DEFAULT_OPSET, name: str | None = None,
           fuse: bool = True) -> bool:
    import torch
    import transformers

    if opset < 17:
        raise SystemExit("--opset must be >= 17")
    silence_default_config_warning()
    model, slow_tok, image_processor = load_checkpoint(model_path)
    length = text_max_length(model)
    h, w = image_hw(model)
    size = image_processor.size
    if (size.get("height"), size.get("width")) != (h, w):
        # rsembed takes the input size from preprocessor_config.json; both must agree.
        raise SystemExit(f"preprocessor size {dict(size)} does not match vision image_size {h}")
    os.makedirs(out_dir, exist_ok=True)

    VisionTower, TextTower = _towers()
    export_graph(VisionTower(model), torch.zeros(1, 3, h, w), os.path.join(out_dir, "vision_model.onnx"),
                 "pixel_values", "image_embeds", opset)
    export_graph(TextTower(model), torch.zeros(1, length, dtype=torch.int64), os.path.join(out_dir, "text_model.onnx"),
                 "input_ids", "text_embeds", opset)
    if fuse:
        import fuse_graph

        vision = os.path.join(out_dir, "vision_model.onnx")
        vc = model.config.vision_config
        print(f"fused: {fuse_graph.fuse(vision, vision, vc.num_attention_heads, vc.hidden_size)}")
    if fp16:
        convert_fp16(os.path.join(out_dir, "vision_model.onnx"), os.path.join(out_dir, "vision_model_fp16.onnx"))

    tok_path = os.path.join(out_dir, "tokenizer.json")
    build_tokenizer_json(slow_tok, length).save(tok_path, pretty=False)

    image_processor.save_pretrained(out_dir)
    model.config.save_pretrained(out_dir)

    with torch.no_grad():
        embed_dim = int(features(model.get_text_features(input_ids=torch.zeros(1, length, dtype=torch.int64))).shape[-1])
    manifest = {
        "format": FORMAT_VERSION,
        "name": name or os.path.basename(os.path.normpath(model_path)),
        "embed_dim": embed_dim,
        "vision": {"file": "vision_model.onnx", "input": "pixel_values", "output": "image_embeds"},
        "text": {"file": "text_model.onnx", "input": "input_ids", "output": "text_embeds", "max_length": length},
        "logit_scale": float(model.logit_scale.detach().reshape(-1)[0]),
        "logit_bias": float(model.logit_bias.detach().reshape(-1)[0]),
    }
    if fp16:
        manifest["vision_fp16"] = {"file": "vision_model_fp16.onnx", "input": "pixel_values", "output": "image_embeds"}
    manifest.update(
        {
            "image_size": [h, w],
            "opset": opset,
            "exporter_version": EXPORTER_VERSION,
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__.split("+")[0],
        }
    )
    with open(os.path.join(out_dir, "rsembed-model.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    # The digests of every other file, which `rsembed fetch-model` checks.
    record_digests.record(out_dir)
    # The uint8 NHWC entries wrapping the vision graphs (their weights shared);
    # they re-record the digests.
    import uint8_entry

    for line in uint8_entry.add_entries(out_dir):
        print(line)

    ok = verify_tokenizer(tok_path, slow_tok, length)
    ok &= check_parity(out_dir, model, fp16)
    print(f"embed_dim {embed_dim}, max_length {length}, vocab {slow_tok.vocab_size}, image {h}x{w}, opset {opset}")
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="Hugging Face model id or local checkpoint directory")
    p.add_argument("--out", required=True, help="output model directory")
    p.add_argument("--fp16", action="store_true", help="also write vision_model_fp16.onnx")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET, help=f"ONNX opset, >= 17 (default {DEFAULT_OPSET})")
    p.add_argument("--name", help="model name for rsembed-model.json (default: last path component)")
    p.add_argument("--no-fuse", action="store_true",
                   help="leave attention and GELU unfused (tools/fuse_graph.py; fused is 1.67x faster in fp16 on CUDA)")
    args = p.parse_args(argv)
    ok = export(args.model, args.out, fp16=args.fp16, opset=args.opset, name=args.name, fuse=not args.no_fuse)
    if not ok:
        print("export FAILED: see mismatches above", file=sys.stderr)
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
