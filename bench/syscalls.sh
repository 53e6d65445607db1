#!/usr/bin/env bash
# Clock-free counts per op of `meshrun bench collectives --hosts 2` (both
# agents, every thread) from perf's software events and tracepoints:
# system calls (all, and the ones the message path uses), context
# switches, CPU time (cpu-us: task-clock, every thread of both agents,
# in us per op), wake-ups (sched:sched_wakeup: a sleeping thread made
# runnable, by a futex, an epoll_ctl's event or a socket's bytes; each is
# a hand-off to a thread that slept), recv-EAGAIN: the recvfrom calls
# that found the socket empty (a poller's probe, or a read turn's end),
# and send-EAGAIN: the sendto calls that found it full.
# Per op = (run of 2N iterations - run of N) / N, so start-up drops out;
# what varies with time rather than ops (the 50 ms tick, heartbeats, the
# handshakes' retries) does not, so N must make the ops dominate: at
# 64 KiB, N = 300 (9 ms of ops) gave negative counts at load 1-3, N =
# 3000 does not (bench/small_ab.sh's default since the tenth session);
# the median over ROUNDS rounds (default 3), interleaved, as a livelock
# or a stretch of load comes in bursts. BASE=PATH measures another build
# too; MPI=1 measures Open MPI at the same op and size (bench/mpi_coll.c,
# 2 ranks, TCP; built by bench/peers.sh or bench/goals19.sh), whose
# progress engine busy-polls.
# Prints the load average, which decides whether a waiter's spin ran.
# usage: [BASE=PATH] [MPI=1] [ROUNDS=3] bench/syscalls.sh OP SIZE N [key=value ...]
set -eu
cd "$(dirname "$0")/.."
op=$1; size=$2; n=$3; shift 3
rounds=${ROUNDS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
calls="sendto recvfrom sendmsg recvmsg writev readv poll ppoll epoll_wait epoll_ctl futex sched_yield"
ev=task-clock,raw_syscalls:sys_enter,context-switches,sched:sched_wakeup
for c in $calls; do ev="$ev,syscalls:sys_enter_$c"; done
# last, as the filter applies to the event before it
eagain=(-e syscalls:sys_exit_recvfrom --filter "ret == -11" -e syscalls:sys_exit_sendto --filter "ret == -11")
case $size in 64K) slot="0 N 0" ;; 1M) slot="0 0 N" ;; 16M) slot="N 0 0" ;; *) slot="" ;; esac
echo "# load $(cat /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
  for impl in ${BASE:-} build/meshrun ${MPI:+openmpi}; do
    for k in 1 2; do
      if [ "$impl" = openmpi ]; then
        [ -n "$slot" ] || { echo "syscalls.sh: Open MPI runs 64K, 1M or 16M, not $size" >&2; exit 2; }
        MPI_COLL_OP=$op perf stat -x, -e "$ev" "${eagain[@]}" -o "$tmp/perf.$k" -- mpirun --allow-run-as-root \
          --oversubscribe -np 2 --mca btl tcp,self --mca btl_tcp_if_include lo --mca pml ob1 \
          build/mpi_coll ${slot//N/$((n * k))} >/dev/null 2>&1
      else
        perf stat -x, -e "$ev" "${eagain[@]}" -o "$tmp/perf.$k" -- "$impl" bench collectives --hosts 2 \
          --op "$op" --sizes "$size" --iters $((n * k)) --warmup 5 "$@" >/dev/null 2>&1
      fi
    done
    paste -d, "$tmp/perf.1" "$tmp/perf.2" | awk -F, -v n="$n" -v impl="$impl" '
      NF > 8 && $1 ~ /^[0-9.]+$/ {
        name = $3; sub(/syscalls:sys_enter_/, "", name); sub(/raw_syscalls:sys_enter/, "syscalls", name)
        sub(/sched:sched_wakeup/, "wake-ups", name); sub(/syscalls:sys_exit_recvfrom/, "recv-EAGAIN", name)
        sub(/syscalls:sys_exit_sendto/, "send-EAGAIN", name)
        v = ($(NF / 2 + 1) - $1) / n
        if (name == "task-clock") { name = "cpu-us"; v *= 1000 }   # ms -> us
        printf "%s %s %.2f\n", impl, name, v }'
  done
done | /usr/bin/python3 -c '
import sys, statistics as st
d, impls, names = {}, [], []
for l in sys.stdin:
    impl, name, v = l.split()
    if impl not in impls: impls.append(impl)
    if name not in names: names.append(name)
    d.setdefault((impl, name), []).append(float(v))
print(f"| per op, '"$op $size $*"', both hosts (median) | " + " | ".join(names) + " |")
print("|---|" + "---|" * len(names))
for i in impls:
    print(f"| {i} | " + " | ".join(f"{st.median(d[(i, k)]):.1f}" if (i, k) in d else "–" for k in names) + " |")
if len(impls) > 1 and impls[1] == "build/meshrun":
    def ratio(k):
        b, m = st.median(d[(impls[0], k)]), st.median(d[(impls[1], k)])
        return f"{m / b:.2f}" if b > 0 and m >= 0 else "–"
    print("| build/meshrun / BASE | " + " | ".join(ratio(k) for k in names) + " |")
'
echo "# load $(cat /proc/loadavg)"
