#!/usr/bin/env bash
# Issue 20 with compute that costs no CPU: what a sharded step costs beyond
# one device's on the same per-device work, when every compute action of
# the step's table sleeps its time (pipeline_compute=sleep, docs/pipeline.md
# "Synthetic compute") and the collectives, buckets, FSDP window, ZeRO-1
# gathers, optimizer and transport are real. configs/llama-bench.yml (4
# layers, 8 rows a device), one OpenBLAS thread a device, agents on
# loopback TLS, --trace on every run (`local`, also for the single device).
# Runs, each with AdamW and Muon (learning_rate=0.001), for each sleep set:
#   one     single device (local --hosts 1): the baseline of its set and
#           optimizer, measured in the same round
#   dp      data=2 (2 hosts x 1)
#   zero1   ZeRO-1 data=2 (shard_optimizer_over_data=true)
#   fsdp22  fsdp 2x2 (dcn_fsdp=2 x ici_fsdp=2)
#   fsdp4   fsdp=4 (1 host x 4 devices)
#   fsdppp  fsdp=2 x stage=2 (dcn_fsdp=2, ici_pipeline=2), circular, one
#           layer a chunk (R = 2), M = 8 microbatches, no recompute, each
#           repeat's weights gathered one repeat ahead
#           (pipeline_fsdp_ag_per_repeat; without it, per microbatch): each
#           action is 1 layer of 16/8 = 2 rows, so its sleep is the
#           per-layer time x 2/8 and a device sleeps what the single device
#           sleeps (32 layer-rows); its ratio also holds the pipeline's
#           bubble, which no overlap can hide
#   fsdpppu the same per use (neither flag: gathered for every microbatch,
#           MaxText's default); fsdpppo the same with pipeline_fsdp_ag_once;
#           these two only when ONLY is given (bench/overlap_sleep.sh 4 1
#           '^fsdppp')
#   fsdppp_zbv   the fsdppp mesh and M with pipeline_schedule=zbv (two
#           chunks a stage in a V, one layer a chunk: the same actions of
#           1 layer x 2 rows as fsdppp, so the same sleeps, x 2/8),
#           ag_per_repeat; fsdppp_zbvu per use, fsdppp_zbvo ag_once (these
#           two only when ONLY is given, as fsdpppu)
#   fsdppp_zbva  fsdppp_zbv with pipeline_update_ahead=true (stage 0
#           updates before the step's global norm arrives; docs/
#           training-step.md, "Updating ahead"; compute that sleeps leaves
#           the gradients zero, so clipping never scales and every update
#           ahead stands)
#   fsdppp_zbh1  zb_h1 (one chunk of 2 layers a stage,
#           num_layers_per_pipeline_stage=2): an action is 2 layers x 2
#           rows, so its sleep is the per-layer time x 2 x 2/8
#   fsdppp_inter interleaved_1f1b, v = 2 (one layer a chunk, x 2/8)
#           Each: per device 8 microbatches x 2 chunk-layers x (F+I+W) at
#           2/8 of the single device's rows, i.e. its 4 layers x (F+I+W)
# Sleep sets (SETS, per-layer F,I,W ms of the single device's 8 rows; a
# step sleeps 4 layers x (F+I+W)): "80,80,80" (about 1 s a step) and
# "20,20,20" (4x shorter: communication is harder to hide).
# Each line: step s (mean of steps >= 1), ratio to the single device of its
# set and optimizer, comm_exposed_s (device 0, mean), tail_s (device 0:
# from the end of its forward+backward to the start of its optimizer span:
# the last buckets' sums and the norm; mean), opt_s (device 0's
# "optimizer" span, mean), xo: the ratio without the optimizer ((step -
# opt_s) over the single device's: what communication adds, the
# optimizer's own CPU, which varies with the load, taken out), the load
# average. msgs (clock-free): `messages` from --metrics, the sends host 0's
# devices posted a step (mean). bg_s: comm_background_s (device 0's
# communication thread's seconds running background collectives a step;
# near the step's time less its sleeps, that thread is the bottleneck and
# no reordering hides more). dcn_mb (clock-free): `dcn_bytes` from --metrics
# in MB, what host 0 moved over DCN a step (mean): with the link's rate
# (`meshrun bench link`) it bounds what communication can hide. peak_mb:
# host 0's peak memory (`peak_mem_mb`, the largest of the steps). f0_ms:
# device 0's waits for FSDP gathers ("all_gather" spans on its own track)
# from its step's start to the end of its first forward (F mb0 c0), ms a
# step (mean): what the next step's first gathers left exposed.
# OLD_MESHRUN=BIN: the same runs with BIN, interleaved (row name "NAME old").
# SETS, OPTS: the sleep sets and optimizers (default "adamw muon").
# VARIANTS: every run but the single device's once per variant, in the same
#   round ("NAME|k=v,k=v" words, rows "RUN NAME"; default one unnamed
#   variant), e.g. the two-level collectives against the flat ring:
#   VARIANTS="flat|coll_two_level=false two|coll_two_level=true" \
#     OPTS=adamw bench/overlap_sleep.sh 4 2 '^fsdp22$'
# ANCHOR=1: instead, each run but one (AdamW, 2 steps) with real compute
#   and with sleeps, and bench/overlap_anchor.py's lines (after which
#   compute action each collective was queued, step 1) diffed: "same"
#   when sleep mode keeps every hook where the model has it.
# usage: bench/overlap_sleep.sh [STEPS] [ROUNDS] [ONLY]
#   ONLY: an extended regex of the run names (one always runs), e.g.
#   bench/overlap_sleep.sh 5 1 '^(dp|zero1)$'
set -eu
cd "$(dirname "$0")/.."
steps=${1:-5}; rounds=${2:-1}; only=${3:-.}
sets=${SETS:-"80,80,80 20,20,20"}; opts=${OPTS:-"adamw muon"}; old=${OLD_MESHRUN:-}
variants=${VARIANTS:-"|"}
make -s all
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cp build/meshrun $tmp/meshrun; C=configs/llama-bench.yml
[ -z "$old" ] || { cp "$old" $tmp/old; old=$tmp/old; }
# stats METRICS TRACE: step_s exposed_s tail_s opt_s msgs bg_s dcn_mb peak_mb f0_ms (steps >= 1)
stats() { python3 - "$1" "$2" <<'PYEOF'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][1:]
e = [x for x in json.load(open(sys.argv[2]))['traceEvents'] if x.get('ph') == 'X' and x['pid'] == 0
     and x['tid'] == 0 and x['args'].get('step', 0) >= 1]
fb = {x['args']['step']: x['ts'] + x['dur'] for x in e if x['name'] == 'forward+backward'}
op = {x['args']['step']: x for x in e if x['name'] == 'optimizer'}
tail = [(op[s]['ts'] - fb[s]) * 1e-6 for s in fb if s in op]
st = {x['args']['step']: x['ts'] for x in e if x['name'] == 'step'}
f0 = {x['args']['step']: x['ts'] + x['dur'] for x in e if x['name'] == 'F mb0 c0'}
first = [sum(x['dur'] for x in e if x['name'].startswith('all_gather') and x['args'].get('step') == s
             and st[s] <= x['ts'] < f0[s]) * 1e-3 for s in st if s in f0]
m = lambda v: sum(v) / len(v) if v else float('nan')
print('%.4f %.4f %.4f %.4f %.1f %.4f %.1f %d %.1f' % (m([x['step_time_s'] for x in r]), m([x.get('comm_exposed_s', 0) for x in r]),
                                    m(tail), m([x['dur'] * 1e-6 for x in op.values()]),
                                    m([x.get('messages', 0) for x in r]), m([x.get('comm_background_s', 0) for x in r]),
                                    m([x.get('dcn_bytes', 0) * 1e-6 for x in r]),
                                    max([x.get('peak_mem_mb', 0) for x in r] or [0]), m(first) if first else 0))
PYEOF
}
# run NAME BIN SLEEPS ARGS...: one run; its stats in $tmp/NAME.st
run() {
  local name=$1 bin=$2 sl=$3; shift 3
  if ! $bin local "$@" --config $C steps=$steps openblas_threads=1 pipeline_compute=sleep \
      pipeline_sleep_ms=$sl --metrics $tmp/m.jsonl --trace $tmp/t.json >/dev/null 2>$tmp/err; then
    echo "refused: $(grep -v '^$' $tmp/err | tail -1)" >$tmp/$name.st; return 0
  fi
  stats $tmp/m.jsonl $tmp/t.json >$tmp/$name.st
}
row() { # NAME LABEL BASE_STATS
  python3 - "$2" "$3" "$(cat $tmp/$1.st)" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PYEOF'
import sys
label, base, st, load = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4]
if st.startswith('refused'):
    print('%-34s %s' % (label, st)); sys.exit()
s, x, t, o, n, g, d, p, f = map(float, st.split())
bs, bo = float(base[0]), float(base[3])
print('%-34s %7.3f %6.3f %9.4f %7.4f %7.4f %6.3f %6.1f %6.3f %6.1f %7d %6.1f  %s' % (label, s, s / bs, x, t, o,
                                                                                     (s - o) / (bs - bo), n, g, d, p, f,
                                                                                     load))
PYEOF
}
# scaled MS FACTOR: every value of "F,I,W" times FACTOR (whole ms)
scaled() { echo "$1" | awk -F, -v f="$2" '{for (i = 1; i <= NF; i++) printf "%s%d", (i > 1 ? "," : ""), $i * f}'; }
# fsdpppu and fsdpppo only when ONLY is given (not in the default set)
want() {
  case $1 in one) return 0 ;; fsdpppu|fsdpppo|fsdppp_zbvu|fsdppp_zbvo) [ "$only" != . ] || return 1 ;; esac
  echo "$1" | grep -Eq -- "$only"
}
if [ -n "${ANCHOR:-}" ]; then
  for n in dp zero1 fsdp22 fsdp4 fsdppp fsdppp_zbv; do
    want $n || continue
    for mode in model sleep; do
      case $n in
        dp) a="--hosts 2" ;;
        zero1) a="--hosts 2 shard_optimizer_over_data=true" ;;
        fsdp22) a="--hosts 2 --devices-per-host 2 ici_data_parallelism=1 dcn_data_parallelism=1
          dcn_fsdp_parallelism=2 ici_fsdp_parallelism=2" ;;
        fsdp4) a="--hosts 1 --devices-per-host 4 ici_data_parallelism=1 ici_fsdp_parallelism=4" ;;
        fsdppp) a="--hosts 2 --devices-per-host 2 ici_data_parallelism=1 ici_pipeline_parallelism=2
          dcn_data_parallelism=1 dcn_fsdp_parallelism=2 num_pipeline_microbatches=8
          pipeline_recompute=false pipeline_fsdp_ag_per_repeat=true" ;;
        fsdppp_zbv) a="--hosts 2 --devices-per-host 2 ici_data_parallelism=1 ici_pipeline_parallelism=2
          dcn_data_parallelism=1 dcn_fsdp_parallelism=2 num_pipeline_microbatches=8
          pipeline_recompute=false pipeline_schedule=zbv num_pipeline_repeats=2
          pipeline_fsdp_ag_per_repeat=true" ;;
      esac
      $tmp/meshrun local $a --config $C steps=2 openblas_threads=1 pipeline_compute=$mode \
        pipeline_sleep_ms=20,20,20 --trace $tmp/t.json >/dev/null 2>$tmp/err || { tail -1 $tmp/err; exit 1; }
      python3 bench/overlap_anchor.py $tmp/t.json >$tmp/$n.$mode.anc
    done
    if diff $tmp/$n.model.anc $tmp/$n.sleep.anc >$tmp/$n.diff; then
      echo "$n: same ($(wc -l <$tmp/$n.model.anc) collectives)"
    else echo "$n: differs"; cat $tmp/$n.diff; fi
  done
  exit 0
fi
t0=$(date +%s)
echo "meshrun $(git rev-parse --short HEAD 2>/dev/null), $steps steps, $rounds round(s), sets $sets," \
  "load $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-34s %7s %6s %9s %7s %7s %6s %6s %6s %6s %7s %6s  %s\n" run step_s ratio exposed_s tail_s opt_s xo msgs \
  bg_s dcn_mb peak_mb f0_ms load
for r in $(seq 1 "$rounds"); do
  for sl in $sets; do
    for o in $opts; do
      echo "-- round $r, sleep $sl ms a layer, $o"
      for b in new ${old:+old}; do
        bin=$tmp/meshrun; sfx=""; [ $b = old ] && bin=$old && sfx=" old"
        for n in one dp zero1 fsdp22 fsdp4 fsdppp fsdpppu fsdpppo fsdppp_zbv fsdppp_zbva fsdppp_zbvu fsdppp_zbvo \
          fsdppp_zbh1 fsdppp_inter; do
          want $n || continue
          for v in $variants; do
          vn=${v%%|*}; va=$(echo "${v#*|}" | tr , ' ')
          [ $n = one ] && [ "$v" != "${variants%% *}" ] && continue
          [ $n = one ] && vn= && va=
          x="opt_type=$o learning_rate=0.001 $va"
          pp="--hosts 2 --devices-per-host 2 $x ici_data_parallelism=1 ici_pipeline_parallelism=2
            dcn_data_parallelism=1 dcn_fsdp_parallelism=2 num_pipeline_microbatches=8 pipeline_recompute=false"
          case $n in
            one) run $n$b $bin $sl --hosts 1 $x ;;
            dp) run $n$b $bin $sl --hosts 2 $x ;;
            zero1) run $n$b $bin $sl --hosts 2 $x shard_optimizer_over_data=true ;;
            fsdp22) run $n$b $bin $sl --hosts 2 --devices-per-host 2 $x ici_data_parallelism=1 \
              dcn_data_parallelism=1 dcn_fsdp_parallelism=2 ici_fsdp_parallelism=2 ;;
            fsdp4) run $n$b $bin $sl --hosts 1 --devices-per-host 4 $x ici_data_parallelism=1 \
              ici_fsdp_parallelism=4 ;;
            fsdppp) run $n$b $bin "$(scaled $sl 0.25)" --hosts 2 --devices-per-host 2 $x \
              ici_data_parallelism=1 ici_pipeline_parallelism=2 dcn_data_parallelism=1 \
              dcn_fsdp_parallelism=2 num_pipeline_microbatches=8 pipeline_recompute=false \
              pipeline_fsdp_ag_per_repeat=true ;;
            fsdpppu) run $n$b $bin "$(scaled $sl 0.25)" --hosts 2 --devices-per-host 2 $x \
              ici_data_parallelism=1 ici_pipeline_parallelism=2 dcn_data_parallelism=1 \
              dcn_fsdp_parallelism=2 num_pipeline_microbatches=8 pipeline_recompute=false ;;
            fsdpppo) run $n$b $bin "$(scaled $sl 0.25)" --hosts 2 --devices-per-host 2 $x \
              ici_data_parallelism=1 ici_pipeline_parallelism=2 dcn_data_parallelism=1 \
              dcn_fsdp_parallelism=2 num_pipeline_microbatches=8 pipeline_recompute=false \
              pipeline_fsdp_ag_once=true ;;
            fsdppp_zbv) run $n$b $bin "$(scaled $sl 0.25)" $pp pipeline_schedule=zbv num_pipeline_repeats=2 \
              pipeline_fsdp_ag_per_repeat=true ;;
            fsdppp_zbva) run $n$b $bin "$(scaled $sl 0.25)" $pp pipeline_schedule=zbv num_pipeline_repeats=2 \
              pipeline_fsdp_ag_per_repeat=true pipeline_update_ahead=true ;;
            fsdppp_zbvu) run $n$b $bin "$(scaled $sl 0.25)" $pp pipeline_schedule=zbv num_pipeline_repeats=2 ;;
            fsdppp_zbvo) run $n$b $bin "$(scaled $sl 0.25)" $pp pipeline_schedule=zbv num_pipeline_repeats=2 \
              pipeline_fsdp_ag_once=true ;;
            fsdppp_zbh1) run $n$b $bin "$(scaled $sl 0.5)" $pp pipeline_schedule=zb_h1 num_pipeline_repeats=1 \
              num_layers_per_pipeline_stage=2 pipeline_fsdp_ag_per_repeat=true ;;
            fsdppp_inter) run $n$b $bin "$(scaled $sl 0.25)" $pp pipeline_schedule=interleaved_1f1b \
              num_pipeline_repeats=2 pipeline_fsdp_ag_per_repeat=true ;;
          esac
          [ $n = one ] && base=$(cat $tmp/one$b.st)
          row $n$b "$n$sfx${vn:+ $vn}" "$base"
          done
        done
      done
    done
  done
done
echo "took $(( $(date +%s) - t0 )) s, load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
