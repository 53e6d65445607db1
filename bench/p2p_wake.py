#!/usr/bin/python3
"""When does a message's reader start? (issue 21, inter15)

Reads the per-record logs a run left with MESHRUN_REC_LOG=DIR
(net/rec_log.h; one CLOCK_MONOTONIC clock for every process of the
machine), cuts each connection's records into messages as
bench/rec_timeline.py does (a gap of more than 250 us between two seals
starts a new one) and, for the messages of MIN..2*MIN bytes (default 1
MiB), prints medians and means, in us:

  to_read   the sender's first send() of the message starting (its first
            bytes on the loopback socket) to the receiver's first recv()
            of it starting: the reading thread's wake-up and its wait for
            a CPU (0 when it was already reading)
  busy_other of to_read, the reading thread busy with another link's
            records (its own work, not a wake-up)
  msg       first seal to last open: the message's time on the wire
  seal/open the sending and reading threads' own time in the message's
            seals, send()s, recv()s and opens
  same_cpu  messages whose every seal and open ran on one CPU (then the
            two sides take turns: no overlap)

With PERF_SCRIPT (the text of `perf script -F pid,tid,cpu,time,event,trace`
over `perf sched record -k CLOCK_MONOTONIC -a`) it also says what ran on
the other CPU while a same-CPU message's reader waited: idle, this run's
agents (the log's processes), or other processes.

usage: p2p_wake.py DIR [MIN_BYTES] [PERF_SCRIPT]
"""
import bisect
import re
import statistics as st
import sys
from collections import defaultdict

from rec_events import bursts as cut, directions, load

GAP_NS = 250000


def sched(path, mine):
    """per CPU: sorted (time ns, what ran from then: idle / agents / other)"""
    sw = re.compile(r"^\s*(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+sched:sched_switch:.*==> next_comm=.* next_pid=(\d+)")
    runs, t2p = defaultdict(list), {}
    for line in open(path):
        m = sw.match(line)
        if m:
            t2p[int(m.group(2))] = int(m.group(1))
            runs[int(m.group(3))].append((float(m.group(4)) * 1e9, int(m.group(5))))
    out = {}
    for c, L in runs.items():
        L.sort()
        out[c] = ([t for t, _ in L],
                  ["idle" if tid == 0 else "agents" if t2p.get(tid) in mine else "other" for _, tid in L])
    return out


def occupancy(runs, cpu, a, b, acc):
    if cpu not in runs:
        return
    ts, who = runs[cpu]
    i = bisect.bisect_right(ts, a) - 1
    t = a
    while t < b and i < len(ts):
        end = min(ts[i + 1] if i + 1 < len(ts) else b, b)
        if i >= 0 and end > t:
            acc[who[i]] += end - t
        t = max(t, end)
        i += 1


def main():
    d = sys.argv[1]
    lo = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20
    ev = load(d)
    runs = sched(sys.argv[3], {e[1] for e in ev}) if len(sys.argv) > 3 else None
    by_thr = defaultdict(list)
    for e in ev:
        by_thr[e[2]].append(e)
    for L in by_thr.values():
        L.sort(key=lambda e: e[8])
    starts = {k: [e[8] for e in L] for k, L in by_thr.items()}
    tx, rx = directions(ev)

    def busy_other(thr, key, a, b):
        L, s = by_thr[thr], 0
        i = max(0, bisect.bisect_left(starts[thr], a) - 1)
        while i < len(L) and L[i][8] < b:
            e = L[i]
            if (e[4], e[5]) not in (key, (key[1], key[0])):
                s += max(0, min(b, e[9]) - max(a, e[8]))
            i += 1
        return s

    rows, occ = [], defaultdict(float)
    for key, es in tx.items():
        peer = sorted(rx.get((key[1], key[0]), []), key=lambda e: e[8])
        for b in cut(es, GAP_NS):
            seals = [e for e in b if e[0] == "seal"]
            size = sum(e[7] for e in seals)
            if not seals or not lo <= size < 2 * lo:
                continue
            s0, s1, t0 = seals[0][6], seals[-1][6], seals[0][8]
            sends = [e for e in b if e[0] == "send" and e[8] >= t0 and e[7] >= 16384]
            recvs = [e for e in peer if e[0] == "recv" and s0 <= e[6] <= s1 + 1 and e[9] >= t0]
            opens = [e for e in peer if e[0] == "open" and s0 <= e[6] <= s1]
            if not sends or not recvs or not opens:
                continue
            a, r0 = sends[0][8], recvs[0][8]
            cpu = seals[0][3]
            same = all(e[3] == cpu for e in seals + opens)
            if same and runs is not None and r0 > a:
                for c in runs:
                    if c != cpu:
                        occupancy(runs, c, a, r0, occ)
            rows.append({
                "to_read": max(0, r0 - a) / 1e3,
                "busy_other": busy_other(recvs[0][2], key, a, max(a, r0)) / 1e3,
                "msg": (opens[-1][9] - t0) / 1e3,
                "seal": sum(e[9] - e[8] for e in b if e[8] >= t0) / 1e3,
                "open": sum(e[9] - e[8] for e in opens + recvs) / 1e3,
                "same": same,
            })
    if not rows:
        print("no messages of %d..%d bytes" % (lo, 2 * lo))
        return
    cols = ["to_read", "busy_other", "msg", "seal", "open"]
    for name, rs in (("all", rows), ("same CPU", [r for r in rows if r["same"]]),
                     ("two CPUs", [r for r in rows if not r["same"]])):
        if rs:
            print("%-9s n=%4d  " % (name, len(rs)) + "  ".join(
                "%s %.0f (mean %.0f)" % (c, st.median(r[c] for r in rs), sum(r[c] for r in rs) / len(rs))
                for c in cols))
    if runs is not None and occ:
        tot = sum(occ.values())
        print("the other CPU while a same-CPU message's reader had not started (%.1f ms): " % (tot / 1e6)
              + ", ".join("%s %.0f%%" % (k, 100 * v / tot) for k, v in sorted(occ.items())))


if __name__ == "__main__":
    main()
