#!/usr/bin/env bash
# Sharded training on configs/llama-bench.yml, 2 hosts x 1 device over
# loopback TLS, next to one device at the same per-device batch and the
# same OpenBLAS threads per device (1: two agents share the 2 cores), in
# one run. Prints step time, tokens/s, DCN bytes per step, the ratio to the
# single-device step, and the share of step time in communication spans
# (read from --trace), and each agent's peak resident memory.
# usage: bench/sharded.sh [STEPS]
set -eu
cd "$(dirname "$0")/.."
steps=${1:-6}
make -s all
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
avg() { # mean of a metrics field over steps >= 1
  python3 -c "import json,sys; r=[json.loads(l) for l in open('$1')][1:]; print(sum(x['$2'] for x in r)/len(r))"; }
peak() { # peak resident MB over the run
  python3 -c "import json,sys; print(max(json.loads(l)['peak_mem_mb'] for l in open('$1')))"; }
commshare() {
  python3 - "$1" <<'PY'
import json, sys, collections
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X" and e["args"]["step"] >= 1]
step = collections.defaultdict(float); comm = collections.defaultdict(float)
for e in ev:
    if e["name"] == "step": step[e["tid"]] += e["dur"]
    elif e["cat"] == "comm": comm[e["tid"]] += e["dur"]
print("%.1f%%" % (100 * max(comm[t] / step[t] for t in step)))
PY
}
build/meshrun train --config configs/llama-bench.yml steps=$steps openblas_threads=1 --metrics $tmp/one.jsonl > /dev/null
one=$(avg $tmp/one.jsonl step_time_s)
printf "%-8s %10s %19s %14s %10s %10s %8s\n" mode step_s tokens_per_s_global dcn_bytes_step vs_single comm_share peak_mb
printf "%-8s %10.3f %19.1f %14s %10s %10s %8s\n" single "$one" "$(avg $tmp/one.jsonl tokens_per_s_global)" 0 1.00 - \
  "$(peak $tmp/one.jsonl)"
for mode in dp fsdp zero1; do
  case $mode in
    dp) extra="" ;;
    fsdp) extra="dcn_data_parallelism=1 dcn_fsdp_parallelism=2" ;;
    zero1) extra="shard_optimizer_over_data=true" ;;
  esac
  build/meshrun local --hosts 2 --config configs/llama-bench.yml steps=$steps $extra \
    --metrics $tmp/$mode.jsonl --trace $tmp/$mode.json > /dev/null
  t=$(avg $tmp/$mode.jsonl step_time_s)
  printf "%-8s %10.3f %19.1f %14.0f %10.2f %10s %8s\n" $mode "$t" "$(avg $tmp/$mode.jsonl tokens_per_s_global)" \
    "$(avg $tmp/$mode.jsonl dcn_bytes)" "$(python3 -c "print($t/$one)")" "$(commshare $tmp/$mode.json)" \
    "$(peak $tmp/$mode.jsonl)"
done
