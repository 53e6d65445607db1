#!/usr/bin/env bash
# bench/load.sh [ROUNDS]: loading a Hugging Face checkpoint of more than 1
# GiB (host/ckpt/hf_load.c through `meshrun bench load`: each host's
# devices' shards read into parameter buffers, no trainer around them),
# next to `cat` reading the same files, in one run (each load line is
# followed by its ratios to that round's `cat`: wall time and CPU time):
#   cat          cat of every shard to /dev/null (the files were read once
#                before, so both read from the page cache)
#   1 thread     one host, one device, read on one thread
#                (MESHRUN_LOAD_THREADS=1): the same-run baseline
#   1 host       one host, one device: the whole model, on the threads
#                the loader takes (cores / agents on the machine)
#   huge pages   1 host with its parameters on transparent huge pages
#                (MESHRUN_HUGEPAGES=1)
#   2 hosts      dcn_fsdp_parallelism=2, both hosts at once: each reads its half
#                (MESHRUN_LOCAL_AGENTS=2 as `meshrun local` sets it, so the
#                two share the machine's cores as agents do)
#   2 x 2        2 hosts x 2 devices (fsdp over hosts, data inside): each
#                host reads its half once, into both devices' parameters
#   2 x 2 copy   2 x 2 with the host's devices loading one after another
#                (MESHRUN_BENCH_LOAD_COPY=1), so the second copies the
#                first one's blocks: the same-run baseline of loading them
#                together (a block both hold written into both from one read)
#   2 x 2 sse2   2 x 2 with BF16 widened by SSE2 (MESHRUN_LOAD_AVX512=0),
#                each device's destination in turn: the same-run baseline of
#                the AVX-512 widening into both at once (the default on a
#                CPU with AVX-512; the load line says which ran)
#   ... pread    1 host, 2 hosts and 2 x 2 again with MESHRUN_LOAD_MMAP=0:
#                the tensors pread through a bounce buffer (a column
#                block's rows one pread each) instead of copied or widened
#                straight out of read-only mappings of the shards (the
#                default): the same-run baseline of the mappings
# for a BF16 checkpoint (1.16 GB: Llama, hidden 2048, 10 layers, vocab
# 32000, 4 shards) and an F32 one (1.25 GB, 4 layers), made once by
# tests/hf_ref.py in $BENCH_LOAD_DIR (default /tmp). Prints one line per
# run and the load average; under it, the making of the parameters
# before the clock starts (util_big_alloc: wall, CPU, minor faults), the
# load's minor faults and the times it was preempted, and the ratios to
# that round's `cat` (a host of several: to `cat` of all the files, and
# to `cat`'s time scaled to the host's share of the bytes). Each run
# starts $BENCH_LOAD_SETTLE seconds (default 3) after the one before:
# the kernel hands memory freed by the last run (2.3 GB) back to the
# hypervisor 2 s after it was freed (free page reporting), on a core the
# next run would be loading on. Run from the repository root after `make`.
set -eu
ROUNDS=${1:-3}
BIN=${MESHRUN:-build/meshrun}
TOP=${BENCH_LOAD_DIR:-/tmp}
PY=/usr/bin/python3
SETTLE=${BENCH_LOAD_SETTLE:-3}
SHAPE="--hidden 2048 --heads 16 --kv_heads 4 --inter 5632 --vocab 32000 --shards 4"

make_ckpt() {  # DIR DTYPE LAYERS
	[ -f "$1/model.safetensors.index.json" ] && return
	echo "making $1 ($2, $3 layers) ..."
	$PY tests/hf_ref.py make "$1" $SHAPE --dtype "$2" --layers "$3" >/dev/null
}

# cat's wall and CPU (user + system) seconds: "WALL CPU"
cat_times() { /usr/bin/time -f "%e %U %S" cat "$@" 2>&1 >/dev/null | tail -1 | awk '{ printf "%.2f %.2f", $1, $2 + $3 }'; }

one() {  # DIR LABEL ARGS...: every host of the mesh at once, one line each
	local dir=$1 label=$2 hosts=$3 dph=$4; shift 4
	local pids=() outs=()
	sleep "$SETTLE"
	for ((h = 0; h < hosts; h++)); do
		outs[h]=$(mktemp)
		MESHRUN_LOCAL_AGENTS=$hosts OPENBLAS_NUM_THREADS=1 "$BIN" bench load --hosts "$hosts" --host-id "$h" --devices-per-host "$dph" \
			load_parameters_path="$dir" "$@" >"${outs[h]}" &
		pids[h]=$!
	done
	for ((h = 0; h < hosts; h++)); do
		wait "${pids[h]}"
		printf '%-13s %s\n' "$label" "$(cut -d';' -f1 "${outs[h]}" | sed 's/, parameters.*//')"
		sed -n 's/.*; parameters \([0-9]*\) MB made before in \([0-9.]*\) s (\([^)]*\)).*/            made first: \1 MB of parameters in \2 s (\3)/p' "${outs[h]}"
		# against cat in the same round: wall / cat's wall, CPU / cat's CPU;
		# with several hosts also against cat's times scaled to this host's
		# share of the checkpoint's bytes
		sed -n 's/.*: load \([0-9.]*\) s .*), \([0-9.]*\) s CPU.*load: read \([0-9]*\) bytes.*/\1 \2 \3/p' "${outs[h]}" |
			awk -v w="$CAT_WALL" -v c="$CAT_CPU" -v all="$bytes" -v hosts="$hosts" '{
				printf "            vs cat: %.2fx wall, %.2fx CPU", $1 / w, (c > 0 ? $2 / c : 0)
				f = $3 / all
				if (hosts > 1)
					printf "; vs cat x its share (%.3f): %.2fx wall, %.2fx CPU", f, $1 / (w * f), (c > 0 ? $2 / (c * f) : 0)
				printf "\n" }'
		sed -n 's/.*load: read \([0-9]*\) bytes.*(index and headers \([0-9]*\), tensors \([0-9]*\) of the checkpoint.s \([0-9]*\)).*/            bytes read \1 (headers \2, tensors \3 of \4)/p' "${outs[h]}"
		rm -f "${outs[h]}"
	done
}

for spec in "bf16 BF16 10" "f32 F32 4"; do
	set -- $spec
	dir=$TOP/meshrun-bench-load-$1
	make_ckpt "$dir" "$2" "$3"
	bytes=$(du -cb "$dir"/*.safetensors | tail -1 | cut -f1)
	echo "== $2 checkpoint: $bytes bytes in $(ls "$dir"/*.safetensors | wc -l) files ($dir)"
	cat "$dir"/*.safetensors >/dev/null
	for ((r = 1; r <= ROUNDS; r++)); do
		echo "-- round $r, load $(cut -d' ' -f1-3 /proc/loadavg)"
		read -r CAT_WALL CAT_CPU <<<"$(cat_times "$dir"/*.safetensors)"
		echo "cat         $CAT_WALL s ($CAT_CPU s CPU) for $bytes bytes"
		MESHRUN_LOAD_THREADS=1 one "$dir" "1 thread" 1 1
		one "$dir" "1 host" 1 1
		MESHRUN_HUGEPAGES=1 one "$dir" "huge pages" 1 1
		one "$dir" "2 hosts" 2 1 dcn_data_parallelism=1 dcn_fsdp_parallelism=2
		one "$dir" "2 x 2" 2 2 dcn_data_parallelism=1 dcn_fsdp_parallelism=2 ici_data_parallelism=2
		MESHRUN_BENCH_LOAD_COPY=1 one "$dir" "2 x 2 copy" 2 2 dcn_data_parallelism=1 dcn_fsdp_parallelism=2 \
			ici_data_parallelism=2
		MESHRUN_LOAD_AVX512=0 one "$dir" "2 x 2 sse2" 2 2 dcn_data_parallelism=1 dcn_fsdp_parallelism=2 \
			ici_data_parallelism=2
		MESHRUN_LOAD_MMAP=0 one "$dir" "1 host pread" 1 1
		MESHRUN_LOAD_MMAP=0 one "$dir" "2 hosts pread" 2 1 dcn_data_parallelism=1 dcn_fsdp_parallelism=2
		MESHRUN_LOAD_MMAP=0 one "$dir" "2 x 2 pread" 2 2 dcn_data_parallelism=1 dcn_fsdp_parallelism=2 \
			ici_data_parallelism=2
	done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
