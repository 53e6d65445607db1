#!/usr/bin/env bash
# Where a run's CPU goes, by thread (issue 21, `meshrun plan`'s
# accounting): runs `meshrun local ARGS` with --metrics and --trace,
# polls every agent thread's CPU ticks (/proc, user + system) by thread
# name (mr-dev*: the device threads, which also encrypt and decrypt their
# transfers; mr-net, mr-stream*: the net threads; mr-comm*), and prints
# each name's CPU seconds a step over steps >= 1 (from the first poll
# after step 0 was logged to the last before the last step was), beside
# the trace's compute spans' CPU a step (bench/sched.py). Prints the load
# average before and after. A polled rate: the polls do not line up with
# the steps' boundaries, so two runs of one configuration differed by 0.3
# CPU s a step outside the spans; `perf record -e cpu-clock -g -p AGENT`
# is the exact split (bench/results/pipeline.md, "plan: stable figures ...").
# usage: [BIN=build/meshrun] bench/cpu_by_thread.sh ARGS...
#   e.g. bench/cpu_by_thread.sh --hosts 4 --config configs/llama-bench.yml base_num_decoder_layers=8 \
#        max_target_length=128 per_device_batch_size=4 ici_data_parallelism=1 dcn_data_parallelism=1 \
#        dcn_pipeline_parallelism=4 pipeline_schedule=1f1b num_pipeline_microbatches=8 \
#        num_layers_per_pipeline_stage=2 pipeline_recompute=false steps=4
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-build/meshrun}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "# load $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin" local "$@" --metrics $tmp/m.jsonl --trace $tmp/t.json --quiet >$tmp/log 2>&1 &
pid=$!
: >$tmp/samples
while kill -0 $pid 2>/dev/null; do
  line="$EPOCHREALTIME $( [ -s $tmp/m.jsonl ] && wc -l <$tmp/m.jsonl || echo 0)"
  declare -A s=()
  for a in $(pgrep -P $pid || true) $(for l in $(pgrep -P $pid || true); do pgrep -P $l || true; done); do
    for t in /proc/$a/task/*; do
      st=$(cat $t/stat 2>/dev/null) || continue
      n=$(cat $t/comm 2>/dev/null) || continue
      [ -n "$n" ] || continue
      c=$(echo "$st" | sed 's/.*) //' | awk '{print $12 + $13}')
      s[$n]=$(( ${s[$n]:-0} + c ))
    done
  done
  for n in "${!s[@]}"; do line="$line $n=${s[$n]}"; done
  unset s
  echo "$line" >>$tmp/samples
  sleep 0.2
done
wait $pid || { cat $tmp/log; exit 1; }
python3 - $tmp $(getconf CLK_TCK) <<'PY'
import json, sys
tmp, hz = sys.argv[1], float(sys.argv[2])
rows = [json.loads(l) for l in open(tmp + "/m.jsonl")]
S = []
for l in open(tmp + "/samples"):
    f = l.split()
    S.append((float(f[0]), int(f[1]), {k: int(v) for k, v in (x.split("=") for x in f[2:])}))
S = [x for x in S if 1 <= x[1] < len(rows)]
if len(S) < 2 or len(rows) < 3:
    sys.exit("cpu_by_thread.sh: too few polls within steps >= 1 (run more steps)")
step = sum(r["step_time_s"] for r in rows[1:]) / (len(rows) - 1)
a, b = S[0], S[-1]
print("mean step %.3f s; polls over %.2f s of steps >= 1" % (step, b[0] - a[0]))
tot = 0
for k in sorted(b[2]):
    r = (b[2][k] - a[2].get(k, 0)) / hz / (b[0] - a[0]) * step
    tot += r
    print("  %-12s %.3f CPU s a step" % (k, r))
print("  total        %.3f CPU s a step" % tot)
PY
echo "trace (bench/sched.py: step, share, idle s, idle per device, compute CPU by kind, W-fillable):"
python3 bench/sched.py $tmp/m.jsonl $tmp/t.json
echo "# load $(cut -d' ' -f1-3 /proc/loadavg)"
