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
# Installs the peers from Debian if missing.
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
need=""
command -v mpicc >/dev/null || need="$need openmpi-bin libopenmpi-dev"
/usr/bin/python3 -c 'import torch' 2>/dev/null || need="$need python3-torch"
if [ -n "$need" ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null
fi
make -s all
bin=build/meshrun
# 64 KiB collectives take ~0.1 ms: they get 500 iterations so each figure
# is a mean over ~50 ms, not a handful of wake-ups; 1 MiB gets 5x the
# 16 MiB count
small=500
mid=$(( iters * 5 ))
mpicc -O2 -o build/mpi_coll bench/mpi_coll.c
log=build/peers${view:+-barrier}.log
: > "$log"
for round in $(seq 1 "$rounds"); do
  {
    echo "# round $round"
    echo "# load $(cat /proc/loadavg)"
    echo "# shape 2x1"
    echo "# meshrun link"
    $bin bench link --hosts 2 --sizes 64K --iters "$small" $keys
    $bin bench link --hosts 2 --sizes 16M --iters "$iters" $keys
    for shape in $shapes; do
      h=${shape%x*}; d=${shape#*x}; ranks=$(( h * d ))
      echo "# shape $shape"
      for op in all_gather reduce_scatter all_reduce all_to_all permute broadcast; do
        echo "# meshrun $op"
        $bin bench collectives --hosts "$h" --devices-per-host "$d" --op "$op" --sizes 64K \
          --iters "$small" --warmup 20 $view $keys
        $bin bench collectives --hosts "$h" --devices-per-host "$d" --op "$op" --sizes 1M \
          --iters "$mid" --warmup 5 $view $keys
        $bin bench collectives --hosts "$h" --devices-per-host "$d" --op "$op" --sizes 16M \
          --iters "$iters" --warmup 3 $view $keys
      done
      # the peers report the same statistic: the slowest rank's time,
      # averaged over the iterations
      echo "# Open MPI (unencrypted)"
      mpirun --allow-run-as-root --oversubscribe -np "$ranks" --mca btl tcp,self \
        --mca btl_tcp_if_include lo --mca pml ob1 build/mpi_coll "$iters" "$small" "$mid" $view
      echo "# gloo (unencrypted)"
      OMP_NUM_THREADS=1 /usr/bin/python3 bench/gloo_coll.py $(( 20000 + RANDOM % 20000 )) \
        "$iters" "$small" all "$ranks" "$mid" $view
    done
  } 2>&1 | tee -a "$log"
done
/usr/bin/python3 bench/peers_summary.py "$log"
