#!/usr/bin/env bash
# bench/halfopen.sh [RUNS]: time from the start of a half-open path to data
# flowing again, beside the same after a reset, on loopback. Each run is a
# 2-host `meshrun local` pingpong (1 MiB messages, 8 rounds, every byte
# checked) with one fault at host 0's 20th data frame to host 1:
#   reset     close:link=0-1:frame=20 (with recovery a reset: the link breaks
#             at once, host 0 redials)
#   half-open halfopen:link=0-1:frame=20 (host 0's connection carries
#             nothing more out; host 1 hears nothing for link_silence_s,
#             drops it, host 0 redials), once with the defaults
#             (heartbeat_timeout_s=10: link_silence_s 4 s) and once with
#             heartbeat_interval_s=0.25 heartbeat_timeout_s=2 (0.8 s)
# The time is taken on stderr lines as they arrive: from "fault: injected"
# to the later of the two hosts' "resumed after" lines (both ends up: data
# flows again). Median, min and max of RUNS runs (default 20); the reset is
# the baseline, measured in the same run of this script.
set -u
B=${MESHRUN:-$(dirname "$0")/../build/meshrun}
N=${1:-20}
echo "load: $(cat /proc/loadavg)"
python3 - "$B" "$N" <<'PY'
import os, socket, statistics as st, subprocess, sys, time

meshrun, runs = sys.argv[1], int(sys.argv[2])

def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p

def once(fault, keys):
    cmd = [meshrun, "local", "--hosts", "2", "--job", "pingpong", "--size", "1M",
           "--rounds", "8", "coordinator_address=127.0.0.1:%d" % port(), "--fault", fault] + keys
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t_inj, t_up = None, []
    for line in p.stderr:
        now = time.monotonic()
        if "fault: injected" in line:
            t_inj = now
        elif "resumed after" in line:
            t_up.append(now)
    out = p.stdout.read()
    rc = p.wait()
    if rc != 0 or "ok" not in out or t_inj is None or len(t_up) < 2:
        raise SystemExit("run failed (exit %d): %s %s" % (rc, " ".join(cmd), out))
    return (max(t_up[:2]) - t_inj) * 1e3

cases = [
    ("reset (close)", "close:link=0-1:frame=20", []),
    ("half-open, link_silence_s 4 s (defaults)", "halfopen:link=0-1:frame=20", []),
    ("reset (close), heartbeat_timeout_s=2", "close:link=0-1:frame=20",
     ["heartbeat_interval_s=0.25", "heartbeat_timeout_s=2"]),
    ("half-open, link_silence_s 0.8 s (heartbeat_timeout_s=2)", "halfopen:link=0-1:frame=20",
     ["heartbeat_interval_s=0.25", "heartbeat_timeout_s=2"]),
]
res = {}
# interleaved, so the machine's load falls on every case alike
for i in range(runs):
    for name, fault, keys in cases:
        res.setdefault(name, []).append(once(fault, keys))
base = st.median(res[cases[0][0]])
print("| case | median ms | min | max | vs reset |")
print("|---|---|---|---|---|")
for name, _, _ in cases:
    v = res[name]
    print("| %s | %.0f | %.0f | %.0f | %+.0f ms |" % (name, st.median(v), min(v), max(v),
                                                    st.median(v) - base))
PY
echo "load: $(cat /proc/loadavg)"
