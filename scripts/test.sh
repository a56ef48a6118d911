#!/usr/bin/env bash
# The whole test suite: formatting, lints, docs and every test, after installing
# what the tests need (Python packages into .cache/venv, ONNX Runtime into .cache/ort).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-test-env.sh
# CI builds once from clean: incremental caches only cost disk there.
if [[ "${CI:-}" == "true" ]]; then
  export CARGO_INCREMENTAL=0
  df -h . | tail -1 | awk '{ print "rsembed: disk free before the build: " $4 }'
fi
export ORT_DYLIB_PATH="$PWD/.cache/ort/libonnxruntime.so.1.31.1"
export RSEMBED_TEST_PYTHON="$PWD/.cache/venv/bin/python"
cargo fmt --all -- --check
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
cargo clippy --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
log=.cache/test-output.log
# Tests that skip (no ../shared/data, no promtool) say so here, so the closing
# line counts them as skipped, not passed (libtest has no skip of its own).
export RSEMBED_SKIP_LOG="$PWD/.cache/skipped-tests.txt"
rm -f "$RSEMBED_SKIP_LOG"
set +e
# Every test target runs even after one fails, so one red run shows them all.
cargo test --workspace --no-fail-fast 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# Bounded fuzzing of the TIFF and JPEG readers (about 60 s a target, after an
# instrumented build of rsembed-raster alone): in CI, or with RSEMBED_FUZZ=1.
fuzz_status=0
if [[ "${CI:-}" == "true" || "${RSEMBED_FUZZ:-0}" == "1" ]]; then
  scripts/fuzz.sh "${FUZZ_SECONDS:-60}" || fuzz_status=$?
fi
# One closing line for the whole suite; cargo's own last line is the last
# crate's doc-tests, which has none.
skips=0
if [[ -f "$RSEMBED_SKIP_LOG" ]]; then
  # One line a test, however often it said so.
  sort -u -o "$RSEMBED_SKIP_LOG" "$RSEMBED_SKIP_LOG"
  skips=$(wc -l < "$RSEMBED_SKIP_LOG")
  sed 's/^/rsembed: skipped /' "$RSEMBED_SKIP_LOG"
fi
awk -v status="$status" -v skips="$skips" '/^test result:/ { p += $4; f += $6; i += $8 }
     END {
       printf "rsembed: %d passed, %d failed, %d skipped\n", p - skips, f, i + skips
       # A build error stops cargo test before any test fails: say so.
       if (status != 0 && f == 0) printf "rsembed: cargo test exited with status %d before finishing (see %s)\n", status, FILENAME
     }' "$log"
if [[ "$status" -eq 0 && "$fuzz_status" -ne 0 ]]; then
  status=$fuzz_status
fi
exit "$status"
