#!/usr/bin/env bash
# DeepSeek's batch split (docs/deepseek.md#batch-split) against the
# unsplit schedule, in one invocation: deepseek3-tiny with experts over
# 2 hosts x 2 devices (EP=4: dcn_expert=2 ici_expert=2, loopback TLS,
# OpenBLAS 1 thread a device), and a wider variant of it where there is
# compute to hide the all-to-all behind (d_model 256, 8 heads, q/kv LoRA
# 128/64, head dims 32/16/32, expert hidden 256, 8 rows a device).
#
# Each run is traced (--trace); bench/bsplit_trace.py reads, per device
# and step (steps >= 1): the MoE layers' time (the executor's `F mb0 cL`
# and `B mb0 cL` spans: chunk L is layer L without a pipeline), the
# all-to-all time (unsplit: the synchronous exchanges; split: while the
# communication thread ran them), the part of it the device waited for,
# the share hidden (1 - waited / all-to-all) and the share spent beside
# the device's own compute. Step time is the median of
# host 0's step_time_s over steps >= 1.
#
# ROUNDS rounds (default 3), the two schedules interleaved; medians over
# the rounds, and split / unsplit ratios.
# usage: [ROUNDS=N] bench/bsplit.sh [STEPS] [key=value ...]   (extra keys go to every run)
set -eu
cd "$(dirname "$0")/.."
steps=${1:-6}
shift || true
extra="$*"
rounds=${ROUNDS:-3}
make -s all
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cfg=configs/deepseek3-tiny.yml
ep4="dcn_data_parallelism=1 ici_data_parallelism=1 dcn_expert_parallelism=2 ici_expert_parallelism=2"
tiny="per_device_batch_size=2"
wide="per_device_batch_size=8 base_emb_dim=256 base_num_query_heads=8 base_num_kv_heads=8 q_lora_rank=128 \
kv_lora_rank=64 qk_nope_head_dim=32 qk_rope_head_dim=16 v_head_dim=32 base_moe_mlp_dim=256"
first_moe=$(sed -n 's/^first_num_dense_layers: //p' $cfg)
echo "load average at start: $(cat /proc/loadavg)"
# run VARIANT SCHEDULE KEYS...: one traced run, its figures appended to $tmp/rows
run() {
  local v=$1 s=$2; shift 2
  build/meshrun local --hosts 2 --devices-per-host 2 --config $cfg steps=$steps openblas_threads=1 $ep4 \
    "$@" $extra --trace $tmp/t.json --metrics $tmp/m.jsonl >$tmp/log 2>&1 || { cat $tmp/log; exit 1; }
  local st; st=$(python3 -c "import json; r=sorted(json.loads(l)['step_time_s'] for l in open('$tmp/m.jsonl'))[1:]; print(r[len(r)//2])")
  echo "$v $s step_s=$st $(python3 bench/bsplit_trace.py $tmp/t.json $first_moe) load=$(cut -d' ' -f1 /proc/loadavg)" \
    | tee -a $tmp/rows
}
for r in $(seq "$rounds"); do
  for v in tiny wide; do
    keys=$tiny; [ $v = wide ] && keys=$wide
    run $v unsplit $keys
    run $v split $keys use_batch_split_schedule=true batch_split_factor=2
  done
done
echo "load average at end: $(cat /proc/loadavg)"
python3 - $tmp/rows <<'EOF'
import sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    v, s, *kv = line.split()
    rows.setdefault((v, s), []).append({k: float(x) for k, x in (p.split('=') for p in kv)})
cols = ['step_s', 'moe_ms', 'a2a_ms', 'exposed_ms', 'hidden', 'beside', 'counts_ms', 'load']
print('%-5s %-8s' % ('model', 'schedule') + ''.join('%11s' % c for c in cols) + '   (medians of %d rounds)'
      % len(next(iter(rows.values()))))
med = {}
for (v, s), rs in sorted(rows.items(), key=lambda x: (x[0][0] != 'tiny', x[0][1] != 'unsplit')):
    med[v, s] = {c: st.median(r[c] for r in rs) for c in cols}
    print('%-5s %-8s' % (v, s) + ''.join('%11.3f' % med[v, s][c] for c in cols))
for v in ('tiny', 'wide'):
    a, b = med[v, 'unsplit'], med[v, 'split']
    print('%s: split / unsplit  step %.2f  MoE layers %.2f  all-to-all waited for %.2f; all-to-all hidden %.0f%% '
          '(beside compute %.0f%%)' % (v, b['step_s'] / a['step_s'], b['moe_ms'] / a['moe_ms'],
                                       b['exposed_ms'] / a['exposed_ms'], 100 * b['hidden'], 100 * b['beside']))
EOF
