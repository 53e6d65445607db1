#!/usr/bin/env bash
# Issue 20, data=2 against one device: config variants of data=2
# (llama-bench, 2 hosts x 1 device, each agent bound to its CPU, one
# OpenBLAS thread) in alternating rounds, beside the single device in
# the same round. Each variant NAME[:key=value,key=value...]:
#   one   the single device (meshrun train), the rounds' baseline (one2,
#         one3 ...: the same again, later in the round; ratios use the last)
#   two   two single devices started together, each on a core while the
#         other computes, as data=2's hosts are (the row: their means)
#   old   data=2 run by $OLD (e.g. /work/bin/s13.sh) with its own configs
#         (OLD_CONFIG, default /work/s13tree/configs/llama-bench.yml)
#   any other name: data=2 by this build with the given keys
# Each run: step s (mean of steps >= 1), its ratio to the round's one,
# comm_exposed_s and comm_background_s (device 0, mean), and from
# /proc/PID/task/*/schedstat sampled every 20 ms between the first and
# last metrics line (steps 1..STEPS-1), per device and step: the device
# thread's run s and run-queue wait s, and the run s of every other
# thread of the agents (mr-comm, mr-stream, mr-net, the main thread)
# summed; the load average. Then each variant's median over the rounds.
# usage: [OLD=BIN] [VARIANTS="one two old new spin0:poll_spin_us=0"]
#        bench/dp_ab.sh [STEPS] [ROUNDS]
set -eu
cd "$(dirname "$0")/.."
steps=${1:-5}; rounds=${2:-3}
variants=${VARIANTS:-"one old new"}
old=${OLD:-}
make -s all
tmp=$(mktemp -d /tmp/dp-ab.XXXXXX); trap 'rm -rf "$tmp"' EXIT
cp build/meshrun $tmp/new
C=$PWD/configs/llama-bench.yml
avg() { python3 -c "
import json; r=[json.loads(l) for l in open('$1')][1:]
print('%.4f' % (sum(x.get('$2', 0) for x in r) / len(r)))"; }
echo "meshrun $(git rev-parse --short HEAD), $steps steps, $rounds rounds, variants: $variants; load $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-5s %-34s %7s %6s %8s %8s %7s %7s %7s  %s\n" round variant step_s ratio exposed backgr dev_run dev_rq others load
t0=$(date +%s)
for r in $(seq 1 "$rounds"); do
  one=""
  for v in $variants; do
    name=${v%%:*}; kv=""; [ "$name" = "$v" ] || kv=$(echo "${v#*:}" | tr ',' ' ')
    m=$tmp/$name-$r.jsonl; rm -f $m
    case $name in
      one*) nd=1; $tmp/new train --config $C steps=$steps openblas_threads=1 --metrics $m >/dev/null 2>$tmp/err & ;;
      two*) nd=1  # two single devices at once: each its own sampler; the row their means
            for x in a b; do
              $tmp/new train --config $C steps=$steps openblas_threads=1 --metrics $m.$x >/dev/null 2>$tmp/err.$x &
              echo $! >$tmp/pid.$x
              python3 bench/thread_sample.py dev $! $m.$x $steps 1 >$tmp/th.$x &
            done
            wait $(cat $tmp/pid.a) && wait $(cat $tmp/pid.b) || { echo "$v failed:"; tail -3 $tmp/err.a $tmp/err.b; exit 1; }
            wait
            python3 -c "
import json; r=[[json.loads(l) for l in open('$m.'+f)] for f in ('a', 'b')]
print('\\n'.join(json.dumps(x) for x in [r[0][0]] + r[0][1:] + r[1][1:]))" >$m
            th=$(cat $tmp/th.a $tmp/th.b | awk '{for (i = 1; i <= 3; i++) s[i] += $i / 2} END {printf "%.3f %.3f %.3f", s[1], s[2], s[3]}')
            true & ;;
      old) nd=2; [ -n "$old" ] || { echo "dp_ab.sh: old needs OLD=BIN" >&2; exit 1; }
           $old local --hosts 2 --config ${OLD_CONFIG:-/work/s13tree/configs/llama-bench.yml} steps=$steps openblas_threads=1 --metrics $m >/dev/null 2>$tmp/err & ;;
      *) nd=2; $tmp/new local --hosts 2 --config $C steps=$steps openblas_threads=1 $kv --metrics $m \
           >/dev/null 2>$tmp/err & ;;
    esac
    pid=$!
    case $name in two*) ;; *) th=$(python3 bench/thread_sample.py dev $pid $m $steps $nd || echo "- - -") ;; esac
    wait $pid || { echo "$v failed:"; tail -3 $tmp/err; exit 1; }
    t=$(avg $m step_time_s)
    case $name in one*) one=$t ;; esac
    ratio=-; [ -z "$one" ] || ratio=$(python3 -c "print('%.3f' % ($t / $one))")
    set -- $th
    printf "%-5s %-34s %7.3f %6s %8.4f %8.4f %7s %7s %7s  %s\n" $r "$v" $t $ratio $(avg $m comm_exposed_s) \
      $(avg $m comm_background_s) $1 $2 $3 "$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a $tmp/rows
  done
done
echo "-- medians over $rounds rounds"
python3 - $tmp/rows <<'PYEOF'
import collections, statistics, sys
rows = collections.defaultdict(list)
for l in open(sys.argv[1]):
    p = l.split(); rows[p[1]].append(p[2:9])
for v, rs in rows.items():
    med = lambda i: statistics.median(float(x[i]) for x in rs if x[i] != '-') if any(x[i] != '-' for x in rs) else float('nan')
    print('%-34s step %.3f ratio %.3f exposed %.4f backgr %.4f dev_run %.3f dev_rq %.3f others %.3f' % (
        v, med(0), med(1), med(2), med(3), med(4), med(5), med(6)))
PYEOF
echo "took $(( $(date +%s) - t0 )) s, load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
