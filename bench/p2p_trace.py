#!/usr/bin/python3
"""One pipeline message's timeline from a `meshrun local ... --trace` file
(issue 21; bench/p2p_link.sh is the same on `bench link`). For every
point-to-point message (job_p2p.c's flights on each device's p2p row, tid
3 x 1000 + device) it pairs the sender's call ("sc": the isend, in which
the device thread seals and writes up to max_send_bytes) with the
receiver's flights ("r": post to completion, "rn": first bytes of the
message read to completion) and the receiver's "stage recv" span on its
device row (the wait; it ends when the waiter returns). Hosts line up to
within a barrier's latency (host/obs/trace.h), so the cross-host column
(send call to first byte read) carries that error; the others are
same-host intervals. With two hosts the
offset is estimated and taken out: the median send-call-to-first-byte
time one way minus the other way's, halved (the sizes are the same both
ways in a pipeline of two stages). Prints medians and quartiles per message size class
in microseconds, with counts.
usage: p2p_trace.py TRACE.json [bytes per message]"""
import json, sys, statistics as st

P2P_TID = 3 * 1000


def q(xs):
    if not xs:
        return "-"
    xs = sorted(xs)
    return "%.0f [%.0f-%.0f] n=%d" % (st.median(xs), xs[len(xs) // 4], xs[(3 * len(xs)) // 4], len(xs))


def main():
    ev = json.load(open(sys.argv[1]))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    dev_of = {}
    sc, r, rn, wait = {}, {}, {}, []
    for e in ev:
        if e.get("ph") != "X":
            continue
        tid, name = e["tid"], e["name"]
        dev = tid % 1000
        key_dev = (e["pid"], dev)
        t0, t1 = e["ts"], e["ts"] + e["dur"]
        step = e.get("args", {}).get("step", 0)
        if tid >= P2P_TID and tid < P2P_TID + 1000:
            kind, _, rest = name.partition(" ")
            if kind in ("sc", "r", "rn"):
                d = {"sc": sc, "r": r, "rn": rn}[kind]
                d.setdefault((rest, step), []).append((key_dev, t0, t1))
        elif tid < 1000 and name.startswith("stage recv"):
            wait.append((key_dev, name[len("stage recv "):], step, t0, t1, e.get("args", {}).get("cpu_us", -1)))
    rows = {"call (sc) us": [], "call -> first byte read at peer us": [],
            "first byte read -> received (rn) us": [], "call -> received us": [],
            "received -> waiter returned us": [], "waiter's wait us (when it waited)": [],
            "waiter's CPU in the wait us": []}
    done = {}
    for (msg, step), lst in rn.items():
        for (kd, t0, t1) in lst:
            done.setdefault((msg, step), []).append((kd, t0, t1))
    # pairs: the receiver of a call is a device of another host whose rn
    # for this message is the nearest to the call (before the hosts'
    # offset is known: +-10 ms)
    pairs = []
    for (msg, step), calls in sc.items():
        for (kd, c0, c1) in calls:
            rows["call (sc) us"].append(c1 - c0)
            cands = [x for x in done.get((msg, step), []) if x[0][0] != kd[0] and abs(x[1] - c0) < 10000]
            if cands:
                rk, f0, f1 = min(cands, key=lambda x: abs(x[1] - c0))
                pairs.append((msg, step, kd, rk, c0, c1, f0, f1))
    hosts = sorted({p[2][0] for p in pairs} | {p[3][0] for p in pairs})
    off = {h: 0.0 for h in hosts}
    if len(hosts) == 2:
        a, b = hosts
        ab = [p[6] - p[4] for p in pairs if p[2][0] == a]
        ba = [p[6] - p[4] for p in pairs if p[2][0] == b]
        if ab and ba:
            off[b] = (st.median(ab) - st.median(ba)) / 2   # b's clock ahead of a's
            print("# host %s's trace clock taken as %.0f us ahead of host %s's" % (b, off[b], a))
    for (msg, step, kd, rk, c0, c1, f0, f1) in pairs:
            d = off[rk[0]] - off[kd[0]]
            f0, f1 = f0 - d, f1 - d
            rows["call -> first byte read at peer us"].append(f0 - c0)
            rows["first byte read -> received (rn) us"].append(f1 - f0)
            rows["call -> received us"].append(f1 - c0)
            for (wk, wmsg, wstep, w0, w1, cpu) in wait:
                if wk == rk and wmsg == msg and wstep == step and w1 >= f1 and w1 - w0 > 20:
                    rows["received -> waiter returned us"].append(w1 - f1)
                    rows["waiter's wait us (when it waited)"].append(w1 - w0)
                    if cpu >= 0:
                        rows["waiter's CPU in the wait us"].append(cpu)
    print("# %s%s" % (sys.argv[1], (", %s bytes a message" % sys.argv[2]) if len(sys.argv) > 2 else ""))
    for k, v in rows.items():
        print("%-40s %s" % (k, q(v)))


main()
