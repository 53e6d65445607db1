#!/usr/bin/env python3
"""CPU by thread of a training run, between its first and last metrics
line (steps 1..STEPS-1), per device and step: samples
/proc/PID/task/*/schedstat (run and run-queue seconds) and the context
switches of every process under ROOTPID every 20 ms while the run goes,
then prints one of two summaries (bench/overlap.sh and bench/dp_ab.sh):
  names  a table by thread name (mr-comm's and mr-stream's digits cut):
         run s, run-queue wait s, voluntary and involuntary switches
  dev    one line "DEV_RUN DEV_RQ OTHERS": the device threads' run and
         run-queue seconds (mr-dev*, or on one device a main thread that
         computes), and every other thread's run seconds summed
usage: bench/thread_sample.py names|dev ROOTPID METRICS STEPS NDEV"""
import os
import sys
import time

mode, root, mpath, steps, nd = (sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]),
                                int(sys.argv[5]))


def procs():
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir('/proc/%d/task' % p):
                todo += [int(x) for x in open('/proc/%d/task/%s/children' % (p, t)).read().split()]
        except OSError:
            pass
    return out


def snap(last):
    """(comm, run s, run-queue s, voluntary, involuntary switches) by (pid, tid)"""
    for p in procs():
        try:
            tids = os.listdir('/proc/%d/task' % p)
        except OSError:
            continue
        for t in tids:
            d = '/proc/%d/task/%s/' % (p, t)
            try:
                sch = open(d + 'schedstat').read().split()
                sw = [int(l.split()[1]) for l in open(d + 'status') if 'voluntary_ctxt' in l]
                last[(p, t)] = (open(d + 'comm').read().strip(), int(sch[0]) * 1e-9,
                                int(sch[1]) * 1e-9, sw[0], sw[1])
            except (OSError, IndexError):
                pass


def nlines():
    try:
        return sum(1 for _ in open(mpath))
    except OSError:
        return 0


last, first = {}, None
while os.path.exists('/proc/%d' % root):
    n = nlines()
    snap(last)
    if n >= 1 and first is None:
        first = dict(last)
    if n >= steps:
        break
    time.sleep(0.02)
if first is None or nlines() < steps:
    sys.exit('thread_sample: the run ended before its last metrics line')
# each thread's change per device and step: run, run-queue, switches
delta = {k: (v[0], [(y - z) / (steps - 1) / nd for y, z in zip(v[1:], first.get(k, (v[0], 0, 0, 0, 0))[1:])])
         for k, v in last.items()}
if mode == 'dev':
    dev, rest = [0.0, 0.0], 0.0
    for comm, (r, q, _, _) in delta.values():
        # one device: the process's main thread computes
        if comm.startswith('mr-dev') or (nd == 1 and r > 0.1):
            dev[0] += r
            dev[1] += q
        else:
            rest += r
    print('%.3f %.3f %.3f' % (dev[0], dev[1], rest))
else:
    tot = {}
    for comm, d in delta.values():
        name = comm.rstrip('0123456789') if comm.startswith(('mr-comm', 'mr-stream')) else comm
        tot[name] = [x + y for x, y in zip(tot.get(name, [0] * 4), d)]
    print('    %-10s %7s %9s %7s %8s   (threads, per device per step)' % ('thread', 'run_s', 'rqwait_s',
                                                                             'vol_sw', 'invol_sw'))
    for name, v in sorted(tot.items(), key=lambda x: -x[1][0]):
        if v[0] >= 0.0005:
            print('    %-10s %7.3f %9.3f %7.0f %8.0f' % (name, v[0], v[1], v[2], v[3]))
