#!/usr/bin/env python3
"""Do the two hosts of a `meshrun bench collectives --hosts 2` run work at
once, or take turns? Reads `perf script` of a system-wide `perf sched
record` (bench/bcast_timeline.sh) and, from sched_switch / sched_waking,
keeps every agent thread's state: running, runnable (woken, waiting for
a CPU) or asleep. Over the middle of the run (the first and last 10%
dropped: start-up and exit) it prints, for each pair of host states, the
share of the time: R = some thread of the host on a CPU, W = none on a
CPU but one runnable (the host has work and waits for a core: the
machine's load), S = every thread asleep (the host waits for its peer).
On an idle 2-core machine a pipelined transfer is R/R most of the time;
R/S or S/R is one host waiting for the other (taking turns); W is load,
or, while a CPU sits idle, the wait between a wake-up and its run
(printed as "W while a CPU idles"; its per-wake split, e.g. wake-ups put
on the waker's busy CPU, needs the trace itself).
sched_stat_runtime events (a task on a CPU) also set R, in case a switch
event was lost. The states are a rough guide: a polling thread counts as
R whether it works or spins (bench/host_work.py tells those apart).
usage: perf script -i FILE | bench/host_overlap.py BENCH_PID"""
import re
import sys

top = int(sys.argv[1])
parent, comm, host = {}, {}, {}
ev = []
sw = re.compile(r'prev_comm=(.*) prev_pid=(\d+) prev_prio=\d+ prev_state=(\S+) ==> '
                r'next_comm=(.*) next_pid=(\d+)')
wk = re.compile(r'comm=(.*) pid=(\d+) prio')
fk = re.compile(r'comm=(.*) pid=(\d+) child_comm=(.*) child_pid=(\d+)')
for line in sys.stdin:
    m = re.match(r'\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s+(.*)', line)
    if not m:
        continue
    t, kind, rest = float(m.group(4)), m.group(5), m.group(6)
    if kind == 'sched:sched_process_fork':
        f = fk.match(rest)
        if f:
            parent[int(f.group(4))] = int(f.group(2))
            comm[int(f.group(4))] = f.group(3)
    elif kind == 'sched:sched_switch':
        s = sw.match(rest)
        if s:
            ev.append((t, 'out', int(s.group(2)), s.group(3)))
            ev.append((t, 'in', int(s.group(5)), s.group(4)))
            ev.append((t, 'cpu', int(m.group(3)), int(s.group(5)) == 0))
            comm[int(s.group(5))] = s.group(4)
    elif kind == 'sched:sched_stat_runtime':
        # the task is on this CPU now: heals a state a lost event left
        r = re.match(r'comm=(.*) pid=(\d+) runtime', rest)
        if r:
            ev.append((t, 'run', int(r.group(2)), ''))
            ev.append((t, 'cpu', int(m.group(3)), int(r.group(2)) == 0))
    elif kind in ('sched:sched_waking', 'sched:sched_wakeup'):
        w = wk.match(rest)
        if w:
            ev.append((t, 'wake', int(w.group(2)), ''))


def host_of(tid):
    chain, p = [], tid
    while p in parent and parent[p] != top:
        chain.append(p)
        p = parent[p]
    return p if p in parent and parent[p] == top else None


agents = sorted({host_of(t) for t in parent if host_of(t) is not None and
                 any(comm.get(x, '').startswith('mr-') for x in parent if host_of(x) == host_of(t))})
if len(agents) != 2:
    sys.exit('host_overlap.py: expected 2 agent processes under %d, found %s' % (top, agents))
hid = {a: i for i, a in enumerate(agents)}
tids = {t: hid[host_of(t)] for t in parent if host_of(t) in hid}
for a in agents:
    tids[a] = hid[a]
ev.sort(key=lambda e: e[0])   # stable: same-time events stay in trace order
times = [e[0] for e in ev if e[2] in tids]
t0, t1 = times[0], times[-1]
lo, hi = t0 + 0.1 * (t1 - t0), t1 - 0.1 * (t1 - t0)
state = {t: 'S' for t in tids}
idle = {}                 # cpu -> running its idle task
share, share_free = {}, {}
last = lo


def host_state(h):
    st = [state[t] for t in tids if tids[t] == h]
    return 'R' if 'R' in st else 'W' if 'W' in st else 'S'


for t, kind, tid, arg in ev:
    if kind != 'cpu' and tid not in tids:
        continue
    if lo < t < hi:
        k = host_state(0) + '/' + host_state(1)
        share[k] = share.get(k, 0) + t - max(last, lo)
        if any(idle.values()):
            share_free[k] = share_free.get(k, 0) + t - max(last, lo)
        last = t
    if kind == 'cpu':
        idle[tid] = arg
        continue
    if kind in ('in', 'run'):
        state[tid] = 'R'
    elif kind == 'out':
        state[tid] = 'W' if arg.startswith('R') else 'S'
    elif kind == 'wake' and state[tid] == 'S':
        state[tid] = 'W'
tot = sum(share.values())
print('# host 0 / host 1 states over %.3f s (middle 80%% of the run); R on a CPU, W runnable, '
      'S asleep' % tot)
for k in sorted(share, key=lambda k: -share[k]):
    print('  %s  %5.1f%%' % (k, 100 * share[k] / tot))
both = share.get('R/R', 0)
turns = share.get('R/S', 0) + share.get('S/R', 0)
print('# both hosts on a CPU %.1f%%; one asleep while the other is on a CPU (turns) %.1f%%; '
      'both asleep %.1f%%' % (100 * both / tot, 100 * turns / tot, 100 * share.get('S/S', 0) / tot))
free = sum(share_free.values())
stacked = sum(v for k, v in share_free.items() if 'W' in k)
print('# while a CPU sat idle (%.1f%% of the time): a host asleep then waits for its peer, '
      'not for a core (W while a CPU idles: %.1f%% of all the time)'
      % (100 * free / tot, 100 * stacked / tot))
for k in sorted(share_free, key=lambda k: -share_free[k]):
    print('  %s  %5.1f%%' % (k, 100 * share_free[k] / max(free, 1e-12)))
