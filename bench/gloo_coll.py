#!/usr/bin/python3
"""gloo (torch.distributed) baseline for `meshrun bench collectives`, N ranks
(default 2) over loopback TCP, float32, the same statistic and nccl-tests bus-bandwidth
arithmetic. By default, as meshrun's default: one barrier, then the
iterations back to back, the slowest rank's loop time over the iterations;
--barrier, as meshrun's --barrier: a barrier before each iteration, the
slowest rank's time of each, averaged. 2 warm-ups; buffers are allocated
before the loop. Run by bench/peers.sh. gloo has no reduce_scatter on CPU;
that row is skipped.
Sizes 64 KiB, 1 MiB, 16 MiB (a size given 0 iterations is skipped).
usage: gloo_coll.py PORT [ITERS_16M [ITERS_64K [OPS [RANKS [ITERS_1M]]]]] [--barrier]   (OPS: comma list or all)"""
import os, resource, sys, time
import torch, torch.distributed as dist
import torch.multiprocessing as mp

def run(rank, n, port, iters, ops, each):
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    for op in ops:
        for size in [65536, 1 << 20, 16 << 20]:
            if iters[size] <= 0:
                continue   # a size given 0 iterations is skipped
            cnt = size // 4
            a = torch.ones(cnt)
            b = torch.empty(cnt)
            outs = [torch.empty(cnt // n) for _ in range(n)]
            total = 0.0
            for it in range(-2, iters[size]):
                if it <= 0 or each:
                    dist.barrier()
                if it == 0:
                    w0 = time.perf_counter(); ru = resource.getrusage(resource.RUSAGE_SELF); c0 = ru.ru_utime + ru.ru_stime
                t0 = time.perf_counter()
                if op == "all_gather":
                    dist.all_gather(outs, a[: cnt // n])
                elif op == "all_reduce":
                    dist.all_reduce(a)
                elif op == "all_to_all":
                    dist.all_to_all_single(b, a)
                elif op == "permute":
                    reqs = [dist.isend(a, (rank + 1) % n), dist.irecv(b, (rank - 1) % n)]
                    for r in reqs: r.wait()
                elif op == "broadcast":
                    dist.broadcast(a, 0)
                if each:
                    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                    if it >= 0: total += dt.item()
            if not each:
                dt = torch.tensor([time.perf_counter() - w0], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                total = dt.item()
            ru = resource.getrusage(resource.RUSAGE_SELF)
            # CPU of both processes per iteration against the loop's wall time
            cw = torch.tensor([ru.ru_utime + ru.ru_stime - c0, time.perf_counter() - w0], dtype=torch.float64)
            dist.all_reduce(cw)
            cpu_us = cw[0].item() / iters[size] * 1e6; cores = cw[0].item() / (cw[1].item() / n)
            mean = total / iters[size]
            alg = size / mean / 1e9; f = (n - 1) / n
            bus = alg * 2 * f if op == "all_reduce" else (alg if op in ("permute", "broadcast") else alg * f)
            if rank == 0:
                print(f"gloo    {op:<14} {size:9d} time_us {mean*1e6:10.1f} algbw {alg:6.3f} busbw {bus:6.3f} cpu_us {cpu_us:10.1f} cores {cores:4.2f}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    each = "--barrier" in sys.argv
    sys.argv = [x for x in sys.argv if x != "--barrier"]
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 29517
    iters = {16 << 20: int(sys.argv[2]) if len(sys.argv) > 2 else 20,
             65536: int(sys.argv[3]) if len(sys.argv) > 3 else 500,
             1 << 20: int(sys.argv[6]) if len(sys.argv) > 6 else 100}
    ranks = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    ops = ["all_gather", "all_reduce", "all_to_all", "permute", "broadcast"]
    if len(sys.argv) > 4 and sys.argv[4] != "all":
        want = sys.argv[4].split(",")
        bad = [o for o in want if o not in ops]
        if bad:
            sys.exit(f"gloo_coll.py: unknown op {bad[0]} (one of {', '.join(ops)})")
        ops = want
    mp.spawn(run, args=(ranks, port, iters, ops, each), nprocs=ranks)
