#!/usr/bin/env bash
# Where the SIGSEGV at the end of `rsembed run` on CUDA comes from, and whether
# leaving without teardown ends it. Run from the repository root after the stages.
W=/tmp/rsembed-gpu; B=$W/base/bin/rsembed; M=$W/models/model; I=$W/images/small
# segv.so is carried: gcc -shared -fPIC -O1 -o bench/gpu/payload/diag/segv.so bench/gpu/diag/segv.c
D=$PWD/bench/gpu/payload/diag
run() {  # run LABEL ENV... -- FLAGS...
  local label=$1; shift; local envs=(); while [[ $1 != -- ]]; do envs+=("$1"); shift; done; shift
  rm -rf /tmp/o
  env "${envs[@]}" RSEMBED_LOG=info,rsembed_coordinator=debug,rsembed_worker::exit=debug,ort=error \
    timeout 90 bash bench/gpu/run.sh __part ort_env $B run --input $I --output /tmp/o --model $M --device cuda:0 --fp16 "$@" --json >/tmp/o.json 2>/tmp/o.err
  local rc=$?
  local js; js=$(python3 -c "import json; s=json.load(open('/tmp/o.json')); print('json ok', s['chips_embedded'], round(s['seconds'],2), round(s.get('engine_busy',0),2))" 2>&1 | tail -1)
  echo "== $label [$*]: rc=$rc; $js"
  grep -E "command done|runtime dropped|without teardown|SIGNAL|  #" /tmp/o.err | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-220 | head -40
}
ls $W/images/small | wc -l
run old-fixed RSEMBED_EXIT_NORMALLY=1 LD_PRELOAD=$D/segv.so -- --batch-size 64
run old-auto RSEMBED_EXIT_NORMALLY=1 LD_PRELOAD=$D/segv.so -- --batch-size auto --max-batch 64
run old-fixed-tif1 RSEMBED_EXIT_NORMALLY=1 LD_PRELOAD=$D/segv.so -- --batch-size 64 --tasks-in-flight 1
run new-fixed X=1 -- --batch-size 64
run new-auto X=1 -- --batch-size auto --max-batch 64
