#!/usr/bin/env python3
"""Where a sleep-mode pipeline step's time beyond its sleeps goes, from a
--trace (pipeline_compute=sleep; e.g. bench/overlap_sleep.sh's
fsdppp_zbv row, or the same mesh without FSDP): per device and step
>= 1, the step split into parts that add up to it, in ms; the median
over devices x steps, and per device (a device is a stage).

  usage: bench/pipe_waits.py TRACE [F_MS I_MS W_MS]   (each compute
         action's sleep; default 20 20 20: an fsdppp action at 80,80,80;
         a B action sleeps I + W)

Columns: step (the device's step span); idle (step minus the compute
it slept: the sum of the columns after it); head (step start to the
first compute action); f0 (the first compute action beyond its sleep:
its wait for the first gather); over (every other compute action beyond
its sleep: gathers, hooks, reduce-scatters waited inside); gaps (no
compute action running between the first's start and the last's end:
the pipeline's bubble, receives waited, the weights actions); tail (the
last compute action's end to the optimizer's start); in it, on the
device's track, rs (reduce-scatters waited for) and ar (the norm's
all-reduces, where the stages' and members' skew shows), and on its
communication track (tid 1000 + device) bkt (bucket sums, 'grads ...');
opt (the optimizer span, the next step's first gathers started in it);
end (the optimizer's end to the step's end).
"""
import json, statistics, sys

SL = {'F': 20.0, 'I': 20.0, 'W': 20.0}
if len(sys.argv) > 4:
    SL = dict(zip('FIW', map(float, sys.argv[2:5])))
SL['B'] = SL['I'] + SL['W']
ev = [e for e in json.load(open(sys.argv[1]))['traceEvents'] if e.get('ph') == 'X']
end = lambda e: e['ts'] + e['dur']
by = {}
for e in ev:
    by.setdefault((e['tid'], e['args'].get('step')), []).append(e)


def clip(spans, a, b):
    return sum(max(0, min(end(x), b) - max(x['ts'], a)) for x in spans) / 1e3


def covered(spans, a, b):  # ms of [a, b) inside some span
    t, n = a, 0.0
    for x in sorted(spans, key=lambda x: x['ts']):
        lo, hi = max(x['ts'], t), min(end(x), b)
        if hi > lo:
            n += hi - lo
            t = hi
    return n / 1e3


rows = {}
for (d, s), own in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
    if d >= 1000 or s is None or s < 1:
        continue
    x = {e['name']: e for e in own}
    comp = sorted([e for e in own if e['name'].split(' ')[0] in SL and ' mb' in e['name']], key=lambda e: e['ts'])
    if 'step' not in x or 'optimizer' not in x or not comp:
        continue
    st, op = x['step'], x['optimizer']
    a, b = end(comp[-1]), op['ts']
    over = [e['dur'] / 1e3 - SL[e['name'][0]] for e in comp]
    comm = by.get((1000 + d, s), []) + by.get((1000 + d, s - 1), [])
    rows.setdefault(d, []).append(dict(
        step=st['dur'] / 1e3,
        idle=st['dur'] / 1e3 - sum(SL[e['name'][0]] for e in comp),
        head=(comp[0]['ts'] - st['ts']) / 1e3,
        f0=over[0],
        over=sum(over[1:]),
        gaps=(a - comp[0]['ts']) / 1e3 - covered(comp, comp[0]['ts'], a),
        tail=(b - a) / 1e3,
        rs=clip([e for e in own if e['name'].startswith('reduce_scatter')], a, b),
        ar=clip([e for e in own if e['name'].startswith('all_reduce')], a, b),
        bkt=clip([e for e in comm if e['name'].startswith('grads')], a, b),
        opt=op['dur'] / 1e3,
        end=(end(st) - end(op)) / 1e3))
if not rows:
    sys.exit('no steps >= 1 with compute actions and an optimizer span')
keys = list(next(iter(rows.values()))[0])
med = statistics.median
print('%-5s ' % '' + ' '.join('%6s' % k for k in keys))
every = [r for d in rows for r in rows[d]]
print('%-5s ' % 'all' + ' '.join('%6.1f' % med(r[k] for r in every) for k in keys),
      ' median of %d (devices x steps)' % len(every))
for d in rows:
    print('%-5s ' % ('dev%d' % d) + ' '.join('%6.1f' % med(r[k] for r in rows[d]) for k in keys))
