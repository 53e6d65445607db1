#!/usr/bin/env bash
# How often a waiting device thread gives up its spin and sleeps, per op,
# BASE (a build before the change) against build/meshrun, interleaved over
# ROUNDS rounds: `meshrun bench collectives` under `perf stat` with uprobes
# on xport_wait (waits), on its line `poll = false;` (the spin given up:
# the waiter sleeps next and the link's stream thread reads for it) and on
# recv_stream_cb (the stream thread's turns), plus context switches, each
# over the run's iterations (start-up included: a few hundredths per op at
# 2000 iterations), with the bench's own time and CPU per op and the load
# average. A give-up costs a stream thread's wake-up and the waiter's: at
# one per op the 64 KiB ops took about twice their time (bench/results/
# transport.md, "Why a 64 KiB op was slow in some runs"). Each build is
# probed in a copy of its own (a uprobe holds every process of the file
# it is set on), and the probes are removed at exit. Needs root and perf.
# usage: BASE=PATH [HOSTS=2] [DPH=1] [SIZE=64K] [ITERS=2000]
#        bench/waiter_sleeps.sh ROUNDS OP [OP ...]
set -eu
cd "$(dirname "$0")/.."
rounds=$1; shift
: "${BASE:?BASE=PATH of the build to compare against}"
hosts=${HOSTS:-2}; dph=${DPH:-1}; size=${SIZE:-64K}; iters=${ITERS:-2000}
make -s all
tmp=$(mktemp -d /tmp/waiter_sleeps.XXXXXX)
grp=ws$$
cleanup() { perf probe -q -d "$grp:*" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
cp "$BASE" "$tmp/base"
cp build/meshrun "$tmp/new"
for b in base new; do
  # the line where the spin ends (poll = false;): in xport_wait, or since
  # small15 in wait_req, which xport_wait calls
  for fn in xport_wait wait_req; do
    line=$(perf probe -x "$tmp/$b" -L $fn 2>/dev/null | awk '/poll = false;/ && $1 ~ /^[0-9]+$/ {print $1; exit}')
    [ -z "$line" ] || break
  done
  [ -n "$line" ] || { echo "waiter_sleeps.sh: no 'poll = false;' line in $b's xport_wait or wait_req" >&2; exit 1; }
  perf probe -q -x "$tmp/$b" -a "$grp:${b}_wait=xport_wait" -a "$grp:${b}_giveup=$fn:$line" \
    -a "$grp:${b}_stream=recv_stream_cb"
done
echo "# load $(cat /proc/loadavg)"
echo "# ${hosts}x$dph, $size, $iters iterations a run; per op: waits, give-ups, stream turns, context switches (every thread of every agent)"
printf '%-5s %-15s %9s %9s %6s %8s %7s %6s %s\n' build op time_us cpu_us waits giveups stream cswitch load
for r in $(seq 1 "$rounds"); do
  for op in "$@"; do
    for b in base new; do
      ${NICE:+nice -n $NICE} perf stat -x, -e "context-switches,$grp:${b}_wait,$grp:${b}_giveup,$grp:${b}_stream" -o "$tmp/stat" -- \
        "$tmp/$b" bench collectives --hosts "$hosts" --devices-per-host "$dph" --op "$op" \
        --sizes "$size" --iters "$iters" --warmup 10 > "$tmp/out" 2>&1
      awk -F, -v b="$b" -v op="$op" -v n="$iters" -v load="$(cut -d' ' -f1 /proc/loadavg)" '
        FNR == NR { if ($0 ~ /^ +[0-9]+ +[0-9]+ +[0-9.]+ /) { split($0, f, " "); t = f[3] }
                    if ($0 ~ /^# cpu [0-9]+:/) { split($0, f, " "); c = f[4] } next }
        !/^#/ && NF > 3 { v[$3] = $1 / n }
        END { printf "%-5s %-15s %9s %9s %6.2f %8.2f %7.2f %6.2f %s\n", b, op, t, c,
                v["'"$grp"':" b "_wait"], v["'"$grp"':" b "_giveup"], v["'"$grp"':" b "_stream"],
                v["context-switches"], load }' "$tmp/out" "$tmp/stat"
    done
  done
done
echo "# load $(cat /proc/loadavg)"
