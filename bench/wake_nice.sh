#!/usr/bin/env bash
# The scheduler question behind device_nice / device_batch, without
# meshrun: how late a thread woken by its timer runs while two threads
# compute (bench/wake_nice.c), for the computing threads at nice 0, 10,
# 19, and SCHED_BATCH; ROUNDS rounds (default 2), interleaved. Prints the
# load average beside each round.
# usage: [ROUNDS=2] bench/wake_nice.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cc -std=c11 -O2 -pthread -o "$tmp/wake_nice" bench/wake_nice.c
for round in $(seq "${ROUNDS:-2}"); do
  echo "round $round; load $(cut -d' ' -f1-3 /proc/loadavg)"
  for v in "0 normal" "10 normal" "19 normal" "0 batch"; do
    # shellcheck disable=SC2086
    "$tmp/wake_nice" $v
  done
done
