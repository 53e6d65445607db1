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
With --goals (bench/goals19.sh's log, 2x1): issue 19's goals, each
judged met / not met, with CPU per wire byte beyond AES-GCM (the AES rate
`openssl speed` measured in the same rounds).
usage: peers_summary.py [--goals] LOG [CORES]"""
import os, re, statistics, sys

OPS = ["all_gather", "reduce_scatter", "all_reduce", "all_to_all", "permute", "broadcast"]
SIZES = (16 << 20, 1 << 20, 65536)


def busbw_factor(op, n):
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("permute", "broadcast", "link"):
        return 1.0
    return (n - 1) / n


def parse(path, aes=None):
    """{(shape, impl, op, size): [(busbw, cpu_us, cores), ...]} over the
    rounds, and the load averages the rounds recorded; AES-128-GCM rates
    (GB/s) the rounds measured are appended to the list aes"""
    runs, loads, section, shape = {}, [], None, "2x1"
    pending = {}   # meshrun rows waiting for their cpu line: size -> busbw
    for line in open(path):
        m = re.match(r"# aes-128-gcm (\S+) GB/s", line)
        if m and aes is not None:
            aes.append(float(m.group(1)))
            continue
        m = re.match(r"# load (\S+) (\S+) (\S+)", line)
        if m:
            loads.append(line[len("# load "):].strip())
            continue
        # bench/goals19.sh: libcrypto's perf samples over a whole meshrun
        # run (warm-ups, iterations, one checked run): the cipher's CPU per
        # op, as the bench's "# cpu" figure counts its timed loop alone
        m = re.match(r"# cipher-samples (\S+) (\d+) (\d+) (\S+) (\d+) (\d+)", line)
        if m:
            op, size, k, hz, it, warm = (m.group(1), int(m.group(2)), int(m.group(3)),
                                         float(m.group(4)), int(m.group(5)), int(m.group(6)))
            us = k / hz * 1e6 / (it + warm + 1)
            runs.setdefault((shape, "meshrun-cipher", op, size), []).append((us, us, 0.0))
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


def wire_factor(op, n):
    """bytes put on the wire per op (all links, one direction each, every
    byte encrypted once and decrypted once), over the buffer's size, for n
    ranks of one device each"""
    if op == "all_reduce":
        return 2.0 * (n - 1)
    if op == "permute":
        return float(n)
    return float(n - 1)


def goals(runs, loads, path):
    """issue 19's goals on 2x1: tables, then one line per goal"""
    aes = []
    parse(path, aes)
    rate = statistics.median(aes) if aes else None
    shape, n = "2x1", 2
    print(f"# issue 19's goals, 2x1, medians over {len(loads) or 1} round(s); busbw in GB/s; "
          "meshrun is TLS, the peers plaintext")
    for l in loads:
        print(f"# load average at a round's start: {l}")
    for l in open(path):
        if l.startswith("# end of run, load"):
            print(l.strip())
    print(f"# AES-128-GCM as the run seals it (meshrun bench cipher or openssl speed, CPU time, 16 KiB): "
          f"{', '.join(f'{a:.2f}' for a in aes) or '–'} GB/s; median {fmt(rate, '.2f')}")
    res = {}
    for size in (65536, 16 << 20):
        print(f"\n## {size} bytes")
        print("| op | busbw meshrun / Open MPI / gloo | meshrun/Open MPI | meshrun/gloo |"
              " CPU us/op meshrun / Open MPI / gloo | AES us/op | CPU ns per wire byte:"
              " meshrun beyond AES / Open MPI / gloo | meshrun's cipher in the run us/op"
              " (x AES) | meshrun ns per wire byte beyond its own cipher samples |")
        print("|---|---|---|---|---|---|---|---|---|")
        for op in OPS:
            b = {i: med(runs, (shape, i, op, size), 0) for i in ("meshrun", "openmpi", "gloo")}
            c = {i: med(runs, (shape, i, op, size), 1) for i in ("meshrun", "openmpi", "gloo")}
            wire = size * wire_factor(op, n)
            aes_us = None if rate is None else 2 * wire / (rate * 1e9) * 1e6
            per = {i: None if c[i] is None else c[i] * 1e3 / wire for i in c}
            if per["meshrun"] is not None and aes_us is not None:
                per["meshrun"] = (c["meshrun"] - aes_us) * 1e3 / wire
            res[(op, size)] = (b, per, aes_us)
            own = med(runs, (shape, "meshrun-cipher", op, size), 1)
            own_per = None if own is None or c["meshrun"] is None else (c["meshrun"] - own) * 1e3 / wire
            print(f"| {op} | {fmt(b['meshrun'], '.3f')} / {fmt(b['openmpi'], '.3f')} / "
                  f"{fmt(b['gloo'], '.3f')} | {fmt(ratio(b['meshrun'], b['openmpi']), '.2f')} | "
                  f"{fmt(ratio(b['meshrun'], b['gloo']), '.2f')} | {fmt(c['meshrun'], '.0f')} / "
                  f"{fmt(c['openmpi'], '.0f')} / {fmt(c['gloo'], '.0f')} | {fmt(aes_us, '.0f')} | "
                  f"{fmt(per['meshrun'], '.2f')} / {fmt(per['openmpi'], '.2f')} / "
                  f"{fmt(per['gloo'], '.2f')} | {fmt(own, '.0f')} ({fmt(ratio(own, aes_us), '.2f')}) | "
                  f"{fmt(own_per, '.2f')} |")

    def verdict(name, pairs, want):
        """pairs: [(op, value or None)]; met when every value is >= want"""
        have = [(v, op) for op, v in pairs if v is not None]
        if not have or len(have) < len(pairs):
            print(f"goal: {name}: not judged (missing figures)")
            return
        worst = min(have)
        print(f"goal: {name}: {'met' if worst[0] >= want else 'not met'} "
              f"(lowest {worst[0]:.2f} at {worst[1]})")

    print()
    verdict("64 KiB, every op >= 0.5x Open MPI's busbw",
            [(op, ratio(res[(op, 65536)][0]["meshrun"], res[(op, 65536)][0]["openmpi"]))
             for op in OPS], 0.5)
    verdict("16 MiB, all_gather, all_reduce, all_to_all, permute >= 1.0x gloo's busbw "
            "(gloo has no reduce_scatter on CPU: not judged)",
            [(op, ratio(res[(op, 16 << 20)][0]["meshrun"], res[(op, 16 << 20)][0]["gloo"]))
             for op in ("all_gather", "all_reduce", "all_to_all", "permute")], 1.0)
    # the AES bound: the op's AES CPU spread over both cores (each host
    # encrypts what it sends and decrypts what it receives at once)
    frac = {}
    for op in OPS:
        b, _, aes_us = res[(op, 16 << 20)]
        if b["meshrun"] is not None and aes_us:
            bound = (16 << 20) * busbw_factor(op, n) / (aes_us / 2 * 1e-6) / 1e9
            frac[op] = (b["meshrun"] / bound, bound)
    if "broadcast" in frac and len(frac) == len(OPS):
        others = min(frac[op][0] for op in OPS if op != "broadcast")
        print(f"goal: 16 MiB broadcast as close to the AES bound as the others: "
              f"{'met' if frac['broadcast'][0] >= others else 'not met'} "
              f"({frac['broadcast'][0]:.2f} of its bound {frac['broadcast'][1]:.2f} GB/s; "
              f"the others' lowest {others:.2f})")
    else:
        print("goal: 16 MiB broadcast as close to the AES bound as the others: not judged "
              "(missing figures)")
    print("# 'beyond AES' (the goal's measure) subtracts the hot 16 KiB AES-GCM rate of the"
          " implementation the run uses (ipsec-mb or OpenSSL) for every wire byte sealed and"
          " opened; 'beyond its own cipher samples' subtracts libcrypto's and libIPSec_MB's"
          " perf samples in the run itself (AES-GCM as the run pays it: cold buffers, calls"
          " per record). The goal lines below use the former.")
    for size, name in ((16 << 20, "16 MiB"), (65536, "64 KiB")):
        verdict(f"{name}, CPU per byte beyond AES-GCM <= Open MPI's, every op "
                "(figure: Open MPI's over meshrun's)",
                [(op, ratio(res[(op, size)][1]["openmpi"], res[(op, size)][1]["meshrun"])
                  if (res[(op, size)][1]["meshrun"] or 0) > 0 else
                  (None if res[(op, size)][1]["meshrun"] is None else float("inf")))
                 for op in OPS], 1.0)
    print("goal: the cipher on more than one core where a host has more cores than links: "
          "not judged here (2x1 on 2 vCPUs; see bench/results/transport.md, 'The cipher on more than one "
          "thread')")
    ceilings(res, n)


def ceilings(res, n):
    """What this machine allows: both hosts share its cores and every op
    here keeps them busy, so an op takes at least (its CPU) / cores. The
    least CPU an encrypted op can take is AES-GCM's (each wire byte
    encrypted once and decrypted once, at the rate measured in the run)
    plus what moving the bytes costs a plaintext peer (Open MPI's CPU per
    op in the same run). The busbw at that CPU is the ceiling; a goal
    above it cannot be met here by any transport, only on a machine with
    cores to spare."""
    cores = os.cpu_count()
    print(f"\n## 16 MiB ceilings on this machine ({cores} cores, both hosts on them): busbw at"
          " AES-GCM's CPU alone, and at AES-GCM's plus Open MPI's CPU per op")
    print("| size | op | target busbw (goal) | meshrun | ceiling AES alone |"
          " ceiling AES + Open MPI's CPU | goal reachable at Open MPI's CPU per byte |")
    print("|---|---|---|---|---|---|---|")
    for size, name, peer, want in ((16 << 20, "16 MiB", "gloo", 1.0),):
        for op in OPS:
            b, per, aes_us = res[(op, size)]
            if op in ("reduce_scatter", "broadcast"):
                continue   # not judged against gloo (no CPU reduce_scatter; broadcast vs its bound)
            target = None if b[peer] is None else b[peer] * want
            nbytes = size * busbw_factor(op, n)
            mpi_us = None if per["openmpi"] is None else per["openmpi"] * size * wire_factor(op, n) / 1e3
            c_aes = None if not aes_us else nbytes / (aes_us / cores) / 1e3
            c_both = None if not aes_us or mpi_us is None else nbytes / ((aes_us + mpi_us) / cores) / 1e3
            ok = None if c_both is None or target is None else ("yes" if c_both >= target else "no")
            print(f"| {name} | {op} | {fmt(target, '.3f')} ({want:g}x {peer}) | "
                  f"{fmt(b['meshrun'], '.3f')} | {fmt(c_aes, '.3f')} | {fmt(c_both, '.3f')} | "
                  f"{ok or '–'} |")


def main():
    if sys.argv[1] == "--goals":
        runs, loads = parse(sys.argv[2])
        goals(runs, loads, sys.argv[2])
        return
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
