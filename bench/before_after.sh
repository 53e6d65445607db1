#!/usr/bin/env bash
# Another build (BASE, e.g. a copy of build/meshrun from before a change)
# against this one, interleaved: every op at 64 KiB (500 iterations) and
# 16 MiB (10), HOSTS hosts x 1 device (default 2), ROUNDS rounds; median
# and min time and CPU per op (every agent).
# usage: [HOSTS=4] bench/before_after.sh BASE [ROUNDS]
set -eu
cd "$(dirname "$0")/.."
base=$1; rounds=${2:-3}; hosts=${HOSTS:-2}
for r in $(seq 1 "$rounds"); do
  echo "# round $r load $(cat /proc/loadavg)" >&2
  for op in all_gather reduce_scatter all_reduce all_to_all permute broadcast; do
    for b in base now; do
      bin=$base; [ $b = now ] && bin=build/meshrun
      for sz in "64K 500" "16M 10"; do
        set -- $sz
        out=$("$bin" bench collectives --hosts "$hosts" --op "$op" --sizes "$1" --iters "$2" --warmup 3 2>&1)
        echo "$b $op $1 $(echo "$out" | awk 'NF==6 && $1 ~ /^[0-9]+$/ {print $3}')" \
             "$(echo "$out" | awk '/^# cpu/ {print $4}')"
      done
    done
  done
done | /usr/bin/python3 -c '
import sys, statistics as st
d = {}
for l in sys.stdin:
    f = l.split()
    if len(f) == 5:
        d.setdefault((f[1], f[2], f[0]), []).append((float(f[3]), float(f[4])))
print("| op | size | build | time us median / min | CPU us per op median |")
print("|---|---|---|---|---|")
for k in sorted(d):
    t = [x[0] for x in d[k]]; c = [x[1] for x in d[k]]
    print(f"| {k[0]} | {k[1]} | {k[2]} | {st.median(t):.0f} / {min(t):.0f} | {st.median(c):.0f} |")
'
