#!/usr/bin/env bash
# Collectives next to their peers, in one run, over loopback:
#   meshrun bench link      (TLS ceiling, 2 hosts, both directions at once)
#   meshrun bench collectives (every op, 64 KiB, 1 MiB and 16 MiB, TLS)
#   Open MPI (unencrypted TCP, bench/mpi_coll.c)
#   gloo via torch.distributed (unencrypted TCP, bench/gloo_coll.py)
# on three shapes: 2 hosts x 1 device (2 ranks), 4 x 1 and 2 x 2 (4 ranks;
# the peers run 4 ranks). ROUNDS rounds, each running everything once
# (interleaved, so a noisy stretch of the shared machine hits all of them);
# the raw output goes to build/peers.log and bench/peers_summary.py prints
# medians, ratios and the CPU per op. All three time their iterations back
# to back after one barrier, as nccl-tests does (bench link streams the
# same way); with --barrier, all three put a barrier before each iteration
# instead (the latency view; raw output in build/peers-barrier.log).
# SHAPES (default "2x1 4x1 2x2") picks the shapes; MESHRUN_KEYS adds
# key=value settings to every meshrun run (e.g. MESHRUN_KEYS=link_streams=2).
# Installs the peers from Debian if missing (bench/peers_lib.sh, shared
# with bench/goals19.sh).
# usage: bench/peers.sh [ITERS_16M [ROUNDS]] [--barrier]
set -eu
cd "$(dirname "$0")/.."
view=""
args=()
for a in "$@"; do
  if [ "$a" = --barrier ]; then view=--barrier; else args+=("$a"); fi
done
iters=${args[0]:-20}
rounds=${args[1]:-1}
shapes=${SHAPES:-"2x1 4x1 2x2"}
keys=${MESHRUN_KEYS:-}
. bench/peers_lib.sh
peers_setup
# 64 KiB collectives take ~0.1 ms: they get 500 iterations so each figure
# is a mean over ~50 ms, not a handful of wake-ups; 1 MiB gets 5x the
# 16 MiB count
small=500
mid=$(( iters * 5 ))
log=build/peers${view:+-barrier}.log
: > "$log"
for round in $(seq 1 "$rounds"); do
  {
    echo "# round $round"
    echo "# load $(cat /proc/loadavg)"
    echo "# shape 2x1"
    echo "# meshrun link"
    build/meshrun bench link --hosts 2 --sizes 64K --iters "$small" $keys
    build/meshrun bench link --hosts 2 --sizes 16M --iters "$iters" $keys
    for shape in $shapes; do
      h=${shape%x*}; d=${shape#*x}; ranks=$(( h * d ))
      echo "# shape $shape"
      for op in all_gather reduce_scatter all_reduce all_to_all permute broadcast; do
        echo "# meshrun $op"
        peers_meshrun "$h" "$d" "$op" 64K "$small" 20 $view $keys
        peers_meshrun "$h" "$d" "$op" 1M "$mid" 5 $view $keys
        peers_meshrun "$h" "$d" "$op" 16M "$iters" 3 $view $keys
      done
      # the peers report the same statistic: the slowest rank's time,
      # averaged over the iterations
      peers_mpi "$ranks" "$iters" "$small" "$mid" $view
      peers_gloo "$ranks" "$iters" "$small" "$mid" $view
    done
  } 2>&1 | tee -a "$log"
done
/usr/bin/python3 bench/peers_summary.py "$log"
