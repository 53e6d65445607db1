#!/usr/bin/env bash
# How many bytes wait unread in the data sockets' receive queues while a
# 16 MiB op runs on 2x1 (`meshrun bench collectives --hosts 2`, ITERS
# iterations): `ss -tn` every 20 ms, 100 samples after a 2 s start, the
# Recv-Q of every loopback TCP socket (the idle ones count as 0); prints
# the mean, median, p90 and max per build. Bytes that wait long are cold
# when the receiver's socket copy reaches them. A build is a path or
# NAME:VAR=VALUE (build/meshrun with that environment variable, e.g.
# write:MESHRUN_POLL_ORDER=write). A sampled figure, not a count: repeat
# it (ROUNDS, default 2, builds taking turns). Prints the load average.
# usage: [ROUNDS=2] [ITERS=150] bench/recvq.sh OP BUILD...
set -eu
cd "$(dirname "$0")/.."
op=$1; shift
rounds=${ROUNDS:-2}
iters=${ITERS:-150}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# load $(cat /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
  for b in "$@"; do
    case $b in
      *:*=*) name=${b%%:*}; env=${b#*:}; cmd=(env "$env" build/meshrun) ;;
      *) name=$(basename "$b"); cmd=("$b") ;;
    esac
    "${cmd[@]}" bench collectives --hosts 2 --op "$op" --sizes 16M --iters "$iters" \
      --warmup 3 >/dev/null 2>&1 &
    pid=$!
    sleep 2
    for _ in $(seq 1 100); do
      ss -tn 2>/dev/null | awk 'NR > 1 && $4 ~ /^127\./ {print $2}'
      sleep 0.02
    done > "$tmp/q"
    wait "$pid" || true
    /usr/bin/python3 - "$name" "$r" "$tmp/q" <<'PY'
import sys, statistics as st
v = sorted(int(x) for x in open(sys.argv[3]) if x.strip())
if not v:
    print(f"{sys.argv[1]} round {sys.argv[2]}: no samples"); sys.exit()
k = lambda q: v[min(len(v) - 1, int(len(v) * q))] / 1024
print(f"{sys.argv[1]} round {sys.argv[2]}: {len(v)} samples, Recv-Q KiB mean {st.mean(v) / 1024:.0f}"
      f" p50 {k(0.5):.0f} p90 {k(0.9):.0f} max {v[-1] / 1024:.0f}")
PY
  done
done
echo "# load $(cat /proc/loadavg)"
