#!/usr/bin/env python3
"""FSDP x stage under zbv (bench/pipe_waits.sh's fsdppp mesh: stages 0
and 1, two FSDP members each, sleep compute): one step's cycle, followed
on stage 1 (the stage that ends the step), split into parts that add up
to it, from a --trace. For each stage-1 device and step s >= 1 whose
step s + 1 is traced: the cycle is its first compute action's start in
step s + 1 minus that in step s, in ms:

  work    the actions' sleeps (F, I, W 20 ms each; B 40)
  f0      its first action (F mb0) beyond its sleep
  over    its other actions beyond their sleeps, but the last
  lastw   its last action (W mb7 of its first chunk) beyond its sleep
  gaps    no action running between its first's start and its last's end
  rs      its last action's end to its last reduce-scatter's end (0 if
          none ends later)
  norm    from there to its optimizer's start (the buckets' sums, the
          norm's all-reduce, the scalars' sum)
  opt     from there to the last optimizer's end over all devices (every
          update; the next step's first gathers start in them)
  head    from there to its first action's start in step s + 1 (the slot
          offset: stage 0's F mb0 c0, its wait for its first gathers, the
          activation's send)

The slot offset (one action, 20 ms at M = 8) is inside head; head less
it is what the next step's start costs beyond it.

  usage: bench/zbv_split.py [--sleep MS] TRACE [TRACE ...]   (medians
         over all; MS: an F's, I's or W's sleep, default 20: M = 8)
"""
import json, statistics, sys

args = sys.argv[1:]
ms = 20.0
if args[:1] == ['--sleep']:
    ms, args = float(args[1]), args[2:]
SL = {'F': ms, 'I': ms, 'W': ms, 'B': 2 * ms}
COLS = ['cycle', 'work', 'f0', 'over', 'lastw', 'gaps', 'rs', 'norm', 'opt', 'head']
end = lambda e: e['ts'] + e['dur']
rows = []
for path in args:
    ev = [e for e in json.load(open(path))['traceEvents'] if e.get('ph') == 'X']
    by = {}
    for e in ev:
        by.setdefault((e['tid'], e['args'].get('step')), []).append(e)
    comp = {}
    for (d, s), own in by.items():
        c = sorted([e for e in own if e['name'].split(' ')[0] in SL and ' mb' in e['name']], key=lambda e: e['ts'])
        if d < 1000 and c:
            comp[(d, s)] = c
    stage1 = sorted({d for (d, s), c in comp.items() if c[0]['name'].endswith('c1')})
    devs = sorted({d for (d, s) in comp})
    for d in stage1:
        for s in sorted(s for (x, s) in comp if x == d):
            if s is None or s < 1 or (d, s + 1) not in comp:
                continue
            c, nxt = comp[(d, s)], comp[(d, s + 1)]
            own = by[(d, s)]
            op = [e for e in own if e['name'] == 'optimizer']
            opall = [end(e) for x in devs for e in by.get((x, s), []) if e['name'] == 'optimizer']
            if not op or len(opall) < len(devs):
                continue
            a = end(c[-1])
            r = max([a] + [end(e) for e in by.get((1000 + d, s), []) if e['name'].startswith('reduce_scatter')])
            covered, t = 0.0, c[0]['ts']
            for e in c:
                lo, hi = max(e['ts'], t), end(e)
                if hi > lo:
                    covered += hi - lo
                    t = hi
            over = [e['dur'] / 1e3 - SL[e['name'][0]] for e in c]
            x = dict(cycle=(nxt[0]['ts'] - c[0]['ts']) / 1e3, work=sum(SL[e['name'][0]] for e in c),
                     f0=over[0], over=sum(over[1:-1]), lastw=over[-1],
                     gaps=(a - c[0]['ts'] - covered) / 1e3, rs=(r - a) / 1e3, norm=(op[0]['ts'] - r) / 1e3,
                     opt=(max(opall) - op[0]['ts']) / 1e3, head=(nxt[0]['ts'] - max(opall)) / 1e3)
            rows.append((d, x))
if not rows:
    sys.exit('no stage-1 steps with a next step traced')
med = statistics.median
print('%-6s' % '' + ' '.join('%7s' % k for k in COLS) + '   sum-cycle')
for d in sorted({d for d, _ in rows}) + [None]:
    xs = [x for e, x in rows if d is None or e == d]
    m = {k: med([x[k] for x in xs]) for k in COLS}
    print('%-6s' % ('all' if d is None else 'dev%d' % d) + ' '.join('%7.1f' % m[k] for k in COLS) +
          '   %5.1f  (median of %d)' % (sum(m[k] for k in COLS[1:]) - m['cycle'], len(xs)))
