#!/usr/bin/env bash
# Bytes copied in user space per op, by call site: bench/memcpy_count.c
# preloaded into `meshrun bench collectives --hosts 2` (both agents), a
# run of 2N iterations minus one of N, over N (start-up, buffer fill and
# the check drop out). Counts bytes, not time, so it holds under load.
# Prints each site's bytes per op and per byte of the op's buffer (SIZE).
# BASE=PATH measures another build too, in the same run; HOSTS=N runs
# N hosts (default 2).
# usage: [BASE=PATH] [HOSTS=N] bench/copies.sh OP SIZE N [key=value ...]
set -eu
cd "$(dirname "$0")/.."
op=$1; size=$2; n=$3; shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -shared -fPIC -o "$tmp/memcpy_count.so" bench/memcpy_count.c -ldl
for bin in ${BASE:-} build/meshrun; do
  for k in 1 2; do
    mkdir -p "$tmp/c$k"; rm -f "$tmp/c$k"/*
    MEMCPY_COUNT_DIR="$tmp/c$k" LD_PRELOAD="$tmp/memcpy_count.so" "$bin" bench collectives \
      --hosts "${HOSTS:-2}" --op "$op" --sizes "$size" --iters $((n * k)) --warmup 3 "$@" >/dev/null 2>&1
  done
  /usr/bin/python3 - "$tmp" "$n" "$size" "$bin $op $size $*" <<'PY'
import glob, sys
tmp, n, size, title = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
nbytes = int(size[:-1]) * mult[size[-1]] if size[-1] in mult else int(size)
def load(k):
    d = {}
    for p in glob.glob(f"{tmp}/c{k}/*"):
        for l in open(p):
            b, c, obj, sym, off = l.split()
            key = f"{obj} {sym if sym != '?' else off}"
            d[key] = d.get(key, 0) + int(b)
    return d
a, b = load(1), load(2)
rows = sorted(((b[k] - a.get(k, 0)) / n, k) for k in b)
print(f"## {title}: user-space copies per op, all hosts")
print("| call site | bytes per op | per buffer byte |")
print("|---|---|---|")
tot = 0
for v, k in reversed(rows):
    if v >= nbytes / 1000:
        print(f"| {k} | {v:.0f} | {v / nbytes:.2f} |")
        tot += v
print(f"| total | {tot:.0f} | {tot / nbytes:.2f} |")
PY
done
