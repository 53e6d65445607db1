#!/usr/bin/python3
"""Itemised CPU per op of one collective, meshrun (TLS) against Open MPI
(TCP), from `perf record -g` (cpu-clock) of a run of N and one of 2N
iterations of each (bench/cpu_vs_mpi.sh): the 2N run's samples minus the
N run's, over N, so start-up, buffer fill and checks drop out. Kernel
samples are sorted by the system call (or fault, or interrupt) their
call chain enters through; user samples by their library and symbol.
The cipher's AES-GCM kernels are Intel ipsec-mb's (libIPSec_MB, whole)
or, for OpenSSL's cipher, what `openssl speed` itself runs: libcrypto's
4 KiB code pages that hold >= 0.5% of its samples (the stitched AES-GCM
and GHASH kernels); the rest of libcrypto is EVP glue. DIR/speed.gbs
holds the seal and open rates of the cipher the run uses (bench/cpu_vs_mpi.sh).
usage: cpu_vs_mpi.py DIR ROUNDS N F OP SIZE WIRE IMPL... (DIR/IMPL.R.K.txt:
perf script output; DIR/speed.txt: `openssl speed` perf script and
GB/s figures)"""
import re, statistics, sys
from collections import Counter

CATS = ["cipher: AES-GCM kernels", "cipher: libcrypto other", "kernel: socket copies",
        "kernel: TCP rest (send/recv, softirq)", "kernel: page faults, mm",
        "kernel: scheduling (futex, epoll, switches)", "polling (spin loop)",
        "user copies (memcpy/memmove)", "sums", "bench harness (fill, check)",
        "rest of implementation",
        "libc other", "other"]
COPY_K = re.compile(r"copy_(to|from)_iter|copy_user|rep_movs|__memcpy|memcpy_orig|skb_copy|copy_page")
SLEEP_SYS = re.compile(r"sys_(futex|epoll_wait|epoll_pwait|nanosleep|clock_nanosleep|select|pselect)")
POLL_SYS = re.compile(r"sys_(sched_yield|poll|ppoll)\b")
NET_SYS = re.compile(r"sys_(sendto|recvfrom|sendmsg|recvmsg|write|read|writev|readv)\b")
MESH_POLL = {"xport_wait", "op_poll", "op_poll_end", "recv_poll", "xport_now_ns", "link_trylock",
             "__vdso_clock_gettime", "clock_gettime", "__clock_gettime", "sched_yield",
             "__sched_yield", "park"}
MPI_POLL = re.compile(r"opal_progress|progress|opal_libevent|event_base_loop|poll_dispatch|"
                      r"ompi_request_default_wait|sync_wait|__poll|ppoll|clock_gettime")
SUMS = re.compile(r"fsum_|add_blocks|ompi_op_|op_base_.*sum|_sum_float|2buff_sum|3buff_sum")
HARNESS = {"setup", "verify", "fill", "main", "run_case", "time_op", "present"}


def blocks(path):
    """(comm, [(ip, sym, dso), ...]) per sample, innermost frame first"""
    comm, frames = None, []
    for line in open(path, errors="replace"):
        if not line.strip():
            if comm is not None:
                yield comm, frames
            comm, frames = None, []
            continue
        if not line[0].isspace():
            if comm is not None:
                yield comm, frames
            comm, frames = line.split()[0], []
            continue
        m = re.match(r"\s*([0-9a-f]+) (.*) \((.*)\)\s*$", line)
        if m:
            frames.append((int(m.group(1), 16), m.group(2), m.group(3)))
    if comm is not None:
        yield comm, frames


def crypto_pages(path):
    """libcrypto's code pages `openssl speed` spends >= 0.5% of its samples in"""
    c = Counter()
    for comm, fr in blocks(path):
        if fr and "libcrypto" in fr[0][2]:
            c[fr[0][0] >> 12] += 1
    tot = sum(c.values())
    return {p for p, k in c.items() if k >= 0.005 * tot}


def classify(comm, frames, pages, callers):
    ip, sym, dso = frames[0]
    if "kernel" in dso:
        chain = " ".join(f[1] for f in frames)
        if COPY_K.search(sym):
            return CATS[2]
        if "exc_page_fault" in chain or re.search(r"clear_page|page_fault|do_anonymous", sym):
            return CATS[4]
        if POLL_SYS.search(chain):
            return CATS[6]
        if SLEEP_SYS.search(chain) or re.search(r"schedul|switch_to|finish_task", sym):
            return CATS[5]
        return CATS[3]   # sys_sendto/recvfrom, softirq, timers, the rest of TCP
    if "libIPSec_MB" in dso:
        return CATS[0]
    if "libcrypto" in dso:
        return CATS[0] if (ip >> 12) in pages else CATS[1]
    if "libc.so" in dso:
        if re.search(r"mem(move|cpy)", sym):
            # the first frame of ours or Open MPI's above it (frame pointers
            # are missing in libc, so this may be the caller's caller)
            who = next((f[1] for f in frames[1:] if "libc.so" not in f[2] and
                        f[1] != "[unknown]"), "?")
            callers[who] += 1
            return CATS[7]
        if sym in MESH_POLL or re.search(r"sched_yield|^__poll|^poll", sym):
            return CATS[6]
        return CATS[11]
    if "vdso" in dso:
        return CATS[6]
    if SUMS.search(sym) or "mca_op_" in dso:
        return CATS[8]
    if re.search(r"meshrun|mpi_coll", dso) and sym in HARNESS:
        return CATS[9]
    if "meshrun" in dso:
        return CATS[6] if sym in MESH_POLL else CATS[10]
    if "libevent" in dso and comm.startswith("mpi_coll"):
        return CATS[6]      # Open MPI's progress engine polls through libevent
    if re.search(r"libmpi|libopen-|mca_|pmix|libhwloc|mpi_coll", dso):
        return CATS[6] if MPI_POLL.search(sym) else CATS[10]
    return CATS[12]


def count(path, pages, callers):
    c = Counter()
    for comm, fr in blocks(path):
        if fr:
            c[classify(comm, fr, pages, callers)] += 1
    return c


def own_cpu(path):
    """ms per op from the program's own CPU line: meshrun's "# cpu SIZE: X us
    per iteration", bench/mpi_coll.c's "cpu_us X" """
    try:
        for line in open(path, errors="replace"):
            m = re.match(r"# cpu \d+: (\S+) us", line) or re.search(r"cpu_us\s+(\S+)", line)
            if m:
                return float(m.group(1)) / 1000.0
    except OSError:
        pass
    return None


def main():
    d, rounds, n, F, op, size, wire = sys.argv[1:8]
    impls = sys.argv[8:]
    rounds, n, F, size, wire = int(rounds), int(n), float(F), int(size), float(wire)
    pages = crypto_pages(f"{d}/speed.txt")
    sp = [[float(x) for x in l.split()] for l in open(f"{d}/speed.gbs") if l.strip()]
    enc, dec = statistics.median(s[0] for s in sp), statistics.median(s[1] for s in sp)
    res, callers = {}, {}
    for impl in impls:
        per = []
        callers[impl] = Counter()
        for r in range(1, rounds + 1):
            a = count(f"{d}/{impl}.{r}.1.txt", pages, Counter())
            b = count(f"{d}/{impl}.{r}.2.txt", pages, callers[impl])
            per.append({k: (b[k] - a[k]) / n * 1000.0 / F for k in CATS})
        res[impl] = {k: statistics.median(p[k] for p in per) for k in CATS}
    W = size * wire
    hot_ms = (W / (enc * 1e9) + W / (dec * 1e9)) * 1e3
    print(f"## {op} {size} bytes, 2x1: CPU ms per op (both processes), median of {rounds} "
          f"({n} vs {2 * n} iterations, perf -F {F:g}); wire bytes per op {W / 2**20:.0f} MiB")
    print("| category | " + " | ".join(impls) + " |")
    print("|---|" + "---|" * len(impls))
    for k in CATS:
        print(f"| {k} | " + " | ".join(f"{res[i][k]:.2f}" for i in impls) + " |")
    tot = {i: sum(res[i].values()) for i in impls}
    print("| **total** | " + " | ".join(f"{tot[i]:.2f}" for i in impls) + " |")
    own = {i: statistics.median(v) if (v := [x for r in range(1, rounds + 1)
                                               if (x := own_cpu(f"{d}/{i}.{r}.2.out")) is not None])
           else None for i in impls}
    print("| CPU per op the program itself reports (rusage over its timed loop; a cross-check) | " +
          " | ".join("–" if own[i] is None else f"{own[i]:.2f}" for i in impls) + " |")
    for i in impls:
        cip = res[i][CATS[0]] + res[i][CATS[1]]
        # an implementation that runs no cipher (Open MPI) has none to take off
        hot = hot_ms if cip > 0.05 else 0.0
        print(f"| ns per wire byte, {i}: total / beyond the cipher's hot rate / beyond the run's "
              f"own cipher samples | {tot[i] * 1e6 / W:.3f} / {(tot[i] - hot) * 1e6 / W:.3f} / "
              f"{(tot[i] - cip) * 1e6 / W:.3f} |" + " |" * (len(impls) - 1))
    for i in impls:
        cip = res[i][CATS[0]] + res[i][CATS[1]]
        if cip > 0.05:
            print(f"# {i}: cipher in the run {cip:.2f} ms/op ({res[i][CATS[0]]:.2f} in the AES-GCM "
                  f"kernels) for {2 * W / 2**20:.0f} MiB sealed+opened: {cip * 1e6 / (2 * W):.3f} ns/B; "
                  f"its hot rate (16 KiB; median of {len(sp)}) seal {enc:.2f} GB/s open {dec:.2f} GB/s: "
                  f"{hot_ms:.2f} ms/op, {hot_ms * 1e6 / (2 * W):.3f} ns/B; run/speed {cip / hot_ms:.2f}")
    for i in impls:
        tot_c = sum(callers[i].values())
        if tot_c:
            top = ", ".join(f"{s} {100 * c / tot_c:.0f}%" for s, c in callers[i].most_common(5))
            print(f"# {i}: memcpy/memmove by caller (frame above libc, {2 * n}-iteration run): {top}")


main()
