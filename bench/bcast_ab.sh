#!/usr/bin/env bash
# Issue 19's 16 MiB broadcast against its bound, in one run (net5): the
# bound first (bench/bcast_bound.c: AES-128-GCM encrypt and decrypt of 16
# MiB alone and at once, plaintext loopback TCP, and the two-thread
# encrypt-send / recv-decrypt pipe), then ROUNDS interleaved rounds of
# `meshrun bench collectives` for broadcast and permute at 16 MiB (20
# iterations) and 64 KiB (500), with BASE (required: a build of the
# commit before the change) and build/meshrun, and with build/meshrun under
# each SETTINGS key=value (default: poll_spin_us=0 link_streams=2
# segment_bytes=4194304). Prints medians of time and CPU per op (both
# agents; the bench's `# cpu` line), each row's ratio to the base's, and
# broadcast's time against the bound measured at the start: the pipe's
# wall time, or for HOSTS > 2 its CPU times the chain's HOSTS-1 hops over
# the cores if that is more. HOSTS=4 runs 4 x 1 instead of 2 x 1.
# Prints the load average at the start and the end: time figures at load
# mean little (bench/results/transport.md, "The 16 MiB broadcast against its bound").
# usage: BASE=PATH [HOSTS=2] [SETTINGS="k=v ..."] bench/bcast_ab.sh [ROUNDS]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-3}
base=${BASE:?give BASE=a meshrun binary built from the commit to compare against}
hosts=${HOSTS:-2}
settings=${SETTINGS:-poll_spin_us=0 link_streams=2 segment_bytes=4194304}
make -s all
cc -O2 -pthread -o build/bcast_bound bench/bcast_bound.c -lcrypto
echo "# load $(cat /proc/loadavg)"
build/bcast_bound 16777216 5 | tee build/bcast_bound.log
# the bound: the pipe's wall time for one hop; a chain of HOSTS-1 hops
# on this machine's cores costs at least the pipe's CPU per hop times the
# hops, spread over the cores
pipe_ms=$(awk -v h="$hosts" -v c="$(nproc)" '$1 == "pipe" {w = $2; x = $4 * (h - 1) / c;
  print (x > w ? x : w)}' build/bcast_bound.log)
run() {   # LABEL BIN OP SIZE ITERS [key=value]
  local label=$1 bin=$2 op=$3 size=$4 iters=$5
  shift 5
  out=$("$bin" bench collectives --hosts "$hosts" --op "$op" --sizes "$size" --iters "$iters" \
        --warmup 3 "$@" 2>&1)
  t=$(echo "$out" | awk 'NF==6 && $1 ~ /^[0-9]+$/ {print $3}')
  c=$(echo "$out" | awk '/^# cpu/ {print $4}')
  w=$(echo "$out" | awk 'NF==6 && $1 ~ /^[0-9]+$/ {print $6}')
  [ "${w:-1}" = 0 ] || { echo "bcast_ab.sh: $label $op $size: wrong elements or no result" >&2; exit 1; }
  echo "$label $op $size $t $c"
}
for r in $(seq 1 "$rounds"); do
  for op in broadcast permute; do
    for size in 16M 64K; do
      iters=20; [ "$size" = 64K ] && iters=500
      run base "$base" $op $size $iters
      run new build/meshrun $op $size $iters
      for kv in $settings; do
        run "new:$kv" build/meshrun $op $size $iters "$kv"
      done
    done
  done
done | /usr/bin/python3 -c '
import sys, statistics as st
pipe_ms = float(sys.argv[1])
d = {}
for l in sys.stdin:
    f = l.split()
    d.setdefault((f[1], f[2], f[0]), []).append((float(f[3]), float(f[4])))
print("| op | size | build / setting | time us median | CPU us per op median | time / base | CPU / base |")
print("|---|---|---|---|---|---|---|")
for k in sorted(d, key=lambda k: (k[0], k[1], k[2] != "base", k[2])):
    t = st.median(x[0] for x in d[k]); c = st.median(x[1] for x in d[k])
    b = d.get((k[0], k[1], "base"))
    bt = st.median(x[0] for x in b) if b else t; bc = st.median(x[1] for x in b) if b else c
    print(f"| {k[0]} | {k[1]} | {k[2]} | {t:.1f} | {c:.1f} | {t / bt:.2f} | {c / bc:.2f} |")
for k in sorted(d):
    if k[0] == "broadcast" and k[1] == "16M":
        t = st.median(x[0] for x in d[k])
        print(f"# broadcast 16 MiB {k[2]}: {t / 1e3:.2f} ms, {t / 1e3 / pipe_ms:.2f}x the bound ({pipe_ms:.2f} ms)")
' "$pipe_ms"
echo "# load $(cat /proc/loadavg)"
