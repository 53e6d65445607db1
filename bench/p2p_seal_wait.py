#!/usr/bin/python3
"""How long a handed-off point-to-point send waits for its first seal (issue 21, inter16).

usage: p2p_seal_wait.py DIR [MIN_BYTES]

Reads the per-record logs a 2-host run left with MESHRUN_REC_LOG=DIR
(net/rec_log.h; one CLOCK_MONOTONIC clock for every process) and, for
each posted send (`isend` mark) of MIN_BYTES or more (default 200000: a
pipeline's activations and gradients), takes the first record the
sending process seals after the post began, the first send() after that
seal, and the peer's first recv() after that send(). Prints medians,
p75, p90 and max, in us, of:

  call          the send call itself (the device thread's isend)
  to_seal       the call's start to the first seal's start: with the
                hand-off (p2p_handoff_bytes), the stream thread's
                wake-up and its wait for a CPU
  seal_to_send  that seal to the first send()
  send_to_recv  that send() to the peer's first recv()

and how many first seals the sending device thread made itself (the
thread that posted the send) and how many waited more than 1 ms. On a
bound 2 x 1 run with real compute the stream thread shares its agent's
one CPU with the device thread, which computes the next action by then.
Approximate: a seal of an earlier message still queued counts as the
first.
"""
import bisect
import statistics as st
import sys

from rec_events import load


def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def main():
    ev = load(sys.argv[1])
    minb = int(sys.argv[2]) if len(sys.argv) > 2 else 200000
    by = {}
    for e in ev:
        by.setdefault(e[1], []).append(e)
    pids = sorted(by)
    if len(pids) != 2:
        raise SystemExit("p2p_seal_wait: needs the logs of exactly two processes, found %d" % len(pids))
    rows = []
    for pid in pids:
        other = pids[1 - pids.index(pid)]
        mine = sorted(by[pid], key=lambda e: e[8])
        seals = [e for e in mine if e[0] == "seal" and e[7] > 1000]
        sends = [e for e in mine if e[0] == "send"]
        recvs = sorted((e for e in by[other] if e[0] == "recv"), key=lambda e: e[8])
        s0, d0, r0 = [e[8] for e in seals], [e[8] for e in sends], [e[8] for e in recvs]
        for e in mine:
            if e[0] != "isend" or e[7] < minb:
                continue
            i = bisect.bisect_left(s0, e[8])
            if i == len(seals):
                continue
            j = bisect.bisect_left(d0, seals[i][8])
            if j == len(sends):
                continue
            k = bisect.bisect_left(r0, sends[j][8])
            if k == len(recvs):
                continue
            rows.append({"call": (e[9] - e[8]) / 1e3, "to_seal": (seals[i][8] - e[8]) / 1e3,
                         "seal_to_send": (sends[j][8] - seals[i][8]) / 1e3,
                         "send_to_recv": (recvs[k][8] - sends[j][8]) / 1e3, "dev": seals[i][2] == e[2]})
    if not rows:
        raise SystemExit("p2p_seal_wait: no posted send of %d bytes or more" % minb)
    for k in ("call", "to_seal", "seal_to_send", "send_to_recv"):
        xs = [r[k] for r in rows]
        print(f"{k:13s} us: median {st.median(xs):8.1f}  p75 {q(xs, .75):8.1f}  p90 {q(xs, .9):8.1f}  "
              f"max {max(xs):8.1f}")
    late = [r for r in rows if r["to_seal"] > 1000]
    print(f"{len(rows)} sends; first sealed by the sending device thread: {sum(r['dev'] for r in rows)}; "
          f"first seal more than 1 ms after the call: {len(late)}, of them by another thread "
          f"{sum(not r['dev'] for r in late)}")


if __name__ == "__main__":
    main()
