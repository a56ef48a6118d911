#!/usr/bin/env bash
# What holds the end-to-end run below the raw session: CPU contention (ORT's
# intra-op pool beside the decoders), tasks in flight. Needs the model, the
# images of part e2e, or makes them.
W=/tmp/rsembed-gpu; B=$W/base/bin/rsembed; M=$W/models/model
[[ -d $W/images/large ]] || python3 bench/gpu/make_images.py --out $W/images/large --count 8704 --unique 64 --size 256
if [[ ! -d $W/images/small ]]; then mkdir -p $W/images/small; ls $W/images/large | head -n 512 | while read -r f; do cp $W/images/large/$f $W/images/small/; done; fi
one() {  # one LABEL MODEL SET FLAGS...
  local label=$1 model=$2 set=$3; shift 3
  rm -rf /tmp/o
  local rc
  TIMEFORMAT="%R s wall, %U user, %S sys"
  { time timeout 90 bash bench/gpu/run.sh __part ort_env $B run --input $W/images/$set --output /tmp/o --model $model --device cuda:0 --fp16 "$@" --json >/tmp/o.json 2>/tmp/o.err; rc=$?; } 2>/tmp/o.time
  python3 - "$label" "$set" "$rc" "$(cat /tmp/o.time | tail -1)" "$*" <<'PY'
import json, sys
label, set_, rc, t, flags = sys.argv[1:]
try:
    s = json.load(open('/tmp/o.json'))
    print(f"{label:12} {set_:5} rc={rc} chips={s['chips_embedded']} seconds={s['seconds']:.2f} engine_s={s['engine_seconds']:.2f} busy={s['engine_busy']:.2f} | {t} | {flags}")
except Exception as e:
    print(f"{label} {set_} rc={rc} no summary: {e}")
PY
}
for set in small large; do
  one base $M $set --batch-size 64
  one intra1 $M $set --batch-size 64 --intra-threads 1
  one intra1-dec8 $M $set --batch-size 64 --intra-threads 1 --decode-threads 8
  one tif4 $M $set --batch-size 64 --tasks-in-flight 4
  one intra1-tif4 $M $set --batch-size 64 --intra-threads 1 --tasks-in-flight 4
  one tiny-intra1 $PWD/fixtures/models/tiny-siglip $set --batch-size 64 --intra-threads 1
done
