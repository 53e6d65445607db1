#!/usr/bin/env bash
# How stable `meshrun plan`'s measured figures are between invocations
# (issue 21): N plans in a row of one bench/sched.sh configuration
# (llama-bench, 8 layers, sequences of 128, 4 hosts x 1 device, --cores
# auto, as bench/sched.sh asks them), for each binary given, alternating
# binaries within a round so both see the same moments of the machine's
# load. Per binary: predicted_step_s, the layer forward and backward per
# microbatch, the forward the devices beside it ran meanwhile, and the
# work a step; min, max and the spread (max / min - 1) of each. Prints
# the load average before every plan and the elapsed seconds at the end.
# usage: [N=5] [ARGS="pipeline_schedule=1f1b ..."] bench/plan_spread.sh BIN [BIN...]
#   e.g. bench/plan_spread.sh /tmp/meshrun-main /tmp/meshrun-new
set -euo pipefail
cd "$(dirname "$0")/.."
n=${N:-5}
[ $# -ge 1 ] || { echo "usage: [N=5] [ARGS=...] bench/plan_spread.sh BIN [BIN...]" >&2; exit 2; }
model="--config configs/llama-bench.yml base_num_decoder_layers=8 max_target_length=128 per_device_batch_size=4"
model="$model ici_data_parallelism=1 dcn_data_parallelism=1 pipeline_recompute=false dcn_pipeline_parallelism=4"
args=${ARGS:-"pipeline_schedule=1f1b num_pipeline_microbatches=8 num_layers_per_pipeline_stage=2"}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
t0=$(date +%s)
for r in $(seq 1 "$n"); do
  for i in $(seq 1 $#); do
    bin=${!i}
    load=$(cut -d' ' -f1 /proc/loadavg)
    "$bin" plan $model --hosts 4 --devices-per-host 1 $args --cores auto --link-gbps 1 --link-latency-us 60 \
      >$tmp/out 2>&1 || { cat $tmp/out; exit 1; }
    awk -v b="$i" -v l="$load" '
      /^predicted_step_s:/ {p = $2}
      /^work:/ {w = $2}
      /^compute per microbatch/ {match($0, /forward [0-9.]+/); f = substr($0, RSTART + 8, RLENGTH - 8)
                                 match($0, /backward [0-9.]+/); bb = substr($0, RSTART + 9, RLENGTH - 9)}
      /ran the layer forward in/ {match($0, /in [0-9.]+/); fb = substr($0, RSTART + 3, RLENGTH - 3)}
      /^cores:/ {match($0, /share [0-9.]+/); c = substr($0, RSTART + 6, RLENGTH - 6)}
      END {printf "%s %s %s %s %s %s %s %s\n", b, p, f, bb, (fb == "" ? 0 : fb), w, c, l}' $tmp/out >>$tmp/rows
    tail -1 $tmp/rows | awk '{printf "round '"$r"' bin %s: predicted %s s, F %s ms, B %s ms, F beside %s ms, work %s s, cores %s; load %s\n", $1, $2, $3, $4, $5, $6, $7, $8}'
  done
done
echo
echo "| binary | figure | min | max | spread |"
echo "|---|---|---|---|---|"
awk -v nb=$# '
  {for (k = 2; k <= 7; k++) {v = $k + 0; key = $1 SUBSEP k
     if (!(key in mn) || v < mn[key]) mn[key] = v; if (!(key in mx) || v > mx[key]) mx[key] = v}}
  END {split("- predicted_step_s F_ms B_ms F_beside_ms work_s cores", name, " ")
       for (b = 1; b <= nb; b++) for (k = 2; k <= 7; k++) {key = b SUBSEP k
         printf "| %d | %s | %.3f | %.3f | %s |\n", b, name[k], mn[key], mx[key],
                (mn[key] > 0 ? sprintf("%.0f%%", 100 * (mx[key] / mn[key] - 1)) : "-")}}' $tmp/rows
echo "# $(( $(date +%s) - t0 )) s; load $(cut -d' ' -f1-3 /proc/loadavg)"
