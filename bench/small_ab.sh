#!/usr/bin/env bash
# The 64 KiB ops on 2 x 1 (reduce_scatter, all_gather, all_reduce by
# default), BASE (a build before the change) against this one and its
# variants, in one run: clock-free counts per op first (bench/syscalls.sh:
# system calls, sendto/recvfrom, recv()s that met EAGAIN, wake-ups, CPU us
# of both agents), then `meshrun bench collectives --iters ITERS` walls
# and CPU (the bench's `# cpu` line) interleaved over ROUNDS rounds (the
# builds take turns going first: round r starts with the r-th),
# medians, and each build's ratio to BASE. A variant is NAME:VAR=VALUE,
# run as build/meshrun with that environment variable set (an A/B hook
# such as MESHRUN_EARLY_BYTES, which commit 035c5c2 adds to
# net/tls_rec.c and the commit after it takes out again). Prints the
# load average at the start and the end: times under load are the
# scheduler's.
# usage: BASE=PATH [VARIANTS="name:VAR=VAL ..."] [OPS="..."] [SIZE=64K]
#        [ITERS=300] [COUNT_N=3000] [COUNTS=0: walls only] bench/small_ab.sh [ROUNDS]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-3}
: "${BASE:?BASE=PATH of the build to compare against}"
ops=${OPS:-reduce_scatter all_gather all_reduce}
size=${SIZE:-64K}
iters=${ITERS:-300}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
make -s all
# every build as one command: BASE, build/meshrun, and a wrapper per variant
impls="base:$BASE new:$PWD/build/meshrun"
for v in ${VARIANTS:-}; do
  name=${v%%:*}; env=${v#*:}
  printf '#!/bin/sh\n%s exec %s "$@"\n' "$env" "$PWD/build/meshrun" > "$tmp/$name"
  chmod +x "$tmp/$name"
  impls="$impls $name:$tmp/$name"
done
echo "# load $(cat /proc/loadavg)"
echo "# builds: $impls"
bins=""
for i in $impls; do [ "${i%%:*}" = new ] || bins="$bins ${i#*:}"; done
if [ "${COUNTS:-1}" != 0 ]; then
  for op in $ops; do
    BASE="$bins" ROUNDS=$rounds bench/syscalls.sh "$op" "$size" "${COUNT_N:-3000}"
  done
fi
echo "# walls: median us per op and CPU us per op (both agents), $rounds rounds of $iters iterations"
set -- $impls
for r in $(seq 1 "$rounds"); do
  for op in $ops; do
    for i in "$@"; do
      "${i#*:}" bench collectives --hosts 2 --op "$op" --sizes "$size" --iters "$iters" --warmup 10 2>&1 |
        awk -v impl="${i%%:*}" -v op="$op" '
          /^ +[0-9]+ +[0-9]+ +[0-9.]+ / { printf "%s %s time %s\n", impl, op, $3 }
          /^# cpu [0-9]+:/ { printf "%s %s cpu %s\n", impl, op, $4 }'
    done
  done
  set -- "${@:2}" "$1"   # the next round starts with the next build
done > "$tmp/walls"
/usr/bin/python3 - "$tmp/walls" <<'PY'
import sys, statistics as st
d, impls, ops = {}, [], []
for l in open(sys.argv[1]):
    impl, op, what, v = l.split()
    if impl not in impls: impls.append(impl)
    if op not in ops: ops.append(op)
    d.setdefault((impl, op, what), []).append(float(v))
med = lambda k: st.median(d[k]) if k in d else float("nan")
print("| op | " + " | ".join(f"{i} us | {i} cpu us" for i in impls) + " | "
      + " | ".join(f"{i}/base time | {i}/base cpu" for i in impls[1:]) + " |")
print("|---|" + "---|---|" * len(impls) + "---|---|" * (len(impls) - 1))
for op in ops:
    row = [f"{med((i, op, w)):.1f}" for i in impls for w in ("time", "cpu")]
    rat = [f"{med((i, op, w)) / med((impls[0], op, w)):.2f}" for i in impls[1:] for w in ("time", "cpu")]
    print(f"| {op} | " + " | ".join(row + rat) + " |")
PY
echo "# load $(cat /proc/loadavg)"
