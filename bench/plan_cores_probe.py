#!/usr/bin/env python3
"""How well can a look at the machine before a run predict the cores the
run's devices get (issue 21, `meshrun plan --cores auto`)?

N busy processes (default 4: the four devices of bench/plan_costs.sh's
rows, as one session, so one scheduler group as a run's agents are) run
for SECONDS; every TICK seconds their CPU (from /proc/PID/stat) gives the
cores they got between them. Then, for each look of L seconds ending at
t, as `plan --cores auto` looks (1 s, then the 2-12 s it measures), the
mean over the look against the mean over a run's window starting GAP
seconds later and lasting RUN seconds (bench/plan_costs.sh: plan's tail
and the run's start-up, then its measured steps): the share of looks
within 15% of the run, and the median and 90th percentile of the error.
What a look cannot know is how the machine's other load moves between it
and the run.

usage: bench/plan_cores_probe.py [SECONDS=180] [N=4] [TICK=0.5] [GAP=4] [RUN=6]
"""
import os
import statistics
import sys
import time


def burn():
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def cpu_s(pid, hz):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / hz  # utime, stime


def main():
    a = [float(x) for x in sys.argv[1:]]
    seconds, n, tick, gap, run = (a + [180, 4, 0.5, 4, 6][len(a):])[:5]
    n = int(n)
    hz = os.sysconf("SC_CLK_TCK")
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            burn()
        pids.append(pid)
    series = []
    try:
        c0, t0 = sum(cpu_s(p, hz) for p in pids), time.monotonic()
        t_end = t0 + seconds
        while time.monotonic() < t_end:
            time.sleep(tick)
            c1, t1 = sum(cpu_s(p, hz) for p in pids), time.monotonic()
            series.append((c1 - c0) / (t1 - t0))
            c0, t0 = c1, t1
    finally:
        for p in pids:
            os.kill(p, 9)
            os.waitpid(p, 0)
    k = lambda s: max(1, int(round(s / tick)))
    print(f"# {n} busy processes, {seconds:.0f} s in ticks of {tick} s: cores got mean "
          f"{statistics.mean(series):.2f}, min {min(series):.2f}, max {max(series):.2f} a tick; "
          f"load {' '.join(open('/proc/loadavg').read().split()[:3])}")
    print(f"| look s | looks | within 15% of the run's window ({run:.0f} s, {gap:.0f} s later) | "
          f"median error | 90th percentile |")
    print("|---|---|---|---|---|")
    for look in (1, 2, 4, 8, 16, 32):
        errs = []
        for i in range(k(look), len(series) - k(gap) - k(run) + 1):
            lk = statistics.mean(series[i - k(look):i])
            rn = statistics.mean(series[i + k(gap):i + k(gap) + k(run)])
            errs.append(abs(lk - rn) / rn)
        if not errs:
            continue
        errs.sort()
        print(f"| {look} | {len(errs)} | {100 * sum(e <= 0.15 for e in errs) / len(errs):.0f}% | "
              f"{100 * errs[len(errs) // 2]:.0f}% | {100 * errs[int(0.9 * (len(errs) - 1))]:.0f}% |")
    print("# series (cores a tick): " + " ".join(f"{c:.2f}" for c in series))


if __name__ == "__main__":
    main()
