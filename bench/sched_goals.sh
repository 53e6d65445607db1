#!/usr/bin/env bash
# Issue 21's goal rows in one run, short enough for an idle rerun (14
# runs; budget 8 minutes idle): llama-bench (8 layers, sequences of 128,
# 16 rows) on 4 stages, columns as in bench/sched.sh:
#   1. recompute off, 4 hosts x 1 device, M in {4, 8, 16}: 1f1b, zb_h1
#      (ZB-H1's idle seconds against 1F1B's: goal <= 0.40), and at M 4
#      and 8 zb_h1/fill (pipeline_fill_waits=true: owed W's run in
#      receive waits; off by default) beside them
#   2. recompute off, 4x1, M = 8: interleaved_1f1b, zbv (the interleaved
#      bubble against its formula: within 10%; zbv against interleaved)
#   3. recompute off, 2 x 2, M = 8: 1f1b, zb_h1
#   4. recompute on (the default), 4x1, M = 8: 1f1b, zb_h1
# each with `meshrun plan`'s prediction (wall and CPU seconds, CPU by
# action kind) beside the measured step (goal: within 15%). STEPS steps
# a run (default 2: step 0 warms up, step 1 is measured; 3 averages
# steps 1-2 and takes about a quarter longer). Prints the elapsed
# seconds and the load average at the end. BIN: that binary (a copy, e.g.
# main's, to set beside this tree's in the same session) instead of
# building this tree. bench/plan_spread.sh and bench/plan_pair.sh check
# plan's stability and set two binaries' plans against the same runs;
# bench/plan_costs.sh runs the same 14 rows and sets plan's own
# prediction beside its prediction from each run's own costs (the
# model's error without the machine's drift).
# usage: [STEPS=2] [BIN=meshrun] bench/sched_goals.sh
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-2}
bin=$(mktemp /tmp/meshrun-goals.XXXXXX)
trap 'rm -f "$bin"' EXIT
if [ -n "${BIN:-}" ]; then
  cp "$BIN" "$bin"
else
  make -s all
  cp build/meshrun "$bin"
fi
chmod +x "$bin"
t0=$(date +%s)
echo "## recompute off; load $(cut -d' ' -f1-3 /proc/loadavg)"
BIN=$bin KV="pipeline_recompute=false" bench/sched.sh "$steps" 4x1 "4 8" "1f1b zb_h1 zb_h1/fill"
BIN=$bin KV="pipeline_recompute=false" bench/sched.sh "$steps" 4x1 16 "1f1b zb_h1" | sed '/^| mesh \|^|---/d'
BIN=$bin KV="pipeline_recompute=false" bench/sched.sh "$steps" 4x1 8 "interleaved_1f1b zbv" | sed '/^| mesh \|^|---/d'
BIN=$bin KV="pipeline_recompute=false" bench/sched.sh "$steps" 2x2 8 "1f1b zb_h1" | sed '/^| mesh \|^|---/d'
echo
echo "## recompute on; load $(cut -d' ' -f1-3 /proc/loadavg)"
BIN=$bin KV="pipeline_recompute=true" bench/sched.sh "$steps" 4x1 8 "1f1b zb_h1"
echo
echo "# $(( $(date +%s) - t0 )) s; load $(cut -d' ' -f1-3 /proc/loadavg)"
