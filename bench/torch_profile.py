#!/usr/bin/python3
"""Where PyTorch's llama-bench step goes, by op: bench/torch_llama.py's
model, batch and thread setup (its source run without its timing loop),
then STEPS steps under torch.profiler after 2 warm-up steps. Prints the
step's wall time (inflated a little by the profiler) and the ops by self
CPU time, ms a step.

usage: bench/torch_profile.py --threads N [--steps K] [--top R]"""
import os, sys

top = 30
if "--top" in sys.argv:
    i = sys.argv.index("--top")
    top = int(sys.argv[i + 1])
    del sys.argv[i:i + 2]
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_llama.py")
src = open(path).read()
tail = "\nelse:\n    main()\n"
assert src.endswith(tail), "bench/torch_llama.py no longer ends by calling main()"
g = {"__file__": path, "__name__": "torch_llama"}
exec(compile(src[: -len(tail)] + "\n", path, "exec"), g)
torch, a, time = g["torch"], g["a"], g["time"]
from torch.profiler import profile, ProfilerActivity

m = g["Model"]()
opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1)
cos, sin = g["rope"](a.seq, g["D"])
idx = torch.randint(0, a.vocab, (a.batch, a.seq))
tgt = torch.randint(0, a.vocab, (a.batch, a.seq))


def step():
    opt.zero_grad(set_to_none=True)
    loss = m(idx, tgt, cos, sin)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()


for _ in range(2):
    step()
t0 = time.perf_counter()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(a.steps):
        step()
dt = (time.perf_counter() - t0) / a.steps
print(f"torch threads={a.threads} step_s={dt:.3f} (under the profiler) load={os.getloadavg()[0]:.2f}")
ev = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
print("| op | ms a step (self CPU) | calls a step |")
print("|---|---|---|")
for e in ev[:top]:
    print(f"| {e.key} | {e.self_cpu_time_total / 1e3 / a.steps:.1f} | {e.count / a.steps:.0f} |")
