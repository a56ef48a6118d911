#!/usr/bin/env bash
# The device side of the GPU benchmark (bench/gpu/README.md gives the call sequence).
#
#   bash bench/gpu/run.sh stage N      call N of the upload: check and copy
#                                      bench/gpu/payload/callN to /tmp; call 1 also
#                                      unpacks the binaries, checks the machine
#                                      (preflight) and starts the model build in
#                                      the background
#   bash bench/gpu/run.sh [PART...]    the benchmark; default `all`:
#       unpack model sweep16 sweep32 torch16 oom shrink copies e2e torch32 report
#   bash bench/gpu/run.sh preflight    only the machine checks
#
# Results: /tmp/rsembed-gpu/results/*.json, and under $OUT: report.md (the tables),
# results.json (everything), run.log, logs.tar.gz.
#
# Environment knobs: BUDGET_S (seconds the benchmark may take, default 330; parts that no
# longer fit are skipped and the report is still written), RSEMBED_GPU_DEVICE (cuda:0),
# OOM_LIMIT (2GiB), PROBE_MAX (256), PYTHON (python3), RSEMBED_GPU_WORK (/tmp/rsembed-gpu),
# RSEMBED_GPU_LOCAL=1 (test on a CPU machine: small model, CPU ONNX Runtime, --device cpu).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
W=${RSEMBED_GPU_WORK:-/tmp/rsembed-gpu}
RES=$W/results
LOGS=$W/logs
LOCAL=${RSEMBED_GPU_LOCAL:-0}
PY=${PYTHON:-python3}
BUDGET=${BUDGET_S:-330}
T0=${RUN_T0:-$(date +%s)}
export RUN_T0=$T0
OUT=${OUT:-$W/out}
mkdir -p "$W" "$RES" "$LOGS" "$OUT"

if [[ $LOCAL == 1 ]]; then
  DEVICE=${RSEMBED_GPU_DEVICE:-cpu}
  BIN=$REPO/target/release
  GPU_BENCH=$BIN/examples/gpu_bench
  RSEMBED=$BIN/rsembed
  ORT_DIR=$REPO/.cache/ort
  MODEL_ARGS=${MODEL_ARGS:---hidden 64 --layers 2 --heads 4 --intermediate 256}
  MAX=${MAX_BATCH:-16}
  PROBE_MAX=${PROBE_MAX:-16}
  OOM_ARGS="--requests 2 --request-size 24 --max-batch 16"
  SHRINK_ARGS="--big 32 --small 4"
  COPIES_BUCKETS=${COPIES_BUCKETS:-1,8}
  COPIES_ARGS="--runs 3"
  TORCH_DEVICE=cpu
  E2E_SMALL=8 E2E_LARGE=40 E2E_UNIQUE=8
else
  DEVICE=${RSEMBED_GPU_DEVICE:-cuda:0}
  BIN=$W/base/bin
  GPU_BENCH=$BIN/gpu_bench
  RSEMBED=$BIN/rsembed
  ORT_DIR=$W/ort
  MODEL_ARGS=${MODEL_ARGS:-}   # build_model.py's defaults: Git-RSCLIP-L's shape
  MAX=${MAX_BATCH:-256}
  PROBE_MAX=${PROBE_MAX:-256}
  OOM_ARGS="--requests 3 --request-size 256 --max-batch 256"
  SHRINK_ARGS="--big 256 --small 8"
  COPIES_ARGS="--runs 5"
  TORCH_DEVICE=cuda
  # 256x256 JPEGs: one model-sized chip each (rsembed takes a PNG/JPEG as one chip), so
  # the run measures decode + the engine, not a resize of big scenes.
  E2E_SMALL=${E2E_SMALL:-512} E2E_LARGE=${E2E_LARGE:-8704} E2E_UNIQUE=64
fi
MODEL=$W/models/model
CKPT=$W/models/model-hf
ORT_LIB=$ORT_DIR/libonnxruntime.so.1.31.1

elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(elapsed) )); }
log() { printf '[run.sh +%ss] %s\n' "$(elapsed)" "$*"; }
fatal() {
  printf '[run.sh +%ss] FATAL: %s\n' "$(elapsed)" "$*" | tee -a "$RES/fatal.txt" >&2
  exit 1
}

# Library folders for ONNX Runtime's CUDA provider: CUDA 13 and cuDNN 9 from the pip
# packages next to torch (nvidia-*), the toolkit, and the driver's folder.
cuda_lib_path() {
  local dirs
  dirs=$("$PY" - <<'EOF' 2>/dev/null
import glob, os, site
roots = list(site.getsitepackages())
try:
    roots.append(site.getusersitepackages())
except Exception:
    pass
out = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "**", "lib"), recursive=True)):
        if glob.glob(os.path.join(d, "lib*.so*")):
            out.append(d)
print(":".join(dict.fromkeys(out)))
EOF
)
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    [[ -d $d ]] && dirs="${dirs:+$dirs:}$d"
  done
  echo "$ORT_DIR${dirs:+:$dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
ORT_LD=$(cuda_lib_path)
# Runs a command with ONNX Runtime's environment.
ort_env() { env LD_LIBRARY_PATH="$ORT_LD" ORT_DYLIB_PATH="$ORT_LIB" "$@"; }

find_lib() {  # is $1 loadable from ORT_LD or the loader cache?
  local d
  IFS=: read -ra ds <<<"$ORT_LD"
  for d in "${ds[@]}"; do [[ -e $d/$1 ]] && { echo "$d/$1"; return 0; }; done
  { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null; } |
    awk -v l="$1" '$1 == l {print $NF; found = 1; exit} END {exit !found}'
}

# step NAME EST_S CAP_S CMD...: runs CMD under a timeout if EST_S still fit the budget;
# stdout to the terminal and logs/NAME.out, stderr to logs/NAME.err; status to steps.tsv.
step() {
  local name=$1 est=$2 cap=$3
  shift 3
  local l t rc s0
  l=$(left)
  if (( l < est )); then
    log "SKIP $name: ${l}s left, needs ~${est}s"
    printf '%s\tskipped\t-\t0\n' "$name" >>"$RES/steps.tsv"
    return 0
  fi
  t=$(( cap < l - 5 ? cap : l - 5 ))
  log "START $name (timeout ${t}s)"
  s0=$(date +%s)
  # The part runs in a fresh copy of this script (timeout needs a program, not a function).
  timeout --kill-after=10 "$t" bash "$REPO/bench/gpu/run.sh" __part "$@" 2>"$LOGS/$name.err" | tee "$LOGS/$name.out"
  rc=${PIPESTATUS[0]}
  local took=$(( $(date +%s) - s0 ))
  if (( rc == 0 )); then
    log "OK $name (${took}s)"
    printf '%s\tok\t0\t%s\n' "$name" "$took" >>"$RES/steps.tsv"
  else
    log "FAILED $name rc=$rc (${took}s; 124 = timeout); last lines of its stderr:"
    tail -n 15 "$LOGS/$name.err" | sed 's/^/    /'
    printf '%s\tfailed\t%s\t%s\n' "$name" "$rc" "$took" >>"$RES/steps.tsv"
  fi
  return "$rc"
}

# ------------------------------------------------------------------ stage / preflight

manifest_get() {  # manifest_get PY-EXPR: evaluated with m = the manifest
  "$PY" -c "import json,sys; m=json.load(open('$W/manifest.json')); print($1)"
}

preflight() {
  log "preflight on $(hostname)"
  if [[ $LOCAL != 1 ]]; then
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader ||
      fatal "nvidia-smi failed: no GPU?"
  fi
  "$PY" - "$TORCH_DEVICE" <<'EOF' || fatal "python3 lacks what build_model.py/torch_bench.py need (see above)"
import importlib.util, sys
need = ["numpy", "torch", "transformers", "onnx", "PIL"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
print("python", sys.version.split()[0], sys.executable)
for m in need + ["onnxruntime", "sentencepiece", "tokenizers"]:
    spec = importlib.util.find_spec(m)
    v = "MISSING"
    if spec is not None:
        try:
            v = getattr(__import__(m), "__version__", "present")
        except Exception as e:
            v = f"broken: {e}"
    print(f"  {m:14s} {v}")
if missing:
    sys.exit(f"missing: {missing}")
import torch
if sys.argv[1] == "cuda":
    if not torch.cuda.is_available():
        sys.exit("torch.cuda.is_available() is False")
    print("  torch cuda", torch.version.cuda, torch.cuda.get_device_name(0))
EOF
  [[ -x $GPU_BENCH ]] || fatal "$GPU_BENCH missing (call 1 unpacks it: bash bench/gpu/run.sh stage 1)"
  [[ -x $RSEMBED ]] || fatal "$RSEMBED missing"
  "$GPU_BENCH" --help >/dev/null || fatal "$GPU_BENCH does not run here (glibc?)"
  [[ -f $ORT_LIB ]] || fatal "$ORT_LIB missing"
  if [[ $LOCAL != 1 ]]; then
    local needed missing=() lib where
    needed=$(manifest_get "' '.join(m['cuda_provider_needs'])") || fatal "no manifest at $W/manifest.json"
    for lib in $needed libcudnn.so.9 libnvidia-ml.so.1; do
      case $lib in libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libgcc_s*|libstdc++*) continue ;; esac
      if where=$(find_lib "$lib"); then echo "  $lib -> $where"; else missing+=("$lib"); fi
    done
    (( ${#missing[@]} == 0 )) || fatal "libraries the CUDA provider needs are not found: ${missing[*]} (LD_LIBRARY_PATH tried: $ORT_LD)"
  fi
  log "preflight ok"
}

copy_src() {  # what the background model build reads, copied out of the (re-sent) tree
  rm -rf "$W/src" && mkdir -p "$W/src/bench/gpu" "$W/src/tools" "$W/src/fixtures/models"
  cp "$REPO"/bench/gpu/*.py "$W/src/bench/gpu/" &&
    cp "$REPO/tools/export_onnx.py" "$REPO/tools/record_digests.py" "$REPO/tools/fuse_graph.py" "$W/src/tools/" &&
    cp -r "$REPO/fixtures/models/tiny-siglip" "$W/src/fixtures/models/"
}

model_stamp() { echo "build_model.py $MODEL_ARGS"; }

model_bg() {
  if [[ -f $MODEL/build_info.json && "$(cat "$W/model.stamp" 2>/dev/null)" == "$(model_stamp)" ]]; then
    log "model already built: $MODEL"
    return 0
  fi
  if [[ -f $W/model-bg.pid ]] && kill -0 "$(cat "$W/model-bg.pid")" 2>/dev/null; then
    log "model build already running (pid $(cat "$W/model-bg.pid"))"
    return 0
  fi
  copy_src || fatal "copying sources to $W/src"
  rm -f "$W/model-bg.rc" "$W/model.stamp"
  # setsid: a process in its own session outlives this call (the machine stays warm
  # between the upload calls, and the build overlaps them).
  setsid nohup bash -c "cd '$W/src' && '$PY' bench/gpu/build_model.py --out '$MODEL' --checkpoint '$CKPT' \
      --float16-py '$W/base/py/float16.py' $MODEL_ARGS >'$LOGS/model.log' 2>&1; echo \$? >'$W/model-bg.rc'" \
      </dev/null >/dev/null 2>&1 &
  echo $! >"$W/model-bg.pid"
  log "model build started in the background (pid $!, log $LOGS/model.log)"
}

stage() {
  local n=$1 d=$REPO/bench/gpu/payload/call$1
  [[ -d $d ]] || fatal "$d is missing: carry bench/gpu/payload/call$n in this call (run bench/gpu/prepare.sh first)"
  if (( n > 1 )) && [[ ! -x $GPU_BENCH ]]; then
    fatal "this is a fresh machine (no $W/base): the machine was given back after an earlier call, so calls 1..$((n - 1)) are lost; start again from call 1"
  fi
  log "stage $n: checking $(du -sh "$d" | cut -f1) carried"
  (cd "$d" && sha256sum --quiet -c SHA256SUMS) || fatal "call $n's files are damaged in transfer: repeat call $n"
  mkdir -p "$W/chunks"
  cp "$d/manifest.json" "$W/manifest.json"
  find "$d" -name '*.zst.*' -exec cp {} "$W/chunks/" \;
  if [[ -f $d/base.tar.xz ]]; then
    rm -rf "$W/base" && mkdir -p "$W/base"
    "$PY" -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$d/base.tar.xz" "$W/base" ||
      fatal "unpacking base.tar.xz"
    # (Local test: ORT_DIR is the repository's CPU library, never written.)
    if [[ $LOCAL != 1 ]]; then mkdir -p "$ORT_DIR" && cp "$W"/base/ort/* "$ORT_DIR/"; fi
    log "base unpacked: $(ls "$W/base/bin" | tr '\n' ' ')"
  fi
  log "stage $n ok; chunks here: $(ls "$W/chunks" | wc -l) of $(manifest_get "len(m['chunked'][0]['chunks'])")"
  if (( n == 1 )); then
    preflight
    model_bg
  fi
  local k
  k=$(manifest_get "len(m['calls'])")
  if (( n < k )); then log "next: call $((n + 1)) of $k, now (the machine stays warm only 30 s)"; fi
}

# ------------------------------------------------------------------ parts

part_unpack() {
  if [[ $LOCAL == 1 ]]; then log "local: CPU ONNX Runtime, nothing to unpack"; return 0; fi
  [[ -f $W/manifest.json ]] || fatal "no $W/manifest.json: run the stage calls first"
  [[ -x $GPU_BENCH ]] || fatal "no $GPU_BENCH: call 1 did not run on this machine (given back in between?); start again from call 1"
  "$GPU_BENCH" unpack --manifest "$W/manifest.json" --chunks-dir "$W/chunks" \
    --chunks-dir "$REPO/bench/gpu/payload" --dest "$ORT_DIR" || fatal "CUDA provider unpack failed (see above)"
  local nf
  nf=$(env LD_LIBRARY_PATH="$ORT_LD" ldd "$ORT_DIR/libonnxruntime_providers_cuda.so" | grep 'not found')
  [[ -z $nf ]] || fatal "the CUDA provider cannot load: $nf"
  # Smoke: CUDA registers and runs the tiny committed model.
  ort_env "$GPU_BENCH" sweep --model "$REPO/fixtures/models/tiny-siglip" --device "$DEVICE" --max-batch 2 \
    --probe-max-batch 0 --bucket-seconds 0.1 || fatal "the CUDA provider does not run the tiny model (see above)"
}

part_model() {
  if [[ -f $MODEL/build_info.json && "$(cat "$W/model.stamp" 2>/dev/null)" == "$(model_stamp)" ]]; then
    log "model already built: $MODEL"
    return 0
  fi
  if [[ -f $W/model-bg.pid ]] && kill -0 "$(cat "$W/model-bg.pid")" 2>/dev/null; then
    log "waiting for the background model build (pid $(cat "$W/model-bg.pid"))"
    while kill -0 "$(cat "$W/model-bg.pid")" 2>/dev/null; do sleep 2; done
  fi
  if [[ -f $W/model-bg.rc ]]; then
    local rc
    rc=$(cat "$W/model-bg.rc")
    rm -f "$W/model-bg.rc" "$W/model-bg.pid"
    cat "$LOGS/model.log" | grep -v -e 'Loading weights' -e 'Writing model' | tail -n 25
    [[ $rc == 0 ]] || fatal "background model build failed (rc $rc), log above"
  else
    log "building the model in the foreground"
    copy_src || fatal "copying sources"
    (cd "$W/src" && "$PY" bench/gpu/build_model.py --out "$MODEL" --checkpoint "$CKPT" \
      --float16-py "$W/base/py/float16.py" $MODEL_ARGS) 2>&1 | grep -v -e 'Loading weights' -e 'Writing model' |
      tee "$LOGS/model.log"
    (( PIPESTATUS[0] == 0 )) || fatal "model build failed"
  fi
  [[ -f $MODEL/build_info.json ]] || fatal "model build left no $MODEL/build_info.json"
  model_stamp >"$W/model.stamp"
  cp "$MODEL/build_info.json" "$RES/build_info.json"
}

part_sweep() {  # part_sweep fp16|fp32
  local extra=()
  [[ $1 == fp16 ]] && extra=(--fp16)
  ort_env "$GPU_BENCH" sweep --model "$MODEL" --device "$DEVICE" "${extra[@]}" --max-batch "$MAX" \
    --probe-max-batch "$PROBE_MAX" --deadline-seconds 80 --json "$RES/sweep_$1.json"
}

part_oom() {
  # shellcheck disable=SC2086
  ort_env "$GPU_BENCH" oom --model "$MODEL" --device "$DEVICE" --gpu-mem-limit "${OOM_LIMIT:-2GiB}" $OOM_ARGS \
    --json "$RES/oom.json"
}

part_shrink() {
  # shellcheck disable=SC2086
  ort_env "$GPU_BENCH" shrink --model "$MODEL" --device "$DEVICE" --fp16 $SHRINK_ARGS --json "$RES/shrink.json"
}

part_copies() {
  # The uint8 entries (idempotent; the model was built without them), then the
  # engine time per chip split into copy in, compute and copy out, float and uint8.
  "$PY" "$REPO/tools/uint8_entry.py" --no-verify "$MODEL" || return 1
  # shellcheck disable=SC2086
  ort_env "$GPU_BENCH" copies --model "$MODEL" --device "$DEVICE" --fp16 --buckets "${COPIES_BUCKETS:-1,16,64,256}" \
    $COPIES_ARGS --json "$RES/copies.json"
}

part_torch() {  # part_torch fp16|fp32
  "$PY" "$REPO/bench/gpu/torch_bench.py" --checkpoint "$CKPT" --device "$TORCH_DEVICE" --dtype "$1" --attn sdpa \
    --max-batch "$MAX" --deadline-seconds 80 --json "$RES/torch_$1.json"
}

part_e2e() {
  local bs
  bs=$("$PY" -c "import json; print(json.load(open('$RES/sweep_fp16.json'))['probe']['chosen'])" 2>/dev/null) || bs=64
  [[ $bs =~ ^[0-9]+$ ]] || bs=64
  "$PY" "$REPO/bench/gpu/make_images.py" --out "$W/images/large" --count "$E2E_LARGE" --unique "$E2E_UNIQUE" \
    --size 256 || return 1
  rm -rf "$W/images/small" && mkdir -p "$W/images/small"
  ls "$W/images/large" | head -n "$E2E_SMALL" | while read -r f; do cp "$W/images/large/$f" "$W/images/small/"; done
  # Fixed --batch-size (the probe's choice) and the default `auto`, each on the
  # small and the large set: the difference of the two sizes cancels start-up.
  local set mode name
  # `tiny`: the committed 2-layer model, whose runs take next to nothing, so its
  # rate is what the readers and writers alone can feed on this machine's cores.
  # `float`: as `fixed`, feeding float32 pixels (`--input-dtype float`); `fixed`, `auto`
  # and `tiny` feed the uint8 entry when the model has one (part `copies` adds it).
  for mode in fixed auto tiny float; do
    for set in small large; do
      name=e2e_$set; [[ $mode != fixed ]] && name=e2e_${mode}_$set
      rm -rf "$W/e2e/$set"
      local flags=(--batch-size "$bs") model=$MODEL
      [[ $mode == auto ]] && flags=(--batch-size auto --max-batch "$bs")
      [[ $mode == tiny ]] && model=$REPO/fixtures/models/tiny-siglip
      [[ $mode == float ]] && flags+=(--input-dtype float)
      log "rsembed run: $(ls "$W/images/$set" | wc -l) scenes, $mode, --fp16 ${flags[*]}"
      ort_env "$RSEMBED" run --input "$W/images/$set" --output "$W/e2e/$set" --model "$model" --device "$DEVICE" \
        --fp16 "${flags[@]}" --json >"$RES/$name.json" || return 1
      "$PY" -c "import json,sys; s=json.load(open(sys.argv[1])); print({k: s.get(k) for k in ('chips_embedded','seconds','engine_seconds','engine_busy','failed_inputs')})" \
        "$RES/$name.json"
    done
  done
  echo "{\"batch_size\": $bs, \"scene_size\": 256}" >"$RES/e2e_params.json"
}

part_report() {
  "$PY" "$REPO/bench/gpu/report.py" --results "$RES" --out "$OUT/report.md" --json "$OUT/results.json"
  tar czf "$OUT/logs.tar.gz" -C "$W" logs results 2>/dev/null || true
}

run_parts() {
  local p
  for p in "$@"; do
    case $p in
      unpack) step unpack 1 120 part_unpack || exit 1 ;;
      model) step model 5 "$(left)" part_model || exit 1 ;;
      sweep16) step sweep_fp16 35 120 part_sweep fp16 ;;
      sweep32) step sweep_fp32 50 130 part_sweep fp32 ;;
      torch16) step torch_fp16 35 110 part_torch fp16 ;;
      oom) step oom 35 110 part_oom ;;
      shrink) step shrink 35 110 part_shrink ;;
      copies) step copies 40 110 part_copies ;;
      e2e) step e2e 95 220 part_e2e ;;
      torch32) step torch_fp32 50 110 part_torch fp32 ;;
      report) BUDGET=$(( $(elapsed) + 60 )) step report 1 60 part_report ;;
      *) fatal "unknown part $p" ;;
    esac
  done
}

case ${1:-all} in
  __part) shift; "$@" ;;
  stage) stage "${2:?stage N}" ;;
  preflight) preflight ;;
  model-bg) model_bg ;;
  all)
    exec > >(tee -a "$OUT/run.log") 2>&1
    log "benchmark on $DEVICE, budget ${BUDGET}s, results in $RES"
    : >"$RES/steps.tsv"
    # A fatal step of an earlier try on this machine is not this run's.
    rm -f "$RES/fatal.txt"
    [[ $LOCAL == 1 ]] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/gpu.txt"
    # The report is written even when a fatal step ends the run early.
    trap 'run_parts report' EXIT
    run_parts unpack model sweep16 sweep32 torch16 oom shrink copies e2e torch32
    ;;
  *)
    exec > >(tee -a "$OUT/run.log") 2>&1
    touch "$RES/steps.tsv"
    rm -f "$RES/fatal.txt"
    trap 'run_parts report' EXIT
    run_parts "$@"
    ;;
esac
