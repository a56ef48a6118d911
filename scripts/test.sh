#!/usr/bin/env bash
# The whole test suite: formatting, lints, docs and every test, after installing
# what the tests need (Python packages into .cache/venv, ONNX Runtime into .cache/ort).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-test-env.sh
export ORT_DYLIB_PATH="$PWD/.cache/ort/libonnxruntime.so.1.31.1"
export RSEMBED_TEST_PYTHON="$PWD/.cache/venv/bin/python"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
cargo test --workspace
