#!/usr/bin/env bash
# Our TLS 1.3 record layer (tls_records=own, net/tls_rec.c) against
# OpenSSL's (tls_records=openssl) in one run, same build: clock-free
# counts per op first (bench/syscalls.sh: system calls, the message path's
# calls, context switches, wake-ups, CPU us of both agents), for
# all_gather at 64 KiB and 16 MiB and broadcast at 16 MiB, then
# `meshrun bench collectives` walls and CPU (the bench's `# cpu` line)
# interleaved over ROUNDS rounds, medians, and the ratio own / openssl.
# BASE=PATH adds that build (e.g. main before the change) to the walls.
# Prints the load average at the start and the end.
# usage: [BASE=PATH] bench/records_ab.sh [ROUNDS]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-3}
make -s all
# the same binary with OpenSSL's records, as syscalls.sh's BASE
wrap=build/meshrun-openssl-records
printf '#!/bin/sh\nexec %s "$@" tls_records=openssl\n' "$PWD/build/meshrun" > "$wrap"
chmod +x "$wrap"
echo "# load $(cat /proc/loadavg)"
echo "# clock-free counts (BASE row: tls_records=openssl; build/meshrun: own)"
BASE=$wrap ROUNDS=$rounds bench/syscalls.sh all_gather 64K 200
BASE=$wrap ROUNDS=$rounds bench/syscalls.sh all_gather 16M 10
BASE=$wrap ROUNDS=$rounds bench/syscalls.sh broadcast 16M 10
echo "# walls: median us per op and CPU us per op (both agents), $rounds rounds"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq 1 "$rounds"); do
  for impl in ${BASE:-} openssl own; do
    case $impl in
      openssl) bin=build/meshrun; keys=tls_records=openssl ;;
      own) bin=build/meshrun; keys=tls_records=own ;;
      *) bin=$impl; keys= ;;
    esac
    for op in all_gather all_reduce broadcast; do
      "$bin" bench collectives --hosts 2 --op $op --sizes 64K,16M --iters 20 --warmup 3 $keys 2>&1 |
        awk -v impl="$impl" -v op=$op '
          /^ +[0-9]+ +[0-9]+ +[0-9.]+ / { printf "%s %s %s time %s\n", impl, op, $1, $3 }
          /^# cpu [0-9]+:/ { sub(":", "", $3); printf "%s %s %s cpu %s\n", impl, op, $3, $4 }'
    done
  done
done > "$tmp/walls"
/usr/bin/python3 - "$tmp/walls" <<'PY'
import sys, statistics as st
d, impls, keys = {}, [], []
for l in open(sys.argv[1]):
    impl, op, size, what, v = l.split()
    if impl not in impls: impls.append(impl)
    k = (op, int(size))
    if k not in keys: keys.append(k)
    d.setdefault((impl, k, what), []).append(float(v))
print("| op | bytes | " + " | ".join(f"{i} us | {i} cpu us" for i in impls) + " | own/openssl time | own/openssl cpu |")
print("|---|---|" + "---|---|" * len(impls) + "---|---|")
for k in keys:
    row = []
    for i in impls:
        for w in ("time", "cpu"):
            v = d.get((i, k, w))
            row.append(f"{st.median(v):.1f}" if v else "-")
    def ratio(w):
        a, b = d.get(("own", k, w)), d.get(("openssl", k, w))
        return f"{st.median(a) / st.median(b):.2f}" if a and b else "-"
    print(f"| {k[0]} | {k[1]} | " + " | ".join(row) + f" | {ratio('time')} | {ratio('cpu')} |")
PY
echo "# load $(cat /proc/loadavg)"
