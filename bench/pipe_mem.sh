#!/usr/bin/env bash
# Pipeline memory, and FSDP / ZeRO-1 beside the pipeline: the seed's two
# cases in shape, on configs/llama-bench.yml, 2 hosts x 2 devices on
# loopback (4 devices on 2 cores: OpenBLAS gets 1 thread each, the
# README's rule), in one run:
#   fsdp4    FSDP over 4 devices, no pipeline   (dcn_fsdp=2 ici_fsdp=2)
#   fsdp+pp  S=2 (a stage a host) x FSDP=2, M=8  (dcn_pipeline=2 ici_fsdp=2)
#   zero4    ZeRO-1 over data=4, no pipeline    (dcn_data=2 ici_data=2)
#   zero+pp  S=2 x data=2 with ZeRO-1, M=8
# Pipelines run 2 layers a stage (R=1).
# Per run: the mean step time over steps >= 1, the CPU seconds of all its
# processes per step (user + system over the whole run / steps: steadier
# than step time on a shared machine), each host's agent's peak resident
# memory (VmHWM from /proc/PID/status, read while it runs), and
# where the time goes (bench/pipe_mem.py on --trace, last round). With
# BEFORE=BIN, the two pipelined runs also on that binary (memory before a
# change). ROUNDS rounds (default 1), the runs interleaved; then the
# median step time of each.
# usage: [BEFORE=BIN] [ROUNDS=N] bench/pipe_mem.sh [STEPS]
set -eu
cd "$(dirname "$0")/.."
steps=${1:-3}
rounds=${ROUNDS:-1}
make -s all
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
. bench/hwm.sh
cfg=configs/llama-bench.yml
avg() { # mean of a metrics field over steps >= 1
  python3 -c "import json; r=[json.loads(l) for l in open('$1')][1:]; print('%.2f' % (sum(x['$2'] for x in r)/len(r)))"; }
# run NAME BIN ARGS...: runs `local`, polls its agents' VmHWM every 0.2 s
run() {
  local name=$1 bin=$2; shift 2
  /usr/bin/time -f "%U %S" -o $tmp/$name.cpu \
    "$bin" local --hosts 2 --devices-per-host 2 --config $cfg steps=$steps "$@" \
    --metrics $tmp/$name.jsonl --trace $tmp/$name.json >$tmp/$name.log 2>&1 &
  local pid=$! h0 h1
  hwm_poll $pid 0.2
  h0=$hwm0 h1=$hwm1
  wait $pid || { cat $tmp/$name.log; exit 1; }
  local t cpu; t=$(avg $tmp/$name.jsonl step_time_s)
  cpu=$(awk -v n=$steps '{printf "%.2f", ($1 + $2) / n}' $tmp/$name.cpu)
  echo "$name $t $cpu" >> $tmp/times
  printf "%-16s %8s %8s  h0=%s h1=%s\n" "$name" "$t" "$cpu" $h0 $h1
}
fsdp4="dcn_data_parallelism=1 ici_data_parallelism=1 dcn_fsdp_parallelism=2 ici_fsdp_parallelism=2"
fsdppp="dcn_data_parallelism=1 ici_data_parallelism=1 dcn_pipeline_parallelism=2 ici_fsdp_parallelism=2
 num_layers_per_pipeline_stage=2 num_pipeline_microbatches=8"
zero4="dcn_data_parallelism=2 ici_data_parallelism=2 shard_optimizer_over_data=true"
zeropp="dcn_data_parallelism=1 ici_data_parallelism=2 dcn_pipeline_parallelism=2 shard_optimizer_over_data=true
 num_layers_per_pipeline_stage=2 num_pipeline_microbatches=8"
printf "%-16s %8s %8s  %s\n" run step_s cpu_s "peak resident MiB per host (VmHWM)"
for r in $(seq "$rounds"); do
  run fsdp4 build/meshrun $fsdp4
  run fsdp+pp build/meshrun $fsdppp
  [ -n "${BEFORE:-}" ] && run fsdp+pp-before "$BEFORE" $fsdppp
  run zero4 build/meshrun $zero4
  run zero+pp build/meshrun $zeropp
  [ -n "${BEFORE:-}" ] && run zero+pp-before "$BEFORE" $zeropp
done
echo "median step_s and cpu_s over $rounds round(s):"
python3 - $tmp/times <<'PY'
import collections, statistics, sys
t, c = collections.defaultdict(list), collections.defaultdict(list)
for l in open(sys.argv[1]):
    n, v, u = l.split()
    t[n].append(float(v))
    c[n].append(float(u))
for n in t:
    print("  %-16s %6.2f %6.2f   (%s)" % (n, statistics.median(t[n]), statistics.median(c[n]),
                                        " ".join("%.2f" % x for x in t[n])))
PY
for n in fsdp4 fsdp+pp zero4 zero+pp; do
  echo "$n: seconds of a step per device (last round)"
  bench/pipe_mem.py $tmp/$n.json
done
