#!/usr/bin/env bash
# fsdp 2x2 (llama-bench, AdamW, compute that sleeps 80,80,80 ms a layer,
# as bench/overlap_sleep.sh's fsdp22 row) traced, build/meshrun and OLD
# alternating in each round, each trace split by bench/step_waits.py;
# then each column's median over the runs of each binary, and from the
# traces every B action's CPU (args.cpu_us) and layer 0's B beyond its
# sleep (where a hook waits for a reduce-scatter in flight).
# usage: bench/step_waits.sh [ROUNDS] [OLD]   (OLD: another meshrun, e.g.
#   /work/bin/meshrun-s9; without it build/meshrun alone)
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-4}; old=${2:-}
make -s all
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cp build/meshrun $tmp/new; [ -z "$old" ] || cp "$old" $tmp/old
A="--hosts 2 --devices-per-host 2 --config configs/llama-bench.yml opt_type=adamw learning_rate=0.001
  ici_data_parallelism=1 dcn_data_parallelism=1 dcn_fsdp_parallelism=2 ici_fsdp_parallelism=2 steps=5
  openblas_threads=1 pipeline_compute=sleep pipeline_sleep_ms=80,80,80"
for r in $(seq 1 "$rounds"); do
  for b in new ${old:+old}; do
    $tmp/$b local $A --trace $tmp/t-$b-$r.json >/dev/null 2>$tmp/err || { tail -1 $tmp/err; exit 1; }
    echo "== round $r $b load $(cut -d' ' -f1-3 /proc/loadavg)"
    python3 bench/step_waits.py $tmp/t-$b-$r.json | tee $tmp/w-$b-$r
  done
done
python3 - "$tmp" <<'PYEOF'
import collections, glob, json, re, statistics, sys
cols, rows, bcpu, bc0 = None, collections.defaultdict(list), collections.defaultdict(list), collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + '/w-*')):
    b = re.search(r'w-(\w+)-\d+$', f).group(1)
    head, vals = open(f).read().splitlines()[:2]
    cols = head.split()
    rows[b].append([float(v) for v in vals.split()[:len(cols)]])
    for e in json.load(open(f.replace('/w-', '/t-') + '.json'))['traceEvents']:
        if e.get('ph') == 'X' and e['tid'] < 1000 and e['args'].get('step', 0) >= 1 and e['name'].startswith('B mb0'):
            bcpu[b].append(e['args'].get('cpu_us', 0) / 1e3)
            if e['name'] == 'B mb0 c0':
                bc0[b].append(e['dur'] / 1e3 - 160)
print('median over runs:')
print('%-4s ' % '' + ' '.join('%6s' % c for c in cols))
for b, rs in rows.items():
    print('%-4s ' % b + ' '.join('%6.1f' % statistics.median(r[j] for r in rs) for j in range(len(cols))))
for b in rows:
    x = sorted(bc0[b])
    print('%s: B action CPU median %.2f ms; B c0 beyond its sleep median %.1f, p90 %.1f, max %.1f ms (%d)' % (
        b, statistics.median(bcpu[b]), statistics.median(x), x[int(len(x) * .9)], x[-1], len(x)))
PYEOF
