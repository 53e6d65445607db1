#!/usr/bin/env bash
# bench/recover.sh [RESETS] [ROUNDS]: link recovery on loopback (root: ss -K).
# 1. RESETS resets (ss -K, 0.5 s apart) of the one link of a 2-host
#    `bench link` stream: from each host's log, the time from the break to
#    the link being up again and the bytes resent (median, max).
# 2. The price of replay: `bench link` and `bench collectives --op
#    all_reduce` at 16 MiB with recovery on (replay_buffer_bytes default)
#    and off (replay_buffer_bytes=0), interleaved, ROUNDS rounds; medians.
# 3. The same for llama-bench data-parallel training (2 hosts x 1 device,
#    4 steps): the mean step time over steps 1-3, median over rounds.
set -u
B=${MESHRUN:-$(dirname "$0")/../build/meshrun}
N=${1:-20}; R=${2:-5}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

reset_children() {   # every established connection of a listener of $1's children
  for port in $(ss -tlnpH | awk -v g="$1" '{ if (match($0, /pid=[0-9]+/)) {
      p = substr($0, RSTART + 4, RLENGTH - 4); cmd = "ps -o ppid= -p " p;
      cmd | getline pp; close(cmd); if (pp + 0 == g) { sub(/.*:/, "", $4); print $4 } } }'); do
    ss -K -tnH state established "( sport = :$port or dport = :$port )" >/dev/null
  done
}

"$B" bench link --hosts 2 --sizes 16M --iters 1000000 >"$tmp/rt.txt" 2>&1 &
lp=$!
sleep 2
for i in $(seq "$N"); do reset_children "$lp"; sleep 0.5; done
kill -INT "$lp"; wait "$lp" 2>/dev/null
python3 - "$tmp/rt.txt" <<'PY'
import re, statistics as st, sys
rows = {}
for l in open(sys.argv[1]):
    m = re.search(r'host (\d+): link to .* resumed after (\d+) ms: resending (\d+) frames \((\d+) bytes\)', l)
    if m:
        rows.setdefault(m.group(1), []).append((int(m.group(2)), int(m.group(4))))
for h, r in sorted(rows.items()):
    print(f"host {h}: {len(r)} resumes; break to up: median {st.median(x[0] for x in r)} ms, "
          f"max {max(x[0] for x in r)} ms; resent: median {st.median(x[1] for x in r):.0f} B, "
          f"max {max(x[1] for x in r)} B")
PY

for i in $(seq "$R"); do
  for r in on off; do
    kv=""; [ $r = off ] && kv="replay_buffer_bytes=0"
    echo "link $r $("$B" bench link --hosts 2 --sizes 16M --iters 30 $kv 2>&1 |
      awk '/^16777216/ { g = $3 } /^# cpu/ { c = $4 } END { print g, c }')"
    echo "all_reduce $r $("$B" bench collectives --hosts 3 --op all_reduce --sizes 16M --iters 20 $kv 2>&1 |
      awk '$1 == 16777216 { g = $5 } /^# cpu/ { c = $4 } END { print g, c }')"
  done
done >"$tmp/price.txt"
python3 - "$tmp/price.txt" <<'PY'
import statistics as st, sys
d = {}
for l in open(sys.argv[1]):
    op, mode, gb, cpu = l.split()
    d.setdefault((op, mode), []).append((float(gb), float(cpu)))
for (op, mode), v in sorted(d.items()):
    print(f"{op:10} recovery {mode:3}: busbw median {st.median(x[0] for x in v):.3f} GB/s, "
          f"cpu median {st.median(x[1] for x in v):.0f} us per iteration ({len(v)} rounds)")
PY

for i in $(seq "$R"); do
  for r in on off; do
    kv=""; [ $r = off ] && kv="replay_buffer_bytes=0"
    "$B" local --hosts 2 --config configs/llama-bench.yml steps=4 $kv \
      --metrics "$tmp/dp-$r-$i.jsonl" >/dev/null 2>&1
    echo "$r $(python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][1:]; print(sum(x['step_time_s'] for x in r)/len(r))" "$tmp/dp-$r-$i.jsonl")"
  done
done >"$tmp/dp.txt"
python3 - "$tmp/dp.txt" <<'PY'
import statistics as st, sys
d = {}
for l in open(sys.argv[1]):
    mode, s = l.split()
    d.setdefault(mode, []).append(float(s))
for mode, v in sorted(d.items()):
    print(f"llama-bench data-parallel recovery {mode:3}: step median {st.median(v):.3f} s "
          f"({' '.join('%.3f' % x for x in v)})")
if 'on' in d and 'off' in d:
    print(f"on / off: {st.median(d['on']) / st.median(d['off']):.3f}")
PY
