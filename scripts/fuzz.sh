#!/usr/bin/env bash
# Bounded fuzzing of rsembed-raster's TIFF and JPEG readers (cargo-fuzz project in fuzz/).
#
#   scripts/fuzz.sh [seconds_per_target]
#
# Seconds per target: the argument, else $FUZZ_SECONDS, else 60. Targets: all
# of fuzz/fuzz_targets, or those named in $FUZZ_TARGETS (space separated).
#
# Exits non-zero when any target crashes (panic, sanitizer report, per-input
# timeout, out-of-memory), after running every target, and prints the path of
# each crashing input. Reproduce one with
#   RUSTC_BOOTSTRAP=1 .cache/cargo-fuzz/bin/cargo-fuzz fuzz run -a <target> <path>
# and keep the minimized input (cargo fuzz tmin) under fuzz/regressions/<target>/:
# every file there is replayed before fuzzing starts, so it stays fixed.
#
# Works on a fresh machine (installs cargo-fuzz from crates.io) and reuses
# between runs on the same machine, all git-ignored:
#   .cache/cargo-fuzz/     cargo-fuzz binary (cargo install --root)
#   fuzz/target/           instrumented build
#   .cache/fuzz/corpus/    the corpus the fuzzer grows, seeded from fuzz/corpus/
# CI should cache those three paths.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-${FUZZ_SECONDS:-60}}"
case "$secs" in
'' | *[!0-9]*) echo "usage: $0 [seconds_per_target]" >&2; exit 2 ;;
esac

CARGO_FUZZ_VERSION=0.13.2
root="$PWD/.cache/cargo-fuzz"
if ! "$root/bin/cargo-fuzz" --version 2>/dev/null | grep -qx "cargo-fuzz $CARGO_FUZZ_VERSION"; then
    cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION" --root "$root"
fi
export PATH="$root/bin:$PATH"

# cargo-fuzz builds with -Zsanitizer=address (and other -Z flags), which only a
# nightly compiler accepts. Only stable Rust is available here, so
# RUSTC_BOOTSTRAP=1 unlocks the nightly features of the stable compiler. It is
# set for this script's fuzz builds only; the normal build and tests never see it.
export RUSTC_BOOTSTRAP=1

# -a: debug assertions and overflow checks, so wrapping size arithmetic (a way
# around TiffLimits) panics instead of passing silently.
build_flags=(--fuzz-dir fuzz -a)

if [ -n "${FUZZ_TARGETS:-}" ]; then
    read -r -a targets <<<"$FUZZ_TARGETS"
else
    mapfile -t targets < <(cargo fuzz list --fuzz-dir fuzz)
fi

start=$(date +%s)
cargo fuzz build "${build_flags[@]}"
echo "fuzz: build took $(($(date +%s) - start)) s"

# libFuzzer options common to every target:
#   -rss_limit_mb=2048  a run whose resident memory passes 2 GiB is a crash
#   -timeout=30         an input taking longer than 30 s is a crash (hang)
#   -max_len=16384      inputs up to 16 KiB (the seeds are 2-9 KiB)
common_opts=(-rss_limit_mb=2048 -timeout=30 -max_len=16384 -print_final_stats=1)

# Per-target options. tiff_decode reads with tight TiffLimits (tiles <= 4 MiB,
# fetch <= 8 MiB, window <= 2^20 samples, ZSTD window <= 8 MiB): no single
# allocation it makes may legitimately come near 64 MiB (16 x max_tile_bytes),
# so a larger one is reported as a crash (a limit bypass).
target_opts() {
    case "$1" in
    tiff_decode) echo "-malloc_limit_mb=64" ;;
    *) echo "-malloc_limit_mb=2048" ;;
    esac
}

failed=()
mkdir -p .cache/fuzz
for t in "${targets[@]}"; do
    log=".cache/fuzz/$t.log"
    reg="fuzz/regressions/$t"
    if compgen -G "$reg/*" >/dev/null; then
        echo "fuzz: $t: replaying $(find "$reg" -type f | wc -l) regression input(s) from $reg"
        # Files given as arguments are each run once.
        if ! cargo fuzz run "${build_flags[@]}" "$t" "$reg"/* -- "${common_opts[@]}" \
            $(target_opts "$t") >"$log.regressions" 2>&1; then
            tail -n 60 "$log.regressions"
            last=$(grep -oE 'Running: .+' "$log.regressions" | tail -n 1 | cut -d' ' -f2-)
            echo "fuzz: $t: REGRESSION: ${last:-an input under $reg} crashes again (log: $log.regressions)" >&2
            failed+=("$t")
            continue
        fi
    fi
    corpus=".cache/fuzz/corpus/$t"
    mkdir -p "$corpus"
    echo "fuzz: $t: ${secs} s (log: $log)"
    # The first corpus directory receives new inputs; the seeds are read only.
    set +e
    cargo fuzz run "${build_flags[@]}" "$t" "$corpus" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" "${common_opts[@]}" $(target_opts "$t") >"$log" 2>&1
    rc=$?
    set -e
    grep -E '^(stat::|#[0-9]+[[:space:]]+DONE)' "$log" || true
    if [ "$rc" -ne 0 ]; then
        tail -n 80 "$log"
        inputs=$(grep -oE '(Test unit written to|artifact written to) [^ ]+' "$log" | awk '{print $NF}' | sort -u)
        echo "fuzz: $t: CRASH (exit $rc); crashing input(s):" >&2
        echo "${inputs:-  (none written, see $log)}" | sed 's/^/  /' >&2
        failed+=("$t")
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz: ${#targets[@]} target(s), ${secs} s each, no crash"
