#!/usr/bin/env bash
# llama-bench's projections as separate products against one fused product
# (q,k,v: N 3 x 512; gate,up: N 2 x 1408), forward, weight and input
# gradients, best of 7 (bench/fused_proj.c); what fusing the parameters
# would save a layer, before any change of layout.
# usage: [THREADS=1] bench/fused_proj.sh
set -eu
cd "$(dirname "$0")/.."
make -s build/libmeshrun.a
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cc -std=c11 -D_GNU_SOURCE -O2 -I. -Ibuild -I/usr/include/x86_64-linux-gnu/openblas-pthread/ \
	bench/fused_proj.c build/libmeshrun.a -L/usr/lib/x86_64-linux-gnu/openblas-pthread/ \
	-lopenblas -lm -pthread -o "$tmp/fp"
echo "# load $(cat /proc/loadavg)"
OPENBLAS_NUM_THREADS=${THREADS:-1} "$tmp/fp" "${THREADS:-1}"
echo "# load $(cat /proc/loadavg)"
