#!/usr/bin/env python3
"""Where a step's time goes, per device, from a --trace file.

usage: bench/pipe_mem.py TRACE

Mean over the steps after the first, per device (trace tid), in seconds of
a step: `slots` the pipeline's forward and backward slots (compute, with
the wait for the slot's gathered weights), `opt` the optimizer, `recv`
waits for a stage's activations or gradients (the bubble shows here: a
stage waiting for its first input), `send` waits for sends to be taken,
`coll` blocking collectives (weight gathers waited for, gradient and loss
sums), `rest` the step less all of these: with a pipeline the embedding,
head and copies; without one the forward and backward's compute.
Background gathers and reduce-scatters overlap the rest and are shown
apart (`bg`, their own duration).
"""
import collections
import json
import sys


def main():
    ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
    steps = sorted({e["args"]["step"] for e in ev})[1:]
    acc = collections.defaultdict(lambda: collections.defaultdict(float))
    for e in ev:
        if e["args"]["step"] not in steps or e["tid"] >= 1000:
            continue  # (tid >= 1000: a background row, not a device's thread)
        n, c, d = e["name"], e.get("cat"), e["dur"] / 1e6
        t = acc[e["tid"]]
        if c == "step":
            t["step"] += d
        elif n.startswith(("F mb", "B mb", "I mb", "W mb", "Fc mb", "embed mb", "head mb", "embed_back mb")):
            t["slots"] += d
        elif n.startswith("optimizer"):
            t["opt"] += d
        elif c == "compute":
            pass  # forward+backward: encloses the spans above
        elif "prefetch" in n or "background" in n:
            t["bg"] += d
        elif n.startswith(("stage recv", "stage post")):
            t["recv"] += d
        elif n.startswith("stage send"):
            t["send"] += d
        elif c == "comm":
            t["coll"] += d
    k = len(steps)
    print("  %-4s %7s %7s %7s %7s %7s %7s %7s %7s" % ("dev", "step", "slots", "opt", "recv",
                                                     "send", "coll", "rest", "bg"))
    for tid in sorted(acc):
        t = {x: v / k for x, v in acc[tid].items()}
        idle = t["step"] - sum(t.get(x, 0) for x in ("slots", "opt", "recv", "send", "coll"))
        print("  %-4d %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f" % (
            tid, t["step"], t.get("slots", 0), t.get("opt", 0), t.get("recv", 0),
            t.get("send", 0), t.get("coll", 0), idle, t.get("bg", 0)))


main()
