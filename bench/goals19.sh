#!/usr/bin/env bash
# Issue 19's goals in one run (2 hosts x 1 device, loopback): every op at
# 64 KiB and 16 MiB, meshrun (TLS) against Open MPI (TCP) and gloo
# (torch.distributed), interleaved, ROUNDS rounds (each round runs every
# implementation once, and measures AES-128-GCM with `openssl speed`);
# prints medians of busbw, the ratios the goals name (meshrun/Open MPI at
# 64 KiB, meshrun/gloo at 16 MiB), CPU us per op of each, CPU per wire
# byte beyond AES-GCM against Open MPI's and gloo's CPU per byte, the load
# average, one line per goal: met / not met, and at 16 MiB the ceilings
# this machine puts on any encrypted transport (AES-GCM's CPU, and that
# plus Open MPI's CPU per op, spread over the cores both hosts share:
# see bench/peers_summary.py `ceilings`). The parts are
# bench/peers_lib.sh's (shared with bench/peers.sh), the summary
# bench/peers_summary.py --goals. Raw output: build/goals19.log.
# MESHRUN_KEYS adds key=value settings to every meshrun run.
# ~50 s a round on an idle 2-vCPU machine.
# usage: bench/goals19.sh [ROUNDS]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-4}
keys=${MESHRUN_KEYS:-}
small=500    # 64 KiB iterations (~0.1 ms each: a mean over ~50 ms)
big=10       # 16 MiB iterations
. bench/peers_lib.sh
peers_setup
log=build/goals19.log
: > "$log"
for round in $(seq 1 "$rounds"); do
  {
    echo "# round $round"
    echo "# load $(cat /proc/loadavg)"
    echo "# shape 2x1"
    # user CPU time per byte, as the CPU figures of the rest
    echo "# aes-128-gcm $(openssl speed -seconds 1 -evp aes-128-gcm -bytes 16384 2>/dev/null |
      awk '/^AES-128-GCM/ {sub(/k$/, "", $2); print $2 * 1000 / 1e9}') GB/s"
    for op in all_gather reduce_scatter all_reduce all_to_all permute broadcast; do
      echo "# meshrun $op"
      peers_meshrun 2 1 "$op" 64K "$small" 20 $keys
      peers_meshrun 2 1 "$op" 16M "$big" 3 $keys
    done
    peers_mpi 2 "$big" "$small" 0
    peers_gloo 2 "$big" "$small" 0
  } 2>&1 | tee -a "$log" | grep -E '^(# (round|load|aes)|openmpi|gloo)' || true
done
echo "# end of run, load $(cat /proc/loadavg)" >> "$log"
/usr/bin/python3 bench/peers_summary.py --goals "$log"
