#!/usr/bin/env python3
"""bench/sched.py METRICS.jsonl TRACE.json: prints the mean step time over
steps >= 1 and the measured bubble: for each step >= 1 and each device, its
idle share between its first and last compute action (the executor's
spans: F, B, I, W, Fc of a microbatch and chunk, and the owners' embed,
head, embed_back), the worst device of each step, averaged over steps."""
import json
import sys

COMPUTE = ("F mb", "B mb", "I mb", "W mb", "Fc mb", "embed mb", "head mb", "embed_back mb")


def main():
    rows = [json.loads(l) for l in open(sys.argv[1])]
    steps = [r["step_time_s"] for r in rows[1:]] or [rows[0]["step_time_s"]]
    ev = [e for e in json.load(open(sys.argv[2]))["traceEvents"] if e.get("ph") == "X"]
    worst = []
    for st in sorted({e["args"]["step"] for e in ev})[1:]:
        idle = []
        for dev in {(e["pid"], e["tid"]) for e in ev}:
            sp = [e for e in ev if e["args"]["step"] == st and (e["pid"], e["tid"]) == dev
                  and e["name"].startswith(COMPUTE)]
            if not sp:
                continue
            w0 = min(e["ts"] for e in sp)
            w1 = max(e["ts"] + e["dur"] for e in sp)
            idle.append(1 - sum(e["dur"] for e in sp) / (w1 - w0) if w1 > w0 else 0)
        if idle:
            worst.append(max(idle))
    print(f"{sum(steps) / len(steps):.3f} {sum(worst) / len(worst) if worst else 0:.3f}")


main()
