#!/usr/bin/env python3
"""The usual PyTorch alternative to `rsembed run`: embed a folder of images into Parquet.

What a Git-RSCLIP user writes following the model card and the PyTorch tutorials:
a torch Dataset that decodes with PIL and applies Hugging Face's PIL-based
SiglipImageProcessor, a DataLoader with worker processes, transformers SiglipModel
(default attention implementation) `get_image_features` under inference_mode, L2
normalisation, and one Parquet file written with pyarrow (path + embedding, zstd as
rsembed writes). `bench/pipeline.py` runs it beside `rsembed run` on the same images.

    .cache/tools-venv/bin/python -m pip install pyarrow   # once
    .cache/tools-venv/bin/python bench/torch_pipeline.py --checkpoint HF_DIR \\
        --input FOLDER --output OUT.parquet [--batch 16] [--workers 1] [--threads 2]

Prints one JSON line: images, seconds after start-up (imports done; model loading
included, as in rsembed's own summary), and the time split.
"""

import time

T_PROCESS = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from transformers import SiglipModel  # noqa: E402

try:  # transformers >= 5: the PIL-based processor is SiglipImageProcessorPil
    from transformers import SiglipImageProcessorPil as SiglipImageProcessor  # noqa: E402
except ImportError:
    from transformers import SiglipImageProcessor  # noqa: E402

EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff")


class Images(Dataset):
    def __init__(self, folder, processor):
        self.paths = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.lower().endswith(EXTENSIONS))
        self.processor = processor

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with Image.open(self.paths[i]) as im:
            rgb = im.convert("RGB")
        return self.processor(images=rgb, return_tensors="pt")["pixel_values"][0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True, help="Hugging Face SiglipModel directory")
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True, help="Parquet file to write")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=1, help="DataLoader worker processes")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads")
    args = ap.parse_args()
    t_imported = time.perf_counter()

    torch.set_num_threads(args.threads)
    model = SiglipModel.from_pretrained(args.checkpoint, dtype=torch.float32).eval()
    processor = SiglipImageProcessor.from_pretrained(args.checkpoint)
    data = Images(args.input, processor)
    loader = DataLoader(data, batch_size=args.batch, num_workers=args.workers,
                        persistent_workers=False, pin_memory=False)
    t_loaded = time.perf_counter()

    rows = []
    with torch.inference_mode():
        for pixels in loader:
            out = model.get_image_features(pixel_values=pixels)
            emb = out if hasattr(out, "shape") else out.pooler_output  # a ModelOutput in transformers 5
            emb = torch.nn.functional.normalize(emb, dim=-1)
            rows.append(emb.numpy().astype(np.float32, copy=False))
    t_embedded = time.perf_counter()

    emb = np.concatenate(rows)
    dim = emb.shape[1]
    table = pa.table({
        "path": pa.array(data.paths),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), dim),
    })
    pq.write_table(table, args.output, compression="zstd")
    t_done = time.perf_counter()

    print(json.dumps({
        "images": len(emb),
        "seconds": t_done - t_imported,
        "imports_s": t_imported - T_PROCESS,
        "load_s": t_loaded - t_imported,
        "loop_s": t_embedded - t_loaded,
        "write_s": t_done - t_embedded,
        "attn_implementation": model.config._attn_implementation,
        "workers": args.workers,
        "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
