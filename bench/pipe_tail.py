#!/usr/bin/env python3
"""A sleep-mode pipeline step's end, from a --trace: per device, steps >= 1,
ms from the end of its last compute action (F, I, W, B) to the end of
its step's last reduce-scatter on its communication track (tid 1000 +
device; 0 when none ends later), and to its optimizer's start; the
median over steps, and over all devices.

  usage: bench/pipe_tail.py TRACE
"""
import json, statistics, sys

ev = [e for e in json.load(open(sys.argv[1]))['traceEvents'] if e.get('ph') == 'X']
end = lambda e: e['ts'] + e['dur']
rs, opt = {}, {}
for d in sorted({e['tid'] for e in ev if e['tid'] < 1000}):
    for s in sorted({e['args'].get('step', 0) for e in ev if e['tid'] == d}):
        if s < 1:
            continue
        own = [e for e in ev if e['tid'] == d and e['args'].get('step') == s]
        comp = [end(e) for e in own if e['name'].split(' ')[0] in ('F', 'I', 'W', 'B') and ' mb' in e['name']]
        op = [e['ts'] for e in own if e['name'] == 'optimizer']
        if not comp or not op:
            continue
        last = max(comp)
        r = [end(e) for e in ev if e['tid'] == 1000 + d and e['args'].get('step') == s
             and e['name'].startswith('reduce_scatter')]
        rs.setdefault(d, []).append(max([0] + [(x - last) / 1e3 for x in r]))
        opt.setdefault(d, []).append((op[0] - last) / 1e3)
med = statistics.median
for d in rs:
    print('device %d: rs_after_last_compute_ms %.1f  optimizer_after_last_compute_ms %.1f' % (d, med(rs[d]), med(opt[d])))
print('all: rs_after_last_compute_ms %.1f  optimizer_after_last_compute_ms %.1f'
      % (med([x for v in rs.values() for x in v]), med([x for v in opt.values() for x in v])))
