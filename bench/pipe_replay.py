#!/usr/bin/python3
"""Replays a traced pipeline step from its actions' own times.

usage: pipe_replay.py TRACE.json [--idle]

For each step of a `meshrun ... --trace` run with a pipeline, takes every
device's compute actions in the order they ran (F, B, I, W of microbatch
mb on chunk c, the head folded into the forward it follows) with the
durations they took, and recomputes the step's span with no transfer
time and no executor: an action starts when the one before it on its
device ends and, across devices, a forward of chunk c when the same
microbatch's forward of chunk c-1 ends, a backward (B or I) of chunk c
when that of chunk c+1 ends (W waits only for its device). It prints,
per step, the measured span of the actions, the replayed one (their
difference is what the transport and the executor add), and the span
the same order gives with every F, B, I, W at its mean over the step
(the difference between the two replays is what the actions' spread
from one microbatch to the next costs, which a bubble formula at mean
costs leaves out). Pure reading of the trace: clock-free in itself.

--idle adds a line a step, "  idle ...": the worst device's idle (the
replayed or measured compute span less its own compute) at each
replay, so its excess over the formula splits into parts: at every
action's mean over all devices (what the formula states; "mean"), at
each device's own means ("dev": the stages at different speeds, e.g.
one CPU's other load), at the actions' own times ("own": their spread
within a device), and measured ("meas": the transport and the
executor on top); and "cpu", the replay at each action's CPU time (a
core a stage with nothing else on it).
"""
import json, re, statistics, sys

ACT = re.compile(r"([FBIW]) mb(\d+) c(\d+)$")


def replay(order, dur, nchunk):
    """order: {dev: [(kind, mb, c)]}; dur: {(kind, mb, c): s}; the span"""
    end, free, pos = {}, {d: 0.0 for d in order}, {d: 0 for d in order}
    left = sum(len(v) for v in order.values())
    while left:
        moved = False
        for d, acts in order.items():
            while pos[d] < len(acts):
                k, mb, c = acts[pos[d]]
                dep = None
                if k == "F" and c > 0:
                    dep = ("F", mb, c - 1)
                elif k in "BI" and c < nchunk - 1:
                    dep = ("B", mb, c + 1) if ("B", mb, c + 1) in dur else ("I", mb, c + 1)
                if dep and dep not in end:
                    break
                t = max(free[d], end[dep] if dep else 0.0) + dur[(k, mb, c)]
                end[(k, mb, c)] = free[d] = t
                pos[d] += 1
                left -= 1
                moved = True
        if not moved:
            raise SystemExit("pipe_replay: the order deadlocks (not a pipeline trace?)")
    return max(end.values())


def idle(order, dur, nchunk):
    """The worst device's idle (ms) in a replay: its span less the device's compute."""
    span = replay(order, dur, nchunk)
    return max(span - sum(dur[k] for k in acts) for acts in order.values())


def main():
    show_idle = "--idle" in sys.argv
    ev = json.load(open(sys.argv[1]))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    xs = sorted((e for e in ev if e.get("ph") == "X"), key=lambda e: e["ts"])
    steps = {}
    for e in xs:
        if e.get("cat") == "step":
            steps.setdefault(e["pid"], []).append(e)
    devs = sorted(steps)
    for si in range(min(len(v) for v in steps.values())):
        order, dur, span0, span1 = {}, {}, None, None
        cpu, dev_of = {}, {}
        for d in devs:
            st = steps[d][si]
            t0, t1 = st["ts"], st["ts"] + st["dur"]
            order[d], last = [], None
            for e in xs:
                if e["pid"] != d or not t0 <= e["ts"] <= t1:
                    continue
                m = ACT.match(e["name"])
                if m:
                    key = (m.group(1), int(m.group(2)), int(m.group(3)))
                    order[d].append(key)
                    dur[key] = e["dur"] / 1e3
                    cpu[key] = e.get("args", {}).get("cpu_us", e["dur"]) / 1e3
                    dev_of[key] = d
                    last = key
                    a, b = e["ts"], e["ts"] + e["dur"]
                    span0 = a if span0 is None else min(span0, a)
                    span1 = b if span1 is None else max(span1, b)
                elif e["name"].startswith("head mb") and last and last[0] == "F":
                    dur[last] += e["dur"] / 1e3
                    cpu[last] += e.get("args", {}).get("cpu_us", e["dur"]) / 1e3
                    span1 = max(span1, e["ts"] + e["dur"])
        if not dur:
            continue
        nchunk = 1 + max(c for _, _, c in dur)
        means = {k: statistics.mean(v for kk, v in dur.items() if kk[0] == k)
                 for k in {kk[0] for kk in dur}}
        own = replay(order, dur, nchunk)
        flat = replay(order, {kk: means[kk[0]] for kk in dur}, nchunk)
        meas = (span1 - span0) / 1e3
        print(f"step {si}: measured {meas:.1f} ms; replayed at the actions' own times {own:.1f} ms"
              f" (transport and executor {meas - own:+.1f} ms); at mean costs "
              + ", ".join(f"{k} {v:.0f}" for k, v in sorted(means.items()))
              + f" ms: {flat:.1f} ms (the actions' spread {own - flat:+.1f} ms)")
        if show_idle:
            dm = {}
            for kk, v in dur.items():
                dm.setdefault((dev_of[kk], kk[0]), []).append(v)
            dm = {k: statistics.mean(v) for k, v in dm.items()}
            # the measured compute span less each device's compute (owners' embed left out)
            busy = {d: sum(dur[k] for k in order[d]) for d in devs}
            im = meas - min(busy.values())
            i_mean = idle(order, {kk: means[kk[0]] for kk in dur}, nchunk)
            i_dev = idle(order, {kk: dm[(dev_of[kk], kk[0])] for kk in dur}, nchunk)
            i_own = idle(order, dur, nchunk)
            i_cpu = idle(order, cpu, nchunk)
            print(f"  idle step {si}: mean {i_mean:.1f} dev {i_dev:.1f} own {i_own:.1f} meas {im:.1f} "
                  f"cpu {i_cpu:.1f} ms; devices' busy " + "/".join(f"{busy[d]:.0f}" for d in devs) + " ms")


if __name__ == "__main__":
    main()
