#!/usr/bin/env bash
# Puts ONNX Runtime's shared library from the PyPI wheel under .cache/, with
# pip's own download (no custom URLs), and prints the library's path.
#   scripts/setup-ort.sh         CPU build (onnxruntime==1.31.1)      -> .cache/ort/
#   scripts/setup-ort.sh --gpu   CUDA 13 build (onnxruntime-gpu==1.31.1) -> .cache/ort-gpu/
set -euo pipefail
cd "$(dirname "$0")/.."
version=1.31.1
pkg=onnxruntime
dest=.cache/ort
if [[ "${1:-}" == "--gpu" ]]; then
  pkg=onnxruntime-gpu
  dest=.cache/ort-gpu
fi
lib="$dest/libonnxruntime.so.$version"
if [[ ! -f "$lib" ]]; then
  mkdir -p "$dest/wheel"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$dest/wheel" "$pkg==$version" >&2
  wheel=$(ls "$dest"/wheel/*.whl | head -n 1)
  # The CUDA provider libraries must sit beside libonnxruntime.so, so take every
  # shared object of onnxruntime/capi, not just the one.
  python3 - "$wheel" "$dest" <<'PY'
import sys, zipfile, os
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("onnxruntime/capi/lib") and ".so" in n]
    if not names:
        sys.exit(f"no shared libraries in {wheel}")
    for n in names:
        out = os.path.join(dest, os.path.basename(n))
        with z.open(n) as src, open(out + ".part", "wb") as dst:
            dst.write(src.read())
        os.replace(out + ".part", out)
PY
  rm -rf "$dest/wheel"
fi
ln -sf "libonnxruntime.so.$version" "$dest/libonnxruntime.so"
echo "$PWD/$lib"
