#!/usr/bin/env bash
# Whether a run's threads wait for a core (issue 20, fsdp10): runs
# `meshrun local ARGS` with --metrics, polls every agent thread's
# /proc/.../schedstat (CPU ns, ns runnable but waiting for a core) by
# thread name (mr-dev*: device threads; mr-comm*: the background
# collectives; mr-net, mr-stream*: the transport), and prints per name
# the CPU seconds and the run-queue wait a step, over the steps after the
# first (from the first poll after step 0 was logged to the last poll),
# beside the metrics' comm_exposed_s (mean of steps >= 1). A thread that
# waits for a core as long as the device waits on communication is
# starved, not slow. Polled every 0.05 s: the last poll before a thread
# exits is what counts. Load average before and after.
# usage: [BIN=build/meshrun] bench/run_delay.sh ARGS...
#   e.g. bench/run_delay.sh --hosts 2 --config configs/llama-bench.yml openblas_threads=1 steps=5
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-build/meshrun}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "# load $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin" local "$@" --metrics $tmp/m.jsonl --quiet >$tmp/log 2>&1 &
pid=$!
: >$tmp/samples
while kill -0 $pid 2>/dev/null; do
  n=$( [ -s $tmp/m.jsonl ] && wc -l <$tmp/m.jsonl || echo 0)
  for a in $pid $(pgrep -P $pid || true); do
    for t in /proc/$a/task/*; do
      { read -r c w _ <$t/schedstat; } 2>/dev/null || continue
      echo "$n $a ${t##*/} $(cat $t/comm 2>/dev/null) $c $w"
    done
  done >>$tmp/samples
  sleep 0.05
done
wait $pid || { echo "run failed:"; tail -3 $tmp/log; exit 1; }
python3 - $tmp/samples $tmp/m.jsonl <<'PYEOF'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[2])]
first, last = {}, {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 6:
        continue
    n, key, name, c, w = int(f[0]), (f[1], f[2]), f[3], int(f[4]), int(f[5])
    if n >= 1 and key not in first:
        first[key] = (n, c, w, name)
    if n >= 1:
        last[key] = (n, c, w, name)
steps = max(len(rows) - 1, 1)
by = {}
for k, (n1, c1, w1, name) in last.items():
    n0, c0, w0, _ = first[k]
    g = re.sub(r'\d+$', '*', name)
    a = by.setdefault(g, [0, 0, 0])
    a[0] += (c1 - c0) * 1e-9 / steps
    a[1] += (w1 - w0) * 1e-9 / steps
    a[2] += 1
ex = [r.get('comm_exposed_s', 0) for r in rows[1:]]
st = [r['step_time_s'] for r in rows[1:]]
print('# steps >= 1: %d, step_s %.3f, comm_exposed_s %.3f (device 0 of host 0, mean)' %
      (len(st), sum(st) / max(len(st), 1), sum(ex) / max(len(ex), 1)))
print('%-14s %7s %10s %10s' % ('threads', 'count', 'cpu_s/step', 'wait_s/step'))
for g in sorted(by, key=lambda g: -by[g][1]):
    c, w, n = by[g]
    print('%-14s %7d %10.3f %10.3f' % (g, n, c, w))
PYEOF
echo "# load $(cut -d' ' -f1-3 /proc/loadavg)"
