#!/usr/bin/env bash
# Issue 19: training on 2 hosts x 1 device (data=2, configs/llama-bench.yml,
# one OpenBLAS thread a device, loopback TLS) with the agents bound
# (cpu_bind=auto, the default) and floating (cpu_bind=none), the two
# alternating, the order swapped each round; per variant the mean step
# seconds (steps >= 1, host 0) of each round, comm_exposed_s and CPU s
# per step (user+sys of the whole run / steps), then the median over the
# rounds, with the load average. Also checks the two give the same loss_hex.
# DPH=2: 2 hosts x 2 devices (data=4) instead.
# SHAPE (issue 20/21, spread13): pipe41 = 4 hosts x 1 device, a pipeline
# of 4 stages (interleaved_1f1b, v = 2, 8 layers, sequence 128, 8
# microbatches of 2 rows, no recompute: bench/sched_sleep.sh's 4x1 run
# with real compute); fsdp22 = 2 hosts x 2 devices, fsdp 2 x 2
# (bench/overlap.sh's fsdp22 keys); dp41 = 4 hosts x 1 device, data=4. A, B: the two variants as NAME=KEY
# (default bound=cpu_bind=auto, unbound=cpu_bind=none), or as
# NAME|ENV|BIN|KEYS (ENV: VAR=VALUE ...; BIN: default build/meshrun;
# KEYS: key=value ...) to weigh builds or A/B hooks, e.g.
#   SHAPE=pipe41 A=spread=cpu_bind=spread B=none=cpu_bind=none bench/bind_train.sh 3 5
#   SHAPE=pipe41 A='old|MESHRUN_YIELD_RULE=old||cpu_bind=none' B='new|||cpu_bind=none' bench/bind_train.sh 3 5
# ~30 s a run on an idle 2-vCPU machine.
# usage: [DPH=1|2] [SHAPE=pipe41|fsdp22|dp41] [A=N=K B=N=K] bench/bind_train.sh [ROUNDS] [STEPS]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-6}
make -s all
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=build/bind_train.log
: > "$out"
shape="--hosts 2 --devices-per-host ${DPH:-1}"
case ${SHAPE:-} in
  "") ;;
  pipe41) shape="--hosts 4 --devices-per-host 1 base_num_decoder_layers=8 max_target_length=128
    ici_data_parallelism=1 dcn_data_parallelism=1 pipeline_recompute=false dcn_pipeline_parallelism=4
    per_device_batch_size=4 pipeline_schedule=interleaved_1f1b num_pipeline_microbatches=8
    num_layers_per_pipeline_stage=1" ;;
  fsdp22) shape="--hosts 2 --devices-per-host 2 ici_data_parallelism=1 dcn_data_parallelism=1
    dcn_fsdp_parallelism=2 ici_fsdp_parallelism=2" ;;
  dp41) shape="--hosts 4 --devices-per-host 1" ;;
  *) echo "bind_train.sh: SHAPE $SHAPE: not pipe41, fsdp22 or dp41" >&2; exit 1 ;;
esac
a=${A:-bound=cpu_bind=auto}
b=${B:-unbound=cpu_bind=none}
one() { # VARIANT ROUND
  local name envs bin keys
  case $1 in
    *"|"*) IFS='|' read -r name envs bin keys <<<"$1" ;;
    *) name=${1%%=*} envs="" bin="" keys=${1#*=} ;;
  esac
  # shellcheck disable=SC2086
  env $envs /usr/bin/time -f "%U %S" -o "$tmp/$name.cpu" "${bin:-build/meshrun}" local $shape \
    --config configs/llama-bench.yml steps="$steps" openblas_threads=1 $keys \
    --metrics "$tmp/$name.$2.jsonl" > /dev/null 2>&1
  /usr/bin/python3 - "$tmp/$name.$2.jsonl" "$tmp/$name.cpu" "$name" "$2" "$steps" <<'PY' | tee -a "$out"
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
  echo "# round $round load $(cat /proc/loadavg)" | tee -a "$out"
  if [ $((round % 2)) = 1 ]; then one "$a" "$round"; one "$b" "$round"
  else one "$b" "$round"; one "$a" "$round"; fi
done
echo "# end load $(cat /proc/loadavg)" | tee -a "$out"
/usr/bin/python3 - "$out" <<'PY'
import statistics, sys
v = {}
hexes = set()
for l in open(sys.argv[1]):
    if l.startswith("#"):
        continue
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
