#!/usr/bin/env bash
# Issue 19 (float20): who runs when on HOSTS x DPH at one size. Records
# sched_switch/sched_wakeup and the waiters' system calls (perf, whole
# machine, only this run's processes kept) over two runs of one op, ITERS
# and 3 x ITERS iterations, and prints their difference per op, all hosts
# together, per thread kind (mr-dev, mr-stream, mr-net, other): CPU time,
# time runnable but not running, time asleep; sched_yields, recvfroms
# with data and empty, futex waits (a waiter's sleep or a contended
# lock), poll()s and wake-ups of that kind. A variant is ENV|KEYS|BIN
# as in spread_ab.sh, or openmpi (bench/mpi_coll.c as spread_ab.sh runs
# it; its ranks are the kind mpi_coll). Needs perf and root.
# usage: [HOSTS=4] [DPH=1] [SIZE=64K] [ITERS=400] bench/sched_split.sh OP [VARIANT]
# e.g.   bench/sched_split.sh reduce_scatter 'MESHRUN_YIELD_RULE=old||'
set -eu
cd "$(dirname "$0")/.."
op=$1; v=${2:-||}
h=${HOSTS:-4}; dph=${DPH:-1}; size=${SIZE:-64K}; iters=${ITERS:-400}
IFS='|' read -r envs keys bin <<<"$v"
make -s all
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# load $(cat /proc/loadavg); hosts $h x $dph, $size, $op, ${envs:-} ${keys:-} ${bin:-build/meshrun}"
if [ "$v" = openmpi ]; then
  [ build/mpi_coll -nt bench/mpi_coll.c ] || mpicc -O2 -o build/mpi_coll bench/mpi_coll.c
fi
for n in "$iters" $((3 * iters)); do
  if [ "$v" = openmpi ]; then
    case $size in 64K) slot="0 $n 0" ;; 1M) slot="0 0 $n" ;; *) slot="$n 0 0" ;; esac
    set -- env MPI_COLL_OP="$op" mpirun --allow-run-as-root --oversubscribe -np $((h * dph)) --mca btl tcp,self \
      --mca btl_tcp_if_include lo --mca pml ob1 build/mpi_coll $slot
  else
    set -- env $envs "${bin:-build/meshrun}" bench collectives --hosts "$h" --devices-per-host "$dph" \
      --op "$op" --sizes "$size" --iters "$n" --warmup 20 $keys
  fi
  perf record -q -a -o "$tmp/p$n" -e sched:sched_switch,sched:sched_wakeup,sched:sched_process_fork \
    -e syscalls:sys_enter_sched_yield,syscalls:sys_exit_recvfrom,syscalls:sys_enter_futex,syscalls:sys_exit_poll \
    -- sh -c 'echo $$ > "$0"; exec "$@"' "$tmp/pid$n" "$@" 2>&1 |
    grep -E '^ +[0-9]+ +[0-9]+ +[0-9.]+ |^openmpi' | sed "s/^/# $n iterations: /"
  perf script -i "$tmp/p$n" -F pid,tid,comm,time,event,trace 2>/dev/null > "$tmp/s$n"
done
/usr/bin/python3 - "$tmp/s$iters" "$tmp/s$((3 * iters))" "$iters" "$(cat "$tmp/pid$iters")" "$(cat "$tmp/pid$((3 * iters))")" <<'PY'
import sys, re, collections
def kind(c):
    for k in ("mr-dev", "mr-stream", "mr-net", "mpi_coll"):
        if c.startswith(k):
            return k
    return "other"
def parse(path, root):
    mine = {root}; names = {}; st = collections.Counter()
    state = {}; since = {}; last_futex = {}; first = None
    ev = re.compile(r'^\s*(\S.*?)\s+(\d+)/(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)$')
    for line in open(path):
        m = ev.match(line)
        if not m:
            continue
        comm, pid, tid, t, e, rest = m.group(1), int(m.group(2)), int(m.group(3)), float(m.group(4)), m.group(5), m.group(6)
        if e == "sched:sched_process_fork":
            cp = int(re.search(r'child_pid=(\d+)', rest).group(1))
            if pid in mine:
                mine.add(cp)
            continue
        if pid in mine:
            names[tid] = kind(comm)
        if e == "sched:sched_switch":
            f = dict(re.findall(r'(\w+)=(\S+)', rest))
            p, n = int(f["prev_pid"]), int(f["next_pid"])
            if p in names:
                k = names[p]
                st[(k, "run")] += t - since.get(p, t)
                state[p] = "R" if f["prev_state"].startswith("R") else "S"
                since[p] = t
            if n in names:
                k = names[n]
                if n in since:
                    st[(k, "runnable" if state.get(n) == "R" else "asleep")] += t - since[n]
                since[n] = t
                state[n] = "on"
            continue
        if e == "sched:sched_wakeup":
            w = int(re.search(r' pid=(\d+)', rest).group(1))
            if w in names:
                wk = names[w]
                st[(wk, "woken")] += 1
                if w in since and state.get(w) == "S":
                    st[(wk, "asleep")] += t - since[w]
                    since[w] = t
                    state[w] = "R"
            continue
        if pid not in mine:
            continue
        k = names[tid]
        if e == "syscalls:sys_enter_sched_yield":
            st[(k, "yields")] += 1
        elif e == "syscalls:sys_exit_recvfrom":
            r = int(rest.split()[-1], 16)
            st[(k, "recv empty" if r >= 1 << 63 else "recv data")] += 1
        elif e == "syscalls:sys_exit_poll":
            st[(k, "polls")] += 1
        elif e == "syscalls:sys_enter_futex":
            if re.search(r'op: 0x0*80\b', rest):
                st[(k, "futex waits")] += 1
    return st
a, b = parse(sys.argv[1], int(sys.argv[4])), parse(sys.argv[2], int(sys.argv[5]))
n = 2 * int(sys.argv[3])
cols = ["run", "runnable", "asleep", "yields", "recv data", "recv empty", "polls", "futex waits", "woken"]
print(f"{'per op, all hosts':18s}" + "".join(f"{c:>12s}" for c in cols))
for k in ("mr-dev", "mr-stream", "mr-net", "mpi_coll", "other"):
    if not any(b[(k, c)] or a[(k, c)] for c in cols):
        continue
    row = []
    for c in cols:
        d = (b[(k, c)] - a[(k, c)]) / n
        row.append(f"{d * 1e6:11.1f}u" if c in ("run", "runnable", "asleep") else f"{d:12.2f}")
    print(f"{k:18s}" + "".join(row))
PY
echo "# load $(cat /proc/loadavg)"
