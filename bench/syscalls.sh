#!/usr/bin/env bash
# System calls and context switches per op (both agents of `meshrun bench
# collectives --hosts 2`), from perf's software events: the difference
# between a run of 2N iterations and one of N, over N, so start-up drops
# out. BASE=PATH (another build's binary) measures it too, in the same run.
# usage: bench/syscalls.sh OP SIZE N [key=value ...]
set -eu
cd "$(dirname "$0")/.."
op=$1; size=$2; n=$3; shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for bin in ${BASE:-} build/meshrun; do
  for k in 1 2; do
    perf stat -x, -e raw_syscalls:sys_enter,context-switches -- "$bin" bench collectives \
      --hosts 2 --op "$op" --sizes "$size" --iters $((n * k)) --warmup 5 "$@" \
      2>"$tmp/perf.$k" >/dev/null
  done
  s1=$(grep sys_enter "$tmp/perf.1" | cut -d, -f1); s2=$(grep sys_enter "$tmp/perf.2" | cut -d, -f1)
  c1=$(grep context "$tmp/perf.1" | cut -d, -f1); c2=$(grep context "$tmp/perf.2" | cut -d, -f1)
  echo "$bin $op $size $*: syscalls/op $(( (s2 - s1) / n )) context switches/op $(( (c2 - c1) / n ))"
done
echo "# load $(cat /proc/loadavg)"
