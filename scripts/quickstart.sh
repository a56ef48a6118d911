#!/usr/bin/env bash
# Quick start: builds rsembed, fetches ONNX Runtime 1.31.1 from PyPI, and embeds
# the sample images in fixtures/images with the committed tiny test model, in
# embedded mode (no server). The summary it prints ends with where the
# GeoParquet is and a DuckDB query to look at it.
set -euo pipefail
cd "$(dirname "$0")/.."
lib=$(scripts/setup-ort.sh)
cargo build --release --quiet -p rsembed-coordinator
out=${1:-out/quickstart}
exec target/release/rsembed run \
  --ort-lib "$lib" \
  --input fixtures/images \
  --output "$out" \
  --model fixtures/models/tiny-siglip
