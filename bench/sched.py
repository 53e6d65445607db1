#!/usr/bin/env python3
"""bench/sched.py METRICS.jsonl TRACE.json [--detail]: the measured step
time and bubble of a run, from its metrics and its --trace (steps >= 1,
averaged over them). Prints one line:

  STEP SHARE IDLE_S IDLE_PER_DEVICE CPU_BY_KIND FILLABLE_S

STEP: the mean step time (s). SHARE: each device's idle share between its
own first and last compute action (the executor's spans: F, B, I, W, Fc
of a microbatch and chunk, and the owners' embed, head, embed_back), the
worst device. IDLE_S: the bubble the way the issue states it, in time: a
device's idle seconds in the step's compute span (the first compute
action on any device to the last on any device) minus its own compute,
the worst device; IDLE_PER_DEVICE: the same for each device, a/b/c/...
(a pipeline's formulas, (S-1)(F+B) for 1F1B and (S-1)(F+I-W) for ZB-H1,
are these seconds on dedicated devices). CPU_BY_KIND: the CPU seconds a
step of each action kind over every device (the spans' args.cpu_us),
F=..,B=..,I=..,W=..,own=.. (own: embed, head, embed_back). FILLABLE_S:
of the worst device's idle, the seconds it waited on a receive while it
owed a weight gradient (an I done, its W not started) that could have
run then, capped at the owed W's measured time: what running owed W's
during waits could win (with pipeline_fill_waits on, the executor runs
them there: what is left is waits whose owed W was its chunk's last,
which it keeps in place, or tables with gathered layers). --detail prints per device the idle split into
before its first compute, receive waits (activations, gradients), other
waits, and after its last compute.

Four more fields follow (--sched NAME --stages S name the run's
schedule; without them FORMULA is -):

  COSTS FORMULA IDLE_SPLIT SPAN_SHARE

COSTS: the mean wall milliseconds of one action of each kind (the
spans' durations, every device, steps >= 1), F=..,B=..,I=..,W=..: the
F, I, W ratio the run actually had. FORMULA: the schedule's idle seconds
a device at those costs, its bubble share, and the idle seconds at the
actions' CPU costs (what a core a stage would give), idle_s/share/cpu_s:
(S-1)(F+B) for gpipe and 1f1b (B = I + W when split), (S-1)(F+I-W) for
zb_h1, (S-1)(F+B) of one chunk's actions for interleaved_1f1b (share
(S-1)/(vM+S-1)); - for circular and zbv. IDLE_SPLIT: per device,
idle = wait + queued, a/b/..: queued is the seconds a step its thread was
runnable but not running outside its compute (the thread's schedstat
run-delay, from --schedstat FILE, less the descheduled part of its
compute spans, their wall minus their CPU), wait what is left: time
blocked on a message. Then :desc, the descheduled seconds inside its
compute spans, which lengthen the step but are not idle. Without
--schedstat only the desc part is known: -+-:desc. FILE holds lines
`WALL DEVICE CPU_NS DELAY_NS STEPS_LOGGED` (/proc/PID/task/TID/schedstat
of each device thread, sampled by bench/sched.sh). SPAN_SHARE: the worst
device's IDLE_S over the step's compute span, the share the formulas
(S-1)/(M+S-1) and (S-1)/(vM+S-1) state."""
import json
import sys

COMPUTE = ("F mb", "B mb", "I mb", "W mb", "Fc mb", "embed mb", "head mb", "embed_back mb")
KINDS = (("F", ("F mb", "Fc mb")), ("B", ("B mb",)), ("I", ("I mb",)), ("W", ("W mb",)),
         ("own", ("embed mb", "head mb", "embed_back mb")))


def fillable(evs, comp):
    """Seconds of receive waits during which the device owed a W, each
    wait capped at the owed W's (mean) duration times how many it owed."""
    ws = [e for e in comp if e["name"].startswith("W mb")]
    wdur = sum(e["dur"] for e in ws) / len(ws) if ws else 0
    i_end = sorted(e["ts"] + e["dur"] for e in comp if e["name"].startswith("I mb"))
    w_start = sorted(e["ts"] for e in ws)
    got = 0
    for e in evs:
        if not e["name"].startswith("stage recv"):
            continue
        owed = sum(t <= e["ts"] for t in i_end) - sum(t <= e["ts"] for t in w_start)
        if owed > 0:
            got += min(e["dur"], owed * wdur)
    return got


def opt(name):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None


def run_delay(path, nrows, steps):
    """Per device: the run-delay seconds a step over steps >= 1 (the
    delay's rate between the first and last sample taken while steps 1
    .. nrows - 1 ran, times the mean step), from sched.sh's samples."""
    by = {}
    for line in open(path):
        w, dev, _cpu, delay, logged = line.split()
        if 1 <= int(logged) < nrows:
            by.setdefault(int(dev), []).append((float(w), int(delay) / 1e9))
    step = sum(steps) / len(steps)
    return {d: (x[-1][1] - x[0][1]) / (x[-1][0] - x[0][0]) * step
            for d, x in by.items() if len(x) >= 2 and x[-1][0] > x[0][0]}


def formula(sched, S, cost, M, v):
    """The schedule's idle seconds a device at the measured costs, and
    its bubble share; None when it has no closed form here."""
    cost = {k: x / 1e3 for k, x in cost.items()}
    F, B = cost.get("F", 0), cost.get("B", cost.get("I", 0) + cost.get("W", 0))
    if sched in ("gpipe", "1f1b", "interleaved_1f1b"):
        return (S - 1) * (F + B), (S - 1) / (v * M + S - 1)
    if sched == "zb_h1":
        I, W = cost.get("I", 0), cost.get("W", 0)
        idle = (S - 1) * (F + I - W)
        return idle, idle / (M * (F + I + W) + idle)
    return None


def main():
    detail = "--detail" in sys.argv
    rows = [json.loads(l) for l in open(sys.argv[1])]
    steps = [r["step_time_s"] for r in rows[1:]] or [rows[0]["step_time_s"]]
    ev = [e for e in json.load(open(sys.argv[2]))["traceEvents"] if e.get("ph") == "X"]
    devs = sorted({(e["pid"], e["tid"]) for e in ev if e["tid"] < 1000})
    share, idle_s, per_dev, fill, span_share = [], [], [], [], []
    kinds = {k: 0.0 for k, _ in KINDS}
    durs = {k: [] for k, _ in KINDS}
    cpus = {k: [] for k, _ in KINDS}
    desc = {}
    nsteps = 0
    for st in sorted({e["args"]["step"] for e in ev})[1:]:
        es = [e for e in ev if e["args"]["step"] == st]
        comp = [e for e in es if e["name"].startswith(COMPUTE) and e["tid"] < 1000]
        if not comp:
            continue
        nsteps += 1
        t0 = min(e["ts"] for e in comp)
        t1 = max(e["ts"] + e["dur"] for e in comp)
        sh, idl, fl = [], [], []
        for dev in devs:
            sp = [e for e in comp if (e["pid"], e["tid"]) == dev]
            if not sp:
                continue
            busy = sum(e["dur"] for e in sp)
            w0 = min(e["ts"] for e in sp)
            w1 = max(e["ts"] + e["dur"] for e in sp)
            sh.append(1 - busy / (w1 - w0) if w1 > w0 else 0)
            idl.append((t1 - t0 - busy) / 1e6)
            mine = sorted((e for e in es if (e["pid"], e["tid"]) == dev), key=lambda e: e["ts"])
            fl.append(fillable(mine, sp) / 1e6)
            for k, pre in KINDS:
                kinds[k] += sum(e["args"].get("cpu_us", 0) for e in sp if e["name"].startswith(pre)) / 1e6
                durs[k] += [e["dur"] / 1e3 for e in sp if e["name"].startswith(pre)]
                cpus[k] += [e["args"]["cpu_us"] / 1e3 for e in sp if e["name"].startswith(pre) and "cpu_us" in e["args"]]
            desc.setdefault(dev[1], []).append(
                sum(e["dur"] - e["args"]["cpu_us"] for e in sp if "cpu_us" in e["args"]) / 1e6)
            if detail:
                acts = sum(e["dur"] for e in mine if e["name"].startswith("stage recv act")) / 1e6
                grads = sum(e["dur"] for e in mine if e["name"].startswith("stage recv grad")) / 1e6
                print(f"step {st} device {dev[1]}: idle {idl[-1]:.3f} s = before first {(w0 - t0) / 1e6:.3f}"
                      f" + after last {(t1 - w1) / 1e6:.3f} + between {idl[-1] - (w0 - t0 + t1 - w1) / 1e6:.3f}"
                      f" (receive waits: activations {acts:.3f}, gradients {grads:.3f}); W-fillable {fl[-1]:.3f}",
                      file=sys.stderr)
        share.append(max(sh))
        worst = max(range(len(idl)), key=lambda i: idl[i])
        idle_s.append(idl[worst])
        span_share.append(idl[worst] * 1e6 / (t1 - t0))
        fill.append(fl[worst])
        per_dev.append(idl)
    n = max(nsteps, 1)
    mean = lambda xs: sum(xs) / len(xs) if xs else 0
    dev_mean = [mean([p[i] for p in per_dev if i < len(p)]) for i in range(max((len(p) for p in per_dev), default=0))]
    cost = {k: mean(v) for k, v in durs.items() if v and k != "own"}
    # M and v from the first device's forwards in the last step (chunks: the c of "F mb3 c1")
    f0 = [e["name"].split() for e in comp if e["name"].startswith("F mb") and (e["pid"], e["tid"]) == devs[0]]
    v = len({x[2] for x in f0 if len(x) > 2}) or 1
    sched, S = opt("--sched"), int(opt("--stages") or 0)
    fm = formula(sched, S, cost, len(f0) // v, v) if sched and S and f0 else None
    fc = formula(sched, S, {k: mean(x) for k, x in cpus.items() if x and k != "own"}, len(f0) // v, v) if fm else None
    rd = run_delay(opt("--schedstat"), len(rows), steps) if opt("--schedstat") else {}
    split = []
    for i, dev in enumerate(devs):
        dc = mean(desc.get(dev[1], []))
        if dev[1] in rd and i < len(dev_mean):
            q = max(rd[dev[1]] - dc, 0)
            split.append(f"{max(dev_mean[i] - q, 0):.2f}+{q:.2f}:{dc:.2f}")
        else:
            split.append(f"-+-:{dc:.2f}")
    print(f"{mean(steps):.3f} {mean(share):.3f} {mean(idle_s):.3f} "
          f"{'/'.join(f'{x:.2f}' for x in dev_mean) or '-'} "
          f"{','.join(f'{k}={v / n:.2f}' for k, v in kinds.items() if v > 0) or '-'} {mean(fill):.3f} "
          f"{','.join(f'{k}={v:.0f}' for k, v in cost.items()) or '-'} "
          f"{f'{fm[0]:.3f}/{fm[1]:.3f}/{fc[0]:.3f}' if fm else '-'} {'/'.join(split) or '-'} "
          f"{mean(span_share):.3f}")


main()
