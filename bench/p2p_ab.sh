#!/usr/bin/env bash
# What the transport and the executor add to a pipeline step (issue 21),
# A/B in one run: 2 stages on 2 hosts x 1 device, M = 8, recompute off,
# llama-bench with 8 layers at sequence 128 (bench/results/pipeline.md's pipe_replay
# command), STEPS steps traced, for each schedule of SCHEDS and each of
#   base  the binary $BASE (required: a build of the commit before the change)
#   one   this build, one receive posted ahead at a time, no landing
#         buffers (MESHRUN_PIPE_PREPOST=1 MESHRUN_PIPE_LANDING=0: base's
#         posting, with this build's p2p trace rows)
#   new   this build as it runs by default
#   niceN this build with device_nice=N (VARIANTS="nice0 nice10": the
#         device threads' nice value, A/B)
#   batch this build with device_nice=0 device_batch=true (SCHED_BATCH)
# (VARIANTS, default "base one new"; BASE is needed only for base)
# in ROUNDS rounds (the variants interleaved, so load drifts over all
# alike). Per run and step >= 1: bench/pipe_replay.py's measured span
# minus the replay at the actions' own times (the transport and the
# executor, ms), and for one/new bench/p2p_late.py's count of messages
# whose receive was posted after their send call (each costs the sender
# a wake-up of its stream thread; clock-free), the count of messages that
# kept their receiver waiting > 1 ms beyond the replay, and the sum of the
# late messages' late parts with its net->data, data->landed and
# landed->back segments (the receiver's threads waiting for a core). Then
# the medians per schedule and variant, and each variant against the
# first. Prints the load average beside each run.
# usage: [BASE=BIN] [VARIANTS="base one new"] [STEPS=3] [ROUNDS=3]
#        [SCHEDS="interleaved_1f1b 1f1b"] bench/p2p_ab.sh
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-3}
rounds=${ROUNDS:-3}
scheds=${SCHEDS:-"interleaved_1f1b 1f1b"}
variants=${VARIANTS:-"base one new"}
base=${BASE:-}
case " $variants " in
  *" base "*) [ -n "$base" ] || { echo "p2p_ab.sh: give BASE=a meshrun binary built from the commit to compare against" >&2; exit 1; } ;;
esac
make -s all
tmp=$(mktemp -d /tmp/p2p-ab.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cp build/meshrun "$tmp/new"
chmod +x "$tmp/new"
t0=$(date +%s)
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$rounds"); do
  for s in $scheds; do
    L=4; [ "$s" = interleaved_1f1b ] && L=2
    for v in $variants; do
      b=$tmp/new; pe=""; le=""; kv=""
      case $v in
        base) b=$base ;;
        one) pe=1; le=0 ;;
        nice[0-9]*) kv="device_nice=${v#nice}" ;;
        batch) kv="device_nice=0 device_batch=true" ;;
      esac
      name=${s}_${v}_$round
      load=$(cut -d' ' -f1 /proc/loadavg)
      MESHRUN_PIPE_PREPOST=$pe MESHRUN_PIPE_LANDING=$le "$b" local --hosts 2 --devices-per-host 1 \
        --config configs/llama-bench.yml base_num_decoder_layers=8 max_target_length=128 \
        per_device_batch_size=8 ici_data_parallelism=1 dcn_data_parallelism=1 \
        dcn_pipeline_parallelism=2 pipeline_schedule=$s num_pipeline_microbatches=8 \
        num_layers_per_pipeline_stage=$L pipeline_recompute=false steps=$steps $kv \
        --trace "$tmp/$name.json" >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; exit 1; }
      hex=$(grep -o 'loss: [0-9.]*' "$tmp/$name.log" | tail -1)
      te=$(python3 bench/pipe_replay.py "$tmp/$name.json" |
           sed -n 's/^step \([0-9]*\):.*transport and executor \([-+0-9.]*\) ms.*/\1 \2/p' |
           awk '$1 >= 1 {printf "%s%s", sep, $2; sep=","}')
      pl="-"; ls="-"; ln="-"; sp="-"
      if [ $v != base ]; then
        python3 bench/p2p_late.py "$tmp/$name.json" >"$tmp/$name.late"
        pl=$(sed -n 's/^step \([0-9]*\): [0-9]* messages, \([0-9]*\) posted after.*; total \([0-9.]*\)$/\1 \2 \3/p' "$tmp/$name.late" |
             awk '$1 >= 1 {printf "%s%s", sep, $2; sep=","}')
        ls=$(sed -n 's/^step \([0-9]*\): .*; total \([0-9.]*\)$/\1 \2/p' "$tmp/$name.late" |
             awk '$1 >= 1 {printf "%s%s", sep, $2; sep=","}')
        ln=$(sed -n 's/^step \([0-9]*\): .*, \([0-9]*\) late by > 1 ms.*/\1 \2/p' "$tmp/$name.late" |
             awk '$1 >= 1 {printf "%s%s", sep, $2; sep=","}')
        # the receiver-side segments, summed over steps >= 1
        sp=$(sed -n 's/^step \([0-9]*\): .*net->data \([0-9.]*\), data->landed \([0-9.]*\), landed->back \([0-9.]*\).*/\1 \2 \3 \4/p' "$tmp/$name.late" |
             awk '$1 >= 1 {a += $2; b += $3; c += $4} END {printf "%.1f,%.1f,%.1f", a, b, c}')
      fi
      echo "RUN $s $v round $round: transport+executor ms $te; posted after send $pl; late ms $ls; late msgs $ln; net->data,data->landed,landed->back ms $sp; $hex; load $load"
    done
  done
done | tee "$tmp/out"
echo
python3 - "$tmp/out" $variants <<'EOF'
import statistics, sys
variants = sys.argv[2:]
runs = {}
for line in open(sys.argv[1]):
    if not line.startswith("RUN "):
        continue
    w = line.split()
    s, v = w[1], w[2]
    te = [float(x) for x in line.split("transport+executor ms ")[1].split(";")[0].split(",") if x]
    field = lambda key: line.split(key)[1].split(";")[0].strip()
    pl, ln, sp = field("posted after send "), field("late msgs "), field("landed->back ms ")
    d = runs.setdefault((s, v), {"te": [], "pl": [], "ln": [], "sp": []})
    d["te"] += te
    if pl != "-":
        d["pl"] += [int(x) for x in pl.split(",") if x]
        d["ln"] += [int(x) for x in ln.split(",") if x]
        d["sp"].append([float(x) for x in sp.split(",")])
print("| schedule | variant | transport+executor ms a step, median (steps) | posted after their send, median a step "
      "| late > 1 ms, median a step | net->data / data->landed / landed->back ms a run, mean |")
print("|---|---|---|---|---|---|")
med = lambda xs, f: f % statistics.median(xs) if xs else "-"
for (s, v), d in runs.items():
    sp = " / ".join(f"{statistics.mean(c):.0f}" for c in zip(*d["sp"])) if d["sp"] else "-"
    print(f"| {s} | {v} | {statistics.median(d['te']):+.1f} ({len(d['te'])}) | {med(d['pl'], '%.0f')} "
          f"| {med(d['ln'], '%.1f')} | {sp} |")
first = variants[0]
for s in dict.fromkeys(k[0] for k in runs):
    a = statistics.median(runs[(s, first)]["te"])
    for v in variants[1:]:
        print(f"{s}: {v} - {first} {statistics.median(runs[(s, v)]['te']) - a:+.1f} ms a step")
EOF
echo "elapsed $(( $(date +%s) - t0 )) s; load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
