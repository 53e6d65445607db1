#!/usr/bin/env bash
# DeepSeek's batch-split schedule (docs/deepseek.md#batch-split) on
# against off, in one invocation, both with the same halves: the
# baseline (schedule "off") is use_batch_split_schedule=false with
# batch_split_factor=$BASE_FACTOR (default 2: the same products, the
# halves one after the other, so the two runs compute the same bits and
# differ only in when the pieces run; BASE_FACTOR=1 gives the unsplit
# layer instead, the comparison earlier sessions made), the split
# (schedule "on") use_batch_split_schedule=true batch_split_factor=2.
# The output says which baseline it used. deepseek3-tiny with experts over
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
# bench/bsplit_cpu.py adds what the run asked of the machine, per step
# (steps >= 1), clock-free: cpu_s, the CPU seconds of all its threads
# (every host's), of which dev_s on the device threads and comm_s on the
# communication threads; util = cpu_s / (step_s x cores), how busy the
# run kept the machine's cores (near 1: no idle core for the split to
# fill, on a machine nothing else runs on).
#
# bsplit_trace.py also splits the waiting: late_ms, waited for a peer
# that had not started the exchange yet (a straggler: uneven expert
# loads), and xfer_ms / hidden_xfer, the transfer after the last peer
# started it and the share of that the device did not wait for.
# bench/expert_load.py adds load_dev, the busiest device's expert rows
# over the mean (1: even), from each run's MESHRUN_EXPERT_LOAD file.
#
# VARIANTS (default "tiny wide widebal wideckpt"): widebal is the wide
# model with every token sent to every expert (4 experts, top 4, no
# groups: each device gets exactly a quarter of the expert rows; from a
# fresh start deepseek3-tiny's routing sends every token to the same few
# experts for its first ~30 steps, see bench/results/deepseek.md); wideckpt is the
# wide model started from a checkpoint whose routing has trained:
# before the rounds (untimed) the wide model trains WARM_STEPS steps
# (default 120) on one device (per_device_batch_size=8,
# routed_bias_update_rate=$WARM_RATE, default 0.001, deepseek3-tiny's
# own) and saves it; the runs then start from it (load_parameters_path)
# at learning_rate=0.0003, the rate the warm-up ended at (its cosine
# decays to 0.1 of deepseek3-tiny's 0.003): restarting at the peak with
# a fresh optimizer undoes the training (loss 2.75 -> 3.7 in one step)
# and sends the routing back to its early collapse (busiest device
# 1.6-1.8x the mean again, 1.1-1.2x at 0.0003). The rate changes no
# product, so the step costs what wide's does. WIDECKPT=DIR keeps that
# checkpoint in DIR and reuses it when DIR has one. Also "wide2x1", the
# wide model on 2 hosts x 1 device (EP=2: a core per device thread on 2
# cores).
# ROUNDS rounds (default 3), the two schedules interleaved; medians over
# the rounds, and on / off ratios.
# usage: [ROUNDS=N] [VARIANTS="..."] [BASE_FACTOR=2|1] [WARM_STEPS=N] [WARM_RATE=R] [WIDECKPT=DIR]
#        bench/bsplit.sh [STEPS] [key=value ...]
#        (extra keys go to every run)
set -eu
cd "$(dirname "$0")/.."
steps=${1:-6}
shift || true
extra="$*"
rounds=${ROUNDS:-3}
variants=${VARIANTS:-tiny wide widebal wideckpt}
warm_steps=${WARM_STEPS:-120}
warm_rate=${WARM_RATE:-0.001}
base_factor=${BASE_FACTOR:-2}
cores=$(nproc)
make -s all
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cfg=configs/deepseek3-tiny.yml
ep="dcn_data_parallelism=1 ici_data_parallelism=1 dcn_expert_parallelism=2"
tiny="per_device_batch_size=2"
wide="per_device_batch_size=8 base_emb_dim=256 base_num_query_heads=8 base_num_kv_heads=8 q_lora_rank=128 \
kv_lora_rank=64 qk_nope_head_dim=32 qk_rope_head_dim=16 v_head_dim=32 base_moe_mlp_dim=256"
balanced="num_experts=4 num_experts_per_tok=4 n_routing_groups=1 topk_routing_group=1"
first_moe=$(sed -n 's/^first_num_dense_layers: //p' $cfg)
echo "load average at start: $(cat /proc/loadavg)"
echo "schedule off (baseline): use_batch_split_schedule=false batch_split_factor=$base_factor" \
  "$([ "$base_factor" = 2 ] && echo '(the same halves as on, one after the other)' || echo '(unsplit)')"
echo "schedule on: use_batch_split_schedule=true batch_split_factor=2"
# run VARIANT SCHEDULE KEYS...: one traced run, its figures appended to $tmp/rows
run() {
  local v=$1 s=$2 dph=2; shift 2
  [ $v = wide2x1 ] && dph=1
  rm -f $tmp/load
  MESHRUN_EXPERT_LOAD=$tmp/load python3 bench/bsplit_cpu.py $tmp/cpu -- \
    build/meshrun local --hosts 2 --devices-per-host $dph --config $cfg steps=$steps openblas_threads=1 $ep \
    ici_expert_parallelism=$dph "$@" $extra --trace $tmp/t.json --metrics $tmp/m.jsonl >$tmp/log 2>&1 ||
    { cat $tmp/log; exit 1; }
  local st; st=$(python3 -c "import json; r=sorted(json.loads(l)['step_time_s'] for l in open('$tmp/m.jsonl'))[1:]; print(r[len(r)//2])")
  local cpu; cpu=$(cat $tmp/cpu)
  local util; util=$(python3 -c "print('%.3f' % (float('${cpu%% *}'.split('=')[1]) / ($st * $cores)))")
  echo "$v $s step_s=$st $(python3 bench/bsplit_trace.py $tmp/t.json $first_moe) $cpu util=$util" \
    "$(python3 bench/expert_load.py $tmp/load $((2 * dph)) 0)" \
    "load=$(cut -d' ' -f1 /proc/loadavg)" | tee -a $tmp/rows
}
ckpt=${WIDECKPT:-$tmp/wideckpt}
if [[ " $variants " == *" wideckpt "* ]]; then
  if ls -d "$ckpt"/step-* >/dev/null 2>&1; then
    echo "wideckpt: reusing $ckpt"
  else
    echo "wideckpt warm-up: $warm_steps steps on one device, routed_bias_update_rate=$warm_rate" \
      "(load $(cut -d' ' -f1 /proc/loadavg))"
    MESHRUN_EXPERT_LOAD=$tmp/warm.load build/meshrun local --hosts 1 --devices-per-host 1 --config $cfg \
      $wide per_device_batch_size=8 openblas_threads=2 steps=$warm_steps routed_bias_update_rate=$warm_rate \
      --checkpoint-dir "$ckpt" >$tmp/log 2>&1 || { cat $tmp/log; exit 1; }
    tail -1 $tmp/log
    python3 bench/expert_load.py $tmp/warm.load 4 $((warm_steps / 6))
  fi
fi
for r in $(seq "$rounds"); do
  for v in $variants; do
    keys=$tiny; [ $v != tiny ] && keys=$wide; [ $v = widebal ] && keys="$wide $balanced"
    [ $v = wideckpt ] && keys="$wide load_parameters_path=$ckpt learning_rate=0.0003"
    run $v off $keys use_batch_split_schedule=false batch_split_factor=$base_factor
    run $v on $keys use_batch_split_schedule=true batch_split_factor=2
  done
done
echo "load average at end: $(cat /proc/loadavg)"
python3 - $tmp/rows <<'EOF'
import sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    v, s, *kv = line.split()
    rows.setdefault((v, s), []).append({k: float(x) for k, x in (p.split('=') for p in kv)})
cols = ['step_s', 'moe_ms', 'a2a_ms', 'exposed_ms', 'late_ms', 'hidden', 'xfer_ms', 'hidden_xfer', 'beside',
        'counts_ms', 'load_dev', 'cpu_s', 'dev_s', 'comm_s', 'util', 'load']
print('%-8s %-8s' % ('model', 'schedule') + ''.join('%12s' % c for c in cols) + '   (medians of %d rounds)'
      % len(next(iter(rows.values()))))
med = {}
order = ['tiny', 'wide', 'widebal', 'wideckpt', 'wide2x1']
for (v, s), rs in sorted(rows.items(), key=lambda x: (order.index(x[0][0]), x[0][1] != 'off')):
    med[v, s] = {c: st.median(r[c] for r in rs) for c in cols}
    print('%-8s %-8s' % (v, s) + ''.join('%12.3f' % med[v, s][c] for c in cols))
for v in [v for v in order if (v, 'on') in med]:
    a, b = med[v, 'off'], med[v, 'on']
    print('%s: on / off  step %.2f  MoE layers %.2f  all-to-all waited for %.2f  CPU %.2f; all-to-all '
          'hidden %.0f%% (of the transfer %.0f%%; beside compute %.0f%%); busiest device %.2fx the mean rows; '
          'cores busy %.0f%% off, %.0f%% on'
          % (v, b['step_s'] / a['step_s'], b['moe_ms'] / a['moe_ms'], b['exposed_ms'] / a['exposed_ms'],
             b['cpu_s'] / a['cpu_s'], 100 * b['hidden'], 100 * b['hidden_xfer'], 100 * b['beside'],
             b['load_dev'], 100 * a['util'], 100 * b['util']))
EOF
