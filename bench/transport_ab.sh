#!/usr/bin/env bash
# The transport's tunables against the defaults, interleaved in one run (2
# hosts x 1 device, loopback): every round runs all_gather, permute,
# all_reduce and broadcast (net5: at 16 MiB the one op bound by one
# host's thread) with the defaults of configs/base.yml and with one key
# changed at a time: at 64 KiB (500 iterations) poll_spin_us 0, 50 and
# 1000; at 16 MiB (10 iterations) poll_spin_us=0, link_streams=2,
# max_send_bytes=262144 and tcp_notsent_lowat_bytes=0. Prints medians and
# minima over ROUNDS of time and CPU per op (both agents), the load
# average, and for each key the value it would choose: the one whose time
# per op, as a geometric mean over the ops and sizes it ran of its median
# over the default's, is lowest, if that is below 0.95 and its CPU per op
# (same mean) at most 1.10 of the default's; else the default stays. ~45
# s a round on an idle 2-vCPU machine.
# usage: bench/transport_ab.sh [ROUNDS]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-4}
make -s all
echo "# load $(cat /proc/loadavg)"
defaults=""
for k in poll_spin_us link_streams max_send_bytes tcp_notsent_lowat_bytes; do
  defaults="$defaults $k=$(awk -v k="$k:" '$1 == k {print $2}' configs/base.yml)"
done
echo "# defaults (configs/base.yml):$defaults"
run() {   # SETTING OP SIZE ITERS (SETTING: key=value, or "default")
  local kv=()
  [ "$1" = default ] || kv=("$1")
  out=$(build/meshrun bench collectives --hosts 2 --op "$2" --sizes "$3" --iters "$4" --warmup 5 \
        "${kv[@]}" 2>&1)
  t=$(echo "$out" | awk 'NF==6 && $1 ~ /^[0-9]+$/ {print $3}')
  c=$(echo "$out" | awk '/^# cpu/ {print $4}')
  echo "$1 $2 $3 $t $c"
}
for r in $(seq 1 "$rounds"); do
  for op in all_gather permute all_reduce broadcast; do
    for v in default poll_spin_us=0 poll_spin_us=50 poll_spin_us=1000; do
      run "$v" "$op" 64K 500
    done
    for v in default poll_spin_us=0 link_streams=2 max_send_bytes=262144 \
	     tcp_notsent_lowat_bytes=0; do
      run "$v" "$op" 16M 10
    done
  done
done | /usr/bin/python3 -c '
import sys, math, statistics as st
defaults = dict(kv.split("=") for kv in sys.argv[1].split())
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
def gm(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None
print()
for key, dv in defaults.items():
    cands = sorted({s for (_, _, s) in d if s.startswith(key + "=")})
    best = None
    for s in cands:
        rt, rc = [], []
        for (op, size, s2), v in d.items():
            base = d.get((op, size, "default"))
            if s2 == s and base:
                rt.append(st.median(x[0] for x in v) / st.median(x[0] for x in base))
                rc.append(st.median(x[1] for x in v) / st.median(x[1] for x in base))
        t, c = gm(rt), gm(rc)
        print(f"# {s}: time {t:.2f}, CPU {c:.2f} of the default ({key}={dv}), geometric mean over {len(rt)} op/size rows")
        if t < 0.95 and c <= 1.10 and (best is None or t < best[1]):
            best = (s, t)
    print("choice: " + (best[0] if best else f"{key}={dv} (the default)"))
' "$defaults"
echo "# load $(cat /proc/loadavg)"
