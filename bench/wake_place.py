#!/usr/bin/env python3
"""Where the scheduler puts meshrun's woken threads, from `perf script` of
a system-wide `perf sched record` (bench/bcast_timeline.sh keeps it with
KEEP=DIR): for every wake-up of a thread named PREFIX* (default mr-),
whether it was placed on the waker's own CPU or the other, whether the
other CPU was idle at that moment, and the wait until it ran. A wake-up
placed on the waker's busy CPU while the other one idles is a loopback
socket's sync wake-up (the waker keeps working). Prints count, total and
mean wait by thread name and case.
usage: perf script -i FILE | bench/wake_place.py [PREFIX]"""
import collections
import re
import sys

prefix = sys.argv[1] if len(sys.argv) > 1 else 'mr-'
cur, pend = {}, {}
wait, count = collections.Counter(), collections.Counter()
for line in sys.stdin:
    m = re.match(r'\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s+(.*)', line)
    if not m:
        continue
    cpu, t, kind, rest = int(m.group(3)), float(m.group(4)), m.group(5), m.group(6)
    if kind == 'sched:sched_switch':
        s = re.search(r'next_comm=(.*) next_pid=(\d+)', rest)
        nxt = int(s.group(2))
        cur[cpu] = nxt
        if nxt in pend:
            tw, key = pend.pop(nxt)
            key = key + ('ran there' if cpu == key[-1] else 'moved',)
            key = key[:3] + key[4:]
            wait[key] += t - tw
            count[key] += 1
    elif kind == 'sched:sched_waking':
        w = re.match(r'comm=(.*) pid=(\d+) prio=\d+ target_cpu=(\d+)', rest)
        if w and w.group(1).startswith(prefix):
            tc = int(w.group(3))
            others = [c for c in cur if c != tc]
            idle = any(cur.get(c, 0) == 0 for c in others)
            pend[int(w.group(2))] = (t, (w.group(1), 'on the waker\'s CPU' if tc == cpu else
                                         'on another CPU', 'another CPU idle' if idle else
                                         'the others busy', tc))
print('| thread | placed | other CPUs at the wake-up | ran | wake-ups | wait ms in all | mean us |')
print('|---|---|---|---|---|---|---|')
for k in sorted(wait, key=lambda k: -wait[k]):
    print('| %s | %s | %s | %s | %d | %.1f | %.0f |' % (k + (count[k], wait[k] * 1e3,
                                                         wait[k] / count[k] * 1e6)))
