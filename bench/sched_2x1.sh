#!/usr/bin/env bash
# Issue 21's bubble goals where the machine matches the theory, and where
# it does not (bench/sched.sh's columns; recompute off; no `meshrun plan`):
#   1. 2 stages on 2 hosts x 1 device: a core a stage on this 2-core
#      machine. M in {2, 4, 8}: gpipe, 1f1b, zb_h1, interleaved_1f1b
#      (v = 2), ROUNDS rounds (default 2) of the whole list, interleaved,
#      so the load drifts over every schedule alike.
#   2. 4 stages on 4 hosts x 1 device (4 device threads on 2 cores),
#      M = 8: 1f1b, zb_h1, interleaved_1f1b, as many rounds.
# Then per mesh and M (medians over the rounds): each schedule's idle
# seconds (the worst device) against its formula at the run's own F, I,
# W costs (the spans' mean wall times; and at their CPU times: a core a
# stage), how much of each device's idle was queued (runnable, not
# running: schedstat run-delay) rather than waiting on a message, and
# the goals: ZB-H1's idle seconds <= 0.40 of 1F1B's (and the ratio its
# formula gives at the run's costs, (F+I-W)/(F+I+W)); interleaved
# 1F1B's idle within 10% of its formula, in seconds and as a share
# ((S-1)/(vM+S-1): the worst device's idle over the step's compute span);
# met or not met. Prints the elapsed seconds and the
# load average at the start and end of each part.
# usage: [STEPS=3] [ROUNDS=2] [MS="2 4 8"] [MS4=8] [SCHEDS=...] bench/sched_2x1.sh
#   (MS: part 1's M's; MS4: part 2's, empty to skip it; SCHEDS: part 1's
#   schedules, default "gpipe 1f1b zb_h1 interleaved_1f1b"; a variant such
#   as zb_h1/noprepost, bench/sched.sh's, is summed up as its own row
#   against the same variant of 1f1b; KEEP=DIR keeps every run's trace
#   for bench/pipe_excess.py DIR/*.json and bench/pipe_crit.py)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-3}
rounds=${ROUNDS:-2}
ms=${MS:-"2 4 8"}
ms4=${MS4-8}
scheds=${SCHEDS:-"gpipe 1f1b zb_h1 interleaved_1f1b"}
make -s all
bin=$(mktemp /tmp/meshrun-2x1.XXXXXX)
out=$(mktemp /tmp/sched-2x1.XXXXXX)
trap 'rm -f "$bin" "$out"' EXIT
cp build/meshrun "$bin"
chmod +x "$bin"
t0=$(date +%s)
echo "## 2 stages, 2 hosts x 1 device, recompute off, $rounds rounds; load $(cut -d' ' -f1-3 /proc/loadavg)"
BIN=$bin NOPLAN=1 ROUNDS=$rounds KV="pipeline_recompute=false" \
  bench/sched.sh "$steps" 2x1 "$ms" "$scheds" | tee "$out"
if [ -n "$ms4" ]; then
  echo
  echo "## 4 stages, 4 hosts x 1 device, recompute off; load $(cut -d' ' -f1-3 /proc/loadavg)"
  BIN=$bin NOPLAN=1 ROUNDS=$rounds KV="pipeline_recompute=false" \
    bench/sched.sh "$steps" 4x1 "$ms4" "1f1b zb_h1 interleaved_1f1b" | tee -a "$out"
fi
echo
python3 - "$out" <<'EOF'
import statistics
import sys

head, rows = None, []
for line in open(sys.argv[1]):
    if not line.startswith("| "):
        continue
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if cells[0] == "mesh":
        head = cells
    else:
        rows.append(dict(zip(head, cells)))
med = statistics.median
by = {}
for r in rows:
    by.setdefault((r["mesh"], int(r["M"]), r["schedule"]), []).append(r)


def num(x):
    try:
        return float(x)
    except ValueError:
        return None


def form(r, i):
    f = r["formula idle s/share/at cpu s"]
    return float(f.split("/")[i]) if f != "-" else None


print("## summary (medians over the rounds)")
print("| mesh | M | schedule | runs | idle s | formula idle s | idle/formula | formula at cpu s | "
      "idle share of span | formula share | queued s (worst device) | step s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for (mesh, M, s), rs in sorted(by.items()):
    q = []
    for r in rs:
        # the worst device's split: wait+queued:desc
        parts = [p for p in r["idle = wait+queued:desc per device"].split("/")]
        qs = [num(p.split(":")[0].split("+")[1]) for p in parts]
        q.append(max((x for x in qs if x is not None), default=float("nan")))
    fi = [form(r, 0) for r in rs if form(r, 0) is not None]
    print(f"| {mesh} | {M} | {s} | {len(rs)} | {med(float(r['idle s']) for r in rs):.2f} | "
          f"{med(fi) if fi else float('nan'):.2f} | "
          f"{med(float(r['idle/formula']) for r in rs) if fi else float('nan'):.2f} | "
          f"{med(form(r, 2) for r in rs) if fi else float('nan'):.2f} | "
          f"{med(float(r['idle share of span']) for r in rs):.3f} | "
          f"{med(form(r, 1) for r in rs) if fi else float('nan'):.3f} | {med(q):.2f} | "
          f"{med(float(r['step s']) for r in rs):.2f} |")
print()
print("## goals")
for (mesh, M, s), rs in sorted(by.items()):
    if s.split("/")[0] == "zb_h1":
        z = [float(r["zb/base idle s"]) for r in rs if num(r["zb/base idle s"]) is not None]
        # the formula's ratio at this run's costs: (F+I-W)/(F+I+W)
        fr = []
        for r in rs:
            c = dict(kv.split("=") for kv in r["action ms"].split(","))
            F, I, W = (float(c.get(k, 0)) for k in "FIW")
            fr.append((F + I - W) / (F + I + W))
        if z:
            print(f"{mesh} M={M}: {s}/1f1b idle s {med(z):.2f} (rounds: {', '.join(f'{x:.2f}' for x in z)}); "
                  f"formula at the run's F:I:W {med(fr):.2f}; goal <= 0.40: "
                  f"{'met' if med(z) <= 0.40 else 'not met'}")
    if s.split("/")[0] == "interleaved_1f1b":
        o = [float(r["idle/formula"]) for r in rs if num(r["idle/formula"]) is not None]
        sh = [float(r["idle share of span"]) / form(r, 1) for r in rs if form(r, 1)]
        if o:
            print(f"{mesh} M={M}: {s} idle s / formula {med(o):.2f}, share / formula share "
                  f"{med(sh):.2f}; goal within 10%: "
                  f"{'met' if abs(med(o) - 1) <= 0.10 else 'not met'} (seconds), "
                  f"{'met' if abs(med(sh) - 1) <= 0.10 else 'not met'} (share)")
EOF
echo
echo "# $(( $(date +%s) - t0 )) s; load $(cut -d' ' -f1-3 /proc/loadavg)"
