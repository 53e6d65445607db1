#!/usr/bin/env bash
# Muon on a mesh, bit for bit against another build: seven meshes (fsdp=4,
# fsdp 2x2 over 2 hosts, deepseek fsdp 2 x expert 2, fsdp 2 x tensor 2,
# deepseek shard-exp-on-fsdp, data 2 x stage 2, data 2x2), 4 steps of
# opt_type=muon each, with this tree's build/meshrun and with OLD; prints
# per mesh "same" (every step's loss_hex, muon_ns_matrices and
# muon_bytes equal) or both lists. bench/losses.sh has no Muon on a mesh.
# usage: bash bench/muon_bits.sh OLD_MESHRUN
set -u
cd "$(dirname "$0")/.."
old=$1
make -s all
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cp build/meshrun $tmp/new; cp "$old" $tmp/old
L=configs/llama-tiny.yml; D=configs/deepseek-tiny.yml
meshes=(
  "--hosts 1 --devices-per-host 4 --config $L ici_data_parallelism=1 ici_fsdp_parallelism=4"
  "--hosts 2 --devices-per-host 2 --config $L dcn_fsdp_parallelism=2 ici_data_parallelism=1 ici_fsdp_parallelism=2"
  "--hosts 1 --devices-per-host 4 --config $D ici_data_parallelism=1 ici_fsdp_parallelism=2 ici_expert_parallelism=2"
  "--hosts 1 --devices-per-host 4 --config $L ici_data_parallelism=1 ici_fsdp_parallelism=2 ici_tensor_parallelism=2"
  "--hosts 1 --devices-per-host 4 --config $D ici_data_parallelism=1 ici_fsdp_parallelism=4 custom_mesh_and_rule=shard-exp-on-fsdp"
  "--hosts 1 --devices-per-host 4 --config $L ici_data_parallelism=2 ici_pipeline_parallelism=2"
  "--hosts 2 --devices-per-host 2 --config $L"
)
for i in "${!meshes[@]}"; do
  for b in new old; do
    # shellcheck disable=SC2086
    $tmp/$b local ${meshes[$i]} opt_type=muon learning_rate=0.01 steps=4 --metrics $tmp/$b.jsonl \
      >$tmp/$b.log 2>&1 || { echo "mesh $i: $b failed: $(tail -1 $tmp/$b.log)"; continue 2; }
    python3 -c "
import json
for l in open('$tmp/$b.jsonl'):
    o = json.loads(l); print(o['step'], o['loss_hex'], o.get('muon_ns_matrices'), o.get('muon_bytes'))" >$tmp/$b.hex
  done
  if cmp -s $tmp/new.hex $tmp/old.hex; then echo "same: ${meshes[$i]}"
  else echo "DIFFERS: ${meshes[$i]}"; paste $tmp/new.hex $tmp/old.hex; fi
done
