#!/usr/bin/env bash
# bench/losses.sh MESHRUN OUTDIR: the ten reference runs (10 steps each) a
# restructure must leave bit-identical; writes OUTDIR/<run>.hex, one
# "step loss_hex" line per step. Compare two builds with
#   cmp A/<run>.hex B/<run>.hex   (for each run)
# Run from the tree whose configs/ the binary knows.
set -u
BIN=$1; OUT=$2; mkdir -p "$OUT"
L=configs/llama-tiny.yml; D=configs/deepseek-tiny.yml
run() {
	name=$1; shift
	rm -f "$OUT/$name.jsonl"
	"$BIN" "$@" steps=10 --metrics "$OUT/$name.jsonl" >"$OUT/$name.log" 2>&1
	echo "$name: exit $?"
	python3 -c "
import json
for l in open('$OUT/$name.jsonl'):
    o = json.loads(l); print(o['step'], o['loss_hex'])" >"$OUT/$name.hex"
}
run train_llama train --config $L
run train_ds train --config $D
run train_ds_muon train --config $D opt_type=muon
run dp_fsdp local --hosts 2 --devices-per-host 2 --config $L per_device_batch_size=2 dcn_data_parallelism=2 ici_data_parallelism=1 ici_fsdp_parallelism=2
run fsdp_tp local --hosts 1 --devices-per-host 4 --config $L per_device_batch_size=2 ici_data_parallelism=1 ici_fsdp_parallelism=2 ici_tensor_parallelism=2
run ds_ep local --hosts 2 --devices-per-host 2 --config $D per_device_batch_size=2 dcn_data_parallelism=1 dcn_expert_parallelism=2
run ds_tp_ep local --hosts 1 --devices-per-host 4 --config $D per_device_batch_size=2 ici_data_parallelism=1 ici_tensor_parallelism=2 ici_expert_parallelism=2
run zero1 local --hosts 2 --config $L per_device_batch_size=4 shard_optimizer_over_data=true
run tt local --hosts 1 --devices-per-host 2 --config $L per_device_batch_size=4 ici_data_parallelism=1 ici_tensor_transpose_parallelism=2
# Muon on a mesh: each matrix orthogonalised by one owner, its blocks
# exchanged in the background (host/optim/muon.c)
run muon_fsdp_ep local --hosts 1 --devices-per-host 4 --config $D per_device_batch_size=2 ici_data_parallelism=1 ici_fsdp_parallelism=2 ici_expert_parallelism=2 opt_type=muon
