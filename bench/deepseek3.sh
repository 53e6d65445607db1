#!/usr/bin/env bash
# DeepSeek-V3's architecture (configs/deepseek3-tiny.yml), in one run:
#
# 1. MaxText's sharding table on 2 hosts x 2 devices over loopback TLS
#    (4 devices on the machine's cores; OpenBLAS 1 thread each, the
#    README's rule), fsdp across the hosts in all three:
#      fsdp4       dcn_fsdp=2 ici_fsdp=2
#      fsdp2+tp2   dcn_fsdp=2 ici_tensor=2
#      fsdp2+tpt2  dcn_fsdp=2 ici_tensor_transpose=2
#    Per run: the mean step time over steps >= 1, CPU seconds of all its
#    processes per step, each host's agent's peak resident memory (VmHWM
#    from /proc/PID/status, polled while it runs), the DCN bytes per step
#    and the share of device 0's step spent waiting in collectives.
# 2. Latent attention against grouped-query attention of the same width
#    (the same d_model, heads and q/k head dim Dn + Dr, as many kv heads
#    as query heads, v head dim = Dn + Dr): the mean step time on one
#    device, and the model's activation allocation per device (`meshrun
#    shardings`: every layer's saved activations and backward scratch)
#    beside the process's peak resident memory.
#
# ROUNDS rounds (default 3), runs interleaved; medians of the step times.
# Extra key=value arguments go to every run (e.g. a wider model).
# usage: [ROUNDS=N] bench/deepseek3.sh [STEPS] [key=value ...]
set -eu
cd "$(dirname "$0")/.."
steps=${1:-12}
shift || true
extra="$*"
rounds=${ROUNDS:-3}
make -s all
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
. bench/hwm.sh
cfg=configs/deepseek3-tiny.yml
echo "load average at start: $(cat /proc/loadavg)"
avg() { # mean of a metrics field over steps >= 1
  python3 -c "import json; r=[json.loads(l) for l in open('$1')][1:]; print('%.4f' % (sum(x['$2'] for x in r)/len(r)))"; }
# run NAME ARGS...: `local` on 2 hosts x 2 devices, polling its agents' VmHWM
run() {
  local name=$1; shift
  /usr/bin/time -f "%U %S" -o $tmp/$name.cpu \
    build/meshrun local --hosts 2 --devices-per-host 2 --config $cfg steps=$steps per_device_batch_size=2 \
    $extra "$@" --metrics $tmp/$name.jsonl >$tmp/$name.log 2>&1 &
  local pid=$! h0 h1
  hwm_poll $pid 0.1
  h0=$hwm0 h1=$hwm1
  wait $pid || { cat $tmp/$name.log; exit 1; }
  local t cpu dcn wait; t=$(avg $tmp/$name.jsonl step_time_s)
  cpu=$(awk -v n=$steps '{printf "%.3f", ($1 + $2) / n}' $tmp/$name.cpu)
  dcn=$(avg $tmp/$name.jsonl dcn_bytes); wait=$(avg $tmp/$name.jsonl comm_wait_s)
  echo "$name $t $cpu" >> $tmp/times
  printf "%-12s %8s %8s %7s %7s %12.0f %8.1f%%\n" "$name" "$t" "$cpu" $h0 $h1 "$dcn" \
    "$(python3 -c "print(100 * $wait / $t)")"
}
# one NAME ARGS...: `train` on one device (OpenBLAS 1 thread, as a device of part 1)
one() {
  local name=$1; shift
  /usr/bin/time -f "%M" -o $tmp/$name.rss build/meshrun train --config $cfg steps=$steps openblas_threads=1 \
    $extra "$@" --quiet --metrics $tmp/$name.jsonl >$tmp/$name.log 2>&1 || { cat $tmp/$name.log; exit 1; }
  echo "$name $(avg $tmp/$name.jsonl step_time_s) 0" >> $tmp/times
}
actbytes() { # the model's activation allocation on one device
  build/meshrun shardings --config $cfg --hosts 1 --devices-per-host 1 $extra "$@" |
    sed -n 's/^model activations and backward scratch: \([0-9]*\) bytes.*/\1/p'; }
h2="dcn_data_parallelism=1 ici_data_parallelism=1 dcn_fsdp_parallelism=2"
key() { # KEY's value: the last of the extra arguments that sets it, else the config's
  local v; v=$(printf '%s\n' $extra | sed -n "s/^$1=//p" | tail -1)
  [ -n "$v" ] && echo "$v" || sed -n "s/^$1: //p" $cfg; }
gqa="attention_type=global head_dim=$(( $(key qk_nope_head_dim) + $(key qk_rope_head_dim) ))"
echo "part 1: 2 hosts x 2 devices, $steps steps, global batch 8 (extra: ${extra:-none})"
printf "%-12s %8s %8s %7s %7s %12s %9s\n" run step_s cpu_s h0_MiB h1_MiB dcn_B/step comm_wait
for r in $(seq "$rounds"); do
  run fsdp4 $h2 ici_fsdp_parallelism=2
  run fsdp2+tp2 $h2 ici_tensor_parallelism=2
  run fsdp2+tpt2 $h2 ici_tensor_transpose_parallelism=2
  one mla
  one gqa $gqa
done
echo "part 2: one device, per_device_batch_size from the config, $gqa for gqa"
printf "%-5s %8s %16s %12s\n" attn step_s activations_B peak_rss_MiB
for n in mla gqa; do
  [ $n = mla ] && a=$(actbytes) || a=$(actbytes $gqa)
  printf "%-5s %8s %16s %12s\n" $n "$(avg $tmp/$n.jsonl step_time_s)" "$a" "$(( $(cat $tmp/$n.rss) / 1024 ))"
done
echo "median step_s over $rounds round(s), and the ratio to the first row of its part:"
python3 - $tmp/times <<'PY'
import collections, statistics, sys
t = collections.defaultdict(list)
for l in open(sys.argv[1]):
    n, v, _ = l.split()
    t[n].append(float(v))
base = {}
for n in t:
    part = "one" if n in ("mla", "gqa") else "mesh"
    m = statistics.median(t[n])
    base.setdefault(part, m)
    print("  %-12s %7.4f  x%.2f   (%s)" % (n, m, m / base[part], " ".join("%.4f" % x for x in t[n])))
PY
echo "load average at end: $(cat /proc/loadavg)"
