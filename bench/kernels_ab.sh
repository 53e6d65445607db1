#!/usr/bin/env bash
# CPU a step of one device, another build (BASE, e.g. a copy of main's
# build/meshrun) against this one, clock-free: perf stat's instructions,
# cycles and task-clock of llama-bench runs of 1 and 1+STEPS steps
# (openblas_threads=1); a step's figures are the difference over STEPS,
# so start-up cancels (instructions and cycles only where perf has the
# counters: a VM often has none). ROUNDS interleaved rounds, the median printed.
# PROFILE=1 adds ROUNDS more interleaved rounds of perf record: each
# build's CPU ms a step by where it went (OpenBLAS's sgemm kernel, its
# packing, its small-matrix kernels, memset, meshrun's own code, the
# rest), by the same subtraction of 1 from 1+STEPS steps (1000 samples a
# CPU second). The sgemm kernel's time moves with the machine's load
# (+-10% between rounds here); the groups a change touches move less.
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
for r in $(seq 1 "$rounds"); do
	for b in base now; do
		bin=$base; [ $b = now ] && bin=$now
		for s in 1 $((steps + 1)); do
			perf record -F 1000 -o "$tmp/perf" "$bin" train --config configs/llama-bench.yml \
				steps=$s openblas_threads=1 >"$tmp/log" 2>&1
			perf report -i "$tmp/perf" --no-children --stdio --sort dso,sym -n -g none 2>/dev/null |
				awk -v r=$r -v b=$b -v s=$s '$1 ~ /%$/ && $2 ~ /^[0-9]+$/ { print r, b, s, $2, $3, $5 }'
		done
	done
done >"$tmp/prof"
echo "# load $(cat /proc/loadavg)"
/usr/bin/python3 - "$tmp/prof" "$steps" <<'PY'
import sys, collections, statistics as st
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
rounds = set()
for l in open(sys.argv[1]):
    r, b, s, n, dso, sym = l.split(None, 5)
    rounds.add(r)
    g = group(dso, sym.strip())
    d = (int(n) if int(s) > 1 else -int(n)) / steps
    ms[(r, b, g)] += d
    ms[(r, b, "all")] += d
groups = sorted({g for _, _, g in ms if g != "all"}, key=lambda g: -ms[(min(rounds), "base", g)]) + ["all"]
med = lambda b, g: st.median([ms[(r, b, g)] for r in rounds])
print(f"| CPU ms a step, perf record ({steps} steps, {len(rounds)} rounds, median) | base | now | now - base |")
print("|---|---|---|---|")
for g in groups:
    a, b = med("base", g), med("now", g)
    print(f"| {g} | {a:.0f} | {b:.0f} | {b - a:+.0f} ({b / a:.3f}x) |" if g == "all" else
          f"| {g} | {a:.0f} | {b:.0f} | {b - a:+.0f} |")
for g in ("meshrun's own code", "all"):
    print(f"{g}, now - base by round (ms): " +
          " ".join(f"{ms[(r, 'now', g)] - ms[(r, 'base', g)]:+.0f}" for r in sorted(rounds)))
PY
