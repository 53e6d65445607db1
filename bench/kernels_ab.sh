#!/usr/bin/env bash
# CPU a step of one device, another build (BASE, e.g. a copy of main's
# build/meshrun) against this one, clock-free: perf stat's instructions,
# cycles and task-clock of llama-bench runs of 1 and 1+STEPS steps
# (openblas_threads=1); a step's figures are the difference over STEPS,
# so start-up cancels (instructions and cycles only where perf has the
# counters: a VM often has none). ROUNDS interleaved rounds, the median printed.
# PROFILE=1 adds, per build, perf record's CPU ms a step by where it
# went (OpenBLAS's sgemm kernel, its packing, its small-matrix kernels,
# memset, meshrun's own code, the rest), the same subtraction of the
# samples of 1 and 1+STEPS steps (1000 samples a CPU second).
# usage: BASE=PATH [NOW=build/meshrun] [STEPS=6] [ROUNDS=3] [PROFILE=1] bench/kernels_ab.sh
set -eu
cd "$(dirname "$0")/.."
base=${BASE:?BASE=path of the baseline meshrun}; now=${NOW:-build/meshrun}; steps=${STEPS:-6}; rounds=${ROUNDS:-3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "# load $(cat /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
	for b in base now; do
		bin=$base; [ $b = now ] && bin=$now
		for s in 1 $((steps + 1)); do
			perf stat -x, -e instructions,cycles,task-clock -o "$tmp/p" \
				"$bin" train --config configs/llama-bench.yml steps=$s openblas_threads=1 \
				>"$tmp/log" 2>&1 || { echo "$b steps=$s failed: $(tail -1 "$tmp/log")" >&2; exit 1; }
			awk -F, -v b=$b -v s=$s -v r=$r '$3 ~ /instructions|cycles|task-clock/ && $1 ~ /^[0-9.]+$/ {
				sub(/:u$/, "", $3); print r, b, s, $3, $1 }' "$tmp/p"
		done
	done
done >"$tmp/all"
echo "# load $(cat /proc/loadavg)"
/usr/bin/python3 - "$tmp/all" "$steps" <<'PY'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1])]
steps = int(sys.argv[2])
v = {}
for r, b, s, ev, x in rows:
    v[(r, b, int(s), ev)] = float(x)
rounds = sorted({r for r, *_ in rows})
def per_step(b, ev):
    if any((r, b, steps + 1, ev) not in v for r in rounds):
        return None  # a counter this machine does not have (a VM: no PMU)
    return st.median([(v[(r, b, steps + 1, ev)] - v[(r, b, 1, ev)]) / steps for r in rounds])
print(f"| a llama-bench step ({steps} steps, {len(rounds)} rounds, median) | base | now | now/base |")
print("|---|---|---|---|")
for ev, name, k in (("task-clock", "CPU s", 1e-3), ("instructions", "instructions (G)", 1e-9),
                    ("cycles", "cycles (G)", 1e-9)):
    a, b = per_step("base", ev), per_step("now", ev)
    if a is None or b is None:
        print(f"| {name} | n/a | n/a | not counted here |")
    else:
        print(f"| {name} | {a * k:.3f} | {b * k:.3f} | {b / a:.3f} |")
r = [((v[(x, "now", steps + 1, "task-clock")] - v[(x, "now", 1, "task-clock")]) /
      (v[(x, "base", steps + 1, "task-clock")] - v[(x, "base", 1, "task-clock")])) for x in rounds]
print("CPU s a step now/base by round: " + " ".join(f"{x:.3f}" for x in r))
PY
[ "${PROFILE:-0}" = 1 ] || exit 0
for b in base now; do
	bin=$base; [ $b = now ] && bin=$now
	for s in 1 $((steps + 1)); do
		perf record -F 1000 -o "$tmp/perf" "$bin" train --config configs/llama-bench.yml steps=$s \
			openblas_threads=1 >"$tmp/log" 2>&1
		perf report -i "$tmp/perf" --no-children --stdio --sort dso,sym -n -g none 2>/dev/null |
			awk -v b=$b -v s=$s '$1 ~ /%$/ && $2 ~ /^[0-9]+$/ { print b, s, $2, $3, $5 }'
	done
done >"$tmp/prof"
echo "# load $(cat /proc/loadavg)"
/usr/bin/python3 - "$tmp/prof" "$steps" <<'PY'
import sys, collections
steps = int(sys.argv[2])
ms = collections.defaultdict(float)
def group(dso, sym):
    if "openblas" in dso:
        if "copy" in sym: return "OpenBLAS packing (*copy)"
        if "sgemm_kernel" in sym: return "OpenBLAS sgemm kernel"
        if "small_kernel" in sym or "beta" in sym: return "OpenBLAS small kernels, beta"
        return "OpenBLAS other"
    if "memset" in sym: return "memset"
    if dso.startswith("meshrun"): return "meshrun's own code"
    return "other (kernel, libc, libm)"
for l in open(sys.argv[1]):
    b, s, n, dso, sym = l.split(None, 4)
    ms[(b, group(dso, sym.strip()))] += (int(n) if int(s) > 1 else -int(n)) / steps
groups = sorted({g for _, g in ms}, key=lambda g: -ms[("base", g)])
print(f"| CPU ms a step, perf record ({steps} steps) | base | now | now - base |")
print("|---|---|---|---|")
for g in groups:
    a, b = ms[("base", g)], ms[("now", g)]
    print(f"| {g} | {a:.0f} | {b:.0f} | {b - a:+.0f} |")
ta = sum(v for (b, _), v in ms.items() if b == "base"); tb = sum(v for (b, _), v in ms.items() if b == "now")
print(f"| all | {ta:.0f} | {tb:.0f} | {tb - ta:+.0f} ({tb / ta:.3f}x) |")
PY
