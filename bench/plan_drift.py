#!/usr/bin/env python3
"""`meshrun plan`'s own error split by the figure that moved (issue 21).

For each configuration (ROWS, as bench/plan_costs.sh's), ROUNDS times:
plan with its own measurement (--cores auto) right before a traced
`meshrun local` run, then from that run's trace:
  * run's costs: `plan --costs-from TRACE` (the run's action CPU, its
    optimizer, the cores fitted to it): the model's error alone;
  * at plan's cores: the same with `--cores` plan's own figure: the error
    the cores plan saw bring on their own;
  * plan after at the run's cores: plan with its own measurement again
    right after the run, given the run's cores: the error its own compute
    figures (action CPU, optimizer, transfers' CPU) bring on their own;
    it also prints the cores the devices' threads got while it measured
    (`cores seen`), a second look at the machine after the run.
Beside each: the cores plan saw before, the run's, the look after; plan's
action CPU a step before, the run's, after; and the cores the rest of
the machine used (its busy CPU in /proc/stat less this script's
children's CPU, over the wall) during the plan before, the run and the
plan after: where plan's cores and the run's differ, did the other load
move between them?

usage: [ROWS="MESH:M:SCHED[/fill]:RECOMPUTE ..."] [ROUNDS=1] [STEPS=3] [BIN=meshrun] [KEEP=DIR] bench/plan_drift.py
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT)
DEFAULT_ROWS = ("4x1:4:1f1b:false 4x1:4:zb_h1:false 4x1:4:zb_h1/fill:false 4x1:8:1f1b:false 4x1:8:zb_h1:false "
                "4x1:8:zb_h1/fill:false 4x1:16:1f1b:false 4x1:16:zb_h1:false 4x1:8:interleaved_1f1b:false "
                "4x1:8:zbv:false 2x2:8:1f1b:false 2x2:8:zb_h1:false 4x1:8:1f1b:true 4x1:8:zb_h1:true")
MODEL = ("--config configs/llama-bench.yml base_num_decoder_layers=8 max_target_length=128 per_device_batch_size=4 "
         "ici_data_parallelism=1 dcn_data_parallelism=1").split()
HZ = os.sysconf("SC_CLK_TCK")


def busy_s():
    """Seconds of CPU the whole machine has been busy (every core)."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / HZ  # user..steal, less idle and iowait


def children_s():
    t = os.times()
    return t.children_user + t.children_system


def run(cmd, out):
    """Runs cmd, its output to out; returns the cores the rest of the
    machine used meanwhile (busy CPU less ours, over the wall)."""
    b0, c0, w0 = busy_s(), children_s(), time.monotonic()
    with open(out, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    wall = time.monotonic() - w0
    other = (busy_s() - b0 - (children_s() - c0)) / wall
    if p.returncode:
        sys.stdout.write(open(out).read())
        sys.exit(f"plan_drift.py: {' '.join(cmd[:3])} ... exited {p.returncode}")
    return max(other, 0.0)


def grab(path, pat, cast=float):
    m = re.search(pat, open(path).read(), re.M)
    if not m:
        sys.exit(f"plan_drift.py: '{pat}' not in {path}:\n{open(path).read()}")
    return cast(m.group(1))


def table_cpu(path):
    """The table's work a step (F+B+I+W+own, the actions' CPU) in a plan's output."""
    m = re.search(r"^work by action: F=(\S+),B=(\S+),I=(\S+),W=(\S+),own=(\S+),", open(path).read(), re.M)
    return sum(float(x) for x in m.groups())


def row_args(row):
    mesh, M, sv, rc = row.split(":")
    s = sv.split("/")[0]
    fill = ["pipeline_fill_waits=true"] if sv.endswith("/fill") else []
    meshes = {"4x1": (4, 1, 4, "dcn_pipeline_parallelism=4 per_device_batch_size=4"),
              "2x2": (2, 2, 4, "dcn_pipeline_parallelism=2 ici_pipeline_parallelism=2 per_device_batch_size=4"),
              "2x1": (2, 1, 2, "dcn_pipeline_parallelism=2 per_device_batch_size=8")}
    if mesh not in meshes:
        sys.exit(f"plan_drift.py: mesh {mesh}: not 4x1, 2x2 or 2x1")
    hosts, dph, S, pp = meshes[mesh]
    if s == "circular":
        sk = f"num_pipeline_repeats=2 num_layers_per_pipeline_stage={8 // (2 * S)}"
    elif s in ("interleaved_1f1b", "zbv"):
        sk = f"num_layers_per_pipeline_stage={8 // (2 * S)}"
    else:
        sk = f"num_layers_per_pipeline_stage={8 // S}"
    args = (pp.split() + [f"pipeline_schedule={s}", f"num_pipeline_microbatches={M}"] + sk.split() +
            [f"pipeline_recompute={rc}"] + fill)
    mesh_flags = ["--hosts", str(hosts), "--devices-per-host", str(dph)]
    return mesh_flags, args


def main():
    rows = os.environ.get("ROWS", DEFAULT_ROWS).split()
    rounds, steps = int(os.environ.get("ROUNDS", "1")), int(os.environ.get("STEPS", "3"))
    keep = os.environ.get("KEEP")
    tmp = tempfile.mkdtemp()
    try:
        bin_ = os.path.join(tmp, "meshrun")
        if os.environ.get("BIN"):
            shutil.copy(os.environ["BIN"], bin_)
        else:
            subprocess.run(["make", "-s", "all"], check=True)
            shutil.copy("build/meshrun", bin_)
        run([bin_, "bench", "link", "--hosts", "2", "--sizes", "4K,1M", "--iters", "50"], f"{tmp}/link")
        link = {int(l.split()[0]): float(l.split()[1]) for l in open(f"{tmp}/link") if re.match(r"^\d+ ", l)}
        lat = link[4096]
        gbps = 8 * 1048576 / ((link[1048576] - lat) * 1e3)
        lk = ["--link-gbps", f"{gbps:.3f}", "--link-latency-us", f"{lat}"]
        print(f"# link (bench link, loopback TLS): latency {lat} us, {gbps:.3f} Gbit/s; "
              f"load {open('/proc/loadavg').read().split()[:3]}")
        print("| mesh | M | schedule | recompute | round | step s | plan s (own) | error | run's costs | error | "
              "at plan's cores | error | plan after at run's cores | error | cores before/run/after | "
              "action cpu s before/run/after | other load's cores plan/run/after | load |")
        print("|" + "---|" * 18)
        out, t0 = [], time.monotonic()
        for row in rows:
            mesh_flags, args = row_args(row)
            mesh, M, sv, rc = row.split(":")
            for r in range(rounds):
                load = open("/proc/loadavg").read().split()[0]
                f = {k: f"{tmp}/{k}" for k in ("own", "log", "run", "atown", "after")}
                plan = [bin_, "plan"] + MODEL + mesh_flags + args + lk
                o_own = run(plan + ["--cores", "auto"], f["own"])
                for x in ("m.jsonl", "t.json"):
                    if os.path.exists(f"{tmp}/{x}"):
                        os.remove(f"{tmp}/{x}")
                o_run = run([bin_, "local"] + mesh_flags + MODEL + args +
                            [f"steps={steps}", "--metrics", f"{tmp}/m.jsonl", "--trace", f"{tmp}/t.json", "--quiet"],
                            f["log"])
                run(plan + ["--costs-from", f"{tmp}/t.json"], f["run"])
                c_own = grab(f["own"], r"^cores: the \d+ devices share (\S+) cores")
                c_run = grab(f["run"], r"^costs: .*; cores (\S+) \(the run's")
                run(plan + ["--costs-from", f"{tmp}/t.json", "--cores", f"{c_own}"], f["atown"])
                o_after = run(plan + ["--cores", f"{c_run}"], f["after"])
                c_after = grab(f["after"], r"^cores seen: the \d+ devices' threads got (\S+) cores")
                ms = [json.loads(l) for l in open(f"{tmp}/m.jsonl")][1:]
                step = sum(m["step_time_s"] for m in ms) / len(ms)
                p = {k: grab(f[k], r"^predicted_step_s: (\S+)") for k in ("own", "run", "atown", "after")}
                e = {k: 100 * (v - step) / step for k, v in p.items()}
                cpu = (table_cpu(f["own"]), table_cpu(f["run"]), table_cpu(f["after"]))
                line = (f"| {mesh} | {M} | {sv} | {rc} | {r} | {step:.2f} | {p['own']:.2f} | {e['own']:+.0f}% | "
                        f"{p['run']:.2f} | {e['run']:+.0f}% | {p['atown']:.2f} | {e['atown']:+.0f}% | "
                        f"{p['after']:.2f} | {e['after']:+.0f}% | {c_own:.2f}/{c_run:.2f}/{c_after:.2f} | "
                        f"{cpu[0]:.2f}/{cpu[1]:.2f}/{cpu[2]:.2f} | {o_own:.2f}/{o_run:.2f}/{o_after:.2f} | {load} |")
                print(line, flush=True)
                out.append(e)
                if keep:
                    k = os.path.join(keep, f"{mesh}-{M}-{sv.replace('/', '-')}-{rc}-{r}")
                    os.makedirs(k, exist_ok=True)
                    for x in list(f.values()) + [f"{tmp}/m.jsonl", f"{tmp}/t.json"]:
                        shutil.copy(x, k)
        n = len(out)
        within = lambda k: sum(abs(e[k]) <= 15 for e in out)
        print(f"# within 15%: plan (own) {within('own')} of {n}, run's costs {within('run')} of {n}, "
              f"at plan's cores {within('atown')} of {n}, plan after at the run's cores {within('after')} of {n}")
        print(f"# {time.monotonic() - t0:.0f} s; load {' '.join(open('/proc/loadavg').read().split()[:3])}")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
