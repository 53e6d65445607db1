#!/usr/bin/env bash
# Pipeline schedules side by side (issue 21): llama-bench with 8 layers
# (sequence 128 to keep a run short) on 4 stages, placed 4 hosts x 1
# device (a stage a host: every hop over loopback TLS) and 2 hosts x 2
# devices (2 stages a host), M in {4, 8, 16} microbatches of a 16-row
# global batch, for circular (2 repeats), gpipe and 1f1b (2 layers a
# stage), interleaved_1f1b (2 chunks of 1 layer a stage); recompute on
# (the default). Per run: the mean step time over steps >= 1; the bubble
# measured from --trace (bench/sched.py: a device's idle share between
# its first and last compute action of a step, the worst device, steps
# >= 1); each host's agent's peak resident memory (VmHWM); the agents'
# CPU seconds a step (after step 0) against plan's `work:` (the half of
# the check the machine's other load does not move: the compute it
# models); and `meshrun plan`'s prediction made right before the run (--cores auto: the cores
# the four devices get now; the link measured at the start with `meshrun
# bench link`), with the error in percent. Prints the load average before
# each run. All devices share this machine's cores, as `meshrun local`
# runs them.
# usage: [BIN=meshrun] bench/sched.sh [STEPS] [MESHES] [MS] [SCHEDS]
#   e.g. bench/sched.sh 3 "4x1 2x2" "4 8 16" "circular gpipe 1f1b interleaved_1f1b"
# (BIN: a copy of build/meshrun, to keep building while it runs)
set -eu
cd "$(dirname "$0")/.."
steps=${1:-3}
meshes=${2:-"4x1 2x2"}
ms=${3:-"4 8 16"}
scheds=${4:-"circular gpipe 1f1b interleaved_1f1b"}
bin=${BIN:-build/meshrun}
[ -n "${BIN:-}" ] || make -s all
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
model="--config configs/llama-bench.yml base_num_decoder_layers=8 max_target_length=128 per_device_batch_size=4"
model="$model ici_data_parallelism=1 dcn_data_parallelism=1"

# the link: a 4 KiB message's time is the latency, 1 MiB's the bandwidth
"$bin" bench link --hosts 2 --sizes 4K,1M --iters 50 >$tmp/link 2>&1 || { cat $tmp/link; exit 1; }
lat_us=$(awk '$1 == 4096 {print $2}' $tmp/link)
gbps=$(awk -v l="$lat_us" '$1 == 1048576 {printf "%.3f", 8 * 1048576 / (($2 - l) * 1e3)}' $tmp/link)
echo "# link (bench link, loopback TLS): latency ${lat_us} us, ${gbps} Gbit/s; load $(cut -d' ' -f1-3 /proc/loadavg)"

# run NAME HOSTS DPH ARGS...: `local`, polling each agent's VmHWM
run() {
  local name=$1 hosts=$2 dph=$3; shift 3
  "$bin" local --hosts $hosts --devices-per-host $dph $model steps=$steps "$@" \
    --metrics $tmp/$name.jsonl --trace $tmp/$name.json --quiet >$tmp/$name.log 2>&1 &
  local pid=$! peaks cpu0=-1 cpu1=0 t0=0 t1=0
  declare -A hwm=() tk=()
  while kill -0 $pid 2>/dev/null; do
    local ticks=0
    for a in $(pgrep -P $pid || true) $(for l in $(pgrep -P $pid || true); do pgrep -P $l || true; done); do
      h=$({ tr '\0' ' ' </proc/$a/cmdline; } 2>/dev/null | sed -n 's/.*--host-id \([0-9]*\).*/\1/p')
      m=$({ awk '/VmHWM/ {print $2}' </proc/$a/status; } 2>/dev/null || true)
      [ -n "$h" ] && [ -n "$m" ] || continue
      c=$({ awk '{print $14 + $15}' </proc/$a/stat; } 2>/dev/null || echo 0)
      [ "${tk[$a]:-0}" -lt "${c:-0}" ] && tk[$a]=$c
      m=$((m / 1024))
      [ "${hwm[$h]:-0}" -lt $m ] && hwm[$h]=$m
    done
    for a in "${!tk[@]}"; do ticks=$((ticks + tk[$a])); done
    if [ -s $tmp/$name.jsonl ]; then
      lines=$(wc -l <$tmp/$name.jsonl)
      [ $cpu0 -lt 0 ] && { cpu0=$ticks; t0=$lines; }
      cpu1=$ticks; t1=$lines
    fi
    sleep 0.2
  done
  wait $pid || { cat $tmp/$name.log; exit 1; }
  peaks=$(for h in $(seq 0 $((hosts - 1))); do printf "%s/" "${hwm[$h]:-?}"; done)
  # CPU seconds a step: from the end of step 0 to the last poll's step count
  echo "${peaks%/} $(awk -v a=$cpu0 -v b=$cpu1 -v s=$t0 -v e=$t1 -v hz=$(getconf CLK_TCK) \
    'BEGIN {printf "%.2f", (e > s && a >= 0) ? (b - a) / hz / (e - s) : -1}')"
}

printf "| mesh | M | schedule | step s | plan s | error | cpu s/step | plan cpu s | cpu error | bubble | plan bubble | peak MiB per host | load |\n"
printf "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
for mesh in $meshes; do
  case $mesh in
    4x1) hosts=4 dph=1 pp="dcn_pipeline_parallelism=4" ;;
    2x2) hosts=2 dph=2 pp="dcn_pipeline_parallelism=2 ici_pipeline_parallelism=2" ;;
  esac
  for M in $ms; do
    for s in $scheds; do
      case $s in
        circular) sk="num_pipeline_repeats=2" ;;
        interleaved_1f1b) sk="" ;;
        *) sk="num_layers_per_pipeline_stage=2" ;;
      esac
      args="$pp pipeline_schedule=$s num_pipeline_microbatches=$M $sk"
      load=$(cut -d' ' -f1 /proc/loadavg)
      "$bin" plan $model --hosts $hosts --devices-per-host $dph $args --cores auto \
        --link-gbps "$gbps" --link-latency-us "$lat_us" >$tmp/plan 2>&1 || { cat $tmp/plan; exit 1; }
      pred=$(awk '/^predicted_step_s:/ {print $2}' $tmp/plan)
      pcpu=$(awk '/^work:/ {print $2}' $tmp/plan)
      pbub=$(sed -n "s/.*idle \([0-9.]*\) of the worst.*/\1/p" $tmp/plan)
      name=${mesh}_${M}_$s
      read -r peaks cpu < <(run $name $hosts $dph $args)
      read -r step bub < <(bench/sched.py $tmp/$name.jsonl $tmp/$name.json)
      err=$(awk -v p="$pred" -v m="$step" 'BEGIN {printf "%+.0f%%", 100 * (p - m) / m}')
      cerr=$(awk -v p="$pcpu" -v m="$cpu" 'BEGIN {printf "%+.0f%%", 100 * (p - m) / m}')
      printf "| %s | %s | %s | %.2f | %.2f | %s | %s | %.2f | %s | %.3f | %.3f | %s | %s |\n" \
        "$mesh" "$M" "$s" "$step" "$pred" "$err" "$cpu" "$pcpu" "$cerr" "$bub" "$pbub" "$peaks" "$load"
    done
  done
done
