#!/usr/bin/env bash
# bench/ns_batch.sh [REPS]: Muon's same-shape batching on this CPU
# (bench/ns_batch.c): k Newton-Schulz runs of one shape separately (what
# host/optim/muon.c runs), step-major (newton_schulz5_batch) and dealt
# over threads, OpenBLAS at 1 and at 2 threads; wall and CPU medians,
# ratios to separate in the same run, and whether the bits match. Builds
# build/ns_batch against build/libmeshrun.a (run `make` first). Prints the
# load before each run.
set -eu
REPS=${1:-9}
cc -std=c11 -D_GNU_SOURCE -O2 -I. -Ibuild -pthread $(pkg-config --cflags openblas 2>/dev/null || echo -I/usr/include/x86_64-linux-gnu/openblas-pthread/) \
	-o build/ns_batch bench/ns_batch.c build/libmeshrun.a \
	$(pkg-config --libs openblas 2>/dev/null || echo -L/usr/lib/x86_64-linux-gnu/openblas-pthread/ -lopenblas) -lm -pthread
for t in 1 2; do
	echo "## threads $t (load $(cut -d' ' -f1-3 /proc/loadavg))"
	build/ns_batch "$t" "$REPS"
done
