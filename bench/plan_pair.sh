#!/usr/bin/env bash
# `meshrun plan` from two binaries against one measured run, row by row
# (issue 21): for each configuration, plan with OLD, plan with NEW (both
# --cores auto, the link measured once with `meshrun bench link`, as
# bench/sched.sh asks them), then one `meshrun local` run of it with NEW;
# prints both predictions, the run's mean step (steps >= 1) and each
# prediction's error, and the load average before each row. The same
# moment for both plans, so their errors compare under any load; the
# errors themselves mean something only on an idle machine.
# usage: [STEPS=3] [ROWS="MESH:M:SCHED:RECOMPUTE ..."] [KV="key=value ..."] bench/plan_pair.sh OLD NEW
#   e.g. bench/plan_pair.sh /tmp/meshrun-main /tmp/meshrun-new
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: [STEPS=3] [ROWS=...] bench/plan_pair.sh OLD NEW" >&2; exit 2; }
old=$1 new=$2 bin=$2 steps=${STEPS:-3}
rows=${ROWS:-"4x1:8:1f1b:false 4x1:8:zb_h1:false 4x1:16:1f1b:false 2x2:8:1f1b:false 4x1:8:1f1b:true"}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
. bench/sched_env.sh  # $model (with KV), and the link: $lat_us, $gbps
echo "| mesh | M | schedule | recompute | step s | old plan s | old error | new plan s | new error | load |"
echo "|---|---|---|---|---|---|---|---|---|---|"
t0=$(date +%s)
for r in $rows; do
  IFS=: read -r mesh M s rc <<<"$r"
  case $mesh in
    4x1) hosts=4 dph=1 pp="dcn_pipeline_parallelism=4" ;;
    2x2) hosts=2 dph=2 pp="dcn_pipeline_parallelism=2 ici_pipeline_parallelism=2" ;;
  esac
  case $s in interleaved_1f1b | zbv) sk="" ;; circular) sk="num_pipeline_repeats=2" ;; *) sk="num_layers_per_pipeline_stage=2" ;; esac
  args="$pp pipeline_schedule=$s num_pipeline_microbatches=$M $sk pipeline_recompute=$rc"
  load=$(cut -d' ' -f1 /proc/loadavg)
  for b in old new; do
    "${!b}" plan $model --hosts $hosts --devices-per-host $dph $args --cores auto --link-gbps "$gbps" \
      --link-latency-us "$lat_us" >$tmp/$b 2>&1 || { cat $tmp/$b; exit 1; }
  done
  rm -f $tmp/m.jsonl
  "$new" local --hosts $hosts --devices-per-host $dph $model $args steps=$steps --metrics $tmp/m.jsonl --quiet \
    >$tmp/log 2>&1 || { cat $tmp/log; exit 1; }
  python3 - "$mesh" "$M" "$s" "$rc" $tmp/m.jsonl $tmp/old $tmp/new "$load" <<'PY'
import json, sys
mesh, M, s, rc, m, po, pn, load = sys.argv[1:]
rows = [json.loads(l) for l in open(m)][1:]
step = sum(r["step_time_s"] for r in rows) / len(rows)
pred = lambda f: next(float(l.split()[1]) for l in open(f) if l.startswith("predicted_step_s:"))
o, n = pred(po), pred(pn)
print(f"| {mesh} | {M} | {s} | {rc} | {step:.2f} | {o:.2f} | {100 * (o - step) / step:+.0f}% | {n:.2f} | "
      f"{100 * (n - step) / step:+.0f}% | {load} |")
PY
done
echo "# $(( $(date +%s) - t0 )) s; load $(cut -d' ' -f1-3 /proc/loadavg)"
