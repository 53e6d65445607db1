#!/usr/bin/env bash
# `meshrun plan`'s error split in two (issue 21): for each configuration,
# plan with its own measurement (--cores auto, the link measured once
# with `meshrun bench link`, as bench/sched.sh asks it), then one traced
# `meshrun local` run, then plan again with --costs-from that run's trace
# (each action its kind's mean CPU on its stage in the run, the run's
# optimizer, the cores the run's devices got, fitted to its spans: nothing
# measured by plan), with --costs-by action too (each action its own mean
# over the steps: the run's spread from one microbatch to the next,
# which a mean per kind leaves out) and --costs-by wall (each action its
# own mean wall time, the cores not shared: the stretch of the shared
# cores is in the walls, so only the model's timeline, its dependencies,
# transfers and tail, is left to be wrong). The error at the run's own costs is the model's; the
# error at plan's own measurement adds the machine's drift between the
# two. Prints per row: the run's mean step (steps >= 1, its metrics), the
# four predictions and their errors, the run's CPU a step in its compute
# actions against plan's own measurement of it (`work by action`, the
# table's part: how far the measured figures drifted), the cores plan saw
# and those fitted to the run, the worst stage's error in its last end
# (the model's timeline against the run's), and the load average before
# the row; then how many rows each prediction has within 15%. Last,
# "saturated": the run's action CPU over the run's cores, plus plan's
# tail and the run's optimizer, the step as if the cores never idled
# (the schedule's timeline left out) with its error: when the devices
# share less than a core (a loaded machine) it is as close as the model,
# so only rows where the two differ test the model's timeline (an idle
# machine, where 4 devices on 2 cores leave cores free in the bubble).
# "walls, untraced": --costs-by wall on the same trace with its send
# spans (and the executor's "stage post" spans) taken out, as an older
# trace, so each send is charged its device's untraced time
# (the fallback for older traces), against "walls" with each transfer its
# traced CPU. "walls, no exec": the same with the executor's own spans
# taken out ("stage post", and the CPU of "stage send wait"), so the
# transfers are charged their traced CPU alone (zb5's plan), against
# "walls" where a receive also carries its posting ahead and a send its
# waits.
# usage: [KEEP=DIR] [STEPS=3] [ROWS="MESH:M:SCHED[/fill]:RECOMPUTE ..."] [BIN=meshrun] bench/plan_costs.sh
#   default rows: bench/sched_goals.sh's 14 (4x1 M 4, 8, 16; interleaved_1f1b
#   and zbv; 2x2; recompute on)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-3}
rows=${ROWS:-"4x1:4:1f1b:false 4x1:4:zb_h1:false 4x1:4:zb_h1/fill:false 4x1:8:1f1b:false 4x1:8:zb_h1:false
4x1:8:zb_h1/fill:false 4x1:16:1f1b:false 4x1:16:zb_h1:false 4x1:8:interleaved_1f1b:false 4x1:8:zbv:false
2x2:8:1f1b:false 2x2:8:zb_h1:false 4x1:8:1f1b:true 4x1:8:zb_h1:true"}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
keep=${KEEP:-}  # a directory: each row's plan outputs, trace and metrics kept there
[ -z "$keep" ] || mkdir -p "$keep"
bin=$tmp/meshrun
if [ -n "${BIN:-}" ]; then cp "$BIN" "$bin"; else make -s all; cp build/meshrun "$bin"; fi
. bench/sched_env.sh  # $model, and the link: $lat_us, $gbps
echo "| mesh | M | schedule | recompute | step s | plan s (own) | error | plan s (run's costs) | error | plan s (each action's) | error | plan s (walls) | error | action cpu s run/plan | cores plan/run | worst stage end error | saturated s | error | walls, untraced s | error | walls, no exec s | error | load |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
t0=$(date +%s)
for r in $rows; do
  IFS=: read -r mesh M sv rc <<<"$r"
  s=${sv%/*}; fk=""
  [ "$sv" = "$s/fill" ] && fk="pipeline_fill_waits=true"
  case $mesh in
    4x1) hosts=4 dph=1 S=4 pp="dcn_pipeline_parallelism=4 per_device_batch_size=4" ;;
    2x2) hosts=2 dph=2 S=4 pp="dcn_pipeline_parallelism=2 ici_pipeline_parallelism=2 per_device_batch_size=4" ;;
    2x1) hosts=2 dph=1 S=2 pp="dcn_pipeline_parallelism=2 per_device_batch_size=8" ;;
    *) echo "plan_costs.sh: mesh $mesh: not 4x1, 2x2 or 2x1" >&2; exit 1 ;;
  esac
  case $s in  # 8 layers: 2 chunks a stage, or one (as bench/sched.sh)
    circular) sk="num_pipeline_repeats=2 num_layers_per_pipeline_stage=$((8 / (2 * S)))" ;;
    interleaved_1f1b | zbv) sk="num_layers_per_pipeline_stage=$((8 / (2 * S)))" ;;
    *) sk="num_layers_per_pipeline_stage=$((8 / S))" ;;
  esac
  args="$pp pipeline_schedule=$s num_pipeline_microbatches=$M $sk pipeline_recompute=$rc $fk"
  load=$(cut -d' ' -f1 /proc/loadavg)
  "$bin" plan $model --hosts $hosts --devices-per-host $dph $args --cores auto --link-gbps "$gbps" \
    --link-latency-us "$lat_us" >$tmp/own 2>&1 || { cat $tmp/own; exit 1; }
  rm -f $tmp/m.jsonl $tmp/t.json
  "$bin" local --hosts $hosts --devices-per-host $dph $model $args steps=$steps --metrics $tmp/m.jsonl \
    --trace $tmp/t.json --quiet >$tmp/log 2>&1 || { cat $tmp/log; exit 1; }
  "$bin" plan $model --hosts $hosts --devices-per-host $dph $args --costs-from $tmp/t.json --link-gbps "$gbps" \
    --link-latency-us "$lat_us" >$tmp/run 2>&1 || { cat $tmp/run; exit 1; }
  "$bin" plan $model --hosts $hosts --devices-per-host $dph $args --costs-from $tmp/t.json --costs-by action \
    --link-gbps "$gbps" --link-latency-us "$lat_us" >$tmp/each 2>&1 || { cat $tmp/each; exit 1; }
  "$bin" plan $model --hosts $hosts --devices-per-host $dph $args --costs-from $tmp/t.json --costs-by wall \
    --link-gbps "$gbps" --link-latency-us "$lat_us" >$tmp/wall 2>&1 || { cat $tmp/wall; exit 1; }
  python3 - $tmp/t.json $tmp/t0.json $tmp/t1.json <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["traceEvents"] = [e for e in t["traceEvents"] if not ((e.get("name", "").startswith("stage send ")
                                                          and e.get("name") != "stage send wait"
                                                          and "cpu_us" in e.get("args", {}))
                                                         or e.get("name", "").startswith("stage post "))]
json.dump(t, open(sys.argv[2], "w"))
t = json.load(open(sys.argv[1]))
t["traceEvents"] = [e for e in t["traceEvents"] if not e.get("name", "").startswith("stage post ")]
for e in t["traceEvents"]:
    if e.get("name") == "stage send wait":
        e.get("args", {}).pop("cpu_us", None)
json.dump(t, open(sys.argv[3], "w"))
PY
  "$bin" plan $model --hosts $hosts --devices-per-host $dph $args --costs-from $tmp/t0.json --costs-by wall \
    --link-gbps "$gbps" --link-latency-us "$lat_us" >$tmp/wall0 2>&1 || { cat $tmp/wall0; exit 1; }
  "$bin" plan $model --hosts $hosts --devices-per-host $dph $args --costs-from $tmp/t1.json --costs-by wall \
    --link-gbps "$gbps" --link-latency-us "$lat_us" >$tmp/wall1 2>&1 || { cat $tmp/wall1; exit 1; }
  grep -q "^transfers: each send its device's untraced" $tmp/wall0 && grep -q "^transfers: each send and receive its traced" $tmp/wall \
    || { echo "plan_costs.sh: the transfers were not charged as expected" >&2; exit 1; }
  python3 - "$mesh" "$M" "$sv" "$rc" $tmp/m.jsonl $tmp/own $tmp/run $tmp/each $tmp/wall $tmp/wall0 $tmp/wall1 "$load" <<'PY' | tee -a $tmp/rows
import json, re, sys
mesh, M, s, rc, m, own, run, each, wall, wall0, wall1, load = sys.argv[1:]
rows = [json.loads(l) for l in open(m)][1:]
step = sum(r["step_time_s"] for r in rows) / len(rows)
txt = {f: open(f).read() for f in (own, run, each, wall, wall0, wall1)}
pred = lambda f: float(re.search(r"^predicted_step_s: (\S+)", txt[f], re.M).group(1))
table = lambda f: sum(float(x) for x in re.search(r"^work by action: F=(\S+),B=(\S+),I=(\S+),W=(\S+),own=(\S+),",
                                                  txt[f], re.M).groups())
cores = lambda f: re.search(r"(?:share|cores) (\d+\.\d+)", re.search(r"^(cores|costs):.*$", txt[f], re.M).group(0)).group(1)
ends = [float(x) for x in re.findall(r"last end \S+ s \(([-+]\S+)%\)", txt[run])]
o, n, a, w, w0, w1 = pred(own), pred(run), pred(each), pred(wall), pred(wall0), pred(wall1)
e = lambda p: 100 * (p - step) / step
ptable = float(re.search(r"^parts: table (\S+) s", txt[run], re.M).group(1))
sat = table(run) / float(cores(run)) + n - ptable
print(f"| {mesh} | {M} | {s} | {rc} | {step:.2f} | {o:.2f} | {e(o):+.0f}% | {n:.2f} | {e(n):+.0f}% | {a:.2f} | {e(a):+.0f}% | {w:.2f} | {e(w):+.0f}% | "
      f"{table(run):.2f}/{table(own):.2f} | {cores(own)}/{cores(run)} | {max(ends, key=abs):+.0f}% | "
      f"{sat:.2f} | {e(sat):+.0f}% | {w0:.2f} | {e(w0):+.0f}% | {w1:.2f} | {e(w1):+.0f}% | {load} |")
PY
  if [ -n "$keep" ]; then
    k=$keep/$mesh-$M-${sv//\//-}-$rc
    mkdir -p "$k"; cp $tmp/own $tmp/run $tmp/each $tmp/wall $tmp/m.jsonl $tmp/t.json $tmp/log "$k"/
  fi
done
python3 - $tmp/rows <<'PY'
import re, sys
rows = [l.split("|") for l in open(sys.argv[1])]
err = lambda r, i: abs(float(r[i].strip().rstrip("%")))
n = len(rows)
print(f"# within 15%: plan (own measurement) {sum(err(r, 7) <= 15 for r in rows)} of {n}, "
      f"plan (run's costs) {sum(err(r, 9) <= 15 for r in rows)} of {n}, each action's {sum(err(r, 11) <= 15 for r in rows)} of {n}, walls {sum(err(r, 13) <= 15 for r in rows)} of {n}, "
      f"saturated {sum(err(r, 18) <= 15 for r in rows)} of {n}, walls untraced {sum(err(r, 20) <= 15 for r in rows)} of {n}, "
      f"walls no exec {sum(err(r, 22) <= 15 for r in rows)} of {n}")
PY
echo "# $(( $(date +%s) - t0 )) s; load $(cut -d' ' -f1-3 /proc/loadavg)"
