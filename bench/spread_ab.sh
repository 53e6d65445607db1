#!/usr/bin/env bash
# Issue 19 (small19): 4 x 1 (or HOSTS x DPH) collectives at one size,
# meshrun builds and settings against each other and Open MPI at the
# same rank count (bench/mpi_coll.c, TCP, oversubscribed as peers.sh runs
# it), interleaved over ROUNDS rounds (round r starts with the r-th
# variant); per op and variant the median us per op (lowest-highest) and
# CPU us per op of all ranks, and each meshrun variant's Open MPI time
# ratio (Open MPI's time / its time = its busbw / Open MPI's). A variant
# is NAME|ENV|KEYS|BIN (ENV: VAR=VALUE ...; KEYS: key=value ... for
# meshrun; BIN: default build/meshrun); the name openmpi runs Open MPI.
# Prints the load average at the start and the end.
# usage: [HOSTS=4] [DPH=1] [SIZE=64K] [ITERS=800] [OPS="..."]
#        bench/spread_ab.sh ROUNDS VARIANT ...
# e.g.   bench/spread_ab.sh 6 'openmpi' 'base|||/work/bin/meshrun-s13' 'auto||' 'spread||cpu_bind=spread'
set -eu
cd "$(dirname "$0")/.."
rounds=$1; shift
h=${HOSTS:-4}; dph=${DPH:-1}; size=${SIZE:-64K}; iters=${ITERS:-800}
ops=${OPS:-"all_gather reduce_scatter all_reduce all_to_all permute broadcast"}
make -s all
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
case " $* " in *" openmpi "*)
  command -v mpicc >/dev/null || { echo "spread_ab.sh: no mpicc (bench/peers.sh installs Open MPI)" >&2; exit 2; }
  [ build/mpi_coll -nt bench/mpi_coll.c ] || mpicc -O2 -o build/mpi_coll bench/mpi_coll.c
  case $size in 64K) slot="0 $iters 0" ;; 1M) slot="0 0 $iters" ;; 16M) slot="$iters 0 0" ;;
    *) echo "spread_ab.sh: Open MPI runs 64K, 1M or 16M" >&2; exit 2 ;; esac ;;
esac
echo "# load $(cat /proc/loadavg); hosts $h x $dph devices, $size, $iters iterations"
for r in $(seq 1 "$rounds"); do
  for op in $ops; do
    for v in "$@"; do
      IFS='|' read -r name envs keys bin <<<"$v"
      if [ "$name" = openmpi ]; then
        MPI_COLL_OP=$op mpirun --allow-run-as-root --oversubscribe -np $((h * dph)) --mca btl tcp,self \
          --mca btl_tcp_if_include lo --mca pml ob1 build/mpi_coll $slot 2>/dev/null |
          awk -v op="$op" '$1 == "openmpi" && $2 == op { print "openmpi", op, $5, $11 }'
      else
        env $envs "${bin:-build/meshrun}" bench collectives --hosts "$h" --devices-per-host "$dph" --op "$op" \
          --sizes "$size" --iters "$iters" --warmup 20 $keys 2>&1 |
          awk -v n="$name" -v op="$op" '/^ +[0-9]+ +[0-9]+ +[0-9.]+ /{t=$3} /^# cpu [0-9]+:/{c=$4} END{print n, op, t, c}'
      fi
    done
  done
  first=$1; shift; set -- "$@" "$first"
done > "$tmp/runs"
/usr/bin/python3 - "$tmp/runs" <<'PY'
import sys, statistics as st, collections
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    f = l.split()
    if len(f) == 4:
        d[(f[1], f[0])].append((float(f[2]), float(f[3])))
for op in dict.fromkeys(k[0] for k in d):
    mpi = d.get((op, "openmpi"))
    m = st.median(x[0] for x in mpi) if mpi else None
    for (o, n), v in d.items():
        if o != op:
            continue
        ts = sorted(x[0] for x in v)
        c = st.median(x[1] for x in v)
        rat = f"  Open MPI/it {m / st.median(ts):.2f}" if m and n != "openmpi" else ""
        print(f"{op:15s} {n:10s} us {st.median(ts):8.1f} ({ts[0]:.1f}-{ts[-1]:.1f})  cpu {c:8.1f}{rat}")
PY
echo "# load $(cat /proc/loadavg)"
