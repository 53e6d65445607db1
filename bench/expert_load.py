#!/usr/bin/env python3
"""Expert load step by step from a MESHRUN_EXPERT_LOAD file
(docs/deepseek.md#router; bench/bsplit.sh's wideckpt warm-up):

  expert_load.py FILE EP [EVERY]

FILE has one line "L<l> c0 .. c<E-1>" per MoE layer and step (the step's
whole batch, summed over the mesh). For every EVERY-th step (default 1)
and the last, over the MoE layers: expert = max / mean of the experts'
rows (1: even; E/k when every token picks the same k experts), device =
max / mean of the rows each of EP devices receives (EP consecutive
blocks of E/EP experts; the devices' order does not change the ratio),
idle = the share of (layer, device) with under a tenth of that layer's
busiest device's rows. The last line is the mean of each over the last
quarter of the steps. EVERY 0 prints one line instead, for
bench/bsplit.sh: load_exp=, load_dev=, idle= the means over steps >= 1.
"""
import sys


def main():
    path, ep = sys.argv[1], int(sys.argv[2])
    every = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    steps = {}  # layer -> [counts per step]
    for line in open(path):
        f = line.split()
        steps.setdefault(f[0], []).append([int(x) for x in f[1:]])
    n = min(len(v) for v in steps.values())
    rows = []
    for s in range(n):
        ex, dv, idle = [], [], 0
        for c in (v[s] for v in steps.values()):
            E = len(c)
            mean = sum(c) / E
            ex.append(max(c) / mean if mean else 0)
            per = [sum(c[x * E // ep:(x + 1) * E // ep]) for x in range(ep)]
            dmean = sum(per) / ep
            dv.append(max(per) / dmean if dmean else 0)
            idle += sum(1 for p in per if p < 0.1 * max(per))
        rows.append((s, sum(ex) / len(ex), sum(dv) / len(dv), idle / (ep * len(steps))))
    if every == 0:
        r = rows[1:] or rows
        print("load_exp=%.3f load_dev=%.3f idle=%.3f" % (
            sum(x[1] for x in r) / len(r), sum(x[2] for x in r) / len(r), sum(x[3] for x in r) / len(r)))
        return
    print("%5s %8s %8s %6s   (%d MoE layers, EP=%d, max / mean, means over layers)"
          % ("step", "expert", "device", "idle", len(steps), ep))
    for s, e, d, i in rows:
        if s % every == 0 or s == n - 1:
            print("%5d %8.3f %8.3f %6.3f" % (s, e, d, i))
    tail = rows[n - max(1, n // 4):]
    print("last %d steps: expert %.3f device %.3f idle %.3f" % (
        len(tail), sum(r[1] for r in tail) / len(tail), sum(r[2] for r in tail) / len(tail),
        sum(r[3] for r in tail) / len(tail)))


if __name__ == "__main__":
    main()
