#!/usr/bin/python3
"""One small collective's timeline, host by host and thread by thread
(issue 19, small15).

Reads the logs of a `meshrun bench collectives` run under
MESHRUN_REC_LOG=DIR (net/rec_log.h: seals, opens, send()s and recv()s,
and the marks of a message's path: posted receives and sends, whole
xport_waits, polls that moved bytes, futex sleeps (park), stream thread
turns). An op is what a device thread did from its first posted receive
or send of one collective seq to the first post of the next; each host's
events are cut by its device thread's seqs, and the two hosts' ops are
lined up by seq (one clock: CLOCK_MONOTONIC). Prints, for the median op
(by the op's span on host 0) and a slow one (the 90th percentile), each
host's events in us from the op's start on host 0, then medians over all
ops of each part: the op's span, the time in posts, seals, send()s,
recv()s, opens, waits, parks, stream turns, and the gap between the last
wait's end and the next op (the return and the caller's loop); and, per
sleep of a device thread (park: its spin given up), the wake-up (from
the last record its host's other threads opened to the wait's end) and
how long its next post took (one that finds the link's lock taken sleeps
on it).

Usage: op_timeline.py DIR [SKIP]   (SKIP: ops left out at the start, 50)
"""
import bisect
import glob
import os
import statistics as st
import sys
from collections import defaultdict

d = sys.argv[1]
skip = int(sys.argv[2]) if len(sys.argv) > 2 else 50
hosts = []
for p in sorted(glob.glob(os.path.join(d, "rec.*.log"))):
    ev = []
    for line in open(p):
        k, tid, cpu, lp, pp, seq, nb, t0, t1 = line.split()
        ev.append((int(t0), int(t1), k, int(tid), int(cpu), int(seq), int(nb)))
    ev.sort()
    hosts.append(ev)
if len(hosts) < 2:
    sys.exit("op_timeline.py: need two hosts' logs in " + d)


def cut(ev):
    """ops by seq: seq -> (start, end, events) on the device thread's posts"""
    devs = {e[3] for e in ev if e[2] in ("irecv", "isend")}
    starts = {}
    for e in ev:
        if e[2] in ("irecv", "isend") and e[5] not in starts:
            starts[e[5]] = e[0]
    seqs = sorted(starts, key=lambda s: starts[s])
    ops = {}
    for i, s in enumerate(seqs[:-1]):
        ops[s] = [starts[s], starts[seqs[i + 1]], []]
    order = [(ops[s][0], s) for s in ops]
    order.sort()
    bounds = [b for b, _ in order]
    for e in ev:
        i = bisect.bisect_right(bounds, e[0]) - 1
        if i < 0:
            continue
        s = order[i][1]
        if e[0] < ops[s][1]:
            ops[s][2].append(e)
    return ops, devs


cuts = [cut(ev) for ev in hosts]
seqs = sorted(set(cuts[0][0]) & set(cuts[1][0]))[skip:]
if not seqs:
    sys.exit("op_timeline.py: no ops in common")


def parts(op, devs):
    s0, s1, evs = op
    p = defaultdict(float)
    cnt = defaultdict(int)
    last_wait = s0
    for t0, t1, k, tid, cpu, seq, nb in evs:
        who = "dev" if tid in devs else "oth"
        p[f"{k}.{who}"] += (t1 - t0) / 1e3
        cnt[f"{k}.{who}"] += 1
        if k == "wait":
            last_wait = max(last_wait, t1)
    p["span"] = (s1 - s0) / 1e3
    p["return"] = (s1 - last_wait) / 1e3
    return p, cnt


spans = sorted(seqs, key=lambda s: cuts[0][0][s][1] - cuts[0][0][s][0])
med = spans[len(spans) // 2]
slow = spans[int(len(spans) * 0.9)]


def show(seq, title):
    base = cuts[0][0][seq][0]
    print(f"## {title}: seq {seq}, host 0's span {(cuts[0][0][seq][1] - base) / 1e3:.1f} us")
    for h, (ops, devs) in enumerate(cuts):
        s0, s1, evs = ops[seq]
        print(f"# host {h} (op {(s0 - base) / 1e3:+.1f} .. {(s1 - base) / 1e3:+.1f})")
        for t0, t1, k, tid, cpu, sq, nb in evs:
            who = "dev" if tid in devs else f"t{tid % 1000}"
            print(f"  {(t0 - base) / 1e3:7.1f} {(t1 - base) / 1e3:7.1f} {(t1 - t0) / 1e3:6.1f}"
                  f"  {k:6s} {who:5s} cpu{cpu} {nb}")


show(med, "median op")
show(slow, "slow op (90th percentile)")
print("## medians over", len(seqs), "ops, us (count per op)")
keys = set()
rows = []
for h, (ops, devs) in enumerate(cuts):
    ps = [parts(ops[s], devs) for s in seqs]
    for p, c in ps:
        keys |= set(p)
    rows.append(ps)
for k in sorted(keys):
    line = f"  {k:12s}"
    for h in range(len(cuts)):
        v = [p.get(k, 0.0) for p, c in rows[h]]
        n = [c.get(k, 0) for p, c in rows[h]]
        line += f"  h{h} {st.median(v):6.1f} us mean {st.mean(v):6.1f} ({st.mean(n):4.2f})"
    print(line)

# after a sleep: each park of a device thread; the time from the last
# record its host's other threads opened before the wait ended (the
# stream thread's completion) to the wait's end (the wake-up), and how
# long the device thread's next post took (a post that finds the link's
# lock taken sleeps on it)
print("## after a sleep (park) of a device thread")
for h, ev in enumerate(hosts):
    devs = cuts[h][1]
    nops = len(cuts[h][0])
    parks = wake = 0
    lat, post = [], []
    last_open = None
    state = None
    for t0, t1, k, tid, cpu, seq, nb in ev:
        if k == "open" and tid not in devs:
            last_open = t1
        if tid not in devs:
            continue
        if k == "park":
            parks += 1
            state = t1
        elif k == "wait" and isinstance(state, int) and t1 >= state:
            if last_open is not None and last_open <= t1:
                lat.append((t1 - last_open) / 1e3)
            state = "post"
        elif k in ("irecv", "isend") and state == "post":
            post.append((t1 - t0) / 1e3)
            state = None

    def q(a, x):
        return sorted(a)[min(int(len(a) * x), len(a) - 1)] if a else float("nan")
    print(f"  h{h} parks {parks} ({parks / max(nops, 1):.3f} per op); wake-up (stream's last open"
          f" -> wait's end) p50 {q(lat, .5):.1f} p90 {q(lat, .9):.1f} us; next post p50"
          f" {q(post, .5):.1f} p90 {q(post, .9):.1f} max {max(post) if post else 0:.1f} us")
