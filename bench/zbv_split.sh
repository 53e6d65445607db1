#!/usr/bin/env bash
# FSDP x stage under zbv (bench/pipe_waits.sh's fsdppp mesh: llama-bench,
# AdamW, fsdp=2 x stage=2, M microbatches, ag_per_repeat, compute that
# sleeps 160/M ms an action: 20 at M = 8), traced, build/meshrun and OLD alternating in
# each round: each run's cycle split by bench/zbv_split.py (stage 1's
# step: its actions' sleeps and overruns, its last W's, the tail's
# reduce-scatters, norm and updates, the next step's head with the slot
# offset) and its mean step_time_s (steps >= 1, --metrics), then each
# binary's medians over all runs.
# usage: bench/zbv_split.sh [ROUNDS] [OLD] [M]   (OLD: another meshrun,
#   e.g. /work/bin/meshrun-s14; M: microbatches, default 8)
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-3}; old=${2:-}; mb=${3:-8}; sl=$((160 / mb))
make -s all
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cp build/meshrun $tmp/new; [ -z "$old" ] || cp "$old" $tmp/old
A="--config configs/llama-bench.yml opt_type=adamw learning_rate=0.001 ici_data_parallelism=1
  ici_pipeline_parallelism=2 num_pipeline_microbatches=$mb pipeline_recompute=false pipeline_schedule=zbv
  num_pipeline_repeats=2 steps=5 openblas_threads=1 pipeline_compute=sleep pipeline_sleep_ms=$sl,$sl,$sl
  --hosts 2 --devices-per-host 2 dcn_data_parallelism=1 dcn_fsdp_parallelism=2 pipeline_fsdp_ag_per_repeat=true"
for r in $(seq 1 "$rounds"); do
  for b in new ${old:+old}; do
    $tmp/$b local $A --trace $tmp/t-$b-$r.json --metrics $tmp/m-$b-$r.jsonl >/dev/null 2>$tmp/err ||
      { tail -1 $tmp/err; exit 1; }
    st=$(python3 -c "import json, sys; r = [json.loads(l)['step_time_s'] for l in open(sys.argv[1])][1:]
print('%.4f' % (sum(r) / len(r)))" $tmp/m-$b-$r.jsonl)
    echo "== round $r $b step_s $st load $(cut -d' ' -f1-3 /proc/loadavg)"
    python3 bench/zbv_split.py --sleep $sl $tmp/t-$b-$r.json | tail -1
  done
done
for b in new ${old:+old}; do
  echo "== $b, all rounds"
  python3 bench/zbv_split.py --sleep $sl $tmp/t-$b-*.json
done
