#!/usr/bin/python3
"""Round by round, from bench/goals19.sh's raw logs (build/goals19.log and,
with AB_KEYS, build/goals19-b.log): each meshrun op's time per op and its
busbw ratio to the same round's Open MPI (64 KiB) or gloo (16 MiB), for
each log side by side, then per op the median, the lowest and the highest
ratio over the rounds (the spread the medians of peers_summary.py hide).
usage: goals19_rounds.py [--size 65536|16777216] LOG [LOG_B]"""
import re, statistics, sys

OPS = ["all_gather", "reduce_scatter", "all_reduce", "all_to_all", "permute", "broadcast"]


def parse(path):
    """{round: {(impl, op, size): (time_us, busbw)}}"""
    rounds, rnd, op = {}, 0, None
    for line in open(path):
        m = re.match(r"# round (\d+)", line)
        if m:
            rnd = int(m.group(1))
            rounds.setdefault(rnd, {})
            continue
        m = re.match(r"# meshrun (\S+)", line)
        if m:
            op = m.group(1)
            continue
        m = re.match(r"(openmpi|gloo)\s+(\S+)\s+(\d+) time_us\s+(\S+) algbw\s+\S+ busbw\s+(\S+)", line)
        if m:
            rounds[rnd][(m.group(1), m.group(2), int(m.group(3)))] = (float(m.group(4)),
                                                                       float(m.group(5)))
            continue
        m = re.match(r"\s+(\d+)\s+\d+\s+(\S+)\s+\S+\s+(\S+)\s+\d+\s*$", line)
        if m and op:
            rounds[rnd][("meshrun", op, int(m.group(1)))] = (float(m.group(2)), float(m.group(3)))
    return rounds


def main():
    args = sys.argv[1:]
    size = 65536
    if args[:1] == ["--size"]:
        size, args = int(args[1]), args[2:]
    peer = "openmpi" if size == 65536 else "gloo"
    logs = [parse(p) for p in args]
    names = ["A", "B"][:len(logs)]
    print(f"# {size} bytes: meshrun us per op and busbw / {peer}'s, round by round "
          f"({' | '.join(n + ': ' + p for n, p in zip(names, args))})")
    ratios = {(n, op): [] for n in names for op in OPS}
    for rnd in sorted(logs[0]):
        cells = []
        for op in OPS:
            for n, lg in zip(names, logs):
                r = lg.get(rnd, {})
                me, pe = r.get(("meshrun", op, size)), r.get((peer, op, size))
                if me and pe and pe[1] > 0:
                    ratios[(n, op)].append(me[1] / pe[1])
                    cells.append(f"{n} {me[0]:7.1f} {me[1] / pe[1]:5.2f}")
                else:
                    cells.append(f"{n}     -     - ")
        print(f"round {rnd}: " + "  ".join(cells))
    print("# op: median (lowest-highest) of the ratio over the rounds")
    for op in OPS:
        parts = []
        for n in names:
            v = ratios[(n, op)]
            if v:
                parts.append(f"{n} {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")
        print(f"{op:15s} " + "   ".join(parts))


main()
