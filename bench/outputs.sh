#!/usr/bin/env bash
# bench/outputs.sh OLD_TREE [ROUNDS] [STEPS]: the price of checked writes
# and preflight (issue 22). Interleaved rounds of the same runs with
# OLD_TREE/build/meshrun (a tree from before them, e.g. the branch point)
# and this tree's build/meshrun, every output on: --metrics (a line per
# step), --checkpoint-dir (checkpoint_period above the steps: one at the
# end), --trace (local). Two runs each round:
#   train: llama-tiny, one device;  local: llama-tiny, 2 hosts x 1 device
# and two figures each:
#   start-up: from exec to the first step's line on stdout (config,
#     preflight, rendezvous, the sgemm peak probe, the first step)
#   step: the median interval between successive step lines (steps 2..),
#     which holds the step, the step log and the metrics write
#   cpu: user + system seconds of the whole run, every process (a loaded
#     machine stretches wall times; CPU time much less)
# Prints every round, then medians and new/old ratios. Build both first:
#   git archive BASE | tar -x -C /tmp/old && make -C /tmp/old
set -u
OLD=$(cd "$1" && pwd); R=${2:-5}; STEPS=${3:-40}
NEW=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mktemp -d "${TMPDIR:-/tmp}/meshrun-bench-outputs.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
echo "# load before: $(cat /proc/loadavg)"
python3 - "$OLD" "$NEW" "$R" "$STEPS" "$OUT" <<'PY'
import os, resource, shutil, statistics, subprocess, sys, time
old, new, rounds, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
runs = {
    "train": ["train", "--config", "configs/llama-tiny.yml", "openblas_threads=1"],
    "local": ["local", "--hosts", "2", "--config", "configs/llama-tiny.yml",
              "per_device_batch_size=4"],
}
def one(tree, name):
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    args = [os.path.join(tree, "build/meshrun")] + runs[name] + [
        "steps=%d" % steps, "checkpoint_period=%d" % (steps + 1),
        "--metrics", d + "/m.jsonl", "--checkpoint-dir", d + "/ck"]
    if name == "local":
        args += ["--trace", d + "/t.json"]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.Popen(args, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    times = []
    for line in p.stdout:
        if line.startswith("completed step: "):
            times.append(time.monotonic())
    rc = p.wait()
    total = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
    if rc or len(times) != steps:
        sys.exit("%s %s: exit %d, %d step lines" % (tree, name, rc, len(times)))
    gaps = [b - a for a, b in zip(times[1:], times[2:])]
    return times[0] - t0, statistics.median(gaps), total, cpu
res = {(v, n): [] for v in ("old", "new") for n in runs}
for r in range(1, rounds + 1):
    for v, tree in (("old", old), ("new", new)):
        for n in runs:
            s, g, t, c = one(tree, n)
            res[(v, n)].append((s, g, t, c))
            print("round %d %s %-5s: start-up %.3f s, step %.2f ms, whole run %.2f s, cpu %.2f s" %
                  (r, v, n, s, g * 1e3, t, c))
            sys.stdout.flush()
print("\nmedians over %d rounds (%d steps):" % (rounds, steps))
print("%-6s %10s %10s %6s %10s %10s %6s %8s %8s %6s" % ("run", "start old", "start new", "ratio",
      "step old", "step new", "ratio", "cpu old", "cpu new", "ratio"))
for n in runs:
    m = lambda v, k: statistics.median(x[k] for x in res[(v, n)])
    so, sn, go, gn, co, cn = m("old", 0), m("new", 0), m("old", 1), m("new", 1), m("old", 3), m("new", 3)
    print("%-6s %8.3f s %8.3f s %6.3f %7.2f ms %7.2f ms %6.3f %6.2f s %6.2f s %6.3f" %
          (n, so, sn, sn / so, go * 1e3, gn * 1e3, gn / go, co, cn, cn / co))
PY
echo "# load after: $(cat /proc/loadavg)"
