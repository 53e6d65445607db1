#!/usr/bin/python3
"""Summarises the raw output of bench/peers.sh (one or more rounds): per
shape, op and size the median busbw of meshrun, Open MPI and gloo over the
rounds, meshrun's ratios to each peer (and, for 2x1, to the link measured
in the same rounds), the CPU each spent per op (user+sys of all its
processes, microseconds), and what the CPU allows: each implementation's
CPU per op divided by the machine's cores is the shortest time the op
could take if it kept every core busy; 'cpu-bound busbw' is the busbw that
time would give. With peers.sh --barrier the CPU figures include the
barrier before each iteration, which at 64 KiB costs as much as the op
itself, so the cpu-bound column is printed for 1 MiB and up only.
usage: peers_summary.py LOG [CORES]"""
import os, re, statistics, sys

OPS = ["all_gather", "reduce_scatter", "all_reduce", "all_to_all", "permute", "broadcast"]
SIZES = (16 << 20, 1 << 20, 65536)


def busbw_factor(op, n):
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("permute", "broadcast", "link"):
        return 1.0
    return (n - 1) / n


def parse(path):
    """{(shape, impl, op, size): [(busbw, cpu_us, cores), ...]} over the
    rounds, and the load averages the rounds recorded"""
    runs, loads, section, shape = {}, [], None, "2x1"
    pending = {}   # meshrun rows waiting for their cpu line: size -> busbw
    for line in open(path):
        m = re.match(r"# load (\S+) (\S+) (\S+)", line)
        if m:
            loads.append(line[len("# load "):].strip())
            continue
        m = re.match(r"# shape (\S+)", line)
        if m:
            shape, section, pending = m.group(1), None, {}
            continue
        m = re.match(r"# meshrun (\S+)", line)
        if m:
            section = m.group(1)
            pending = {}
            continue
        m = re.match(r"(openmpi|gloo)\s+(\S+)\s+(\d+) time_us\s+\S+ algbw\s+\S+ busbw\s+(\S+)"
                     r" cpu_us\s+(\S+) cores\s+(\S+)", line)
        if m:
            impl, op, size = m.group(1), m.group(2), int(m.group(3))
            runs.setdefault((shape, impl, op, size), []).append(
                (float(m.group(4)), float(m.group(5)), float(m.group(6))))
            continue
        if section is None:
            continue
        f = line.split()
        if section == "link" and len(f) == 3 and f[0].isdigit():
            pending[int(f[0])] = float(f[2])
        elif section != "link" and len(f) == 6 and f[0].isdigit():
            pending[int(f[0])] = float(f[4])
        m = re.match(r"# cpu (\d+): (\S+) us .*; (\S+) cores busy", line)
        if m and int(m.group(1)) in pending:
            size = int(m.group(1))
            runs.setdefault((shape, "meshrun", section, size), []).append(
                (pending.pop(size), float(m.group(2)), float(m.group(3))))
    return runs, loads


def med(runs, key, i):
    v = [r[i] for r in runs.get(key, [])]
    return statistics.median(v) if v else None


def fmt(x, spec):
    return "–" if x is None else format(x, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def ranks(shape):
    h, d = shape.split("x")
    return int(h) * int(d)


def table(runs, shape, size, cores):
    n = ranks(shape)
    link = med(runs, (shape, "meshrun", "link", size), 0)
    title = f"\n## {shape}, {size} bytes"
    if link is not None:
        title += f" (link, per direction: {link:.3f} GB/s)"
    print(title)
    print("| op | meshrun | Open MPI | gloo | vs link | vs Open MPI | vs gloo |"
          " CPU us/op meshrun / Open MPI / gloo | cores busy meshrun | cpu-bound busbw meshrun / gloo |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for op in (["link"] if link is not None else []) + OPS:
        k = lambda impl: (shape, impl, op, size)
        m, o, g = (med(runs, k(i), 0) for i in ("meshrun", "openmpi", "gloo"))
        cm, co, cg = (med(runs, k(i), 1) for i in ("meshrun", "openmpi", "gloo"))
        km = med(runs, k("meshrun"), 2)
        # bytes the busbw is computed from: the whole buffer times the factor
        nbytes = size * busbw_factor(op, n)
        big = size >= 1 << 20
        floor_m = None if cm is None or not big else nbytes / (cm / cores) / 1e3
        floor_g = None if cg is None or not big else nbytes / (cg / cores) / 1e3
        print(f"| {op} | {fmt(m, '.3f')} | {fmt(o, '.3f')} | {fmt(g, '.3f')} | "
              f"{fmt(ratio(m, link) if op != 'link' else None, '.2f')} | "
              f"{fmt(ratio(m, o), '.2f')} | {fmt(ratio(m, g), '.2f')} | "
              f"{fmt(cm, '.0f')} / {fmt(co, '.0f')} / {fmt(cg, '.0f')} | "
              f"{fmt(km, '.2f')} | {fmt(floor_m, '.2f')} / {fmt(floor_g, '.2f')} |")


def main():
    runs, loads = parse(sys.argv[1])
    cores = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count()
    shapes = []
    for key in runs:
        if key[0] not in shapes:
            shapes.append(key[0])
    print(f"# medians over {len(loads) or 1} round(s); {cores} cores; busbw in GB/s; meshrun is "
          "TLS, the peers plaintext")
    for l in loads:
        print(f"# load average at a round's start: {l}")
    for shape in shapes:
        for size in SIZES:
            table(runs, shape, size, cores)


if __name__ == "__main__":
    main()
