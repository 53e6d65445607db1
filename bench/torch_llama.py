#!/usr/bin/python3
"""PyTorch eager float32 baseline for `configs/llama-bench.yml`: the same
decoder (RMSNorm, RoPE rotate_half, causal attention, SwiGLU, untied head),
the same batch, AdamW, measured the same way as meshrun's step log.

usage: OMP_WAIT_POLICY=PASSIVE bench/torch_llama.py --threads N [--steps K] [--ddp P]
Prints one line: `torch threads=N tokens_per_s=X gflops=Y step_s=Z blas=K`
(K: the OpenBLAS kernels, the same as meshrun picks). With
--ddp P: P processes, each its batch, DistributedDataParallel over gloo on
127.0.0.1 (its default buckets, 25 MiB, reduced during the backward); the
line is rank 0's, tokens_per_s per process."""
import argparse, math, os, sys, time

# Debian's torch does its matmuls in the system OpenBLAS (BLAS_INFO=generic),
# whose threads ignore torch.set_num_threads: pin both, before torch loads.
_t = "1"
for i, x in enumerate(sys.argv):
    if x == "--threads" and i + 1 < len(sys.argv):
        _t = sys.argv[i + 1]
os.environ["OPENBLAS_NUM_THREADS"] = _t
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _blas_kernels():
    """The OpenBLAS kernels meshrun runs on (it picks them itself where
    OpenBLAS would fall back: host/util/threads.c), as `meshrun bench
    matmul` names them; None if that build is not there. Asked before
    torch loads OpenBLAS, which reads OPENBLAS_CORETYPE once, on loading."""
    import re, subprocess
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "meshrun")
    try:
        out = subprocess.run([exe, "bench", "matmul", "--size", "64", "--reps", "1"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"core (\w+):", out)
    return m.group(1) if m else None


# the same OpenBLAS kernels as meshrun, or the comparison is of kernels
# (Prescott's, OpenBLAS's fallback on this CPU, ran ~5x slower than
# the SkylakeX kernels meshrun picks)
if "OPENBLAS_CORETYPE" not in os.environ:
    _k = _blas_kernels()
    if _k:
        os.environ["OPENBLAS_CORETYPE"] = _k
import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=1)
p.add_argument("--steps", type=int, default=6)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--d", type=int, default=512)
p.add_argument("--heads", type=int, default=8)
p.add_argument("--mlp", type=int, default=1408)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--vocab", type=int, default=256)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--ddp", type=int, default=0)
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
D = a.d // a.heads

def rope(T, D, theta=10000.0):
    inv = 1.0 / theta ** (torch.arange(0, D, 2).float() / D)
    f = torch.outer(torch.arange(T).float(), inv)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()

def rot_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)

class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.n1 = nn.RMSNorm(a.d, eps=1e-5) if hasattr(nn, "RMSNorm") else None
        s.w1 = nn.Parameter(torch.ones(a.d)); s.w2 = nn.Parameter(torch.ones(a.d))
        s.q = nn.Linear(a.d, a.d, bias=False); s.k = nn.Linear(a.d, a.d, bias=False)
        s.v = nn.Linear(a.d, a.d, bias=False); s.o = nn.Linear(a.d, a.d, bias=False)
        s.g = nn.Linear(a.d, a.mlp, bias=False); s.u = nn.Linear(a.d, a.mlp, bias=False)
        s.dn = nn.Linear(a.mlp, a.d, bias=False)
    @staticmethod
    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    def forward(s, x, cos, sin):
        B, T, C = x.shape
        h = s.norm(x, s.w1)
        q = s.q(h).view(B, T, a.heads, D).transpose(1, 2)
        k = s.k(h).view(B, T, a.heads, D).transpose(1, 2)
        v = s.v(h).view(B, T, a.heads, D).transpose(1, 2)
        q = q * cos + rot_half(q) * sin
        k = k * cos + rot_half(k) * sin
        att = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + s.o(y)
        h = s.norm(x, s.w2)
        return x + s.dn(F.silu(s.g(h)) * s.u(h))

class Model(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(a.vocab, a.d)
        s.blocks = nn.ModuleList([Block() for _ in range(a.layers)])
        s.wf = nn.Parameter(torch.ones(a.d))
        s.head = nn.Linear(a.d, a.vocab, bias=False)
    def forward(s, idx, tgt, cos, sin):
        x = s.emb(idx)
        for b in s.blocks:
            x = b(x, cos, sin)
        logits = s.head(Block.norm(x, s.wf))
        return F.cross_entropy(logits.view(-1, a.vocab), tgt.view(-1))

def main(rank=0):
    m = Model()
    if a.ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                                world_size=a.ddp)
        torch.manual_seed(1 + rank)
        m = DistributedDataParallel(m)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1)
    cos, sin = rope(a.seq, D)
    idx = torch.randint(0, a.vocab, (a.batch, a.seq))
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq))
    C, L, T = a.d, a.layers, a.seq
    flops_tok = 6 * (L * (4 * C * C + 3 * C * a.mlp) + a.vocab * C) + 12 * L * T * C
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = m(idx, tgt, cos, sin)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(dt)
    best = sorted(times)[len(times) // 2]
    tok = a.batch * a.seq / best
    if rank == 0:
        print(f"torch threads={a.threads} tokens_per_s={tok:.1f} gflops={tok * flops_tok * 1e-9:.1f} "
              f"step_s={best:.4f}" + (f" ddp={a.ddp}" if a.ddp else "") +
              f" blas={os.environ.get('OPENBLAS_CORETYPE', 'its own')}", flush=True)
    if a.ddp:
        torch.distributed.destroy_process_group()

if a.ddp:
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    mp.start_processes(main, nprocs=a.ddp, start_method="fork")
else:
    main()
