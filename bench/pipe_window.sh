#!/usr/bin/env bash
# bench/pipe_window.sh [STEPS] [LAYERS]: the pipeline's FSDP weight window
# on configs/llama-bench.yml (4 layers, or LAYERS), FSDP=2 x PP=2 on 2
# hosts x 2 devices over loopback TLS (fsdp across the hosts, the 2 stages
# inside each; S=2, R=LAYERS/2, M=4, per-device batch 2: a microbatch is
# one row), for the
# three weight modes, next to the same 4 devices without the pipeline
# (fsdp=2 x data=2). OpenBLAS threads by the README's rule (4 devices on
# 2 cores: 1 each). Per mode: step time, host 0's peak resident memory
# (the agent's VmHWM, peak_mem_mb; host 1 holds the same shapes), layer
# gathers per step (metrics weight_gathers, next to `meshrun schedule`'s
# figure), the time devices wait for a layer gather per step (trace spans
# "all_gather (prefetch)", the step's first one, the non-layer tensors,
# left out) and the share of a gather hidden behind compute: 1 - (wait per
# gather) / (wait per gather of the default mode, whose gathers are waited
# right after they are issued), and the time waiting for reduce-scatters
# (all of them, the non-layer one too). Means over steps 1..STEPS-1 and
# devices.
# Run it on an idle machine: with other work on the cores the step times
# mostly measure that work.
set -eu
cd "$(dirname "$0")/.."
steps=${1:-5}
layers=${2:-4}
make -s all
tmp=$(mktemp -d "${TMPDIR:-/tmp}/meshrun-window.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cfg="--config configs/llama-bench.yml steps=$steps per_device_batch_size=2 base_num_decoder_layers=$layers"
mesh="dcn_data_parallelism=1 dcn_fsdp_parallelism=2 ici_data_parallelism=1"
pipe="ici_pipeline_parallelism=2 num_pipeline_microbatches=4"

stats() { # metrics trace -> step_s peak_mb gathers wait_s_per_step wait_share_of_step wait_per_gather_ms rs_wait_s_per_step
  python3 - "$1" "$2" <<'PY'
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
ev = [e for e in json.load(open(sys.argv[2]))["traceEvents"]
      if e.get("ph") == "X" and e["args"].get("step", 0) >= 1]
step = sum(r["step_time_s"] for r in rows) / len(rows)
peak = max(r["peak_mem_mb"] for r in rows)
g = rows[-1].get("weight_gathers", 0)
per = collections.defaultdict(list)   # (device, step) -> gather waits in order
for e in sorted(ev, key=lambda e: e["ts"]):
    if e["name"].startswith("all_gather (prefetch)"):
        per[(e["tid"], e["args"]["step"])].append(e["dur"] / 1e6)
waits = [sum(v[1:]) for v in per.values()]   # the first: the non-layer tensors
w = sum(waits) / len(waits) if waits else 0
rs = collections.defaultdict(float)           # (device, step) -> reduce-scatter waits
for e in ev:
    if e["name"].startswith("reduce_scatter ("):  # span names are cut at 23 characters
        rs[(e["tid"], e["args"]["step"])] += e["dur"] / 1e6
r = sum(rs.values()) / len(per) if per else 0
print("%.3f %d %d %.4f %.1f%% %.3f %.4f" % (step, peak, g, w, 100 * w / step, 1e3 * w / g if g else 0, r))
PY
}

printf "%-28s %7s %8s %8s %9s %13s %11s %16s %8s %14s\n" mode step_s peak_mb gathers scheduled gwait_s/step gwait/step gwait_ms/gather hidden rs_wait_s/step
base=""
for mode in iter once repeat nopipe; do
  case $mode in
    iter) extra="$mesh $pipe"; name="per iteration (default)" ;;
    once) extra="$mesh $pipe pipeline_fsdp_ag_once=true"; name="pipeline_fsdp_ag_once" ;;
    repeat) extra="$mesh $pipe pipeline_fsdp_ag_per_repeat=true"; name="pipeline_fsdp_ag_per_repeat" ;;
    nopipe) extra="dcn_data_parallelism=1 dcn_fsdp_parallelism=2 ici_data_parallelism=2"; name="no pipeline (fsdp x data)" ;;
  esac
  build/meshrun local --hosts 2 --devices-per-host 2 $cfg $extra \
    --metrics "$tmp/$mode.jsonl" --trace "$tmp/$mode.json" >"$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
  sched=-
  if [ "$mode" != nopipe ]; then
    sched=$(build/meshrun schedule $cfg $extra | awk '/^  \* /{for(i=3;i<=NF;i++) if($i ~ /^[0-9]+$/){print $i; exit}}')
  fi
  read -r t peak g w ws wpg rsw <<<"$(stats "$tmp/$mode.jsonl" "$tmp/$mode.json")"
  [ "$mode" = iter ] && base=$wpg
  hidden=$(python3 -c "b=float('$base'); print('%.0f%%' % (100 * (1 - float('$wpg') / b)) if b > 0 and '$mode' != 'iter' else '-')")
  printf "%-28s %7.3f %8d %8d %9s %13.4f %11s %16.3f %8s %14.4f\n" "$name" "$t" "$peak" "$g" "$sched" "$w" "$ws" "$wpg" "$hidden" "$rsw"
done
