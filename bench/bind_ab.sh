#!/usr/bin/env bash
# Issue 19: do bound agents (cpu_bind: auto, each local agent on its own
# CPU) leave the 64 KiB ops' slow mode? meshrun alone (no peers), 2 hosts
# x 1 device, every op at SIZE, each variant once per round, the order
# rotated round by round; prints each run's time per op and, per variant
# and op, the median, lowest and highest over the rounds and how many
# runs were slow (over 1.3x the op's fastest run of any variant).
# VARIANTS: space-separated NAME=BIN[,key=value...] (BIN a meshrun
# binary; default: bound and unbound of build/meshrun). Raw: build/bind_ab.log.
# HOSTS=4: 4 hosts x 1 device instead (e.g. cpu_bind=spread against
# cpu_bind=none: VARIANTS="spread=build/meshrun,cpu_bind=spread
# none=build/meshrun,cpu_bind=none").
# ~3 s a variant a round on an idle 2-vCPU machine.
# usage: [VARIANTS="..."] [SIZE=64K] [ITERS=500] [HOSTS=2|4] bench/bind_ab.sh [ROUNDS]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-10}
size=${SIZE:-64K}
iters=${ITERS:-500}
variants=${VARIANTS:-"bound=build/meshrun unbound=build/meshrun,cpu_bind=none"}
ops="all_gather reduce_scatter all_reduce all_to_all permute broadcast"
log=build/bind_ab.log
make -s all
read -r -a vs <<< "$variants"
nv=${#vs[@]}
: > "$log"
for round in $(seq 1 "$rounds"); do
  echo "# round $round load $(cat /proc/loadavg)" | tee -a "$log"
  for j in $(seq 0 $((nv - 1))); do
    v=${vs[$(( (j + round) % nv ))]}
    name=${v%%=*}
    spec=${v#*=}
    bin=${spec%%,*}
    keys=""
    [ "$bin" = "$spec" ] || keys=${spec#*,}
    for op in $ops; do
      t=$("$bin" bench collectives --hosts "${HOSTS:-2}" --devices-per-host 1 --op "$op" --sizes "$size" \
        --iters "$iters" --warmup 20 ${keys//,/ } 2>&1 | awk '$1 ~ /^[0-9]+$/ && NF == 6 {print $3}')
      echo "$name $op ${t:-fail}" >> "$log"
    done
  done
done
echo "# end load $(cat /proc/loadavg)" | tee -a "$log"
/usr/bin/python3 - "$log" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    if line.startswith("#"):
        continue
    name, op, t = line.split()
    if t != "fail":
        runs.setdefault((name, op), []).append(float(t))
names = list(dict.fromkeys(k[0] for k in runs))
ops = list(dict.fromkeys(k[1] for k in runs))
print("op              " + "".join(f"{n:>34s}" for n in names))
print("                " + "".join(f"{'median (low-high) slow/runs':>34s}" for n in names))
for op in ops:
    best = min(min(runs.get((n, op), [1e9])) for n in names)
    cells = []
    for n in names:
        v = runs.get((n, op), [])
        slow = sum(t > 1.3 * best for t in v)
        cells.append(f"{statistics.median(v):8.1f} ({min(v):6.1f}-{max(v):6.1f}) {slow:2d}/{len(v):<2d}" if v else "-")
    print(f"{op:16s}" + "".join(f"{c:>34s}" for c in cells))
PY
