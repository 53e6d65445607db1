#!/usr/bin/env bash
# Where the CPU of a collective goes: `perf record` (cpu-clock, F Hz) on
# `meshrun bench collectives --hosts 2` (both agents), the samples sorted
# into the cipher (libcrypto: AES-GCM and GHASH; or Intel ipsec-mb's libIPSec_MB), copies in user space
# (libc memcpy/memmove: OpenSSL's record buffers, our own), the kernel's
# copies (to and from the socket), scheduling (switches, futex, epoll
# sleeps), the rest of the kernel (TCP, syscalls), OpenSSL's record layer
# (libssl), meshrun's own code and the rest of libc. A run of 2N
# iterations minus one of N, over N, so start-up, buffer fill and the
# check drop out: CPU ms per op by category. Counts samples, not clocks,
# so it holds under load better than time does (but a loaded machine
# still slows every category: caches and cores are shared). BASE=PATH
# measures another build too, interleaved; ROUNDS=R (default 3) repeats
# and prints the median of each category.
# usage: bench/cpu_breakdown.sh OP SIZE N [key=value ...]
set -eu
cd "$(dirname "$0")/.."
op=$1; size=$2; n=$3; shift 3
F=${F:-999}
rounds=${ROUNDS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# load $(cat /proc/loadavg)"
bins="${BASE:-} build/meshrun"
for r in $(seq 1 "$rounds"); do
  i=0
  for bin in $bins; do
    i=$((i + 1))
    for k in 1 2; do
      perf record -q -F "$F" -o "$tmp/p.data" -- "$bin" bench collectives --hosts 2 \
        --op "$op" --sizes "$size" --iters $((n * k)) --warmup 3 "$@" >/dev/null 2>&1
      perf script -i "$tmp/p.data" -F ip,sym,dso 2>/dev/null >"$tmp/s.$i.$r.$k"
    done
  done
done
i=0
for bin in $bins; do
  i=$((i + 1))
  /usr/bin/python3 - "$tmp" "$i" "$rounds" "$n" "$F" "$bin $op $size $*" <<'EOF'
import sys, re, statistics
order = ["cipher (libcrypto, libIPSec_MB)", "user copies (libc memcpy)", "kernel copies",
         "scheduling/futex/epoll", "kernel other", "openssl record layer (libssl)",
         "meshrun", "libc other", "other"]
def cat(line):
    if "libcrypto" in line or "libIPSec_MB" in line: return order[0]
    if "libssl" in line: return order[5]
    if "[kernel" in line:
        if re.search(r"copy_(to|from)_iter|copy_user|__pi_memcpy|copy_page|skb_copy", line): return order[2]
        if re.search(r"schedul|switch|futex|ep_poll|epoll|hrtimeout|idle|yield", line): return order[3]
        return order[4]
    if "libc.so" in line:
        return order[1] if re.search(r"mem(move|cpy)", line) else order[7]
    if "meshrun" in line: return order[6]
    return order[8]
def count(p):
    c = dict.fromkeys(order, 0)
    for l in open(p):
        if l.strip(): c[cat(l)] += 1
    return c
tmp, i, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
n, F = int(sys.argv[4]), float(sys.argv[5])
per = []
for r in range(1, rounds + 1):
    a, b = count(f"{tmp}/s.{i}.{r}.1"), count(f"{tmp}/s.{i}.{r}.2")
    per.append({k: (b[k] - a[k]) / n * 1000.0 / F for k in order})
ms = {k: statistics.median(p[k] for p in per) for k in order}
tot = sum(ms.values())
print(f"## {sys.argv[6]}: CPU ms per op, both hosts, median of {rounds}")
print("| category | ms/op | share |")
print("|---|---|---|")
for k in order:
    print(f"| {k} | {ms[k]:.2f} | {100 * ms[k] / tot if tot else 0:.0f}% |")
print(f"| total | {tot:.2f} | |")
EOF
done
echo "# load $(cat /proc/loadavg)"
