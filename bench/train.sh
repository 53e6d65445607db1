#!/usr/bin/env bash
# Single-device training speed on configs/llama-bench.yml next to PyTorch
# (Debian python3-torch, eager float32, same model and batch, same thread
# count for OpenMP and OpenBLAS) in one run. usage: bench/train.sh [STEPS]
set -eu
cd "$(dirname "$0")/.."
steps=${1:-6}
/usr/bin/python3 -c 'import torch' 2>/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch >/dev/null; }
make -s all
for th in 1 2; do
  t=$(/usr/bin/python3 bench/torch_llama.py --threads $th --steps "$steps" | tail -1)
  m=$(build/meshrun train --config configs/llama-bench.yml steps=$((steps + 1)) openblas_threads=$th |
      grep 'completed step' | tail -n +2 | awk -F'Tokens/s/device: ' '{split($2,a,","); s+=a[1]; n++} END {printf "%.1f", s/n}')
  mfu=$(build/meshrun train --config configs/llama-bench.yml steps=3 openblas_threads=$th |
      grep 'completed step: 2' | sed 's/.*MFU: \([0-9.]*%\).*/\1/')
  tt=$(echo "$t" | sed 's/.*tokens_per_s=\([0-9.]*\).*/\1/')
  echo "threads=$th meshrun_tokens_per_s=$m torch_tokens_per_s=$tt ratio=$(awk "BEGIN{printf \"%.2f\", $m/$tt}") meshrun_mfu=$mfu"
done
