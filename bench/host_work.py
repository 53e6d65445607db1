#!/usr/bin/env python3
"""Which host of a 2-host `meshrun bench collectives` run moves bytes while
the other waits? host_overlap.py sees a polling thread as on a CPU whether
it works or spins; this tells the two apart from a cpu-clock profile
(bench/bcast_timeline.sh records it with PROFILE=1): each sample is work
if it is in the cipher (libcrypto or ipsec-mb's libIPSec_MB), a copy (memmove, the kernel's
_copy_to_iter / _copy_from_iter) or the TCP send/receive path, else other
(polls that find nothing, yields, locks, the bench's own code). Per
window of WINDOW_US (default 400 us, two samples a CPU at 5 kHz) over the
middle 80% of the run, a host works if one of its samples in the window
is work. Prints the share of windows by host 0 / host 1: work (X),
samples but no work (o: spinning or bookkeeping), no sample (-).
usage: perf script -F pid,tid,time,ip,sym,dso -i FILE | bench/host_work.py [WINDOW_US]"""
import re
import sys

win = float(sys.argv[1]) * 1e-6 if len(sys.argv) > 1 else 400e-6
WORK = ('_copy_to_iter', '_copy_from_iter', 'memmove', 'memcpy', 'tcp_sendmsg', 'tcp_recvmsg',
        'skb_', 'tcp_', '__tcp', 'ip_', '__dev_queue_xmit', 'handle_softirqs')
samples = []
for line in sys.stdin:
    m = re.match(r'\s*(\d+)/(\d+)\s+([\d.]+):\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$', line)
    if not m:
        continue
    pid, t, sym, dso = int(m.group(1)), float(m.group(3)), m.group(4), m.group(5)
    work = 'libcrypto' in dso or 'libIPSec_MB' in dso or any(w in sym for w in WORK)
    samples.append((t, pid, work))
if not samples:
    sys.exit('host_work.py: no samples')
# the two agents: the two pids with the most samples at work
count = {}
for t, pid, work in samples:
    count[pid] = count.get(pid, 0) + work
agents = sorted(sorted(count, key=lambda p: -count[p])[:2])
if len(agents) < 2:
    sys.exit('host_work.py: fewer than two processes in the profile')
ts = [t for t, p, _ in samples if p in agents]
lo, hi = min(ts) + 0.1 * (max(ts) - min(ts)), max(ts) - 0.1 * (max(ts) - min(ts))
nw = int((hi - lo) / win)
state = [['-', '-'] for _ in range(nw)]
for t, pid, work in samples:
    if pid not in agents or not lo <= t < lo + nw * win:
        continue
    w = state[int((t - lo) / win)]
    h = agents.index(pid)
    w[h] = 'X' if work or w[h] == 'X' else 'o'
share = {}
for w in state:
    k = w[0] + '/' + w[1]
    share[k] = share.get(k, 0) + 1
print('# host 0 (pid %d) / host 1 (pid %d), %d windows of %.0f us: X work, o on a CPU without '
      'work, - no sample' % (agents[0], agents[1], nw, win * 1e6))
for k in sorted(share, key=lambda k: -share[k]):
    print('  %s  %5.1f%%' % (k, 100 * share[k] / nw))
