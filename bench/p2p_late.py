#!/usr/bin/python3
"""Where each pipeline message's time went, from a `meshrun ... --trace` run.

usage: p2p_late.py TRACE.json [--all]

Reads the device rows (compute actions, "stage recv" waits) and the p2p
rows (tid 3000 + device: per message "sc" the send call, "s"/"sn" the
send from its post / from when the net layer took it to its completion,
"r"/"rn" the receive likewise). For every message of every step it finds
the action that made it on the sender (the last compute action ending
before the send call) and the one that used it on the receiver (the first
compute action starting after the receive returned), and splits the time
between them along the message's path:

  exec             the receiver's executor from when it was ready (its previous
                   action's end, or the message's making) to its receive's call:
                   its own sends (the send call writes the message when its
                   receive is posted), waits for them, posts
then, while the receiver waits in its receive, the message's path:
  made   -> call   the sender's executor, from the action's end to the send call
  call   -> net    the send waiting for its receive to be posted (rendezvous):
                   'posted late' when the receiver posted after the call
  net    -> data   from the send handed to the net layer to its first bytes read
                   at the receiver (the sender's write, the receiver's read
                   waiting for a thread)
  data   -> landed the bytes in flight and decrypted
  landed -> back   until the receiver's recv returned
  back   -> use    the receiver's executor to the using action's start

A message is late by what the replay (bench/pipe_replay.py) does not
have: use - max(made, the receiver's previous action's end) = exec + the
wait split along the path + back -> use. The totals per segment sum that
split over the messages late by more than 1 ms. Clock-free in itself
(it reads the trace's times); prints per step the late messages (all of
them with --all) and the sums.
"""
import json, re, sys

ACT = re.compile(r"([FBIW]) mb(\d+) c(\d+)$|head mb|embed|embed_back mb")
SEG = ["exec", "made->call", "call->net", "net->data", "data->landed", "landed->back", "back->use"]


def main():
    ev = json.load(open(sys.argv[1]))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    show_all = "--all" in sys.argv
    xs = sorted((e for e in ev if e.get("ph") == "X"), key=lambda e: e["ts"])
    devs = sorted({e["tid"] for e in xs if e["tid"] < 1000})
    steps = {d: [e for e in xs if e["tid"] == d and e.get("cat") == "step"] for d in devs}
    nsteps = min(len(v) for v in steps.values())
    tot_all = dict.fromkeys(SEG, 0.0)
    for si in range(nsteps):
        win = {d: (steps[d][si]["ts"], steps[d][si]["ts"] + steps[d][si]["dur"]) for d in devs}
        inwin = lambda e, d: win[d][0] <= e["ts"] <= win[d][1]
        comp = {d: [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in xs
                    if e["tid"] == d and e.get("cat") in ("pipeline", "pipelin") and ACT.match(e["name"])
                    and inwin(e, d)] for d in devs}
        recv = {d: {e["name"][len("stage recv "):]: e for e in xs
                    if e["tid"] == d and e["name"].startswith("stage recv ") and inwin(e, d)} for d in devs}
        fl = {d: {e["name"]: e for e in xs if e["tid"] == 3000 + d and inwin(e, d)} for d in devs}
        tot = dict.fromkeys(SEG, 0.0)
        late_n, msgs, plate = 0, 0, 0
        rows = []
        for R in devs:
            for msg, rw in recv[R].items():
                r, rn = fl[R].get("r " + msg), fl[R].get("rn " + msg)
                cands = [(S, fl[S]["sc " + msg]) for S in devs if S != R and "sc " + msg in fl[S]]
                if not r or not cands:
                    continue
                S, sc = min(cands, key=lambda c: abs(c[1]["ts"] - r["ts"]))
                sn = fl[S].get("sn " + msg)
                made = max([a[1] for a in comp[S] if a[1] <= sc["ts"] + 1] or [None], key=lambda v: v or 0)
                back = rw["ts"] + rw["dur"]
                use = min([a[0] for a in comp[R] if a[0] >= back - 1] or [None], key=lambda v: v or 1e18)
                prev = max([a[1] for a in comp[R] if a[1] <= rw["ts"] + 1] or [0.0])
                if made is None or use is None or sn is None or rn is None:
                    continue
                msgs += 1
                plate += r["ts"] > sc["ts"]
                call, net, data, landed = sc["ts"], sn["ts"], rn["ts"], r["ts"] + r["dur"]
                ready = max(made, prev)
                late = use - ready
                # the receiver's own executor before it waits (its sends,
                # waits for them, posts), then its wait along the path
                start = max(rw["ts"], ready)
                part = {"exec": max(0.0, min(rw["ts"], back) - ready)}
                pts = [made, call, net, data, landed, back]
                for i, k in enumerate(SEG[1:-1]):
                    a = min(max(pts[i], start), back)
                    b = min(max(pts[i + 1], start), back)
                    part[k] = max(0.0, b - a)
                part["back->use"] = max(0.0, use - max(back, ready))
                if late > 1000:
                    late_n += 1
                    for k in SEG:
                        tot[k] += part[k]
                if late > 1000 or show_all:
                    rows.append((made, f"  {msg:>8} d{S}->d{R}: late {late / 1e3:6.2f} ms "
                                 + ("(posted late %.2f ms) " % ((r['ts'] - call) / 1e3) if r["ts"] > call else "")
                                 + " ".join(f"{k} {part[k] / 1e3:.2f}" for k in SEG)))
        print(f"step {si}: {msgs} messages, {plate} posted after their send, {late_n} late by > 1 ms; sum of the late part, ms: "
              + ", ".join(f"{k} {tot[k] / 1e3:.1f}" for k in SEG)
              + f"; total {sum(tot.values()) / 1e3:.1f}")
        for _, line in sorted(rows):
            print(line)
        for k in SEG:
            tot_all[k] += tot[k]
    print("all steps, ms: " + ", ".join(f"{k} {tot_all[k] / 1e3:.1f}" for k in SEG))


if __name__ == "__main__":
    main()
