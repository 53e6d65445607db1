#!/usr/bin/env python3
"""Where a sleep-mode FSDP step's time beyond its sleeps goes, from a
--trace (bench/overlap_sleep.sh's runs, pipeline_compute=sleep): per
device and step >= 1, the device's own track against its communication
track (tid 1000 + device), in ms; the median over devices x steps.

  usage: bench/step_waits.py TRACE [F_MS B_MS]   (per-action sleeps,
         default 80 and 160: llama-bench at 80,80,80 a layer)

Columns: step (the device's step span); f0 (first forward action's
time beyond F: its wait for the first layer's gather); ag_nl / ag_l0
(the communication thread's spans of the first two gathers the
previous update queued: the non-layer group, layer 0); frest / bx (the
other forward / every backward action beyond its sleep); tail (end of
the last backward action to the end of forward+backward: the step's
last reduce-scatters); in it, on the communication thread, bkt (bucket
sums, 'grads ...'), rs_l0 (the first reduce-scatter after the last
backward action: layer 0's), rs_nl (the next one: the non-layer
group's) and gap (no collective running); norm (forward+backward's end
to the optimizer's start: sum of squares, scalar sums); opt (the
optimizer span); skew_b (this device's last backward end after the
earliest device's) and skew_o (its optimizer end after the earliest
device's): what the other devices make it wait for.
"""
import json, statistics, sys

F = float(sys.argv[2]) if len(sys.argv) > 2 else 80.0
B = float(sys.argv[3]) if len(sys.argv) > 3 else 160.0
ev = [e for e in json.load(open(sys.argv[1]))['traceEvents'] if e.get('ph') == 'X']
end = lambda e: e['ts'] + e['dur']
devs = sorted({e['tid'] for e in ev if e['tid'] < 1000})
by = {}
for e in ev:
    by.setdefault((e['tid'], e['args'].get('step')), []).append(e)


def clip(spans, a, b):
    return sum(max(0, min(end(x), b) - max(x['ts'], a)) for x in spans) / 1e3


rows = []
steps = sorted({s for (_, s) in by if s is not None and s >= 1})
for s in steps:
    g = {d: {x['name']: x for x in by.get((d, s), [])} for d in devs}
    if any('step' not in g[d] or 'optimizer' not in g[d] for d in devs):
        continue
    fw = sorted(n for n in g[devs[0]] if n.startswith('F mb0 c'))
    bw = sorted(n for n in g[devs[0]] if n.startswith('B mb0 c'))
    if not fw or not bw:
        continue
    b_last = bw[0]  # B of chunk 0 runs last
    b0_min = min(end(g[d][b_last]) for d in devs)
    op_min = min(end(g[d]['optimizer']) for d in devs)
    for d in devs:
        x = g[d]
        st, fb, op, bl = x['step']['ts'], x['forward+backward'], x['optimizer'], x[b_last]
        comm = sorted([c for c in by.get((1000 + d, s), []) + by.get((1000 + d, s - 1), [])
                       if not c['name'].startswith('q ')], key=lambda c: c['ts'])
        a, b = end(bl), end(fb)
        inwin = [c for c in comm if end(c) > a and c['ts'] < b]
        rs = [c for c in inwin if c['name'].startswith('reduce_scatter') and c['ts'] >= a - 1]
        bkt = [c for c in inwin if c['name'].startswith('grads')]
        busy = clip(inwin, a, b)
        f0 = x[fw[0]]
        ag = [c for c in comm if c['name'].startswith('all_gather') and end(c) > st - 50e3 and c['ts'] < end(f0)
              and (c['ts'] < st or c['args'].get('step', s) == s)]
        ag = [c for c in ag if c['ts'] < f0['ts'] + 1e3]
        rows.append(dict(
            step=x['step']['dur'] / 1e3,
            f0=f0['dur'] / 1e3 - F,
            ag_nl=ag[0]['dur'] / 1e3 if len(ag) > 0 else 0,
            ag_l0=ag[1]['dur'] / 1e3 if len(ag) > 1 else 0,
            frest=sum(x[n]['dur'] / 1e3 - F for n in fw[1:]),
            bx=sum(x[n]['dur'] / 1e3 - B for n in bw),
            tail=(b - a) / 1e3,
            bkt=clip(bkt, a, b),
            rs_l0=clip(rs[:1], a, b),
            rs_nl=clip(rs[1:2], a, b),
            gap=(b - a) / 1e3 - busy,
            norm=(op['ts'] - b) / 1e3,
            opt=op['dur'] / 1e3,
            skew_b=(a - b0_min) / 1e3,
            skew_o=(end(op) - op_min) / 1e3))
if not rows:
    sys.exit('no steps >= 1 with a forward, a backward and an optimizer span')
keys = list(rows[0])
print(' '.join('%6s' % k for k in keys))
print(' '.join('%6.1f' % statistics.median(r[k] for r in rows) for k in keys),
      ' median of %d (devices x steps)' % len(rows))
