#!/usr/bin/python3
"""Where a real-compute pipeline step's idle beyond its formula goes.

usage: pipe_excess.py TRACE.json [TRACE.json ...]

For each traced run (`meshrun local ... --trace`, e.g. bench/sched.sh's
with KEEP=DIR) and each step >= 1, the worst device's idle (the compute
span less its own compute, ms) at four replays (bench/pipe_replay.py's
--idle): "mean" every F, B, I, W at its mean over all devices (what the
formula states), "dev" each device's own means (stages at different
speeds), "own" the actions' own times (their spread within a device),
and "meas" the measured step (the transport and the executor on top);
and "cpu", the replay at each action's CPU time (a core a stage with
nothing else on it), also at the CPU times' means over all devices
("cpu mean": the formula at CPU costs) and each device's ("cpu dev":
the stages' own work apart, e.g. the head on the last). Then the parts: dev - mean ("imbalance"), own -
dev ("spread"), meas - own ("transport+exec"). Then per device, over
the run's steps >= 1: its compute's wall and CPU seconds a step and
their difference ("desc": descheduled inside its compute, the CPU's
other load), and the CPU time of F and B (or I, W) actions that start
right after a wait (a receive the device waited on more than 1 ms
since its previous compute) against those that do not, as the ratio of
their means: above 1 is a cold start after a wait. Last, the medians
over runs and steps of the parts, and with several runs a table of
them per run name less its round (bench/sched.sh's MESH_M_SCHED_ROUND).
Pure reading of the traces.
"""
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pipe_replay import ACT, replay  # noqa: E402


def idle(order, dur, nchunk):
    span = replay(order, dur, nchunk)
    return max(span - sum(dur[k] for k in acts) for acts in order.values())


def one(path, parts):
    ev = json.load(open(path))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    xs = sorted((e for e in ev if e.get("ph") == "X" and "step" in e.get("args", {})), key=lambda e: e["ts"])
    steps = sorted({e["args"]["step"] for e in xs})
    devs = sorted({(e["pid"], e["tid"]) for e in xs if e["tid"] < 1000})
    wall, cpu, after, cont = {}, {}, {}, {}
    name = os.path.basename(path)
    for st in steps:
        if st < 1:
            continue
        order, dur, dcpu, dev_of = {}, {}, {}, {}
        s0, s1 = None, None
        for d in devs:
            order[d], last, prev_end = [], None, None
            waited = 0.0
            for e in xs:
                if (e["pid"], e["tid"]) != d or e["args"]["step"] != st:
                    continue
                if e["name"].startswith("stage recv"):
                    waited += e["dur"]
                    continue
                m = ACT.match(e["name"])
                c = e["args"].get("cpu_us", e["dur"])
                if m:
                    key = (m.group(1), int(m.group(2)), int(m.group(3)))
                    order[d].append(key)
                    dur[key], dcpu[key], dev_of[key] = e["dur"] / 1e3, c / 1e3, d
                    last = key
                    s0 = e["ts"] if s0 is None else min(s0, e["ts"])
                    s1 = e["ts"] + e["dur"] if s1 is None else max(s1, e["ts"] + e["dur"])
                    wall[d] = wall.get(d, 0) + e["dur"] / 1e6
                    cpu[d] = cpu.get(d, 0) + c / 1e6
                    kind = "F" if m.group(1) == "F" else "B"
                    (after if prev_end is not None and waited > 1e3 else cont).setdefault(
                        (d, kind), []).append(c / 1e3)
                    prev_end, waited = e["ts"] + e["dur"], 0.0
                elif e["name"].startswith("head mb") and last and last[0] == "F":
                    dur[last] += e["dur"] / 1e3
                    dcpu[last] += c / 1e3
                    s1 = max(s1, e["ts"] + e["dur"])
        if not dur:
            continue
        nchunk = 1 + max(c for _, _, c in dur)
        means = {k: statistics.mean(v for kk, v in dur.items() if kk[0] == k) for k in {kk[0] for kk in dur}}
        dm = {}
        for kk, v in dur.items():
            dm.setdefault((dev_of[kk], kk[0]), []).append(v)
        dm = {k: statistics.mean(v) for k, v in dm.items()}
        busy = [sum(dur[k] for k in order[d]) for d in devs]
        i_mean = idle(order, {kk: means[kk[0]] for kk in dur}, nchunk)
        i_dev = idle(order, {kk: dm[(dev_of[kk], kk[0])] for kk in dur}, nchunk)
        i_own = idle(order, dur, nchunk)
        i_meas = (s1 - s0) / 1e3 - min(busy)
        i_cpu = idle(order, dcpu, nchunk)
        cm = {k: statistics.mean(v for kk, v in dcpu.items() if kk[0] == k) for k in means}
        cd = {}
        for kk, v in dcpu.items():
            cd.setdefault((dev_of[kk], kk[0]), []).append(v)
        cd = {k: statistics.mean(v) for k, v in cd.items()}
        i_cpu_mean = idle(order, {kk: cm[kk[0]] for kk in dur}, nchunk)
        i_cpu_dev = idle(order, {kk: cd[(dev_of[kk], kk[0])] for kk in dur}, nchunk)
        p = {"mean": i_mean, "imbalance": i_dev - i_mean, "spread": i_own - i_dev,
             "transport+exec": i_meas - i_own, "meas": i_meas, "cpu mean": i_cpu_mean,
             "cpu dev": i_cpu_dev, "cpu": i_cpu}
        parts.append(p)
        print(f"{name} step {st}: idle mean {i_mean:.0f}, dev {i_dev:.0f}, own {i_own:.0f}, meas {i_meas:.0f}, "
              f"cpu mean/dev/own {i_cpu_mean:.0f}/{i_cpu_dev:.0f}/{i_cpu:.0f} ms: imbalance {p['imbalance']:+.0f}, spread {p['spread']:+.0f}, "
              f"transport+exec {p['transport+exec']:+.0f} ms; meas/mean {i_meas / i_mean:.2f}")
    n = max(len([s for s in steps if s >= 1]), 1)
    for d in devs:
        if d not in wall:
            continue
        cold = []
        for kind in ("F", "B"):
            a, c = after.get((d, kind), []), cont.get((d, kind), [])
            cold.append(f"{kind} {statistics.mean(a) / statistics.mean(c):.2f} ({len(a)}/{len(c)})"
                        if a and c else f"{kind} - ({len(a)}/{len(c)})")
        print(f"{name} device {d[0]}/{d[1]}: compute wall {wall[d] / n:.2f} s, cpu {cpu[d] / n:.2f} s, "
              f"desc {(wall[d] - cpu[d]) / n:.2f} s a step; cpu after a wait / not: {', '.join(cold)}")


def main():
    parts, by = [], {}
    for path in sys.argv[1:]:
        mine = []
        one(path, mine)
        parts += mine
        # bench/sched.sh's run names: MESH_M_SCHED[_VARIANT]_ROUND.json
        by.setdefault(re.sub(r"_\d+\.json$", "", os.path.basename(path)), []).extend(mine)
    med = lambda ps, k: statistics.median(p[k] for p in ps)
    if len(by) > 1:
        print("| run | steps | mean (formula) ms | imbalance | spread | transport+exec | meas | meas/mean "
              "| cpu: mean | dev | own |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for name, ps in sorted(by.items()):
            if ps:
                print(f"| {name} | {len(ps)} | {med(ps, 'mean'):.0f} | {med(ps, 'imbalance'):+.0f} | "
                      f"{med(ps, 'spread'):+.0f} | {med(ps, 'transport+exec'):+.0f} | {med(ps, 'meas'):.0f} | "
                      f"{statistics.median(p['meas'] / p['mean'] for p in ps):.2f} | {med(ps, 'cpu mean'):.0f} | "
                      f"{med(ps, 'cpu dev'):.0f} | {med(ps, 'cpu'):.0f} |")
    if parts:
        print("median over %d steps: " % len(parts) + ", ".join(
            f"{k} {med(parts, k):+.0f}" for k in parts[0]) + " ms")


if __name__ == "__main__":
    main()
