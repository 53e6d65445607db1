#!/usr/bin/env python3
"""Pipeline bubble measured from a --trace file of a pipelined run.

usage: bench/pipe_bubble.py TRACE S M R D

For each step after the first and each pass (forward, backward), the
pass's window runs from the first forward (or backward) action span ("F mb.."
/ "B mb..", the executor's) of any
stage to the last one's end; a stage's idle time in it is the window less
its slot spans. Prints the mean idle fraction over stages and steps, per
pass and for both, next to d(S-1)/T with T = R*M + d(S-1).
"""
import json
import sys


def main():
    path, S, M, R, D = sys.argv[1], *map(int, sys.argv[2:6])
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    out = {}
    for pas, prefix in (("fwd", "F mb"), ("bwd", "B mb")):
        fr = []
        steps = sorted({e["args"]["step"] for e in ev})[1:]
        for st in steps:
            sl = [e for e in ev if e["args"]["step"] == st and e["name"].startswith(prefix)]
            if not sl:
                continue
            w0 = min(e["ts"] for e in sl)
            w1 = max(e["ts"] + e["dur"] for e in sl)
            for tid in {e["tid"] for e in sl}:
                busy = sum(e["dur"] for e in sl if e["tid"] == tid)
                fr.append(1 - busy / (w1 - w0))
        out[pas] = sum(fr) / len(fr)
    T = R * M + D * (S - 1)
    print(f"S={S} M={M} R={R} d={D}  bubble fwd {out['fwd']:.3f}  bwd {out['bwd']:.3f}  "
          f"mean {(out['fwd'] + out['bwd']) / 2:.3f}  d(S-1)/T {D * (S - 1) / T:.3f}")


main()
