#!/usr/bin/env bash
# One llama-bench layer's causal attention, forward and backward, with
# kernels/nn.c built at each ATT_BLK of BLKS (rows per sgemm block),
# ROUNDS alternating rounds, best of 10 calls each; then whether each
# block size's outputs are bit-identical to 64's (the built-in size).
# THREADS OpenBLAS threads (with 2, one core busy elsewhere doubles
# attention's time: run it idle).
# usage: [BLKS="32 64 128"] [THREADS=1] [ROUNDS=3] bench/attn_blocks.sh
set -eu
cd "$(dirname "$0")/.."
blks=${BLKS:-32 64 128}; th=${THREADS:-1}; rounds=${ROUNDS:-3}
make -s build/libmeshrun.a
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cf="-std=c11 -D_GNU_SOURCE -O2 -fno-math-errno -I. -Ibuild -I/usr/include/x86_64-linux-gnu/openblas-pthread/"
lf="build/libmeshrun.a -L/usr/lib/x86_64-linux-gnu/openblas-pthread/ -lopenblas -lm -pthread"
for b in 64 $blks; do
	cc $cf -DATT_BLK="$b" -c kernels/nn.c -o "$tmp/nn$b.o"
	cc $cf bench/attn_blocks.c "$tmp/nn$b.o" $lf -o "$tmp/ab$b"
done
echo "# load $(cat /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
	for b in $blks; do
		echo "round $r ATT_BLK $b threads $th: $(OPENBLAS_NUM_THREADS=$th "$tmp/ab$b" 10 "$tmp/o$b" "$th")"
	done
done
echo "# load $(cat /proc/loadavg)"
"$tmp/ab64" 1 "$tmp/ref" 1 >/dev/null
for b in $blks; do
	cmp -s "$tmp/ref" "$tmp/o$b" && echo "ATT_BLK $b: outputs bit-identical to 64's" ||
		echo "ATT_BLK $b: outputs differ from 64's"
done
