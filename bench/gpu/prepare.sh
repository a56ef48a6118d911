#!/usr/bin/env bash
# Prepares the GPU benchmark's payload ON THIS (CPU) MACHINE, before a device session.
#
#   bench/gpu/prepare.sh            build, download, compress, split, self-check
#   ZSTD_LEVEL=19 bench/gpu/prepare.sh   (default 9: 188 MB in 5 s; 19 saves 2 MB for 160 s)
#
# 1. Release builds of what the device runs: `rsembed` and the `gpu_bench` example.
# 2. `pip download onnxruntime-gpu==1.31.1 --no-deps` (cached in .cache/ort-gpu-wheel/),
#    from which it takes libonnxruntime.so.1.31.1, libonnxruntime_providers_shared.so,
#    libonnxruntime_providers_cuda.so (284 MB) and onnxruntime/transformers/float16.py.
# 3. base.tar.xz: the two binaries (debug info stripped), the two small ORT libraries and
#    float16.py; the device unpacks it with python3's tarfile (no zstd needed there).
# 4. The CUDA provider compressed with zstd, split by bench/gpu/pack.py into one chunk per
#    device call so that each call carries less than 64 MiB with the working tree, under
#    bench/gpu/payload/callN/ (git-ignored), with manifest.json (sha256 of every chunk and
#    of the reassembled file) and SHA256SUMS in each.
# 5. Self-check: reassembles the chunks with `gpu_bench unpack` (the device's own code
#    path), checks the sha256, unpacks base.tar.xz and runs the unpacked gpu_bench.
#
# Prints the device call sequence (also in bench/gpu/payload/CALLS.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=1.31.1
LEVEL=${ZSTD_LEVEL:-9}
PAY=bench/gpu/payload
WORK=${GPU_BENCH_WORK:-.cache/gpu-bench-work}  # big intermediate files, never carried
WHEEL_DIR=${ORT_GPU_WHEEL_DIR:-.cache/ort-gpu-wheel}
CUDA=libonnxruntime_providers_cuda.so

fail() { echo "prepare.sh: FATAL: $*" >&2; exit 1; }
for t in cargo python3 zstd xz tar sha256sum strip git objdump; do
  command -v "$t" >/dev/null || fail "$t is not installed"
done
git check-ignore -q "$PAY/call1/x" || fail "$PAY is not git-ignored: .gitignore needs /bench/gpu/payload/"
[[ $(uname -m) == x86_64 ]] || fail "the device is x86-64; build there-compatible binaries on an x86-64 machine"

echo "== 1/5 release builds"
cargo build --release -p rsembed-coordinator --bin rsembed
cargo build --release -p rsembed-worker --example gpu_bench

echo "== 2/5 onnxruntime-gpu==$VERSION wheel"
mkdir -p "$WHEEL_DIR" "$WORK"
wheel=$(ls "$WHEEL_DIR"/onnxruntime_gpu-"$VERSION"-*.whl 2>/dev/null | head -n 1 || true)
if [[ -z $wheel ]]; then
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$WHEEL_DIR" "onnxruntime-gpu==$VERSION"
  wheel=$(ls "$WHEEL_DIR"/onnxruntime_gpu-"$VERSION"-*.whl | head -n 1)
fi
echo "$wheel"
rm -rf "$WORK/base" && mkdir -p "$WORK/base/bin" "$WORK/base/ort" "$WORK/base/py"
python3 - "$wheel" "$WORK" <<'EOF'
import os, sys, zipfile
wheel, work = sys.argv[1], sys.argv[2]
want = {
    "onnxruntime/capi/libonnxruntime.so.1.31.1": "base/ort/libonnxruntime.so.1.31.1",
    "onnxruntime/capi/libonnxruntime_providers_shared.so": "base/ort/libonnxruntime_providers_shared.so",
    "onnxruntime/transformers/float16.py": "base/py/float16.py",
    "onnxruntime/capi/libonnxruntime_providers_cuda.so": "libonnxruntime_providers_cuda.so",
}
with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    for member, dest in want.items():
        if member not in names:
            sys.exit(f"{wheel} has no {member}")
        out = os.path.join(work, dest)
        info = z.getinfo(member)
        if dest.endswith("cuda.so") and os.path.isfile(out) and os.path.getsize(out) == info.file_size:
            continue  # unchanged; keeps the compressed copy's cache valid
        with z.open(member) as src, open(out + ".part", "wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
        os.replace(out + ".part", out)
EOF

echo "== 3/5 base.tar.xz"
strip --strip-debug -o "$WORK/base/bin/rsembed" target/release/rsembed
strip --strip-debug -o "$WORK/base/bin/gpu_bench" target/release/examples/gpu_bench
git_head="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- worker coordinator schemas 2>/dev/null || echo +dirty)"
printf 'rsembed bench/gpu payload\ncreated %s\ngit %s\nwheel %s\n' "$(date -u +%FT%TZ)" "$git_head" \
  "$(basename "$wheel")" >"$WORK/base/BUILD.txt"
tar -C "$WORK/base" -cf - . | xz -T2 -6 >"$WORK/base.tar.xz"
ls -la "$WORK/base.tar.xz"

echo "== 4/5 zstd -$LEVEL of $CUDA"
raw_sha=$(sha256sum "$WORK/$CUDA" | cut -d' ' -f1)
stamp="$raw_sha zstd-$LEVEL"
if [[ -f $WORK/$CUDA.zst && "$(cat "$WORK/$CUDA.zst.stamp" 2>/dev/null)" == "$stamp" ]]; then
  echo "cached: $WORK/$CUDA.zst"
else
  rm -f "$WORK/$CUDA.zst.stamp"
  s0=$(date +%s)
  zstd -q -f -T0 "-$LEVEL" "$WORK/$CUDA" -o "$WORK/$CUDA.zst"
  echo "$stamp" >"$WORK/$CUDA.zst.stamp"
  echo "compressed in $(( $(date +%s) - s0 )) s"
fi
ls -la "$WORK/$CUDA" "$WORK/$CUDA.zst"

needs=$(objdump -p "$WORK/$CUDA" | awk '/NEEDED/ {print $2}')
# What always travels with a call: tracked and untracked, not ignored files (and shared/).
tree_bytes=$( (git ls-files -z -co --exclude-standard; if [[ -d shared ]]; then find shared -type f -print0; fi) |
  xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
python3 - "$WORK" "$LEVEL" "$git_head" "$(basename "$wheel")" $needs <<'EOF'
import hashlib, json, os, sys, time
work, level, head, wheel, *needs = sys.argv[1:]
base = os.path.join(work, "base")
contents = []
for root, _, files in os.walk(base):
    for f in sorted(files):
        p = os.path.join(root, f)
        contents.append({"path": os.path.relpath(p, base), "bytes": os.path.getsize(p),
                         "sha256": hashlib.sha256(open(p, "rb").read()).hexdigest()})
json.dump({"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "git_head": head,
           "ort_version": "1.31.1", "wheel": wheel, "compression": f"zstd -{level}",
           "cuda_provider_needs": needs, "base_contents": contents},
          open(os.path.join(work, "meta.json"), "w"), indent=2)
EOF
# A fresh clone has no payload folder yet (it is git-ignored).
mkdir -p "$PAY"
python3 bench/gpu/pack.py --work "$WORK" --payload "$PAY" --tree-bytes "$tree_bytes" \
  --limit-mib "${CALL_LIMIT_MIB:-64}" --margin-mib "${MARGIN_MIB:-6}"

echo "== 5/5 self-check: the device's unpack path"
check=$(mktemp -d)
trap 'rm -rf "$check"' EXIT
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$PAY/call1/base.tar.xz" "$check/base"
for d in "$PAY"/call*/; do (cd "$d" && sha256sum --quiet -c SHA256SUMS) || fail "SHA256SUMS of $d"; done
mkdir -p "$check/chunks" && cp "$PAY"/call*/*.zst.* "$check/chunks/"
"$check/base/bin/gpu_bench" unpack --manifest "$PAY/call1/manifest.json" --chunks-dir "$check/chunks" \
  --dest "$check/ort" || fail "reassembly failed"
cmp "$check/ort/$CUDA" "$WORK/$CUDA" || fail "reassembled provider differs"
echo "self-check ok: chunks reassemble to $CUDA ($raw_sha)"
du -sh "$PAY"/call*
echo "payload ready; device calls in $PAY/CALLS.md"
