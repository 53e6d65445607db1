#!/usr/bin/env bash
# Pipeline schedules side by side (issue 21): llama-bench with 8 layers
# (sequence 128 to keep a run short) on 4 stages, placed 4 hosts x 1
# device (a stage a host: every hop over loopback TLS) and 2 hosts x 2
# devices (2 stages a host), M in {4, 8, 16} microbatches of a 16-row
# global batch, for circular (2 repeats), gpipe and 1f1b (2 layers a
# stage), interleaved_1f1b (2 chunks of 1 layer a stage), and the
# zero-bubble zb_h1 (2 layers a stage, as 1f1b) and zbv (2 chunks of 1
# layer a stage in a V, as interleaved_1f1b); recompute on (the default;
# KV="pipeline_recompute=false" adds keys to every run). Per run: the
# mean step time over steps >= 1; the bubble measured from --trace
# (bench/sched.py, steps >= 1), two ways: as a share (a device's idle
# share between its own first and last compute action, the worst
# device) and in seconds as the issue states it (a device's idle seconds
# in the step's compute span, the worst device and each device), with a
# zero-bubble run's ratio to its baseline's in the same run (zb_h1 to
# 1f1b, zbv to interleaved_1f1b: run the baseline first) on both, and the
# worst device's receive waits that an owed W could have filled; the
# compute's CPU seconds a step by action kind (the trace's args.cpu_us)
# against plan's `work by action:`; each host's agent's peak resident
# memory (VmHWM); the agents'
# CPU seconds a step (after step 0) against plan's `work:` (the half of
# the check the machine's other load does not move: the compute it
# models); and `meshrun plan`'s prediction made right before the run (--cores auto: the cores
# the four devices get now; the link measured at the start with `meshrun
# bench link`), with the error in percent. Prints the load average before
# each run. All devices share this machine's cores, as `meshrun local`
# runs them. Also per run: the mean wall milliseconds of each action kind
# (the F, I, W ratio the run had), the schedule's formula at those costs
# (idle seconds a device and bubble share, then the idle seconds at
# the actions' CPU costs: a core a stage; gpipe, 1f1b, interleaved_1f1b,
# zb_h1), the worst device's idle over it, and each device's idle split
# into waiting for a message and queued (runnable, not running: its
# thread's /proc schedstat run-delay outside its compute spans), with the
# descheduled seconds inside its compute spans (bench/sched.py).
# Mesh 2x1: 2 stages on 2 hosts x 1 device, a core a stage on this
# machine (per-device batch 8, so the same 16 rows; 4 layers a stage, or
# 2 chunks of 2). ROUNDS=n runs the whole M x schedule list n times, the
# rounds interleaved (load drifts over all schedules alike); NOPLAN=1
# skips `meshrun plan` (its columns print -).
# usage: [BIN=meshrun] [KV="key=value ..."] [ROUNDS=1] [NOPLAN=1] bench/sched.sh [STEPS] [MESHES] [MS] [SCHEDS]
#   e.g. bench/sched.sh 3 "4x1 2x2" "4 8 16" "circular gpipe 1f1b interleaved_1f1b zb_h1 zbv"
#   a schedule written SCHED/fill runs with pipeline_fill_waits=true (zb_h1,
#   zbv: owed W's in receive waits), SCHED/nofill with false (the default),
#   e.g. "1f1b zb_h1 zb_h1/fill"; SCHED/noprepost runs with each receive
#   posted at its place (MESHRUN_PIPE_PREPOST=0), not ahead (the default);
#   SCHED/one with one receive posted ahead at a time and no landing
#   buffers (MESHRUN_PIPE_PREPOST=1 MESHRUN_PIPE_LANDING=0: zb3's posting);
#   SCHED/base with the binary $BASE (required then: a build of the
#   commit before the change), for an A/B in one run; SCHED/niceN with
#   device_nice=N (the device threads' nice value; default 10), SCHED/batch
#   with device_nice=0 device_batch=true (SCHED_BATCH), SCHED/KEY=V[+KEY=V]
#   with those keys (e.g. 1f1b/p2p_handoff_bytes=0), SCHED/MESHRUN_X=V[+...]
#   with those in the environment (e.g. 1f1b/MESHRUN_PIPE_YIELD=1)
# (BIN: a copy of build/meshrun, to keep building while it runs)
# (KEEP=DIR: keep every run's trace, metrics, log and schedstat samples in DIR)
set -eu
cd "$(dirname "$0")/.."
steps=${1:-3}
meshes=${2:-"4x1 2x2"}
ms=${3:-"4 8 16"}
scheds=${4:-"circular gpipe 1f1b interleaved_1f1b zb_h1 zbv"}
bin=${BIN:-build/meshrun}
[ -n "${BIN:-}" ] || make -s all
tmp=$(mktemp -d)
# KEEP=DIR: the runs' traces, metrics, logs and schedstat samples copied there
if [ -n "${KEEP:-}" ]; then
  mkdir -p "$KEEP"; trap 'cp -r "$tmp"/. "$KEEP"/; rm -rf "$tmp"' EXIT
else
  trap 'rm -rf "$tmp"' EXIT
fi
. bench/sched_env.sh  # $model, and the link: $lat_us, $gbps
rounds=${ROUNDS:-1}

# run NAME HOSTS DPH ARGS...: `local`, polling each agent's VmHWM, its
# CPU ticks and its device threads' schedstat (to $tmp/NAME.ss: wall,
# device, CPU ns, run-delay ns, steps logged)
run() {
  local name=$1 hosts=$2 dph=$3; shift 3
  "${RUN_BIN:-$bin}" local --hosts $hosts --devices-per-host $dph $model steps=$steps "$@" \
    --metrics $tmp/$name.jsonl --trace $tmp/$name.json --quiet >$tmp/$name.log 2>&1 &
  local pid=$! peaks samples=""
  declare -A hwm=() tk=()
  while kill -0 $pid 2>/dev/null; do
    local ticks=0 logged=0 ss=""
    [ -s $tmp/$name.jsonl ] && logged=$(wc -l <$tmp/$name.jsonl)
    for a in $(pgrep -P $pid || true) $(for l in $(pgrep -P $pid || true); do pgrep -P $l || true; done); do
      h=$({ tr '\0' ' ' </proc/$a/cmdline; } 2>/dev/null | sed -n 's/.*--host-id \([0-9]*\).*/\1/p')
      m=$({ awk '/VmHWM/ {print $2}' </proc/$a/status; } 2>/dev/null || true)
      [ -n "$h" ] && [ -n "$m" ] || continue
      c=$({ awk '{print $14 + $15}' </proc/$a/stat; } 2>/dev/null || echo 0)
      [ "${tk[$a]:-0}" -lt "${c:-0}" ] && tk[$a]=$c
      m=$((m / 1024))
      [ "${hwm[$h]:-0}" -lt $m ] && hwm[$h]=$m
      for t in /proc/$a/task/*; do
        local cm="" cpu_ns delay_ns _sl
        { read -r cm <$t/comm && [[ $cm == mr-dev* ]] && read -r cpu_ns delay_ns _sl <$t/schedstat; } 2>/dev/null || continue
        ss="$ss$EPOCHREALTIME $((h * dph + ${cm#mr-dev})) $cpu_ns $delay_ns $logged"$'\n'
      done
    done
    printf "%s" "$ss" >>$tmp/$name.ss
    for a in "${!tk[@]}"; do ticks=$((ticks + tk[$a])); done
    # a sample: wall seconds, the agents' CPU ticks, the steps logged
    [ -s $tmp/$name.jsonl ] && samples="$samples $EPOCHREALTIME:$ticks:$logged"
    sleep 0.2
  done
  # (run's output is read by the caller: the log goes to stderr)
  wait $pid || { cat $tmp/$name.log >&2; echo failed; exit 1; }
  peaks=$(for h in $(seq 0 $((hosts - 1))); do printf "%s/" "${hwm[$h]:-?}"; done)
  # CPU seconds a step: the agents' CPU rate from the first sample after
  # step 0 to the last one before the last step was logged (the last step
  # is often logged right before the agents exit, after the last poll),
  # times the mean step time of steps >= 1
  echo "${peaks%/} $(python3 -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
hz = float(sys.argv[2])
s = [tuple(map(float, x.split(":"))) for x in sys.argv[3:]]
s = [x for x in s if 1 <= x[2] < len(rows)]
step = [r["step_time_s"] for r in rows[1:]]
ok = len(s) >= 2 and s[-1][0] > s[0][0] and step
print("%.2f" % ((s[-1][1] - s[0][1]) / hz / (s[-1][0] - s[0][0]) * sum(step) / len(step) if ok else -1))' \
    $tmp/$name.jsonl $(getconf CLK_TCK) $samples)"
}

printf "| mesh | M | schedule | step s | plan s | error | cpu s/step | plan cpu s | cpu error | action cpu s, measured/plan (error) | bubble share | plan share | idle s | idle s per device | zb/base idle s | zb/base share | W-fillable s | action ms | formula idle s/share/at cpu s | idle/formula | idle share of span | idle = wait+queued:desc per device | peak MiB per host | load |\n"
printf "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
declare -A base_idle=() base_share=()
for round in $(seq $rounds); do
for mesh in $meshes; do
  case $mesh in
    4x1) hosts=4 dph=1 S=4 pp="dcn_pipeline_parallelism=4 per_device_batch_size=4" ;;
    2x2) hosts=2 dph=2 S=4 pp="dcn_pipeline_parallelism=2 ici_pipeline_parallelism=2 per_device_batch_size=4" ;;
    2x1) hosts=2 dph=1 S=2 pp="dcn_pipeline_parallelism=2 per_device_batch_size=8" ;;
    *) echo "sched.sh: mesh $mesh: not 4x1, 2x2 or 2x1" >&2; exit 1 ;;
  esac
  for M in $ms; do
    for sv in $scheds; do
      # SCHED/fill, SCHED/nofill: the schedule with pipeline_fill_waits true, false
      s=${sv%/*}; fk=""; pp_env=""; land_env=""; run_bin=$bin; envv=""
      case $sv in
        */fill) fk="pipeline_fill_waits=true" ;;
        */nofill) fk="pipeline_fill_waits=false" ;;
        */noprepost) pp_env=0 ;;
        */one) pp_env=1; land_env=0 ;;
        */base) run_bin=${BASE:?SCHED/base needs BASE=a meshrun binary to compare against} ;;
        */nice[0-9]*) fk="device_nice=${sv##*/nice}" ;;
        */batch) fk="device_nice=0 device_batch=true" ;;
        */MESHRUN_*=*) envv="${sv#*/}"; envv="${envv//+/ }" ;;
        */*=*) fk="${sv#*/}"; fk="${fk//+/ }" ;;
      esac
      case $s in
        # 8 layers: 2 chunks a stage, or one
        circular) sk="num_pipeline_repeats=2 num_layers_per_pipeline_stage=$((8 / (2 * S)))" ;;
        interleaved_1f1b | zbv) sk="num_layers_per_pipeline_stage=$((8 / (2 * S)))" ;;
        *) sk="num_layers_per_pipeline_stage=$((8 / S))" ;;
      esac
      args="$pp pipeline_schedule=$s num_pipeline_microbatches=$M $sk $fk"
      load=$(cut -d' ' -f1 /proc/loadavg)
      if [ -n "${NOPLAN:-}" ]; then
        printf "predicted_step_s: nan\nwork: nan\n" >$tmp/plan
      else
        "$bin" plan $model --hosts $hosts --devices-per-host $dph $args --cores auto \
          --link-gbps "$gbps" --link-latency-us "$lat_us" >$tmp/plan 2>&1 || { cat $tmp/plan; exit 1; }
      fi
      pred=$(awk '/^predicted_step_s:/ {print $2}' $tmp/plan)
      pcpu=$(awk '/^work:/ {print $2}' $tmp/plan)
      pbub=$(sed -n "s/.*idle \([0-9.]*\) of the worst.*/\1/p" $tmp/plan)
      pbub=${pbub:-nan}
      pkind=$(sed -n 's/^work by action: \([^ ]*\) s,.*/\1/p' $tmp/plan)
      name=${mesh}_${M}_${sv//\//_}_$round
      read -r peaks cpu < <([ -z "$envv" ] || export $envv
        MESHRUN_PIPE_PREPOST=$pp_env MESHRUN_PIPE_LANDING=$land_env RUN_BIN=$run_bin run $name $hosts $dph $args)
      [ "$peaks" != failed ] || { echo "sched.sh: run $name failed (its log above)" >&2; exit 1; }
      read -r step bub idle idles kind fill costs form split sshare < <(bench/sched.py $tmp/$name.jsonl $tmp/$name.json \
        --sched $s --stages $S --schedstat $tmp/$name.ss)
      ovf=$(awk -v i="$idle" -v f="${form%%/*}" 'BEGIN {print (f > 0 ? sprintf("%.2f", i / f) : "-")}')
      # per action kind: measured/plan (error), the kinds either has
      kinds=$(python3 -c 'import sys
m = dict(kv.split("=") for kv in sys.argv[1].split(",") if "=" in kv)
p = dict(kv.split("=") for kv in sys.argv[2].split(",") if "=" in kv)
print(" ".join(f"{k} {float(m[k]):.2f}/-" if not p and k in m else
               f"{k} {float(m.get(k, 0)):.2f}/{float(p.get(k, 0)):.2f} ({100 * (float(p.get(k, 0)) - float(m[k])) / float(m[k]):+.0f}%)"
               if float(m.get(k, 0)) > 0 else f"{k} -/{float(p[k]):.2f}" for k in ("F", "B", "I", "W", "own")
               if float(m.get(k, 0)) > 0 or float(p.get(k, 0)) > 0))' "$kind" "$pkind")
      key=${mesh}_${M}
      case $s in
        # (a variant's baseline: the same variant's, else the plain one)
        1f1b | interleaved_1f1b) base_idle[$key$sv]=$idle; base_share[$key$sv]=$bub; rel="-"; rels="-" ;;
        zb_h1 | zbv)
          b=1f1b; [ $s = zbv ] && b=interleaved_1f1b
          v=${sv#$s}; bi=${base_idle[$key$b$v]:-${base_idle[$key$b]:-0}}; bs=${base_share[$key$b$v]:-${base_share[$key$b]:-0}}
          rel=$(awk -v z="$idle" -v b="$bi" 'BEGIN {print (b > 0 ? sprintf("%.2f", z / b) : "-")}')
          rels=$(awk -v z="$bub" -v b="$bs" 'BEGIN {print (b > 0 ? sprintf("%.2f", z / b) : "-")}') ;;
        *) rel="-"; rels="-" ;;
      esac
      err=$(awk -v p="$pred" -v m="$step" 'BEGIN {if (p == "nan") print "-"; else printf "%+.0f%%", 100 * (p - m) / m}')
      cerr=$(awk -v p="$pcpu" -v m="$cpu" 'BEGIN {if (p == "nan") print "-"; else printf "%+.0f%%", 100 * (p - m) / m}')
      printf "| %s | %s | %s | %.2f | %.2f | %s | %s | %.2f | %s | %s | %.3f | %.3f | %.2f | %s | %s | %s | %.2f | %s | %s | %s | %s | %s | %s | %s |\n" \
        "$mesh" "$M" "$sv" "$step" "$pred" "$err" "$cpu" "$pcpu" "$cerr" "$kinds" "$bub" "$pbub" "$idle" "$idles" \
        "$rel" "$rels" "$fill" "$costs" "$form" "$ovf" "$sshare" "$split" "$peaks" "$load"
    done
  done
done
done
