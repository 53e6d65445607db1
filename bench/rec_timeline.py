#!/usr/bin/python3
"""The per-record timeline of one-way messages (issues 21 and 19, stream9).

Reads the logs a run left with MESHRUN_REC_LOG=DIR (net/rec_log.h: one
line per record sealed or opened, per send() and per recv() with data,
CLOCK_MONOTONIC, one clock for every process of the machine), pairs each
connection's two ends by their ports, cuts each direction's records into
bursts (a gap of more than GAP_US between two seals starts a new one) and
prints, per burst size, the medians of when each step happened, in us from
the burst's first seal:

  seal_end   the sender's last record sealed
  send1      the sender's first send() of a record or more returned,
             and after how many sealed KiB (send1_kb); sends: send()s
  recv1      the receiver's first recv() of a record or more returned
  open1      the receiver's first full record (16 KiB) opened
  open_end   the receiver's last record opened (the message is in)
  overlap    bursts whose first record was opened before their last was
             sealed (an order of events, not a duration)
  cpus       the CPUs the sealing and the opening threads ran on

Usage: rec_timeline.py DIR [MIN_BYTES] [GAP_US]   (default 65536, 250)
"""
import statistics as st
import sys
from collections import defaultdict

from rec_events import bursts as cut, directions, load


def main():
    d = sys.argv[1]
    min_bytes = int(sys.argv[2]) if len(sys.argv) > 2 else 65536
    gap = (int(sys.argv[3]) if len(sys.argv) > 3 else 250) * 1000
    ev = load(d)
    tx, rx = directions(ev)
    rows = defaultdict(list)
    for key, es in tx.items():
        peer = sorted(rx.get((key[1], key[0]), []), key=lambda e: e[8])
        for b in cut(es, gap):
            seals = [e for e in b if e[0] == "seal"]
            # a send() that began before the burst's first seal is the last one's
            # (and a send() of less than a record carries a frame header or a
            # control frame ahead of the data: not the first piece)
            sends = [e for e in b if e[0] == "send" and e[8] >= seals[0][8]]
            big = [e for e in sends if e[7] >= 16384] or sends
            size = sum(e[7] for e in seals)
            if size < min_bytes or not sends:
                continue
            s0, s1 = seals[0][6], seals[-1][6]
            t0 = seals[0][8]
            opens = [e for e in peer if e[0] == "open" and s0 <= e[6] <= s1]
            recvs = [e for e in peer if e[0] == "recv" and s0 <= e[6] <= s1 + 1
                     and e[9] >= t0]
            if not opens:
                continue
            bigo = [e for e in opens if e[7] >= 16384] or opens
            bigr = [e for e in recvs if e[7] >= 16384] or recvs
            sealed_before = sum(e[7] for e in seals if e[9] <= big[0][8])
            r = {
                "seal_end": (seals[-1][9] - t0) / 1e3,
                "send1": (big[0][9] - t0) / 1e3,
                "send1_kb": sealed_before / 1024,
                "sends": len(sends),
                "recv1": (bigr[0][9] - t0) / 1e3 if recvs else float("nan"),
                "recvs": len(recvs),
                "open1": (bigo[0][8] - t0) / 1e3,
                "open_end": (opens[-1][9] - t0) / 1e3,
                "overlap": 1 if bigo[0][8] < seals[-1][9] else 0,
                "cpus": "%s/%s" % ("".join(sorted({str(e[3]) for e in seals})),
                                   "".join(sorted({str(e[3]) for e in opens}))),
            }
            # round the size to the message's (frame headers ride along)
            rows[1 << max(0, (size - 1).bit_length() - 1)].append(r)
    cols = ["seal_end", "send1", "send1_kb", "sends", "recv1", "recvs", "open1", "open_end"]
    print("%9s %6s " % ("size", "bursts") + " ".join("%9s" % c for c in cols)
          + " %9s %s" % ("overlap", "cpus seal/open"))
    for size in sorted(rows):
        rs = rows[size]
        cpus = defaultdict(int)
        for r in rs:
            cpus[r["cpus"]] += 1
        print("%9d %6d " % (size, len(rs))
              + " ".join("%9.1f" % st.median(r[c] for r in rs) for c in cols)
              + " %4d/%-4d %s" % (sum(r["overlap"] for r in rs), len(rs),
                                  " ".join("%s:%d" % kv for kv in sorted(cpus.items()))))
    print("# medians, us from each burst's first seal; overlap: bursts whose first "
          "record was opened before their last was sealed")


if __name__ == "__main__":
    main()
