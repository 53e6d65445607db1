#!/usr/bin/env bash
# Do the two hosts of a broadcast (or any op) work at once, or take turns?
# Records the scheduler system-wide (`perf sched record`) over `meshrun
# bench collectives --hosts 2` and prints, from bench/host_overlap.py, the
# share of the run's middle 80% spent in each pair of host states: R (a
# thread of the host on a CPU), W (runnable, waiting for a CPU: the
# machine's load), S (every thread asleep: waiting for the peer). On an
# idle 2-core machine a pipelined 16 MiB broadcast should be R/R; R/S or
# S/R is one host waiting for the other. Also the load average before and
# after. Needs root (perf sched record is system-wide). PROFILE=1 also
# runs the op under a cpu-clock profile and prints bench/host_work.py's
# split of the time by which host does work (cipher, copies, TCP) and
# which is on a CPU without work (polls that find nothing).
# KEEP=DIR keeps the trace's text (DIR/sched.txt) for bench/wake_place.py.
# usage: [PROFILE=1] [KEEP=DIR] bench/bcast_timeline.sh [OP [SIZE [ITERS [key=value ...]]]]
set -eu
cd "$(dirname "$0")/.."
op=${1:-broadcast}; size=${2:-16M}; iters=${3:-60}
shift $(( $# < 3 ? $# : 3 ))
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "# load $(cat /proc/loadavg)"
perf sched record -o "$tmp/sched.data" -- build/meshrun bench collectives --hosts 2 --op "$op" \
  --sizes "$size" --iters "$iters" --warmup 3 "$@" 2>&1 | grep -E '^ +[0-9]|^# (cpu|threads)' || true
perf script -i "$tmp/sched.data" 2>/dev/null > "$tmp/sched.txt"
top=$(awk '/sched_process_fork/ && /child_comm=exe/ {print $2; exit}' "$tmp/sched.txt")
/usr/bin/python3 bench/host_overlap.py "$top" < "$tmp/sched.txt"
if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$tmp/sched.txt" "$KEEP/"; fi
if [ "${PROFILE:-0}" = 1 ]; then
  perf record -F 5000 -e cpu-clock -o "$tmp/prof.data" -- build/meshrun bench collectives --hosts 2 \
    --op "$op" --sizes "$size" --iters "$iters" --warmup 3 "$@" 2>&1 | grep -E '^ +[0-9]' || true
  perf script -F pid,tid,time,ip,sym,dso -i "$tmp/prof.data" 2>/dev/null |
    /usr/bin/python3 bench/host_work.py
fi
echo "# load $(cat /proc/loadavg)"
