#!/usr/bin/env python3
"""bench/sched_sleep.sh's summary: reads its runs list on stdin (a line a
run: name (rROUND-VARIANT-...) S M schedule v "F,I,W" per action ms, load
before, load after, hop ms, send ms, "span0,spanH" of bench/sched_hop.c,
the stream's hop ms, "span0,spanH" at it)
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
  hop ms        one message's time at the run's size, from its send call's
                start to the woken receiver (`meshrun bench link
                --pingpong`'s one way, at the mesh's start, same variant)
  send ms       the part of it in the send call (the sending device
                thread's, which its next compute waits for)
  sim+hop       the simulator's longest stage span with every message
                taking hop ms and its sender send ms (bench/sched_hop.c):
                the formula's schedule on this link; span over it is what
                the executor adds beyond both
  hop(stream)   the older hop: a stream of messages both ways (`meshrun
                bench link`), the sender charged nothing; and sim+hop and
                span over it at that hop
Rows are per variant (VARIANTS in sched_sleep.sh). Then: ZB-H1's idle over 1F1B's (the worst device's idle ms, same mesh, M,
costs) against its formula's and against sim+hop's (the same ratio if the
link's time a message were all there is beyond the formula), and
interleaved 1F1B's idle over its formula's (and sim+hop's over it), each
goal met or not; with several variants, each variant's span and worst
idle over the first variant's, run by run.
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


variants = []


def vorder(item):
    return (variants.index(item[0][0]),) + item[0][1:]


def main():
    d = sys.argv[1]
    runs = {}
    for line in sys.stdin:
        name, S, M, sched, v, c, la, lb, hop, snd, hs, shop, shs = line.split()
        simhop = float(hs.split(",")[1])
        S, M, v = int(S), int(M), int(v)
        c = tuple(float(x) for x in c.split(","))
        per, simt, fidle = run_figures(d, name, S, M, sched, v, c)
        var = name.split("-")[1]
        if var not in variants:
            variants.append(var)
        key = (var, "%dx1" % S, M, sched, name.rsplit("-", 1)[1], c)
        r = runs.setdefault(key, {"per": [], "sim": simt, "fidle": fidle, "load": [], "hop": [],
                                  "send": [], "simhop": [], "shop": [], "ssimhop": [], "rounds": []})
        r["hop"].append(float(hop))
        r["send"].append(float(snd))
        r["simhop"].append(simhop)
        r["shop"].append(float(shop))
        r["ssimhop"].append(float(shs.split(",")[1]))
        r["per"] += per
        r["rounds"].append((med(x["wall"] for x in per), med(max(x["idle"]) for x in per)))
        r["load"].append("%s-%s" % (la, lb))
    print("| variant | mesh | M | schedule | F,I,W ms an action | step ms (fb) | span ms | busy ms | idle ms per device | share | "
          "formula share | share/formula | formula span ms | sim span ms | span/sim | beyond sim ms | "
          "late ms | xfer cpu ms | recv | beyond/recv us | hop ms | send ms | sim+hop span ms | span/(sim+hop) | "
          "hop(stream) ms | sim+hop(stream) ms | span/(sim+hop(stream)) | load |")
    print("|" + "---|" * 28)
    idle_of = {}
    for key in sorted(runs, key=lambda k: (variants.index(k[0]), k[1], k[4], k[2])):
        var, mesh, M, sched, kind, c = key
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
        idle_of[(var, mesh, M, sched, kind)] = (max(idle), fidle, med(r["simhop"]) - busy)
        hop, simhop = med(r["hop"]), med(r["simhop"])
        shop, ssimhop = med(r["shop"]), med(r["ssimhop"])
        print("| %s | %s | %d | %s | %s | %.1f | %.1f | %.1f | %s | %.3f | %s | %s | %s | %s | %s | %s | %.1f | %.1f | %d | %s | "
              "%.2f | %.2f | %.1f | %.3f | %.2f | %.1f | %.3f | %s |" % (
            var, mesh, M, sched, ",".join("%g" % x for x in c), fbw, wall, busy, "/".join("%.1f" % x for x in idle),
            share, "%.3f" % fshare if fshare is not None else "-",
            "%.2f" % (share / fshare) if fshare else "-",
            "%.1f" % fstep if fstep is not None else "-", "%.1f" % sim if sim else "-",
            "%.3f" % (wall / sim) if sim else "-", "%.1f" % beyond if sim else "-", late, med(x["xcpu"] for x in p), recv,
            "%.0f" % (beyond * 1e3 / recv) if sim and recv else "-", hop, med(r["send"]), simhop, wall / simhop,
            shop, ssimhop, wall / ssimhop, " ".join(r["load"])))
    print()
    print("| variant | mesh | M | costs | zb_h1 idle / 1f1b idle (worst device) | formula | sim+hop | goal <= 0.40 |")
    print("|---|---|---|---|---|---|---|---|")
    for (var, mesh, M, sched, kind), (idle, fidle, hidle) in sorted(idle_of.items(), key=vorder):
        if sched != "zb_h1" or (var, mesh, M, "1f1b", kind) not in idle_of:
            continue
        bi, bf, bh = idle_of[(var, mesh, M, "1f1b", kind)]
        ratio = idle / bi if bi > 0 else float("nan")
        print("| %s | %s | %d | %s | %.2f (%.1f / %.1f ms) | %.2f | %.2f | %s |" % (
            var, mesh, M, kind, ratio, idle, bi, fidle / bf, hidle / bh if bh > 0 else float("nan"),
            "met" if ratio <= 0.40 else "not met"))
    print()
    print("| variant | mesh | M | interleaved idle / formula idle (worst device) | sim+hop idle / formula idle | "
          "goal within 10% |")
    print("|---|---|---|---|---|---|")
    for (var, mesh, M, sched, kind), (idle, fidle, hidle) in sorted(idle_of.items(), key=vorder):
        if sched == "interleaved_1f1b" and fidle:
            q = idle / fidle
            print("| %s | %s | %d | %.2f (%.1f / %.1f ms) | %.2f | %s |" % (var, mesh, M, q, idle, fidle,
                                                                         hidle / fidle,
                                                                         "met" if q <= 1.10 else "not met"))
    if len(variants) < 2:
        return
    print()
    print("| variant | mesh | M | schedule | costs | span / %s's, round by round | worst idle / %s's |" % (
        variants[0], variants[0]))
    print("|---|---|---|---|---|---|---|")
    for key in sorted(runs, key=lambda k: (variants.index(k[0]), k[1], k[4], k[2], k[3])):
        var, rest = key[0], key[1:]
        base = runs.get((variants[0],) + rest)
        if var == variants[0] or not base:
            continue
        pairs = list(zip(runs[key]["rounds"], base["rounds"]))
        print("| %s | %s | %d | %s | %s | %s | %s |" % (
            var, rest[0], rest[1], rest[2], rest[3], " ".join("%.3f" % (a[0] / b[0]) for a, b in pairs),
            " ".join("%.2f" % (a[1] / b[1]) if b[1] > 0 else "-" for a, b in pairs)))


if __name__ == "__main__":
    main()
