#!/usr/bin/env bash
# Interleaved 1F1B's group of microbatches a chunk (pipeline_interleave_group,
# docs/pipeline.md) in the simulator, no agents: for S = 2 and 4, M = S,
# 2S, 4S, two chunks a stage and every group g from S to M the builder
# takes, the worst stage's idle over the formula's (S-1)(F+B) and stage
# 0's peak of saved chunk inputs, at F = I = W = $MS_F ms a chunk's
# action (default 10: bench/sched_sleep.sh's default, 20 ms a microbatch
# through a stage) and every transfer taking each of $HOPS ms (default
# 0 0.2 0.4 0.6, loopback TLS's one way for 0.25-1 MiB), the sender kept
# $SEND ms of it (default 0: the hand-off, p2p_handoff_bytes).
# usage: [MESHES="2 4"] [MULTS="1 2 4"] [MS_F=10] [HOPS="0 0.2 0.4 0.6"] [SEND=0] bench/sched_group.sh
set -euo pipefail
cd "$(dirname "$0")/.."
f=${MS_F:-10}
if [ ! -f build/libmeshrun.a ]; then make -s build/libmeshrun.a; fi
tmp=$(mktemp -d /tmp/sched-group.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
libs="$(pkg-config --libs openblas libcjson yaml-0.1 libprotobuf-c libevent_core libevent_pthreads libssl libcrypto) -lm -pthread"
cc -std=c11 -D_GNU_SOURCE -O2 -I. -Ibuild $(pkg-config --cflags openblas libcjson) bench/sched_group.c \
  build/libmeshrun.a $libs -o $tmp/sched_group
first=1
for S in ${MESHES:-2 4}; do
  for mult in ${MULTS:-1 2 4}; do
    # the header once, then rows
    $tmp/sched_group $S $((mult * S)) $f $f $f ${SEND:-0} ${HOPS:-0 0.2 0.4 0.6} | sed "1,2{$( [ $first = 1 ] || echo d)}"
    first=0
  done
done
