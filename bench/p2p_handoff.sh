#!/usr/bin/env bash
# The point-to-point hand-off (p2p_handoff_bytes, docs/collectives.md "The
# life of a message") with real compute: a 2 x 1 pipeline of llama-bench
# (8 layers, sequence 128, a 16-row batch, recompute off), interleaved
# 1F1B (v = 2) at M = 4, variants run in alternation, round by round, in
# the same run. Per variant: the median step time over steps >= 1 (each
# round's median, then their median), its ratio to the first variant's,
# the load, and whether every step's loss_hex equals the first variant's
# (and, with MAIN=BIN, a binary from before: its loss_hex too). Then a
# 16 MiB permute and all_gather (`bench collectives`) for each variant,
# which the hand-off does not touch (point-to-point sends only).
# usage (from the worktree root):
#   [ROUNDS=3] [STEPS=8] [BIN=build/meshrun] [MAIN=/work/bin/meshrun-2ac [MAIN_REV=2ac8099]] \
#     bash bench/p2p_handoff.sh ['name|key=value ..' ...]
# Default variants: base (p2p_handoff_bytes=0: the sending thread seals)
# and hand (262144, the default: this run's 1 MiB messages handed off).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/meshrun}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-8}
[ $# -gt 0 ] || set -- 'base|p2p_handoff_bytes=0' 'hand|p2p_handoff_bytes=262144'
tmp=$(mktemp -d /tmp/p2p-handoff.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
kv="--config configs/llama-bench.yml base_num_decoder_layers=8 max_target_length=128 ici_data_parallelism=1"
kv="$kv dcn_data_parallelism=1 pipeline_recompute=false dcn_pipeline_parallelism=2 per_device_batch_size=8"
kv="$kv pipeline_schedule=interleaved_1f1b num_pipeline_microbatches=4 num_layers_per_pipeline_stage=2"
echo "# p2p_handoff: 2x1 llama-bench interleaved_1f1b M=4, steps=$STEPS rounds=$ROUNDS; load $(cut -d' ' -f1-3 /proc/loadavg)"
onerun() {  # NAME BIN KEYS...: one run's metrics in $tmp/NAME.jsonl
  local name=$1 bin=$2
  shift 2
  "$bin" local --hosts 2 --devices-per-host 1 $kv steps=$STEPS "$@" --metrics $tmp/$name.jsonl --quiet \
    >$tmp/$name.log 2>&1 || { cat $tmp/$name.log >&2; echo "p2p_handoff: $name failed" >&2; exit 1; }
  echo "$name $(cut -d' ' -f1 /proc/loadavg)" >>$tmp/runs
}
for r in $(seq "$ROUNDS"); do
  for v in "$@"; do
    onerun "r$r-${v%%|*}" "$BIN" ${v#*|}
  done
  if [ -n "${MAIN:-}" ] && [ "$r" = 1 ]; then
    # the binary from before reads the configs from before (MAIN_REV)
    mkdir -p $tmp/main
    git archive "${MAIN_REV:-2ac8099}" configs | tar -x -C $tmp/main
    kv=${kv/configs\/llama-bench.yml/$tmp\/main\/configs\/llama-bench.yml} onerun "r$r-main" "$MAIN"
  fi
done
python3 - "$tmp" "$@" <<'EOF'
import json, statistics, sys
d, variants = sys.argv[1], [v.split("|")[0] for v in sys.argv[2:]]
runs = [l.split() for l in open(d + "/runs")]
def steps(name):
    return [json.loads(l) for l in open("%s/%s.jsonl" % (d, name))]
hex0 = [s["loss_hex"] for s in steps(runs[0][0])]
base = None
print("| variant | step s (median of rounds' medians, steps >= 1) | rounds | x %s | loss_hex = %s's | load |" % (
    variants[0], variants[0]))
print("|---|---|---|---|---|---|")
for v in variants + ["main"]:
    mine = [r for r in runs if r[0].split("-", 1)[1] == v]
    if not mine:
        continue
    meds = [statistics.median(s["step_time_s"] for s in steps(r[0]) if s["step"] >= 1) for r in mine]
    same = all([s["loss_hex"] for s in steps(r[0])] == hex0 for r in mine)
    m = statistics.median(meds)
    base = m if base is None else base
    print("| %s | %.4f | %s | %.3f | %s | %s |" % (v, m, " ".join("%.4f" % x for x in meds), m / base,
                                                  "yes" if same else "NO", " ".join(r[1] for r in mine)))
EOF
echo
echo "# 16 MiB collectives, 2 hosts (busbw GB/s as bench collectives prints it)"
for r in $(seq "$ROUNDS"); do
  for v in "$@"; do
    for op in permute all_gather; do
      echo "${v%%|*} $op $("$BIN" bench collectives --hosts 2 --op $op --sizes 16M --iters 20 ${v#*|} 2>&1 |
        awk '$1 ~ /^[0-9]+$/ {print $0}' | tail -1) load $(cut -d' ' -f1 /proc/loadavg)"
    done
  done
done
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
