#!/usr/bin/env bash
# Issue 21's open goals in one run, short enough for the idle rerun: 28
# runs of llama-bench (8 layers, sequences of 128, 16 rows) on 4 stages,
# 4 hosts x 1 device and 2 x 2:
#   1. recompute off, M in {4, 8, 16}: 1f1b, zb_h1, interleaved_1f1b, zbv
#      (ZB-H1's bubble against 1F1B's, in idle seconds and as a share;
#      zbv against interleaved; the interleaved bubble against its formula)
#   2. recompute on (the default), M = 8: 1f1b, zb_h1
# each with `meshrun plan`'s prediction (wall and CPU seconds, CPU by
# action kind) beside the measured step. Columns: bench/sched.sh. STEPS
# steps a run (default 2: step 0 warms up, step 1 is measured; 3 averages
# steps 1-2 and takes about a third longer). A run took about 60 s at 3
# steps on the shared machine at load 5-8 (2026-11-28).
# usage: [STEPS=2] bench/sched_goals.sh
set -eu
cd "$(dirname "$0")/.."
steps=${STEPS:-2}
make -s all
bin=$(mktemp /tmp/meshrun-goals.XXXXXX)
trap 'rm -f "$bin"' EXIT
cp build/meshrun "$bin"
chmod +x "$bin"
t0=$(date +%s)
echo "## recompute off; load $(cut -d' ' -f1-3 /proc/loadavg)"
BIN=$bin KV="pipeline_recompute=false" bench/sched.sh "$steps" "4x1 2x2" "4 8 16" "1f1b zb_h1 interleaved_1f1b zbv"
echo
echo "## recompute on; load $(cut -d' ' -f1-3 /proc/loadavg)"
BIN=$bin KV="pipeline_recompute=true" bench/sched.sh "$steps" "4x1 2x2" 8 "1f1b zb_h1"
echo
echo "# $(( $(date +%s) - t0 )) s; load $(cut -d' ' -f1-3 /proc/loadavg)"
