#!/usr/bin/env python3
"""bench/sched_sleep.sh's summary: reads its runs list on stdin (a line a
run: name S M schedule v "F,I,W" per action ms, load before, load after,
hop ms, "span0,spanH" of bench/sched_hop.c)
and, per run, DIR/NAME.json (the --trace of a pipeline_compute=sleep run)
and DIR/NAME.sched (`meshrun schedule --costs` at the same costs).

Per run, over steps >= 1 (medians over the steps; over the rounds when
there are several):
  step ms (fb)  the step's wall: the longest device's forward+backward span
                (from the executor's call to its return: with the skew of
                the devices' starts, which the between-step optimizer and
                all-reduce set, not the table)
  span ms       the longest stage span, as the formulas and the simulator
                count it: a device's first compute action's start to its
                last one's end (one process's clock), the longest device
  busy ms       the compute the busiest device slept: its actions' set
                times (F, I, W; B = I + W; the owners' 0), counted from the
                trace's action spans
  idle ms       per device: span minus its own sleeps
  share         (span - busy) / span: the bubble as the formulas count it
  formula       the schedule's formula at these costs: gpipe and 1f1b
                (S-1)(F+B) idle a stage, interleaved the same per chunk
                ((S-1)/(vM+S-1)), zb_h1 (S-1)(F+I-W), zbv 0 when M >= 2S
                and F = I = W (else -); its span = busy + that idle
  sim ms        the unit-slot simulator's longest stage span at the same
                costs (`meshrun schedule`), where transfers take no time
  beyond ms     span - sim: what the executor and the transport add
  late ms       the busiest device's sleep overshoot: its action spans'
                wall over their set times, summed (the wake-up after each
                sleep, and any wait an action does before its compute)
  recv          the receives a device runs a step (the most), and beyond
                per receive in microseconds: the per-message cost if every
                receive were on the critical path
  xfer cpu ms   the device thread's CPU in its sends, receives, posts and
                send waits (the trace's `stage ...` spans' cpu_us; the
                most of any device): transport work on the thread that
                runs the table, which the simulator does not count
  hop ms        the link's time for one message of the run's size (`meshrun
                bench link` at the mesh's start)
  sim+hop       the simulator's longest stage span with every message
                taking hop ms (bench/sched_hop.c): the formula's schedule
                on this link; span over it is what is left beyond both
Then: ZB-H1's idle over 1F1B's (the worst device's idle ms, same mesh, M,
costs) against its formula's and against sim+hop's (the same ratio if the
link's time a message were all there is beyond the formula), and
interleaved 1F1B's idle over its formula's (and sim+hop's over it), each
goal met or not.
"""
import json
import re
import statistics
import sys

med = statistics.median


def load_trace(path):
    ev = json.load(open(path))
    return ev["traceEvents"] if isinstance(ev, dict) else ev


def cost_of(name, c):
    op = name.split(" ")[0]
    return {"F": c[0], "Fc": c[0], "I": c[1], "W": c[2], "B": c[1] + c[2]}.get(op, 0.0)


COMPUTE = ("F", "Fc", "B", "I", "W", "embed", "head", "embed_back")


def run_figures(d, name, S, M, sched, v, c):
    ev = load_trace("%s/%s.json" % (d, name))
    steps = sorted({e["args"]["step"] for e in ev
                    if e.get("name") == "forward+backward" and e["args"]["step"] >= 1})
    per = []
    for st in steps:
        fb = {e["pid"] * 1000 + e["tid"]: e["dur"] / 1e3 for e in ev
              if e.get("name") == "forward+backward" and e["args"]["step"] == st}
        busy, late, recv, t0, t1, xcpu = {}, {}, {}, {}, {}, {}
        for e in ev:
            if e.get("ph") != "X" or e.get("args", {}).get("step") != st:
                continue
            dev = e["pid"] * 1000 + e["tid"]
            op = e["name"].split(" ")[0]
            if op in COMPUTE:
                t = cost_of(e["name"], c)
                busy[dev] = busy.get(dev, 0.0) + t
                t0[dev] = min(t0.get(dev, e["ts"]), e["ts"])
                t1[dev] = max(t1.get(dev, 0.0), e["ts"] + e["dur"])
                late[dev] = late.get(dev, 0.0) + e["dur"] / 1e3 - t
            elif e["name"].startswith("stage recv"):
                recv[dev] = recv.get(dev, 0) + 1
            if e["name"].startswith("stage ") and "cpu_us" in e.get("args", {}):
                xcpu[dev] = xcpu.get(dev, 0.0) + e["args"]["cpu_us"] / 1e3
        fbw = max(fb.values())
        wall = max(t1[k] - t0[k] for k in t0) / 1e3
        top = max(busy, key=busy.get)
        per.append({"wall": wall, "fb": fbw, "busy": busy[top], "late": late[top],
                    "xcpu": max(xcpu.values()) if xcpu else 0.0,
                    "idle": [wall - busy.get(k, 0.0) for k in sorted(fb)],
                    "recv": max(recv.values()) if recv else 0})
    sim = open("%s/%s.sched" % (d, name)).read()
    m = re.search(r"^bubble: .*longest stage span \(([0-9.]+) slots", sim, re.M)
    simt = float(m.group(1)) if m else None
    f, i, w = c
    if sched in ("gpipe", "1f1b", "interleaved_1f1b"):
        fidle = (S - 1) * (f + i + w)
    elif sched == "zb_h1":
        fidle = (S - 1) * (f + i - w)
    elif sched == "zbv" and M >= 2 * S and f == i == w:
        fidle = 0.0
    else:
        fidle = None
    return per, simt, fidle


def main():
    d = sys.argv[1]
    runs = {}
    for line in sys.stdin:
        name, S, M, sched, v, c, la, lb, hop, hs = line.split()
        simhop = float(hs.split(",")[1])
        S, M, v = int(S), int(M), int(v)
        c = tuple(float(x) for x in c.split(","))
        per, simt, fidle = run_figures(d, name, S, M, sched, v, c)
        key = ("%dx1" % S, M, sched, name.rsplit("-", 1)[1], c)
        r = runs.setdefault(key, {"per": [], "sim": simt, "fidle": fidle, "load": [], "hop": [],
                                  "simhop": []})
        r["hop"].append(float(hop))
        r["simhop"].append(simhop)
        r["per"] += per
        r["load"].append("%s-%s" % (la, lb))
    print("| mesh | M | schedule | F,I,W ms an action | step ms (fb) | span ms | busy ms | idle ms per device | share | "
          "formula share | share/formula | formula span ms | sim span ms | span/sim | beyond sim ms | "
          "late ms | xfer cpu ms | recv | beyond/recv us | hop ms | sim+hop span ms | span/(sim+hop) | load |")
    print("|" + "---|" * 23)
    idle_of = {}
    for key in sorted(runs, key=lambda k: (k[0], k[3], k[1])):
        mesh, M, sched, kind, c = key
        r = runs[key]
        p = r["per"]
        wall = med(x["wall"] for x in p)
        fbw = med(x["fb"] for x in p)
        busy = med(x["busy"] for x in p)
        nd = len(p[0]["idle"])
        idle = [med(x["idle"][k] for x in p) for k in range(nd)]
        late = med(x["late"] for x in p)
        recv = max(x["recv"] for x in p)
        share = (wall - busy) / wall
        fidle = r["fidle"]
        fstep = busy + fidle if fidle is not None else None
        fshare = fidle / fstep if fidle is not None else None
        sim = r["sim"]
        beyond = wall - sim if sim else None
        idle_of[(mesh, M, sched, kind)] = (max(idle), fidle, med(r["simhop"]) - busy)
        hop, simhop = med(r["hop"]), med(r["simhop"])
        print("| %s | %d | %s | %s | %.1f | %.1f | %.1f | %s | %.3f | %s | %s | %s | %s | %s | %s | %.1f | %.1f | %d | %s | "
              "%.2f | %.1f | %.3f | %s |" % (
            mesh, M, sched, ",".join("%g" % x for x in c), fbw, wall, busy, "/".join("%.1f" % x for x in idle),
            share, "%.3f" % fshare if fshare is not None else "-",
            "%.2f" % (share / fshare) if fshare else "-",
            "%.1f" % fstep if fstep is not None else "-", "%.1f" % sim if sim else "-",
            "%.3f" % (wall / sim) if sim else "-", "%.1f" % beyond if sim else "-", late, med(x["xcpu"] for x in p), recv,
            "%.0f" % (beyond * 1e3 / recv) if sim and recv else "-", hop, simhop, wall / simhop,
            " ".join(r["load"])))
    print()
    print("| mesh | M | costs | zb_h1 idle / 1f1b idle (worst device) | formula | sim+hop | goal <= 0.40 |")
    print("|---|---|---|---|---|---|---|")
    for (mesh, M, sched, kind), (idle, fidle, hidle) in sorted(idle_of.items()):
        if sched != "zb_h1" or (mesh, M, "1f1b", kind) not in idle_of:
            continue
        bi, bf, bh = idle_of[(mesh, M, "1f1b", kind)]
        ratio = idle / bi if bi > 0 else float("nan")
        print("| %s | %d | %s | %.2f (%.1f / %.1f ms) | %.2f | %.2f | %s |" % (
            mesh, M, kind, ratio, idle, bi, fidle / bf, hidle / bh if bh > 0 else float("nan"),
            "met" if ratio <= 0.40 else "not met"))
    print()
    print("| mesh | M | interleaved idle / formula idle (worst device) | sim+hop idle / formula idle | "
          "goal within 10% |")
    print("|---|---|---|---|---|")
    for (mesh, M, sched, kind), (idle, fidle, hidle) in sorted(idle_of.items()):
        if sched == "interleaved_1f1b" and fidle:
            q = idle / fidle
            print("| %s | %d | %.2f (%.1f / %.1f ms) | %.2f | %s |" % (mesh, M, q, idle, fidle, hidle / fidle,
                                                                    "met" if q <= 1.10 else "not met"))


if __name__ == "__main__":
    main()
