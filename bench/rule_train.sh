#!/usr/bin/env bash
# Issue 19 (float20): a real-compute job under two builds or settings,
# floating (cpu_bind=none): bench/bind_train.sh's pipe41 shape (4 hosts x
# 1 device, a 4-stage interleaved 1F1B pipeline, configs/llama-bench.yml,
# one OpenBLAS thread a device), the variants alternating, the order
# swapped each round; per run the mean step seconds (steps >= 1, host 0),
# comm_exposed_s and CPU s per step, then the medians, the load average
# and whether every run gave the same last loss_hex. A variant is
# NAME|ENV|BIN (ENV: VAR=VALUE ...; BIN: default build/meshrun), e.g.
#   bench/rule_train.sh 3 5 'old|MESHRUN_YIELD_RULE=old|' 'new||'
# usage: bench/rule_train.sh ROUNDS STEPS VARIANT VARIANT
set -eu
cd "$(dirname "$0")/.."
rounds=$1; steps=$2; va=$3; vb=$4
make -s all
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shape="--hosts 4 --devices-per-host 1 base_num_decoder_layers=8 max_target_length=128
  ici_data_parallelism=1 dcn_data_parallelism=1 pipeline_recompute=false dcn_pipeline_parallelism=4
  per_device_batch_size=4 pipeline_schedule=interleaved_1f1b num_pipeline_microbatches=8
  num_layers_per_pipeline_stage=1"
one() { # VARIANT ROUND
  IFS='|' read -r name envs bin <<<"$1"
  # shellcheck disable=SC2086
  env $envs /usr/bin/time -f "%U %S" -o "$tmp/$name.cpu" "${bin:-build/meshrun}" local $shape \
    --config configs/llama-bench.yml steps="$steps" openblas_threads=1 cpu_bind=none \
    --metrics "$tmp/$name.$2.jsonl" > /dev/null 2>&1
  /usr/bin/python3 - "$tmp/$name.$2.jsonl" "$tmp/$name.cpu" "$name" "$2" "$steps" <<'PY' | tee -a "$tmp/out"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
u, s = map(float, open(sys.argv[2]).read().split()[-2:])
r = [o for o in rows if o["step"] >= 1]
st = sum(o["step_time_s"] for o in r) / len(r)
ce = sum(o["comm_exposed_s"] for o in r) / len(r)
print(f"{sys.argv[3]} round {sys.argv[4]} step_s {st:.3f} comm_exposed_s {ce:.3f} "
      f"cpu_s_per_step {(u + s) / int(sys.argv[5]):.3f} last_loss_hex {rows[-1]['loss_hex']}")
PY
}
for round in $(seq 1 "$rounds"); do
  echo "# round $round load $(cat /proc/loadavg)"
  if [ $((round % 2)) = 1 ]; then one "$va" "$round"; one "$vb" "$round"
  else one "$vb" "$round"; one "$va" "$round"; fi
done
echo "# end load $(cat /proc/loadavg)"
/usr/bin/python3 - "$tmp/out" <<'PY'
import statistics, sys
v = {}
hexes = set()
for l in open(sys.argv[1]):
    w = l.split()
    v.setdefault(w[0], []).append((float(w[4]), float(w[6]), float(w[8])))
    hexes.add(w[10])
for n, rs in v.items():
    print(f"{n:8s} median step_s {statistics.median(r[0] for r in rs):.3f} "
          f"(low {min(r[0] for r in rs):.3f}, high {max(r[0] for r in rs):.3f}) "
          f"comm_exposed_s {statistics.median(r[1] for r in rs):.3f} "
          f"cpu_s_per_step {statistics.median(r[2] for r in rs):.3f}")
print("last loss_hex the same in every run" if len(hexes) == 1 else f"last loss_hex differs: {hexes}")
PY
