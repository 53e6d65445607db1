#!/usr/bin/env bash
# Two-level collectives (coll_two_level, docs/collectives.md "Two levels")
# against the flat ring, in the same rounds: `meshrun bench collectives`
# on H x D (default 2x2) for all_gather, reduce_scatter and all_reduce at
# SIZES (default 16M), each op with the key off and on, interleaved. Per
# op and setting: wall time per iteration (the slowest rank's, median over
# the rounds), the CPU all agents spent per iteration (user+sys, median),
# and the payload host 0 sent to other hosts per iteration (the "# dcn"
# line: counted when posted, clock-free: the flat ring's (n-1)/n of the
# buffer, two levels' (H-1)/H; all_reduce twice that); then on/off ratios.
# Then (TRAIN_STEPS, default 6; 0 skips it) fsdp 2x2 training of
# configs/llama-bench.yml with compute that sleeps (pipeline_compute=sleep,
# 20 ms a layer's F, I and W), off and on in the same rounds: the CPU
# seconds the whole job spent (user+sys of the launcher and its agents,
# /usr/bin/time: start-up included, the same in both), the mean step
# (steps >= 1), comm_exposed_s and dcn_bytes (MB a step, clock-free) from
# --metrics. The load average is printed with every round.
# usage: [SHAPES="2x2 4x2"] [SIZES=16M] [TRAIN_STEPS=6] bench/two_level.sh [ITERS [ROUNDS]]
set -eu
cd "$(dirname "$0")/.."
iters=${1:-10}; rounds=${2:-3}
shapes=${SHAPES:-2x2}; sizes=${SIZES:-16M}; tsteps=${TRAIN_STEPS:-6}
make -s all
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cp build/meshrun $tmp/meshrun
echo "meshrun $(git rev-parse --short HEAD 2>/dev/null), $iters iters, $rounds round(s), shapes $shapes," \
  "sizes $sizes, load $(cut -d' ' -f1-3 /proc/loadavg)"
: >$tmp/raw
for r in $(seq 1 "$rounds"); do
  echo "-- round $r, load $(cut -d' ' -f1-3 /proc/loadavg)"
  for shape in $shapes; do
    h=${shape%x*}; d=${shape#*x}
    for op in all_gather reduce_scatter all_reduce; do
      for two in false true; do
        $tmp/meshrun bench collectives --hosts "$h" --devices-per-host "$d" --op $op --sizes "$sizes" \
          --iters "$iters" --warmup 2 coll_two_level=$two >$tmp/out 2>$tmp/err ||
          { echo "$shape $op coll_two_level=$two failed: $(tail -1 $tmp/err)"; exit 1; }
        # SHAPE OP TWO SIZE TIME_US CPU_US DCN_BYTES
        python3 - "$shape" $op $two $tmp/out >>$tmp/raw <<'PYEOF'
import re, sys
shape, op, two, path = sys.argv[1:]
rows, cpu, dcn = {}, {}, {}
for l in open(path):
    w = l.split()
    if len(w) == 6 and w[0].isdigit():
        rows[w[0]] = w[2]
    m = re.match(r'# cpu (\d+): ([\d.]+) us', l)
    if m: cpu[m.group(1)] = m.group(2)
    m = re.match(r'# dcn (\d+): ([\d.]+) bytes', l)
    if m: dcn[m.group(1)] = m.group(2)
for s in rows:
    print(shape, op, two, s, rows[s], cpu.get(s, 'nan'), dcn.get(s, 'nan'))
PYEOF
        awk -v s="$shape" -v o=$op -v t=$two '$1==s && $2==o && $3==t' $tmp/raw | tail -n 1 |
          awk '{printf "%-5s %-15s two_level=%-5s %10s B  %10.1f us  cpu %10.1f us  dcn %12.0f B\n", $1, $2, $3, $4, $5, $6, $7}'
      done
    done
  done
  [ "$tsteps" -gt 0 ] || continue
  for two in false true; do
    /usr/bin/time -f "%U %S %e" -o $tmp/time $tmp/meshrun local --hosts 2 --devices-per-host 2 \
      --config configs/llama-bench.yml steps=$tsteps openblas_threads=1 pipeline_compute=sleep \
      pipeline_sleep_ms=20,20,20 ici_data_parallelism=1 dcn_data_parallelism=1 \
      dcn_fsdp_parallelism=2 ici_fsdp_parallelism=2 coll_two_level=$two \
      --metrics $tmp/m.jsonl >/dev/null 2>$tmp/err || { echo "training failed: $(tail -1 $tmp/err)"; exit 1; }
    # train TWO CPU_S WALL_S STEP_S EXPOSED_S DCN_MB
    python3 - $two $tmp/time $tmp/m.jsonl >>$tmp/train <<'PYEOF'
import json, sys
two, tf, mf = sys.argv[1:]
u, s, e = map(float, open(tf).read().split()[-3:])
r = [json.loads(l) for l in open(mf)][1:]
m = lambda k: sum(x.get(k, 0) for x in r) / len(r)
print('train', two, u + s, e, m('step_time_s'), m('comm_exposed_s'), m('dcn_bytes') / 1e6)
PYEOF
    tail -n 1 $tmp/train | awk '{printf "fsdp22 train two_level=%-5s cpu %7.2f s  wall %6.2f s  step %.4f s  exposed %.4f s  dcn %.1f MB a step\n", $2, $3, $4, $5, $6, $7}'
  done
done
echo "-- medians over $rounds round(s), on/off"
python3 - $tmp/raw <<'PYEOF'
import sys, statistics as st
d = {}
for l in open(sys.argv[1]):
    shape, op, two, size, t, cpu, dcn = l.split()
    d.setdefault((shape, op, size), {}).setdefault(two, []).append((float(t), float(cpu), float(dcn)))
print('%-5s %-15s %10s %11s %11s %6s %11s %11s %6s %10s %10s %6s' % ('shape', 'op', 'size', 'off_us', 'on_us', 'wall',
      'off_cpu_us', 'on_cpu_us', 'cpu', 'off_dcn_MB', 'on_dcn_MB', 'dcn'))
for (shape, op, size), v in d.items():
    if 'false' not in v or 'true' not in v:
        continue
    med = lambda k, i: st.median(x[i] for x in v[k])
    f = [med('false', i) for i in range(3)]
    n = [med('true', i) for i in range(3)]
    print('%-5s %-15s %10s %11.1f %11.1f %6.3f %11.1f %11.1f %6.3f %10.3f %10.3f %6.3f' % (
        shape, op, size, f[0], n[0], n[0] / f[0], f[1], n[1], n[1] / f[1], f[2] / 1e6, n[2] / 1e6, n[2] / f[2]))
PYEOF
[ "$tsteps" -gt 0 ] && python3 - $tmp/train <<'PYEOF'
import sys, statistics as st
d = {}
for l in open(sys.argv[1]):
    w = l.split()
    d.setdefault(w[1], []).append([float(x) for x in w[2:]])
med = lambda k, i: st.median(x[i] for x in d[k])
names = ('cpu_s', 'wall_s', 'step_s', 'exposed_s', 'dcn_MB')
print('fsdp22 training, medians: ' + '  '.join('%s %.4g -> %.4g (%.3f)' % (n, med('false', i), med('true', i),
      med('true', i) / med('false', i) if med('false', i) else float('nan')) for i, n in enumerate(names)))
PYEOF
echo "load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
