#!/usr/bin/env bash
# The executor and the transport against the bubble formulas, with
# compute that takes time and no CPU (issue 21; docs/pipeline.md,
# "Synthetic compute"): every compute action of the step's table sleeps
# its time (pipeline_compute=sleep, pipeline_sleep_ms), everything else
# is real (agents, loopback TLS links, sends and receives at llama-bench's
# message sizes, the executor's posting, probing and waits). So each
# stage has, in effect, a processor of its own that runs each action in
# its fixed time: what the formulas assume.
#
# Runs S = 2 (2 hosts x 1 device) and S = 4 (4 hosts x 1 device), M in
# {S, 2S, 4S}, gpipe, 1f1b, interleaved_1f1b (v = 2), zb_h1 and zbv, at
# F = I = W = $MS_F ms (default 20) per microbatch through a stage's
# layers: the two-chunk schedules (interleaved_1f1b, zbv) sleep half of
# it per chunk action, so every schedule does the same work a step. Then
# 1f1b and zb_h1 at M = 2S with F:I:W = $RATIO (default 20,20,10: W
# cheaper, ZB-H1's formula ratio (F+I-W)/(F+I+W) = 0.6). llama-bench with
# 8 layers, sequence 128, a 16-row batch, recompute off. Per run and mesh
# (bench/sched_sleep.py, steps >= 1, medians): the step's wall (the
# longest device's forward+backward span), the compute it slept (the
# busiest device), each device's idle (wall minus its sleeps), the
# bubble share against its formula, the formula's and the unit-slot
# simulator's (`meshrun schedule --costs`) longest stage span at these
# costs, the same simulator with every message taking one message's time
# for its size (bench/sched_hop.c: from its send's start to the woken
# receiver, `meshrun bench link --pingpong`'s one way, of which the send
# call's time keeps the sending stage busy; measured at the start of each
# mesh and variant, 16/M rows x 128 tokens x 512 floats), the same with
# the older hop (a stream of messages both ways, `bench link`, nothing on
# the sender: "hop(stream)"), and ZB-H1's idle over 1F1B's; the load
# average beside each run.
# VARIANTS: runs of the same binary with extra key=value's, alternating
# run by run ("NAME|k=v+k=v" words, + between a variant's key=value's;
# default "base|"), e.g.
#   VARIANTS="off|p2p_handoff_bytes=0 hand|p2p_handoff_bytes=262144"
# A MESHRUN_*=V word in a variant goes to the runs' environment, not
# their command line (e.g. "slice|MESHRUN_STREAM_SLICE_US=100").
# pipeline_interleave_group=X in a variant goes to the interleaved_1f1b
# runs only, X a number, M (the run's microbatches) or next (the least
# group above S whose last group is 0 or above S, else S), e.g.
#   VARIANTS="base| next|pipeline_interleave_group=next gM|pipeline_interleave_group=M"
# KEEP=DIR keeps the runs' traces, logs and summaries there
# (bench/pipe_crit.py reads the traces).
# usage: [STEPS=6] [ROUNDS=1] [MESHES="2x1 4x1"] [MULTS="1 2 4"] [SCHEDS=...] [MS_F=20] [RATIO=20,20,10] [VARIANTS=...] [KEEP=DIR] bench/sched_sleep.sh
#   (BIN: a meshrun binary to run, else build/meshrun after `make`;
#   RATIO= (empty) skips the unequal-ratio runs)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-6}
rounds=${ROUNDS:-1}
meshes=${MESHES:-"2x1 4x1"}
mults=${MULTS:-"1 2 4"}    # M = S times each of these
scheds=${SCHEDS:-"gpipe 1f1b interleaved_1f1b zb_h1 zbv"}
f=${MS_F:-20}
ratio=${RATIO-20,20,10}
variants=${VARIANTS:-"base|"}
if [ -z "${BIN:-}" ]; then make -s all; fi
tmp=$(mktemp -d /tmp/sched-sleep.XXXXXX)
bin=$tmp/meshrun
cp "${BIN:-build/meshrun}" "$bin"
trap 'if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp -r "$tmp"/. "$KEEP"/; fi; rm -rf "$tmp"' EXIT
libs="$(pkg-config --libs openblas libcjson yaml-0.1 libprotobuf-c libevent_core libevent_pthreads libssl libcrypto) -lm -pthread"
cc -std=c11 -D_GNU_SOURCE -O2 -I. -Ibuild $(pkg-config --cflags openblas libcjson) bench/sched_hop.c \
  build/libmeshrun.a $libs -o $tmp/sched_hop
model_kv="base_num_decoder_layers=8 max_target_length=128 ici_data_parallelism=1 dcn_data_parallelism=1"
model_kv="$model_kv pipeline_recompute=false"
model="--config configs/llama-bench.yml $model_kv"
t0=$(date +%s)
echo "# sched_sleep: steps=$steps rounds=$rounds F=I=W=$f ms, ratio $ratio; load $(cut -d' ' -f1-3 /proc/loadavg)"

# the variant's MESHRUN_*=V words, for env(1)
env_kv() {
  local kv out=""
  for kv in $1; do
    case $kv in MESHRUN_*=*) out="$out $kv" ;; esac
  done
  echo "$out"
}

# the variant's key=value's for a run of schedule $3 (S $1, M $2):
# pipeline_interleave_group for interleaved_1f1b only, M and next resolved
group_kv() {
  local S=$1 M=$2 s=$3 kv out="" g
  for kv in $4; do
    case $kv in
      MESHRUN_*=*) continue ;;
      pipeline_interleave_group=*)
        [ "$s" = interleaved_1f1b ] || continue
        g=${kv#*=}
        if [ "$g" = M ]; then g=$M; fi
        if [ "$g" = next ]; then
          g=$S
          for ((k = S + 1; k <= M; k++)); do
            if [ $((M % k)) -eq 0 ] || [ $((M % k)) -gt $S ]; then g=$k; break; fi
          done
        fi
        kv=pipeline_interleave_group=$g ;;
    esac
    out="$out $kv"
  done
  echo "$out"
}

# run NAME S M SCHED COSTS(F,I,W ms per microbatch through the stage)
# VARIANT_NAME "K=V ...": one `local` run and the simulator at the same
# costs; a line for the summary
run() {
  local name=$1 S=$2 M=$3 s=$4 costs=$5 vn=$6 vkv v=1 l
  vkv=$(group_kv $2 $3 $4 "${7//+/ }")
  case $s in interleaved_1f1b|zbv) v=2 ;; esac
  l=$((8 / S / v))
  # per action: a chunk of 8/(S v) layers does 1/v of a stage's work
  local c
  c=$(python3 -c 'import sys; v = int(sys.argv[2]); print(",".join("%g" % (float(x) / v) for x in sys.argv[1].split(",")))' "$costs" $v)
  local kv="dcn_pipeline_parallelism=$S per_device_batch_size=$((16 / S)) pipeline_schedule=$s"
  kv="$kv num_pipeline_microbatches=$M num_layers_per_pipeline_stage=$l"
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  "$bin" schedule $model $kv $vkv --costs "${c//,/:}" >$tmp/$name.sched 2>&1 || { cat $tmp/$name.sched >&2; exit 1; }
  # the simulator again, each message one message's time for its size
  # (one way, the sender's send call part of it), and the stream's time
  local bytes=$((4194304 / M)) hop snd shop
  hop=$(awk -v b=$bytes '$1 == b {printf "%.3f", $2 / 1000}' $tmp/pp-$vn)
  snd=$(awk -v b=$bytes '$1 == "#" && $2 == "send" && $3 == b ":" {printf "%.3f", $4 / 1000}' $tmp/pp-$vn)
  shop=$(awk -v b=$bytes '$1 == b {printf "%.3f", $2 / 1000}' $tmp/link)
  $tmp/sched_hop configs/llama-bench.yml $S ${c//,/ } $hop $snd $model_kv $kv $vkv >$tmp/$name.hop
  $tmp/sched_hop configs/llama-bench.yml $S ${c//,/ } $shop 0 $model_kv $kv $vkv >$tmp/$name.shop
  env $(env_kv "${7//+/ }") "$bin" local --hosts $S --devices-per-host 1 $model $kv $vkv steps=$steps pipeline_compute=sleep \
    pipeline_sleep_ms=$c --trace $tmp/$name.json --metrics $tmp/$name.jsonl --quiet \
    >$tmp/$name.log 2>&1 || { cat $tmp/$name.log >&2; echo "sched_sleep: $name failed" >&2; exit 1; }
  echo "$name $S $M $s $v $c $load $(cut -d' ' -f1 /proc/loadavg) $hop $snd $(tr ' ' , <$tmp/$name.hop)" \
    "$shop $(tr ' ' , <$tmp/$name.shop)" >>$tmp/runs
}

for round in $(seq $rounds); do
  for mesh in $meshes; do
    case $mesh in
      2x1) S=2 ;;
      4x1) S=4 ;;
      *) echo "sched_sleep.sh: mesh $mesh: not 2x1 or 4x1" >&2; exit 1 ;;
    esac
    # the link's time a message of each size (loopback TLS, both ways)
    sizes=4194304,2097152,1048576,524288,262144
    "$bin" bench link --hosts 2 --sizes $sizes --iters 30 >$tmp/link 2>&1 || { cat $tmp/link >&2; exit 1; }
    echo "# $mesh link ms a message streaming (4M/2M/1M/512K/256K): $(awk '$1 ~ /^[0-9]+$/ {printf "%.2f ", $2 / 1000}' $tmp/link); load $(cut -d' ' -f1-3 /proc/loadavg)"
    for var in $variants; do
      vn=${var%%|*}
      # one message at a time: one way, and the send call's part of it
      env $(env_kv "$(tr + ' ' <<<"${var#*|}")") "$bin" bench link --hosts 2 --sizes $sizes --iters 30 --pingpong $(group_kv 1 1 none "$(tr + ' ' <<<"${var#*|}")") >$tmp/pp-$vn 2>&1 ||
        { cat $tmp/pp-$vn >&2; exit 1; }
      echo "# $mesh $vn one way ms (4M/2M/1M/512K/256K): $(awk '$1 ~ /^[0-9]+$/ {printf "%.2f ", $2 / 1000}' $tmp/pp-$vn)" \
        "send call ms: $(awk '$2 == "send" {printf "%.3f ", $4 / 1000}' $tmp/pp-$vn); load $(cut -d' ' -f1-3 /proc/loadavg)"
    done
    for mult in $mults; do
      M=$((mult * S))
      for s in $scheds; do
        for var in $variants; do
          run "r$round-${var%%|*}-$mesh-$M-$s-eq" $S $M $s "$f,$f,$f" "${var%%|*}" "${var#*|}"
        done
      done
    done
    if [ -n "$ratio" ]; then
      for s in 1f1b zb_h1; do
        for var in $variants; do
          run "r$round-${var%%|*}-$mesh-$((2 * S))-$s-ratio" $S $((2 * S)) $s "$ratio" "${var%%|*}" "${var#*|}"
        done
      done
    fi
  done
done
python3 bench/sched_sleep.py "$tmp" <$tmp/runs
echo
echo "# elapsed $(( $(date +%s) - t0 )) s; load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
