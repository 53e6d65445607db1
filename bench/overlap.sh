#!/usr/bin/env bash
# Issue 20's benchmark: does a sharded step cost what one device's step
# costs, and what does Muon cost beside AdamW. configs/llama-bench.yml,
# the same per-device batch (8) and one OpenBLAS thread per device
# everywhere; agents on loopback TLS. In one run, rounds interleaved:
#   single device; data over 2 hosts with the buckets summed during the
#   backward (grad_bucket_mb=25, the default) and after it
#   (grad_bucket_mb=0, the order before issue 20); FSDP 2x2; ZeRO-1 over
#   2 hosts, its buckets reduce-scattered during the backward and its
#   parameters gathered per bucket (grad_bucket_mb=25) against the
#   whole-seg reduce-scatter and gather (grad_bucket_mb=0); FSDP 2x2
#   the same way (0: the next step's first gathers not started by the
#   update); FSDP + pipeline (2 hosts x 2: stage over the host's two
#   devices, fsdp over the hosts); Muon and AdamW under FSDP=4 (1 host x
#   4 devices), optimizer time from the trace; PyTorch DDP over gloo
#   (bench/torch_llama.py --ddp 2) beside meshrun's data parallelism;
#   the seed's shard-exp-on-fsdp claim: configs/deepseek-tiny.yml with
#   Muon on 2 hosts x 2 devices, custom_mesh_and_rule=shard-exp-on-fsdp
#   against plain fsdp=4 and fsdp=2 x expert=2 (step, optimizer time and
#   muon_bytes, the bytes devices sent each other for Muon, per step),
#   each with Muon's owners balanced by size (muon_assign=size, the
#   default) and round robin (muon_assign=round_robin), with the busiest
#   and least busy device's Newton-Schulz GFLOP a step.
#   FSDP 2x2 beside ZeRO-1 (data 2 x fsdp 2) and Muon under FSDP=4, each
#   with grad_bucket_mb=0 beside it (the next step's first FSDP gathers
#   not started by the update).
# Two baselines: "single device" (one process alone on the machine) and
# "single x2 at once" (two independent single-device processes started
# together, the same config: each core computes while the other does, as
# in data=2 over 2 hosts; its step s and CPU are the two processes'
# means). ratio and cpu_x compare with the first, ratio2 and cpu_x2 with
# the second (the 4-device rows with the pair measured beside them).
# Each line: step s (mean of steps >= 1), ratio to the single device,
# comm_exposed_s (device 0, mean; every wait, the loss and norm sums'
# for the other host too), bkt_wait (the part of it spent waiting for
# gradient buckets, from the trace), comm_background_s, CPU s per step
# per device (user + sys of every process of the run, start-up included,
# / steps / devices) and its ratio to the single device's, peak memory
# (peak_mem_mb: host 0's process, which holds its devices-per-host
# devices; max over the steps), optimizer s per step (device 0's
# "optimizer" spans), the load average.
# OVERLAP_THREADS=1: each run's CPU by thread (mr-dev0 or exe: the
#   device's compute and its synchronous collectives; mr-comm: the
#   background collectives; mr-stream: the links' reads; mr-net, meshrun:
#   the agent), from /proc/PID/task/*/{schedstat,status} sampled every
#   20 ms between the first and the last metrics line (steps 1..STEPS-1),
#   per step and device (summed over the run's processes): run s,
#   run-queue wait s, voluntary and involuntary switches.
# OLD2_MESHRUN=BIN: a second build to compare with, in the same rounds:
#   FSDP 2x2 (fsdpold2) and fsdp=4 AdamW (f4adamwold2) (issue 20's ovl5:
#   ovl4's window, which staged column-split blocks, against OLD = main
#   and this build).
# Columns msgs and copies (clock-free): `messages` (sends posted by host
#   0's devices a step) and `window_copies` (floats the FSDP window of
#   device 0 copied a step, millions) from --metrics, "-" for a build
#   without them.
# OVERLAP_PERF=1: each run under `perf record -F 499` (start-up
#   included), its samples by thread and kind (sgemm kernel, BLAS
#   packing, copies memcpy/memmove/memset, AES (libcrypto, libssl),
#   kernel, the rest) in CPU s per device per step.
# usage: bench/overlap.sh [STEPS] [ROUNDS] [OLD_MESHRUN] [ONLY]
#   OLD_MESHRUN: a build to compare with, run in the same rounds ("" for
#   none): data=2 (dpold) and ZeRO-1 data=2 (zero1old) with buckets,
#   FSDP 2x2 (fsdpold), FSDP + pipeline (fsdpppold), fsdp=4 AdamW
#   (f4adamwold),
#   Muon under fsdp=4 (f4old; last session: Muon on every device
#   that shares a matrix, before host/optim/muon.c) and ZeRO-1 x fsdp 2x2
#   (zfsdpold; main before the first FSDP gathers were started beside
#   ZeRO-1 and by Muon's update: the A/B of that change alone). ONLY: an extended regex of the runs to make (names:
#   dp dp0 dpold fsdp fsdp0 fsdpold zero1 zero10 zero1old zfsdp zfsdp0 zfsdpold fsdppp
#   fsdpppold f4adamw f4adamwold fsdpold2 f4adamwold2
#   f4muon f4muon0 f4old torch dsexpsize dsexpround_robin, the same for dsfsdp
#   and dsep; the single device always runs); default: every run but
#   torch and the ds rows (issue 20's table, about 5 minutes idle);
#   "." for all of them, e.g.
#   bench/overlap.sh                                       (issue 20's table)
#   bench/overlap.sh 4 1 "" '^(zero1|zero10|fsdp|fsdp0)$'   (ZeRO-1, FSDP)
#   bench/overlap.sh 4 1 "" '^(f4|ds)'                     (the Muon rows)
set -eu
cd "$(dirname "$0")/.."
steps=${1:-4}; rounds=${2:-1}; old=${3:-}; old2=${OLD2_MESHRUN:-}
only=${4:-'^(dp|dp0|fsdp|fsdp0|zero1|zero10|zfsdp|zfsdp0|fsdppp|f4adamw|f4muon|f4muon0)$'}
want() { case $1 in one|one4|two*) return 0 ;; esac; echo "$1" | grep -Eq -- "$only"; }
make -s all
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# copies: a rebuild while this runs does not change what it measures
cp build/meshrun $tmp/meshrun; B=$tmp/meshrun; C=configs/llama-bench.yml
[ -z "$old" ] || { cp "$old" $tmp/old-meshrun; old=$tmp/old-meshrun; }
[ -z "$old2" ] || { cp "$old2" $tmp/old2-meshrun; old2=$tmp/old2-meshrun; }
avg() { python3 -c "
import json; r=[json.loads(l) for l in open('$1')][1:]
print('%.4f' % (sum(x.get('$2', 0) for x in r) / len(r)))"; }
# avgm FILE KEY SCALE: avg of KEY over steps >= 1, divided by SCALE; "-"
# when no line has it
avgm() { python3 -c "
import json; r=[json.loads(l) for l in open('$1')][1:]
print('%.2f' % (sum(x['$2'] for x in r) / len(r) / $3) if r and all('$2' in x for x in r) else '-')"; }
optspan() { python3 -c "
import json; e=[x for x in json.load(open('$1'))['traceEvents'] if x.get('ph')=='X' and x['tid']==0
  and x['name']=='optimizer' and x['args']['step']>=1]
print('%.4f' % (sum(x['dur'] for x in e) / len(e) * 1e-6))"; }
cat >$tmp/pkind.py <<'PYEOF'
# pkind.py PERFDATA STEPS NDEV: perf samples (499 Hz) by thread and kind,
# CPU s per device per step (start-up included)
import collections, subprocess, sys
f, steps, nd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = subprocess.run(['perf', 'report', '-i', f, '--no-children', '--sort', 'comm,dso,sym', '--stdio',
                      '-F', 'sample,comm,dso,sym'], capture_output=True, text=True).stdout
kinds = ['sgemm', 'blas_pack', 'copies', 'aes', 'kernel', 'rest', 'all']
t = collections.defaultdict(collections.Counter)
for l in out.splitlines():
    p = l.split()
    if len(p) < 4 or not p[0].isdigit() or l.lstrip().startswith('#'): continue
    n, comm, dso, sym = int(p[0]), p[1], p[2], p[-1]
    comm = comm.rstrip('0123456789') if comm.startswith(('mr-comm', 'mr-stream')) else comm
    k = ('kernel' if '[k]' in l else 'sgemm' if 'sgemm_kernel' in sym or 'sgemm_small' in sym
         else 'blas_pack' if 'openblas' in dso else 'aes' if 'crypto' in dso or 'ssl' in dso or 'IPSec_MB' in dso
         else 'copies' if any(x in sym for x in ('memmove', 'memcpy', 'memset')) else 'rest')
    t[comm][k] += n
    t[comm]['all'] += n
print('    %-10s' % 'thread' + ''.join('%10s' % k for k in kinds) + '   (perf, s/device/step)')
for comm, c in sorted(t.items(), key=lambda x: -x[1]['all']):
    if c['all'] / 499 / steps / nd >= 0.002:
        print('    %-10s' % comm + ''.join('%10.3f' % (c[k] / 499 / steps / nd) for k in kinds))
PYEOF
# bkt_wait: device 0's waits for its gradient buckets ("grads ..." and
# ZeRO-1's "zero ..." spans on its own track), s per step >= 1
bktwait() { python3 -c "
import json; e=[x for x in json.load(open('$1'))['traceEvents'] if x.get('ph')=='X' and x['tid']==0
  and x['args'].get('step', 0)>=1]
w=sum(x['dur'] for x in e if x['name'].startswith(('grads ', 'zero ')))
print('%.4f' % (w / max(1, len({x['args']['step'] for x in e})) * 1e-6))"; }
# run NAME BIN ARGS...: one run, its metrics, trace and CPU time, and
# its devices (--hosts x --devices-per-host)
run() {
  name=$1; bin=$2; shift 2
  want $name || return 0
  echo "$@" | awk '{h=1; d=1; for (i = 1; i < NF; i++) { if ($i == "--hosts") h = $(i+1);
    if ($i == "--devices-per-host") d = $(i+1) } print h * d}' >$tmp/$name.nd
  rm -f $tmp/$name.jsonl
  ${OVERLAP_PERF:+perf record -q -F 499 -o $tmp/$name.perf --} \
    /usr/bin/time -f "%U %S" -o $tmp/$name.cpu $bin "$@" steps=$steps openblas_threads=1 \
    --metrics $tmp/$name.jsonl $( [ "$1" = local ] && echo --trace $tmp/$name.json ) >/dev/null 2>$tmp/$name.err &
  local pid=$!
  [ -z "${OVERLAP_THREADS:-}" ] || python3 bench/thread_sample.py names $pid $tmp/$name.jsonl $steps $(cat $tmp/$name.nd) >$tmp/$name.thr || true
  wait $pid || { echo "$name failed:"; tail -3 $tmp/$name.err; return 1; }
}
# run2 NAME ARGS...: two single-device runs of ARGS started together
# (NAME.a, NAME.b); NAME's steps and CPU are both runs' (CPU their mean)
run2() {
  local n=$1; shift
  run $n.a $B "$@" & local pa=$!
  run $n.b $B "$@" & local pb=$!
  wait $pa && wait $pb || return 1
  echo 1 >$tmp/$n.nd
  # avg() drops the first line (step 0): one step 0, then both runs' steps >= 1
  python3 -c "
import json; r=[[json.loads(l) for l in open('$tmp/$n.'+f+'.jsonl')] for f in ('a', 'b')]
print('\n'.join(json.dumps(x) for x in [r[0][0]] + r[0][1:] + r[1][1:]))" >$tmp/$n.jsonl
  cat $tmp/$n.a.cpu $tmp/$n.b.cpu | awk '{u += $1; s += $2} END {print u / 2, s / 2}' >$tmp/$n.cpu
  if [ -f $tmp/$n.a.thr ]; then cat $tmp/$n.a.thr $tmp/$n.b.thr; fi >$tmp/$n.thr
  if [ -n "${OVERLAP_PERF:-}" ]; then python3 $tmp/pkind.py $tmp/$n.a.perf $steps 1; fi >$tmp/$n.pk
}
peak() { python3 -c "
import json; print(max(json.loads(l).get('peak_mem_mb', 0) for l in open('$1')))"; }
cpuof() { awk -v s=$steps -v n=$(cat $tmp/$1.nd) '{printf "%.3f", ($1 + $2) / s / n}' $tmp/$1.cpu; }
row() { # NAME LABEL BASE_S [BASE2_S: the pair's, default $two]
  local t cpu nd opt="-" bw="-" b2=${4:-$two} c2
  want $1 || return 0
  t=$(avg $tmp/$1.jsonl step_time_s)
  nd=$(cat $tmp/$1.nd)
  cpu=$(cpuof $1)
  [ -f $tmp/$1.json ] && opt=$(optspan $tmp/$1.json) && bw=$(bktwait $tmp/$1.json)
  onecpu=$(cpuof one); c2=$(cpuof two); [ -z "${4:-}" ] || c2=$(cpuof two4)
  printf "%-42s %7.3f %6.2f %6.2f %9s %8s %9s %8s %6.2f %6.2f %7s %8s %7s %7s  %s\n" "$2" "$t" "$(python3 -c "print($t/$3)")" \
    "$(python3 -c "print($t/$b2)")" "$(avg $tmp/$1.jsonl comm_exposed_s)" "$bw" "$(avg $tmp/$1.jsonl comm_background_s)" \
    "$cpu" "$(python3 -c "print($cpu/$onecpu)")" "$(python3 -c "print($cpu/$c2)")" "$(peak $tmp/$1.jsonl)" \
    "$opt" "$(avgm $tmp/$1.jsonl messages 1)" "$(avgm $tmp/$1.jsonl window_copies 1e6)" "$(cut -d' ' -f1-3 /proc/loadavg)"
  [ ! -s $tmp/$1.thr ] || cat $tmp/$1.thr
  if [ -n "${OVERLAP_PERF:-}" ]; then
    if [ -f $tmp/$1.pk ]; then cat $tmp/$1.pk; else python3 $tmp/pkind.py $tmp/$1.perf $steps $nd; fi
  fi
}
t0=$(date +%s)
echo "meshrun $(git rev-parse --short HEAD 2>/dev/null), $steps steps, $rounds round(s), load $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-42s %7s %6s %6s %9s %8s %9s %8s %6s %6s %7s %8s %7s %7s  %s\n" run step_s ratio ratio2 exposed_s bkt_wait backgr_s \
  cpu_dev cpu_x cpu_x2 peak_mb opt_s msgs copies load
for r in $(seq 1 "$rounds"); do
  echo "-- round $r"
  run one $B train --config $C
  one=$(avg $tmp/one.jsonl step_time_s)
  run2 two train --config $C
  two=$(avg $tmp/two.jsonl step_time_s)
  row one "single device" $one
  row two "single x2 at once (2 processes)" $one
  run dp $B local --hosts 2 --config $C grad_bucket_mb=25; row dp "data=2, buckets during backward" $one
  run dp0 $B local --hosts 2 --config $C grad_bucket_mb=0; row dp0 "data=2, sums after backward" $one
  if [ -n "$old" ]; then
    run dpold "$old" local --hosts 2 --config $C grad_bucket_mb=25; row dpold "data=2, buckets, OLD_MESHRUN" $one
  fi
  run fsdp $B local --hosts 2 --devices-per-host 2 --config $C ici_data_parallelism=1 \
    dcn_data_parallelism=1 dcn_fsdp_parallelism=2 ici_fsdp_parallelism=2
  run one4 $B train --config $C   # the single device again, beside the 4-device runs
  one4=$(avg $tmp/one4.jsonl step_time_s)
  run2 two4 train --config $C   # and the pair again
  two4=$(avg $tmp/two4.jsonl step_time_s)
  row two4 "single x2 at once, again" $one4 $two4
  row fsdp "fsdp 2x2 (4 devices, 2 cores)" $one4 $two4
  if [ -n "$old" ]; then
    run fsdpold "$old" local --hosts 2 --devices-per-host 2 --config $C ici_data_parallelism=1 \
      dcn_data_parallelism=1 dcn_fsdp_parallelism=2 ici_fsdp_parallelism=2
    row fsdpold "fsdp 2x2, OLD_MESHRUN" $one4 $two4
  fi
  if [ -n "$old2" ]; then
    run fsdpold2 "$old2" local --hosts 2 --devices-per-host 2 --config $C ici_data_parallelism=1 \
      dcn_data_parallelism=1 dcn_fsdp_parallelism=2 ici_fsdp_parallelism=2
    row fsdpold2 "fsdp 2x2, OLD2_MESHRUN" $one4 $two4
  fi
  run fsdp0 $B local --hosts 2 --devices-per-host 2 --config $C ici_data_parallelism=1 \
    dcn_data_parallelism=1 dcn_fsdp_parallelism=2 ici_fsdp_parallelism=2 grad_bucket_mb=0
  row fsdp0 "fsdp 2x2, grad_bucket_mb=0" $one4 $two4
  run zero1 $B local --hosts 2 --config $C shard_optimizer_over_data=true; row zero1 "ZeRO-1 data=2" $one
  run zero10 $B local --hosts 2 --config $C shard_optimizer_over_data=true grad_bucket_mb=0
  row zero10 "ZeRO-1 data=2, grad_bucket_mb=0" $one
  if [ -n "$old" ]; then
    run zero1old "$old" local --hosts 2 --config $C shard_optimizer_over_data=true
    row zero1old "ZeRO-1 data=2, OLD_MESHRUN" $one
  fi
  for g in 25 0; do
    n=zfsdp; l="ZeRO-1 data=2 x fsdp=2"; [ $g = 0 ] && n=zfsdp0 && l="$l, grad_bucket_mb=0"
    run $n $B local --hosts 2 --devices-per-host 2 --config $C ici_data_parallelism=1 \
      dcn_data_parallelism=2 ici_fsdp_parallelism=2 shard_optimizer_over_data=true grad_bucket_mb=$g
    row $n "$l" $one4 $two4
  done
  if [ -n "$old" ]; then
    run zfsdpold "$old" local --hosts 2 --devices-per-host 2 --config $C ici_data_parallelism=1 \
      dcn_data_parallelism=2 ici_fsdp_parallelism=2 shard_optimizer_over_data=true
    row zfsdpold "ZeRO-1 data=2 x fsdp=2, OLD_MESHRUN" $one4 $two4
  fi
  run fsdppp $B local --hosts 2 --devices-per-host 2 --config $C ici_data_parallelism=1 \
    ici_pipeline_parallelism=2 dcn_data_parallelism=1 dcn_fsdp_parallelism=2
  row fsdppp "fsdp=2 x stage=2 (4 devices)" $one4 $two4
  if [ -n "$old" ]; then
    run fsdpppold "$old" local --hosts 2 --devices-per-host 2 --config $C ici_data_parallelism=1 \
      ici_pipeline_parallelism=2 dcn_data_parallelism=1 dcn_fsdp_parallelism=2
    row fsdpppold "fsdp=2 x stage=2, OLD_MESHRUN" $one4 $two4
  fi
  for o in adamw muon; do
    run f4$o $B local --hosts 1 --devices-per-host 4 --config $C ici_data_parallelism=1 \
      ici_fsdp_parallelism=4 opt_type=$o learning_rate=0.001
    row f4$o "fsdp=4 $o" $one4 $two4
  done
  if [ -n "$old" ]; then
    run f4adamwold "$old" local --hosts 1 --devices-per-host 4 --config $C ici_data_parallelism=1 \
      ici_fsdp_parallelism=4 opt_type=adamw learning_rate=0.001
    row f4adamwold "fsdp=4 adamw, OLD_MESHRUN" $one4 $two4
  fi
  if [ -n "$old2" ]; then
    run f4adamwold2 "$old2" local --hosts 1 --devices-per-host 4 --config $C ici_data_parallelism=1 \
      ici_fsdp_parallelism=4 opt_type=adamw learning_rate=0.001
    row f4adamwold2 "fsdp=4 adamw, OLD2_MESHRUN" $one4 $two4
  fi
  run f4muon0 $B local --hosts 1 --devices-per-host 4 --config $C ici_data_parallelism=1 \
    ici_fsdp_parallelism=4 opt_type=muon learning_rate=0.001 grad_bucket_mb=0
  row f4muon0 "fsdp=4 muon, grad_bucket_mb=0" $one4 $two4
  if [ -n "$old" ]; then
    run f4old "$old" local --hosts 1 --devices-per-host 4 --config $C ici_data_parallelism=1 \
      ici_fsdp_parallelism=4 opt_type=muon learning_rate=0.001
    row f4old "fsdp=4 muon, OLD_MESHRUN" $one4 $two4
  fi
  # PyTorch DDP over gloo, 2 processes, same model and per-process batch
  if want torch; then
    tt=$(/usr/bin/python3 bench/torch_llama.py --threads 1 --steps "$steps" --ddp 2 | tail -1)
    echo "torch DDP gloo x2: $tt; meshrun data=2 tokens/s/device $(avg $tmp/dp.jsonl tokens_per_s_per_device)"
  fi
  for m in exp fsdp ep; do
    case $m in
      exp) x="ici_fsdp_parallelism=2 custom_mesh_and_rule=shard-exp-on-fsdp" ;;
      fsdp) x="ici_fsdp_parallelism=2" ;;
      ep) x="ici_expert_parallelism=2" ;;
    esac
    for a in size round_robin; do
      run ds$m$a $B local --hosts 2 --devices-per-host 2 --config configs/deepseek-tiny.yml opt_type=muon \
        learning_rate=0.01 ici_data_parallelism=1 dcn_data_parallelism=1 dcn_fsdp_parallelism=2 $x \
        muon_assign=$a
      row ds$m$a "deepseek-tiny muon, dcn_fsdp=2 $m, $a" $one4 $two4
      if want ds$m$a; then
        echo "  muon_bytes/step $(avg $tmp/ds$m$a.jsonl muon_bytes)," \
          "Newton-Schulz GFLOP/step busiest device $(avg $tmp/ds$m$a.jsonl muon_ns_gflop_max_device)," \
          "least busy $(avg $tmp/ds$m$a.jsonl muon_ns_gflop_min_device)"
      fi
    done
  done
done
echo "took $(( $(date +%s) - t0 )) s, load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
