#!/usr/bin/env python3
"""The batch split's figures from one run's --trace (bench/bsplit.sh):

  bsplit_trace.py TRACE.json FIRST_MOE_LAYER

prints one line of key=value: per device and step (steps >= 1, the mean
over devices and steps):
  moe_ms     the MoE layers' time: the executor's actions on them summed
             ("F mb0 cL" and "B mb0 cL", category pipeline: without a
             pipeline chunk L is layer L; each runs from its window wait
             to its return; with the split it holds the previous layer's
             deferred second-half combine and not its own)
  a2a_ms     all-to-all time: an unsplit run's synchronous "all_to_all
             expert" spans; a split run's exchanges while the device's
             exchange thread ran them (category flight, row 2000 + d)
  exposed_ms the part of a2a_ms the device's thread spent waiting for
             that exchange (all of it when synchronous)
  hidden     1 - exposed / a2a
  beside     the share of a2a_ms during which the device's thread was in
             a compute span of the model's and not waiting for anything
             (the all-to-all hidden behind compute, strictly)
  counts_ms  the expert counts' all_gather before each dispatch (both
             schedules run it synchronously; the split once for both
             halves)
  late_ms    the part of exposed_ms spent before the last device of the
             group had started that exchange (unsplit: entered the
             all_to_all; split: its exchange thread began it): waiting
             for a peer still computing (the experts' uneven loads, a
             peer's thread without a core), not for the bytes
  xfer_ms    the transfer: the part of a2a_ms after the last device of
             the group had started that exchange, i.e. each exchange's
             span on this device from max(its start here, the last
             device's start) to its end (an exchange cannot end before
             every member has sent; before that it waits for a peer)
  hidden_xfer  1 - (exposed_ms - late_ms) / xfer_ms: the share of the
             transfer the device did not wait for (the wait after the
             last peer started, against the transfer). 0 when
             synchronous. The straggler's part (late_ms) is left out of
             both: no schedule of the pieces can hide a peer that has
             not sent yet, only even loads can
"""
import json
import re
import sys

EXCH = re.compile(r"^(disp|comb)( bwd)? h[01] L\d+$")
PIECE = re.compile(r" h[01] L\d+$")


def union(iv):
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def inter_len(a, b, iv):
    """length of [a, b) inside the union iv (sorted, disjoint)"""
    t = 0.0
    for x, y in iv:
        lo, hi = max(a, x), min(b, y)
        if hi > lo:
            t += hi - lo
    return t


def minus(iv, cut):
    """iv minus cut, both unions"""
    out = []
    for a, b in iv:
        pieces = [[a, b]]
        for x, y in cut:
            nxt = []
            for p, q in pieces:
                if y <= p or x >= q:
                    nxt.append([p, q])
                    continue
                if x > p:
                    nxt.append([p, x])
                if y < q:
                    nxt.append([y, q])
            pieces = nxt
        out.extend(pieces)
    return out


def main():
    path, first_moe = sys.argv[1], int(sys.argv[2])
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X" and e["args"]["step"] >= 1]
    devs = sorted({e["tid"] for e in ev if e["tid"] < 1000})  # rows 1000 + d, 2000 + d: its threads'
    steps = sorted({e["args"]["step"] for e in ev})
    by = {}
    for e in ev:
        by.setdefault((e["tid"], e["args"]["step"]), []).append(e)
    tot = dict(moe=0.0, a2a=0.0, exposed=0.0, beside=0.0, counts=0.0, late=0.0, xfer=0.0)
    # when each device started each exchange: (step, name or k-th
    # synchronous all_to_all) -> [start per device]
    start = {}
    for d in devs:
        for s in steps:
            k = 0
            for e in sorted(by.get((d, s), []), key=lambda e: e["ts"]):
                if e["cat"] == "comm" and e["name"].startswith("all_to_all expert"):
                    start.setdefault((s, k), []).append(e["ts"])
                    k += 1
            for e in by.get((2000 + d, s), []):
                if EXCH.match(e["name"]):
                    start.setdefault((s, e["name"]), []).append(e["ts"])
    last = {k: max(v) for k, v in start.items() if len(v) == len(devs)}
    for d in devs:
        for s in steps:
            mine = by.get((d, s), [])
            flight = [e for e in by.get((2000 + d, s), []) if EXCH.match(e["name"])]
            for e in mine:
                m = re.match(r"^[FB] mb0 c(\d+)$", e["name"])
                if m and int(m.group(1)) >= first_moe:
                    tot["moe"] += e["dur"]
                if e["cat"] == "comm" and e["name"].startswith("all_gather expert"):
                    tot["counts"] += e["dur"]
            comm = union([(e["ts"], e["ts"] + e["dur"]) for e in mine if e["cat"] == "comm"])
            pieces = union([(e["ts"], e["ts"] + e["dur"]) for e in mine
                            if e["cat"] == "compute" and PIECE.search(e["name"])])
            working = minus(pieces, comm)
            if not flight:  # unsplit: the exchanges are synchronous
                k = 0
                for e in sorted(mine, key=lambda e: e["ts"]):
                    if e["cat"] == "comm" and e["name"].startswith("all_to_all expert"):
                        tot["a2a"] += e["dur"]
                        tot["exposed"] += e["dur"]
                        t = last.get((s, k), e["ts"])
                        late = min(max(0, t - e["ts"]), e["dur"])
                        tot["late"] += late
                        tot["xfer"] += e["dur"] - late
                        k += 1
                continue
            waits = {e["name"][5:]: (e["ts"], e["ts"] + e["dur"]) for e in mine
                     if e["cat"] == "comm" and e["name"].startswith("wait ")}
            for f in flight:
                a, b = f["ts"], f["ts"] + f["dur"]
                tot["a2a"] += b - a
                t = last.get((s, f["name"]), a)
                tot["xfer"] += max(0, b - max(a, t))
                w = waits.get(f["name"])
                if w:
                    tot["exposed"] += inter_len(a, b, [list(w)])
                    tot["late"] += inter_len(a, min(b, t), [list(w)])
                tot["beside"] += inter_len(a, b, working)
    n = len(devs) * len(steps)
    a2a, xfer = tot["a2a"], tot["xfer"]
    print("moe_ms=%.2f a2a_ms=%.2f exposed_ms=%.2f hidden=%.3f beside=%.3f counts_ms=%.2f late_ms=%.2f "
          "xfer_ms=%.2f hidden_xfer=%.3f" % (
              tot["moe"] / n / 1e3, a2a / n / 1e3, tot["exposed"] / n / 1e3,
              1 - tot["exposed"] / a2a if a2a else 0, tot["beside"] / a2a if a2a else 0,
              tot["counts"] / n / 1e3, tot["late"] / n / 1e3, xfer / n / 1e3,
              round(1 - (tot["exposed"] - tot["late"]) / xfer, 3) + 0.0 if xfer else 0))


if __name__ == "__main__":
    main()
