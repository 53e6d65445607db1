#!/usr/bin/env python3
"""CPU time of a meshrun run, per step and per thread kind (bench/bsplit.sh):

  bsplit_cpu.py OUT -- COMMAND...

runs COMMAND (meshrun local: its hosts are its child processes), passes
its stdout through, and at each "completed step: N" line host 0 prints
reads every thread of the run (/proc/PID/task/TID: schedstat's time on a
CPU and time runnable but waiting for one, the context switches) and
sums them by kind, the name without its number (mr-dev, mr-comm,
mr-stream, mr-net, the main threads). Writes OUT, one line of key=value
per step >= 1 averaged (from the end of step 0 to the end of the last):
  cpu_s    CPU seconds of all the run's threads (every host's)
  dev_s    of the device threads alone
  comm_s   of the communication threads (exchanges, background collectives)
  net_s    of the net and stream threads (TLS, sockets)
  rq_s     seconds threads were runnable but waited for a CPU
  nvcsw    involuntary context switches (preempted, or a yield that ran
           another thread)
Clock-free figures where the step time is not: a run's CPU per step is
what it asks of the machine whatever else runs on it (within the noise
of shared caches), and cpu_s / (step_s x cores) is how busy it kept the
cores (1: every core busy; nothing left for a reordering to fill).
Exit status: COMMAND's.
"""
import collections
import os
import re
import subprocess
import sys


def children(root):
    kids = collections.defaultdict(list)
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            s = open("/proc/%s/stat" % d).read()
        except OSError:
            continue
        kids[int(s[s.rfind(")") + 2:].split()[1])].append(int(d))
    out, todo = {root}, [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def kind(comm):
    k = re.sub(r"\d+$", "", comm)
    if k in ("mr-stream", "mr-net"):
        return "net"
    return {"mr-dev": "dev", "mr-comm": "comm"}.get(k, "main")


def snapshot(root):
    tot = collections.Counter()
    for pid in children(root):
        try:
            tids = os.listdir("/proc/%d/task" % pid)
        except OSError:
            continue
        for t in tids:
            b = "/proc/%d/task/%s/" % (pid, t)
            try:
                comm = open(b + "comm").read().strip()
                run, wait, _ = open(b + "schedstat").read().split()
                st = open(b + "status").read()
            except OSError:
                continue  # the thread ended meanwhile
            m = re.search(r"\nnonvoluntary_ctxt_switches:\s+(\d+)", st)
            tot["cpu_s"] += int(run) / 1e9
            tot[kind(comm) + "_s"] += int(run) / 1e9
            tot["rq_s"] += int(wait) / 1e9
            tot["nvcsw"] += int(m.group(1)) if m else 0
    return tot


def main():
    out, cmd = sys.argv[1], sys.argv[3:]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    snaps = []
    for line in p.stdout:
        sys.stdout.write(line)
        if line.startswith("completed step:"):
            snaps.append(snapshot(p.pid))
    rc = p.wait()
    keys = ["cpu_s", "dev_s", "comm_s", "net_s", "rq_s", "nvcsw"]
    n = len(snaps) - 1
    with open(out, "w") as f:
        if n >= 1:
            f.write(" ".join("%s=%.3f" % (k, (snaps[-1][k] - snaps[0][k]) / n) for k in keys) + "\n")
    sys.exit(rc)


if __name__ == "__main__":
    main()
