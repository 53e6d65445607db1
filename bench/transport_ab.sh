#!/usr/bin/env bash
# The transport's tunables against each other, interleaved in one run (2
# hosts x 1 device, loopback): poll_spin_us, link_streams and
# max_send_bytes, each value of one key with the others at their
# defaults. Prints medians and minima over ROUNDS of time and CPU per op
# (both agents), with the load average at the start (16 MiB also
# tcp_notsent_lowat_bytes 0 against 256 KiB). The defaults in
# configs/base.yml were picked with this (bench/README.md says on what).
# usage: bench/transport_ab.sh [ROUNDS]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-5}
make -s all
echo "# load $(cat /proc/loadavg)"
run() {   # KEY=VALUE OP SIZE ITERS
  out=$(build/meshrun bench collectives --hosts 2 --op "$2" --sizes "$3" --iters "$4" --warmup 5 "$1" 2>&1)
  t=$(echo "$out" | awk 'NF==6 && $1 ~ /^[0-9]+$/ {print $3}')
  c=$(echo "$out" | awk '/^# cpu/ {print $4}')
  echo "$1 $2 $3 $t $c"
}
for r in $(seq 1 "$rounds"); do
  for op in all_gather permute all_reduce; do
    for v in poll_spin_us=0 poll_spin_us=50 poll_spin_us=200 poll_spin_us=1000; do
      run "$v" "$op" 64K 500
    done
    for v in link_streams=1 link_streams=2 max_send_bytes=262144 max_send_bytes=1048576 \
	     poll_spin_us=0 poll_spin_us=200 tcp_notsent_lowat_bytes=0 tcp_notsent_lowat_bytes=262144; do
      run "$v" "$op" 16M 10
    done
  done
done | /usr/bin/python3 -c '
import sys, statistics as st
d = {}
for l in sys.stdin:
    f = l.split()
    if len(f) == 5:
        d.setdefault((f[1], f[2], f[0]), []).append((float(f[3]), float(f[4])))
print("| op | size | setting | time us median / min | CPU us per op median / min |")
print("|---|---|---|---|---|")
for k in sorted(d):
    t = [x[0] for x in d[k]]; c = [x[1] for x in d[k]]
    print(f"| {k[0]} | {k[1]} | {k[2]} | {st.median(t):.1f} / {min(t):.1f} | {st.median(c):.1f} / {min(c):.1f} |")
'
echo "# load $(cat /proc/loadavg)"
