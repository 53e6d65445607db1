#!/usr/bin/env bash
# Where one device's llama-bench step spends its sgemm time, by product
# shape: cblas_sgemm timed by an LD_PRELOAD shim (bench/sgemm_shapes.c),
# a run of 1+STEPS steps minus one of 1, over STEPS (start-up and the first
# step's page faults drop out). Prints ms a step and GFLOP/s for each
# group (linear layers' forward NT, input-gradient NN, weight-gradient TN;
# attention's blocks: products with no dimension of the batch's N rows),
# then the TOP slowest shapes. Wall time: rerun under load.
# usage: [THREADS=1] [STEPS=4] [TOP=12] bench/sgemm_shapes.sh [BIN] [key=value ...]
set -eu
cd "$(dirname "$0")/.."
bin=${1:-build/meshrun}; [ $# -gt 0 ] && shift
th=${THREADS:-1}; steps=${STEPS:-4}; top=${TOP:-12}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cc -O2 -shared -fPIC -I/usr/include/x86_64-linux-gnu/openblas-pthread/ -o "$tmp/shim.so" \
	bench/sgemm_shapes.c -ldl -pthread
echo "# load $(cat /proc/loadavg)"
for s in 1 $((steps + 1)); do
	SGEMM_SHAPES_OUT=$tmp/s$s LD_PRELOAD=$tmp/shim.so "$bin" train --config configs/llama-bench.yml \
		steps=$s openblas_threads="$th" "$@" >"$tmp/log$s" 2>&1 ||
		{ echo "steps=$s failed: $(tail -1 "$tmp/log$s")" >&2; exit 1; }
done
echo "# load $(cat /proc/loadavg)"
N=$(awk '/^per_device_batch_size:/ {b=$2} /^max_target_length:/ {t=$2} END {print b*t}' configs/llama-bench.yml)
/usr/bin/python3 - "$tmp/s1" "$tmp/s$((steps + 1))" "$steps" "$N" "$top" "$tmp/log$((steps + 1))" <<'PY'
import sys, collections, re
def load(f):
    d = {}
    for l in open(f):
        ta, tb, m, n, k, c, s = l.split()
        d[tuple(map(int, (ta, tb, m, n, k)))] = (int(c), float(s))
    return d
a, b = load(sys.argv[1]), load(sys.argv[2])
steps, N, top = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
secs = [float(x) for x in re.findall(r"completed step: \d+, seconds: ([0-9.]+)", open(sys.argv[6]).read())[1:]]
rows = []
for key, (c, s) in b.items():
    c0, s0 = a.get(key, (0, 0))
    dc, ds = (c - c0) / steps, (s - s0) / steps
    if key[2:] == (1024, 1024, 1024):
        continue  # start-up's sgemm peak (host/bench/bench_matmul.c): runs for a time, not a count
    if dc > 0:
        ta, tb, m, n, k = key
        rows.append((ds, key, dc, 2.0 * m * n * k * dc))
g = collections.defaultdict(lambda: [0.0, 0.0])
for ds, (ta, tb, m, n, k), dc, fl in rows:
    kind = "linear" if N in (m, n, k) else "attention"
    g[f"{kind} {'T' if ta else 'N'}{'T' if tb else 'N'}"][0] += ds
    g[f"{kind} {'T' if ta else 'N'}{'T' if tb else 'N'}"][1] += fl
tot = sum(r[0] for r in rows)
step = sum(secs) / len(secs) if secs else float("nan")
print(f"step {step * 1e3:.0f} ms (steps 1..{steps}), sgemm {tot * 1e3:.0f} ms a step ({tot / step:.0%})")
print("| products | ms a step | GFLOP a step | GFLOP/s |")
print("|---|---|---|---|")
for k in sorted(g):
    s, f = g[k]
    print(f"| {k} | {s * 1e3:.1f} | {f / 1e9:.2f} | {f / s / 1e9:.1f} |")
print(f"| all | {tot * 1e3:.1f} | {sum(r[3] for r in rows) / 1e9:.2f} | {sum(r[3] for r in rows) / tot / 1e9:.1f} |")
print(f"slowest {top} shapes (ta tb M N K: calls a step, ms a step, GFLOP/s):")
for ds, key, dc, fl in sorted(rows, reverse=True)[:top]:
    print(f"  {key}: {dc:.0f}, {ds * 1e3:.1f} ms, {fl / ds / 1e9:.1f}")
PY
