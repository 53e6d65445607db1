#!/usr/bin/env bash
# bench/pipe_bubble.sh [STEPS]: the pipeline bubble of S=2 on 1 host x 2
# devices (llama-tiny, 32 rows a step, 2 layers a stage, layers 4, 8 or 16 so that R is 1, 2 or 4), measured from
# --trace by bench/pipe_bubble.py, for M in {2,4,8}, R in {1,2,4}, d in {1,2}.
set -eu
cd "$(dirname "$0")/.."
steps=${1:-4}
out=$(mktemp -d "${TMPDIR:-/tmp}/meshrun-bubble.XXXXXX")
trap 'rm -rf "$out"' EXIT
for D in 1 2; do
  for R in 1 2 4; do
    for M in 2 4 8; do
      [ "$D" = 2 ] && [ "$M" -lt 4 ] && continue   # the delay needs M >= 2S
      delay=false; [ "$D" = 2 ] && delay=true
      build/meshrun local --hosts 1 --devices-per-host 2 --config configs/llama-tiny.yml \
        ici_data_parallelism=1 ici_pipeline_parallelism=2 per_device_batch_size=16 \
        base_num_decoder_layers=$((2 * R * 2)) num_layers_per_pipeline_stage=2 \
        num_pipeline_microbatches=$M pipeline_delay_activation_forwarding=$delay \
        steps="$steps" --trace "$out/t.json" >"$out/log" 2>&1 || { cat "$out/log"; exit 1; }
      bench/pipe_bubble.py "$out/t.json" 2 "$M" "$R" "$D"
    done
  done
done
