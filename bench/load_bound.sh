#!/usr/bin/env bash
# bench/load_bound.sh [ROUNDS]: the floor under loading BF16 on 2 x 2
# (bench/load.sh's "2 x 2" row): what this machine takes to write a host's
# two devices' float32 parameters (2 x 1.16 GB = 2.33 GB, widened from its
# 0.58 GB half of the checkpoint) with no loader around it, both hosts at
# once as in the row, against `cat` of the whole BF16 checkpoint (the
# goal's yardstick) in the same round. bench/load_bound.c is compiled here;
# the source half is anonymous memory filled before the clock; each
# process prints wall and CPU seconds (a line per host):
#   stream       streaming stores of zeros into the 2.33 GB (no source):
#                the write floor
#   dual512      AVX-512 widening, both destinations from one load (the
#                loader's default on a CPU with AVX-512)
#   widen        SSE2 widening, 64 Ki values into one destination then the
#                other (the loader with MESHRUN_LOAD_AVX512=0)
#   rows1024f    SSE2 widening in rows of 1024 values with a store fence
#                after each row (the loader before load4: a fence per row)
#   memset       plain stores (no streaming) into the same memory
#   memset fresh plain stores into memory not yet faulted in (the first
#                touch in the clock: what a load into fresh memory pays)
# Ratios: wall over cat's wall, CPU over cat's CPU, of the same round. Needs the BF16
# checkpoint of bench/load.sh ($BENCH_LOAD_DIR/meshrun-bench-load-bf16;
# made by running bench/load.sh once). Run from the repository root.
set -eu
ROUNDS=${1:-3}
TOP=${BENCH_LOAD_DIR:-/tmp}
dir=$TOP/meshrun-bench-load-bf16
[ -f "$dir/model.safetensors.index.json" ] || { echo "bench/load_bound.sh: no checkpoint in $dir: run bench/load.sh first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -o "$tmp/load_bound" bench/load_bound.c
bytes=$(du -cb "$dir"/*.safetensors | tail -1 | cut -f1)
half=$((bytes / 2))
echo "== BF16 checkpoint $bytes bytes; a host's half $half bytes widened into 2 destinations"
cat "$dir"/*.safetensors >/dev/null
for ((r = 1; r <= ROUNDS; r++)); do
	echo "-- round $r, load $(cut -d' ' -f1-3 /proc/loadavg)"
	read -r cw cc <<<"$(/usr/bin/time -f "%e %U %S" cat "$dir"/*.safetensors 2>&1 >/dev/null | tail -1 |
		awk '{ printf "%.2f %.2f", $1, $2 + $3 }')"
	echo "cat            $cw s wall, $cc s CPU"
	for spec in "stream prefaulted" "dual512 prefaulted" "widen prefaulted" "rows1024f prefaulted" \
		"memset prefaulted" "memset fresh"; do
		set -- $spec
		sleep 2  # the last run's freed memory handed back first (bench/load.sh's settle)
		"$tmp/load_bound" "$1" "$half" 2 "$2" >"$tmp/h0" &
		p0=$!
		"$tmp/load_bound" "$1" "$half" 2 "$2" >"$tmp/h1"
		wait $p0
		for h in 0 1; do
			awk -v c="$cw" -v cc="$cc" -v h=$h '{ printf "%-14s host %d: %s s wall, %s s CPU: vs cat %.2fx wall, %.2fx CPU\n",
				$1 ($2 == "fresh:" ? " fresh" : ""), h, $3, $6, $3 / c, (cc > 0 ? $6 / cc : 0) }' "$tmp/h$h"
		done
	done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
