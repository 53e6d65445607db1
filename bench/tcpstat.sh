#!/usr/bin/env bash
# The kernel's TCP work per op, meshrun against Open MPI: each run goes
# in a network namespace of its own (unshare -n, only lo up), so `nstat`
# counts only its sockets; per op = (run of 2N iterations - run of N) / N,
# medians over ROUNDS rounds (interleaved). Counts segments in/out, pure
# and delayed ACKs, window events, collapse/prune, autocorking, and
# (perf) the send and receive calls; derived: bytes a send call, wire KiB a
# segment. BASE=PATH measures another build too; MPI=1 Open MPI (TCP,
# build/mpi_coll, as bench/syscalls.sh runs it). Extra key=value args go
# to meshrun. Prints the load average.
# usage: [BASE=PATH] [MPI=1] [ROUNDS=3] bench/tcpstat.sh OP SIZE N [key=value ...]
set -eu
cd "$(dirname "$0")/.."
op=$1; size=$2; n=$3; shift 3
rounds=${ROUNDS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
keys="TcpInSegs TcpOutSegs IpExtOutOctets TcpExtTCPPureAcks TcpExtTCPHPAcks TcpExtTCPHPHits TcpExtDelayedACKs
TcpExtTCPAutoCorking TcpExtTCPRcvCollapsed TcpExtPruneCalled TcpExtTCPRcvCoalesce TcpExtTCPBacklogCoalesce
TcpExtTCPWantZeroWindowAdv TcpExtTCPToZeroWindowAdv TcpExtTCPFromZeroWindowAdv TcpExtTCPOFOQueue
TcpExtTCPRcvQDrop TcpExtTCPDelivered TcpExtTCPOrigDataSent"
case $size in 64K) slot="0 N 0" ;; 1M) slot="0 0 N" ;; 16M) slot="N 0 0" ;; *) slot="" ;; esac
calls="sendto recvfrom sendmsg recvmsg writev readv"
ev=task-clock; for c in $calls; do ev="$ev,syscalls:sys_enter_$c"; done
echo "# load $(cat /proc/loadavg)"
run() {  # impl iters out
  local impl=$1 it=$2 out=$3 cmd; shift 3
  if [ "$impl" = openmpi ]; then
    cmd="MPI_COLL_OP=$op mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl tcp,self --mca btl_tcp_if_include lo --mca pml ob1 build/mpi_coll ${slot//N/$it}"
  else
    cmd="$impl bench collectives --hosts 2 --op $op --sizes $size --iters $it --warmup 5 $*"
  fi
  unshare -n sh -c "ip link set lo up; nstat -n; perf stat -x, -e $ev -o $out.perf -- sh -c '$cmd' >/dev/null 2>&1; nstat -az > $out.nstat"
}
for r in $(seq 1 "$rounds"); do
  for impl in ${BASE:-} build/meshrun ${MPI:+openmpi}; do
    run "$impl" "$n" "$tmp/a" "$@"; run "$impl" $((n * 2)) "$tmp/b" "$@"
    for k in $keys; do
      a=$(awk -v k=$k '$1 == k {print $2}' "$tmp/a.nstat"); b=$(awk -v k=$k '$1 == k {print $2}' "$tmp/b.nstat")
      echo "$impl $k $(( ${b:-0} - ${a:-0} ))"
    done
    for k in $calls task-clock; do
      a=$(awk -F, -v k=$k '$3 ~ ("_" k "$") || $3 == k {print $1}' "$tmp/a.perf"); b=$(awk -F, -v k=$k '$3 ~ ("_" k "$") || $3 == k {print $1}' "$tmp/b.perf")
      echo "$impl $k $(awk -v a="$a" -v b="$b" 'BEGIN{print b - a}')"
    done
  done
done | /usr/bin/python3 -c '
import sys, statistics as st
n = '"$n"'
d, impls, names = {}, [], []
for l in sys.stdin:
    impl, name, v = l.split()
    if impl not in impls: impls.append(impl)
    if name not in names: names.append(name)
    d.setdefault((impl, name), []).append(float(v) / n)
med = {k: st.median(v) for k, v in d.items()}
pa = "TcpExtTCPPureAcks"
print(f"| per op, '"$op $size $*"' (median of {len(d[(impls[0], names[0])])}) | " + " | ".join(impls) + " |")
print("|---|" + "---|" * len(impls))
for k in names:
    f = (lambda v: f"{v:.1f}") if k != "task-clock" else (lambda v: f"{v:.2f} ms")
    print(f"| {k[6:] if k.startswith('"'"'TcpExt'"'"') else k} | " + " | ".join(f(med[(i, k)]) for i in impls) + " |")
for i in impls:
    o, seg = med[(i, "IpExtOutOctets")], med[(i, "TcpOutSegs")]
    so = sum(med[(i, c)] for c in ("sendto", "sendmsg", "writev"))
    mib = o / 2**20
    print(f"# {i}: {mib:.1f} MiB on the wire an op; {o / so / 1024 if so else 0:.0f} KiB a send call; "
          f"{o / seg / 1024 if seg else 0:.1f} KiB a segment; segments/MiB {seg / mib if mib else 0:.1f}; "
          f"pure ACKs/MiB {med[(i, pa)] / mib if mib else 0:.2f}")
'
echo "# load $(cat /proc/loadavg)"
