"""The per-record logs a run leaves with MESHRUN_REC_LOG=DIR (net/rec_log.h),
for bench/rec_timeline.py and bench/p2p_wake.py: one line per record
sealed or opened and per send() and recv() with data, CLOCK_MONOTONIC,
one clock for every process of the machine.

An event is a tuple (kind, pid, tid, cpu, lport, pport, seq, bytes, t0,
t1): kind "seal", "send", "open" or "recv"; lport and pport the
connection's local and peer ports, so the two ends of a connection pair
up as (a, b) and (b, a); t0 and t1 in ns.
"""
import glob
import os
from collections import defaultdict


def load(d):
    """Every event of every rec.PID.log in directory d."""
    ev = []
    for p in glob.glob(os.path.join(d, "rec.*.log")):
        pid = int(p.rsplit(".", 2)[1])
        for line in open(p):
            k, tid, cpu, lp, pp, seq, nb, t0, t1 = line.split()
            ev.append((k, pid, int(tid), int(cpu), int(lp), int(pp), int(seq), int(nb),
                       int(t0), int(t1)))
    return ev


def directions(ev):
    """(tx, rx): the sending side's seals and sends, the receiving side's
    opens and recvs, each by the (lport, pport) of its own end."""
    tx, rx = defaultdict(list), defaultdict(list)
    for e in ev:
        (tx if e[0] in ("seal", "send") else rx)[(e[4], e[5])].append(e)
    return tx, rx


def bursts(es, gap_ns):
    """One direction's events in time order, cut into messages: a gap of
    more than gap_ns between one seal's end and the next seal's start
    starts a new one (sends go with the seals before them)."""
    out, cur, last = [], [], None
    for e in sorted(es, key=lambda e: e[8]):
        if e[0] == "seal" and last is not None and e[8] - last > gap_ns:
            out.append(cur)
            cur = []
        if e[0] == "seal":
            last = e[9]
        cur.append(e)
    if cur:
        out.append(cur)
    return out
