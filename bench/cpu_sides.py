#!/usr/bin/python3
"""A 2x1 op's CPU per process and thread, from the perf scripts
bench/cpu_vs_mpi.sh keeps (KEEP=DIR): per implementation, side and thread
name (digits dropped: mr-dev, mr-stream, mr-net, ...), bench/cpu_vs_mpi.py's
categories, ms per op = (2N run's samples - N run's) / N, the median over
ROUNDS rounds and each round's figure in brackets. The side is the
process: of the two busiest processes of a run, "root" is the one with
more samples sealing or sending (ipsec-mb's aes_gcm_enc*, or a
sendto/writev/sendmsg in the chain) than opening or receiving, "recv" the
other, so for a broadcast the root and its receiver (for a symmetric op
the split is arbitrary); "other" is the rest (mpirun, the bench's parent).
usage: cpu_sides.py DIR/OP ROUNDS N F IMPL..."""
import re, statistics, sys
from collections import Counter, defaultdict

src = open(__file__.replace("cpu_sides.py", "cpu_vs_mpi.py")).read()
cvm = {}
exec(compile(src.replace("\nmain()\n", "\n"), "cpu_vs_mpi.py", "exec"), cvm)


def blocks(path):
    """(comm, pid, frames) per sample"""
    comm, pid, fr = None, None, []
    for line in open(path, errors="replace"):
        if not line.strip() or not line[0].isspace():
            if comm is not None:
                yield comm, pid, fr
            comm, fr = None, []
            if line.strip():
                t = line.split()
                comm, pid = t[0], t[1].split("/")[0]
            continue
        m = re.match(r"\s*([0-9a-f]+) (.*) \((.*)\)\s*$", line)
        if m:
            fr.append((int(m.group(1), 16), m.group(2), m.group(3)))
    if comm is not None:
        yield comm, pid, fr


def count(path, pages):
    rows, score = [], Counter()
    for comm, pid, fr in blocks(path):
        if not fr:
            continue
        chain = " ".join(f[1] for f in fr)
        if "aes_gcm_enc" in fr[0][1] or re.search(r"sys_(sendto|writev|sendmsg)", chain):
            score[pid] += 1
        if "aes_gcm_dec" in fr[0][1] or re.search(r"sys_(recvfrom|readv|recvmsg)", chain):
            score[pid] -= 1
        rows.append((pid, re.sub(r"\d+$", "", comm), cvm["classify"](comm, fr, pages, Counter())))
    top2 = [p for p, _ in Counter(r[0] for r in rows).most_common(2)]
    root = max(top2, key=lambda p: score[p]) if top2 else None
    c = Counter()
    for pid, t, cat in rows:
        c[("root" if pid == root else "recv" if pid in top2 else "other", t, cat)] += 1
    return c


def main():
    d, rounds, n, F = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    pages = cvm["crypto_pages"](f"{d}/speed.txt")
    for impl in sys.argv[5:]:
        per = []
        for r in range(1, rounds + 1):
            a, b = count(f"{d}/{impl}.{r}.1.txt", pages), count(f"{d}/{impl}.{r}.2.txt", pages)
            per.append({k: (b[k] - a[k]) / n * 1000 / F for k in set(a) | set(b)})
        keys = set().union(*per)
        fig = lambda ks: [sum(p.get(k, 0) for k in ks) for p in per]
        show = lambda v: f"{statistics.median(v):.2f} [" + " ".join(f"{x:.2f}" for x in v) + "]"
        print(f"### {impl}: ms per op, median of {rounds} [rounds]; total {show(fig(keys))}")
        for side in ("root", "recv", "other"):
            sk = [k for k in keys if k[0] == side]
            if not sk:
                continue
            print(f"  {side}: {show(fig(sk))}")
            thr = defaultdict(list)
            for k in sk:
                thr[k[1]].append(k)
            for t, tk in sorted(thr.items(), key=lambda kv: -statistics.median(fig(kv[1]))):
                if abs(statistics.median(fig(tk))) < 0.05:
                    continue
                print(f"    {t}: {show(fig(tk))}")
                for k in sorted(tk, key=lambda k: -statistics.median(fig([k]))):
                    if abs(statistics.median(fig([k]))) >= 0.05:
                        print(f"      {k[2]}: {show(fig([k]))}")


main()
