#!/usr/bin/env bash
# bench/pipe_losses.sh MESHRUN OUTDIR: five pipeline runs (6 steps each) a
# restructure of the pipeline executor must leave bit-identical, beside
# bench/losses.sh's ten: circular (4 stages, 2 repeats), 1f1b over two
# hosts, interleaved 1F1B, zbv with fsdp=2, and DeepSeek-tiny on 1f1b.
# Writes OUTDIR/<run>.hex, one "step loss_hex" line per step; compare two
# builds with cmp, as for bench/losses.sh. Run from the tree whose
# configs/ the binary knows.
set -u
BIN=$1; OUT=$2; mkdir -p "$OUT"
L=configs/llama-tiny.yml; D=configs/deepseek-tiny.yml
run() {
	name=$1; shift
	"$BIN" "$@" steps=6 --metrics "$OUT/$name.jsonl" >"$OUT/$name.log" 2>&1; echo "$name: exit $?"
	python3 -c "
import json
for l in open('$OUT/$name.jsonl'):
    o=json.loads(l); print(o['step'], o['loss_hex'])" > "$OUT/$name.hex"
}
run circular local --hosts 1 --devices-per-host 4 --config $L ici_data_parallelism=1 ici_pipeline_parallelism=4 num_pipeline_microbatches=8 num_pipeline_repeats=2 base_num_decoder_layers=8
run f1b local --hosts 2 --devices-per-host 1 --config $L dcn_data_parallelism=1 dcn_pipeline_parallelism=2 num_pipeline_microbatches=4 pipeline_schedule=1f1b
run inter local --hosts 1 --devices-per-host 2 --config $L ici_data_parallelism=1 ici_pipeline_parallelism=2 num_pipeline_microbatches=4 pipeline_schedule=interleaved_1f1b num_pipeline_repeats=2 base_num_decoder_layers=4
run zbv_fsdp local --hosts 1 --devices-per-host 4 --config $L ici_data_parallelism=1 ici_pipeline_parallelism=2 ici_fsdp_parallelism=2 num_pipeline_microbatches=8 pipeline_schedule=zbv base_num_decoder_layers=4 num_pipeline_repeats=2
run ds_1f1b local --hosts 1 --devices-per-host 2 --config $D max_target_length=32 ici_data_parallelism=1 ici_pipeline_parallelism=2 num_pipeline_microbatches=4 pipeline_schedule=1f1b
