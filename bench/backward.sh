#!/usr/bin/env bash
# bench/backward.sh [MESHRUN]: one layer's forward (F), full backward (B)
# and split backward (I, W) on one device, OpenBLAS on one thread, for
# llama-tiny, a 4x wider llama-tiny and deepseek3-tiny (dense and MoE
# layers): the zero-bubble schedules' F:I:W and what splitting costs
# against B, measured in the same rounds. Prints the load before each.
set -u
BIN=${1:-build/meshrun}
R=31
run() {
	echo "## $* (load $(cut -d' ' -f1-3 /proc/loadavg))"
	"$BIN" bench backward --rounds $R "$@" | grep -v '^#'
}
run --config configs/llama-tiny.yml
run --config configs/llama-tiny.yml base_emb_dim=512 base_mlp_dim=1376 base_num_query_heads=8 base_num_kv_heads=8 per_device_batch_size=4
run --config configs/deepseek3-tiny.yml
