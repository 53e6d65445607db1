#!/usr/bin/python3
"""A traced pipeline step's critical path, and where its time went.

usage: pipe_crit.py TRACE.json F,I,W [--path] [--split [HOP_MS]]
  (F, I, W: the sleep of one action in ms, pipeline_compute=sleep's
  pipeline_sleep_ms; B = I + W, the owners' actions 0)

The hosts' trace clocks line up only to within a barrier's latency
(host/obs/trace.h), which is as much as the messages' own times, so this
first lines them up from the messages: a message's first bytes are read
at the receiver ("rn" starts) after its send call ("sc" starts), and its
receive lands ("r" ends) before the sender's send completes ("s" ends:
the receiver's acknowledgement). Over every message of the run both ways
that bounds each pair of hosts' offset; the middle of the bounds is
taken (printed with its width).

Then, per step, from the last compute action of the device whose span
(first compute start to last compute end) is the longest, it walks back:
an action waited either for the device's previous action (then the gap
between them is the device's executor: sends, posts, send waits) or for
a message it received in that gap (the receive that returned last before
it, if the message's making action on the sender ended after the
device's previous action ended). A message's time splits into the
sender's executor (making action's end to its send call), the transfer
(send call to the receive's landing: sealing, the socket, reading,
opening), the wake (landing to the receive's return on the receiver) and
the receiver's executor (the return to the next action's start). A receive that returned after
the device's previous action ended, for a message made before it, is
"recv wait" (the message was late, not the executor). Each
compute action on the path is its sleep and its overshoot (late). The
sums over the path equal the span; the simulator with a message's time
(sched_hop) charges each message on its path one hop and nothing else.
Prints per step the path's sums and its message count; --path lists it.

--split cuts each path message's transfer further: the send call to the
receiver's first bytes read ("rn" starts: the sender's stream thread
woken, the first 256 KiB sealed and written, the receiver's reader
woken), and those to the landing (the rest sealed, read and opened);
and it says what else was on the wire meanwhile: the other messages of
the step whose send call to landing overlaps this one's, counted and in
ms of overlap (on a machine whose cores the stages share, another
message's seal and open take the CPU this one's need). With HOP_MS (a
message's one-way time alone, `bench link --pingpong`) it gives the
path's transfers over that hop, for the messages that went alone and
for those that shared the wire.
"""
import json
import re
import statistics
import sys

ACT = re.compile(r"^(F|Fc|B|I|W) mb(\d+) c(\d+)$|^(embed|head|embed_back) mb(\d+)$")


def cost(name, c):
    m = ACT.match(name)
    if not m:
        return None
    op = m.group(1) or m.group(4)
    return {"F": c[0], "Fc": c[0], "I": c[1], "W": c[2], "B": c[1] + c[2]}.get(op, 0.0)


def main():
    ev = json.load(open(sys.argv[1]))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    c = [float(x) * 1e3 for x in sys.argv[2].split(",")]  # us
    show = "--path" in sys.argv
    split = "--split" in sys.argv
    hop = None
    if split and sys.argv.index("--split") + 1 < len(sys.argv):
        try:
            hop = float(sys.argv[sys.argv.index("--split") + 1]) * 1e3
        except ValueError:
            pass
    xs = [e for e in ev if e.get("ph") == "X" and "step" in e.get("args", {})]
    hosts = sorted({e["pid"] for e in xs})
    # per (step, host): compute actions, receives, flights
    comp, recv, fl = {}, {}, {}
    for e in xs:
        k = (e["args"]["step"], e["pid"])
        t0, t1 = e["ts"], e["ts"] + e["dur"]
        if e["tid"] >= 3000:
            kind, _, msg = e["name"].partition(" ")
            fl.setdefault(k, {})[(kind, msg)] = (t0, t1)
        elif cost(e["name"], c) is not None:
            comp.setdefault(k, []).append((t0, t1, e["name"]))
        elif e["name"].startswith("stage recv "):
            recv.setdefault(k, []).append((t0, t1, e["name"][len("stage recv "):]))
    for v in comp.values():
        v.sort()
    steps = sorted({k[0] for k in comp})
    # each message: sender and receiver host, per step
    lo, hi = {}, {}
    sender = {}
    for (st, h), f in fl.items():
        for (kind, msg), (t0, t1) in f.items():
            if kind == "sc":
                sender[(st, msg)] = h
    for (st, R), f in fl.items():
        for (kind, msg), (t0, t1) in f.items():
            if kind != "r" or (st, msg) not in sender:
                continue
            S = sender[(st, msg)]
            fs = fl[(st, S)]
            rn = f.get(("rn", msg))
            pair = (S, R)
            # o = clock_R - clock_S
            if rn and ("sc", msg) in fs:
                hi[pair] = min(hi.get(pair, 1e18), rn[0] - fs[("sc", msg)][0])
            if ("s", msg) in fs:
                lo[pair] = max(lo.get(pair, -1e18), t1 - fs[("s", msg)][1])
    # pairwise offsets (both directions combined), then each host against host 0
    est = {}
    for (S, R) in set(lo) | set(hi):
        a, b = min(S, R), max(S, R)
        if (a, b) in est:
            continue
        # o_ab = clock_b - clock_a
        l = max(lo.get((a, b), -1e18), -hi.get((b, a), 1e18))
        u = min(hi.get((a, b), 1e18), -lo.get((b, a), -1e18))
        if l > -1e17 and u < 1e17:
            est[(a, b)] = ((l + u) / 2, u - l)
    off = {hosts[0]: 0.0}
    changed = True
    while changed:
        changed = False
        for (a, b), (o, w) in est.items():
            if a in off and b not in off:
                off[b] = off[a] + o
                changed = True
            elif b in off and a not in off:
                off[a] = off[b] - o
                changed = True
    print("# clock offsets, us against host %d: %s; bounds' widths: %s" % (
        hosts[0], " ".join("h%d %+.0f" % (h, off.get(h, 0)) for h in hosts),
        " ".join("%d-%d %.0f" % (a, b, w) for (a, b), (o, w) in sorted(est.items()))))
    sums_all = []
    for st in steps:
        if st < 1:
            continue
        A = {h: [(t0 - off.get(h, 0), t1 - off.get(h, 0), n) for t0, t1, n in comp.get((st, h), [])] for h in hosts}
        Rv = {h: [(t0 - off.get(h, 0), t1 - off.get(h, 0), n) for t0, t1, n in recv.get((st, h), [])] for h in hosts}
        F = {h: {k: (v[0] - off.get(h, 0), v[1] - off.get(h, 0)) for k, v in fl.get((st, h), {}).items()} for h in hosts}
        span = {h: A[h][-1][1] - A[h][0][0] for h in hosts if A[h]}
        h = max(span, key=span.get)
        i = len(A[h]) - 1
        s = dict.fromkeys(["compute", "late", "exec", "recv wait", "msg sender exec", "msg transfer",
                           "msg wake", "msg receiver exec", "start"], 0.0)
        # every message of the step: (send call, landing) on host 0's clock
        wins = {}
        for hh in hosts:
            for (kind, msg), (a, b) in F[hh].items():
                if kind == "sc":
                    wins.setdefault(msg, [None, None])[0] = a
                elif kind == "r":
                    wins.setdefault(msg, [None, None])[1] = b
        wins = {m: w for m, w in wins.items() if w[0] is not None and w[1] is not None}
        nmsg, path, splits = 0, [], []
        t_end = A[h][i][1]
        while True:
            t0, t1, name = A[h][i]
            cc = cost(name, c)
            s["compute"] += min(cc, t1 - t0)
            s["late"] += max(0.0, t1 - t0 - cc)
            path.append("h%d %9.3f %7.3f %s" % (h, t0 / 1e3, (t1 - t0) / 1e3, name))
            prev = A[h][i - 1][1] if i > 0 else None
            # the receive that returned last before this action, after the previous one
            best = None
            for r0, r1, msg in Rv[h]:
                if r1 <= t0 + 1 and (prev is None or r1 >= prev - 1) and (best is None or r1 > best[1]):
                    best = (r0, r1, msg)
            dep = None
            if best:
                S = sender.get((st, best[2]))
                sc = F.get(S, {}).get(("sc", best[2])) if S is not None else None
                if sc:
                    made = [j for j, a in enumerate(A[S]) if a[1] <= sc[0] + 1]
                    if made and (prev is None or A[S][made[-1]][1] > prev) and best[1] - best[0] > 20:
                        dep = (S, made[-1], sc, best)
            if dep:
                S, j, sc, (r0, r1, msg) = dep
                land = F[h].get(("r", msg), (r0, r1))[1]
                land = min(max(land, sc[0]), r1)
                s["msg receiver exec"] += t0 - r1
                s["msg wake"] += r1 - land
                s["msg transfer"] += land - sc[0]
                s["msg sender exec"] += sc[0] - A[S][j][1]
                rn = F[h].get(("rn", msg))
                first = min(max(rn[0], sc[0]), land) if rn else land
                ov = [min(land, w[1]) - max(sc[0], w[0]) for m2, w in wins.items() if m2 != msg]
                ov = [x for x in ov if x > 0]
                splits.append((msg, land - sc[0], first - sc[0], land - first, len(ov), sum(ov)))
                path.append("   msg %s h%d->h%d: made %.3f call %.3f landed %.3f returned %.3f" % (
                    msg, S, h, A[S][j][1] / 1e3, sc[0] / 1e3, land / 1e3, r1 / 1e3))
                nmsg += 1
                h, i = S, j
            elif prev is not None and best and best[1] > prev + 20 and best[1] - best[0] > 20:
                # a message made before this device's previous action
                # ended, still on its way after it: the gap is its
                # transfer, not this device's executor
                s["recv wait"] += best[1] - prev
                s["exec"] += t0 - best[1]
                path.append("   wait %s (made before h%d's previous action ended): %.3f ms" % (
                    best[2], h, (best[1] - prev) / 1e3))
                i -= 1
            elif prev is not None:
                s["exec"] += t0 - prev
                i -= 1
            else:
                s["start"] = t0 - min(A[x][0][0] for x in hosts if A[x])
                t_start = t0
                break
        tot = sum(v for k, v in s.items() if k != "start")
        sums_all.append((s, nmsg, span[max(span, key=span.get)], tot, splits))
        print("step %d: longest span %.1f ms (host %d); path %.1f ms, %d messages: " % (
            st, max(span.values()) / 1e3, max(span, key=span.get), tot / 1e3, nmsg)
              + ", ".join("%s %.2f" % (k, v / 1e3) for k, v in s.items()))
        if show:
            for line in reversed(path):
                print("  " + line)
        if split:
            for msg, tr, fb, rest, n, o in reversed(splits):
                print("   split %-9s transfer %.3f = to first bytes %.3f + rest %.3f; %d others on the wire, %.3f ms overlap" % (
                    msg, tr / 1e3, fb / 1e3, rest / 1e3, n, o / 1e3))
    if sums_all:
        keys = list(sums_all[0][0])
        print("median over steps >= 1: span %.1f ms, path %.1f ms, messages %d; " % (
            statistics.median(x[2] for x in sums_all) / 1e3, statistics.median(x[3] for x in sums_all) / 1e3,
            statistics.median(x[1] for x in sums_all))
              + ", ".join("%s %.2f" % (k, statistics.median(x[0][k] for x in sums_all) / 1e3) for k in keys))
    if split and sums_all:
        sp = [m for x in sums_all for m in x[4]]
        med = lambda xs: statistics.median(xs) / 1e3 if xs else float("nan")
        print("split over steps >= 1, %d path messages: transfer %.3f ms median = to first bytes %.3f + rest %.3f; "
              "alone (no other message on the wire) %d, median %.3f ms; with others %d, median %.3f ms, "
              "%.1f others, %.3f ms overlap" % (
                  len(sp), med([m[1] for m in sp]), med([m[2] for m in sp]), med([m[3] for m in sp]),
                  sum(1 for m in sp if m[4] == 0), med([m[1] for m in sp if m[4] == 0]),
                  sum(1 for m in sp if m[4] > 0), med([m[1] for m in sp if m[4] > 0]),
                  statistics.median([m[4] for m in sp if m[4] > 0] or [0]),
                  med([m[5] for m in sp if m[4] > 0])))
        if hop is not None:
            n = len(sums_all)
            over = sum(m[1] - hop for m in sp) / n
            alone = sum(m[1] - hop for m in sp if m[4] == 0) / n
            print("path transfers over the hop (%.3f ms a message), a step: %.2f ms, of which %.2f on messages "
                  "alone and %.2f on messages that shared the wire" % (hop / 1e3, over / 1e3, alone / 1e3,
                                                                        (over - alone) / 1e3))


if __name__ == "__main__":
    main()
