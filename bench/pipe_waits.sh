#!/usr/bin/env bash
# FSDP x stage under zbv (bench/overlap_sleep.sh's fsdppp_zbv row:
# llama-bench, AdamW, fsdp=2 x stage=2, M = 8, ag_per_repeat, compute
# that sleeps 20 ms an action: 80,80,80 a layer x 2/8) against zbv alone
# (the same schedule, M and sleeps on 1 host x 2 devices, no FSDP),
# traced, build/meshrun and OLD alternating in each round, each trace
# split by bench/pipe_waits.py; then each column's median over the runs
# of each binary and mesh: what fsdppp_zbv pays beyond zbv alone.
# usage: bench/pipe_waits.sh [ROUNDS] [OLD]   (OLD: another meshrun, e.g.
#   /work/bin/meshrun-s10; without it build/meshrun alone)
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-3}; old=${2:-}
make -s all
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cp build/meshrun $tmp/new; [ -z "$old" ] || cp "$old" $tmp/old
A="--config configs/llama-bench.yml opt_type=adamw learning_rate=0.001 ici_data_parallelism=1
  ici_pipeline_parallelism=2 num_pipeline_microbatches=8 pipeline_recompute=false pipeline_schedule=zbv
  num_pipeline_repeats=2 steps=5 openblas_threads=1 pipeline_compute=sleep pipeline_sleep_ms=20,20,20"
PP="--hosts 2 --devices-per-host 2 dcn_data_parallelism=1 dcn_fsdp_parallelism=2 pipeline_fsdp_ag_per_repeat=true"
ZB="--hosts 1 --devices-per-host 2"
for r in $(seq 1 "$rounds"); do
  for b in new ${old:+old}; do
    for m in pp zb; do
      [ $m = pp ] && a=$PP || a=$ZB
      $tmp/$b local $a $A --trace $tmp/t-$m-$b-$r.json >/dev/null 2>$tmp/err || { tail -1 $tmp/err; exit 1; }
      echo "== round $r $b $m load $(cut -d' ' -f1-3 /proc/loadavg)"
      python3 bench/pipe_waits.py $tmp/t-$m-$b-$r.json | tee $tmp/w-$m-$b-$r | sed -n 1,2p
    done
  done
done
python3 - "$tmp" <<'PYEOF'
import collections, glob, re, statistics, sys
cols, rows = None, collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + '/w-*')):
    m, b = re.search(r'w-(\w+)-(\w+)-\d+$', f).groups()
    lines = open(f).read().splitlines()
    cols = lines[0].split()
    rows[(m, b)].append([float(v) for v in lines[1].split()[1:1 + len(cols)]])
print('median over runs (each run: the median over devices x steps):')
print('%-8s ' % '' + ' '.join('%6s' % c for c in cols))
med = {}
for (m, b), rs in sorted(rows.items()):
    med[(m, b)] = [statistics.median(r[j] for r in rs) for j in range(len(cols))]
    print('%-8s ' % (m + ' ' + b) + ' '.join('%6.1f' % v for v in med[(m, b)]))
for b in ('new', 'old'):
    if ('pp', b) in med and ('zb', b) in med:
        print('%-8s ' % ('pp-zb ' + b) + ' '.join('%6.1f' % (x - y) for x, y in zip(med[('pp', b)], med[('zb', b)])))
PYEOF
