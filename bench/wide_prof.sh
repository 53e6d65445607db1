#!/usr/bin/env bash
# Where a four-rank op's CPU goes, by thread and by symbol: one
# `meshrun bench collectives` run (SHAPE, default 2x2; SIZE, default 16M;
# ITERS, default 20) under `perf record -F 999 -e cpu-clock` (all its
# agents), then ms per op by thread name (mr-dev*, mr-stream*, mr-net)
# and each thread group's top symbols (self), and the bench's own lines
# (its per-thread CPU for host 0, the CPU per op), and how much of the
# machine stayed idle meanwhile (/proc/stat). NS=name runs it inside
# that network namespace. Prints the load before and after.
# usage: [SHAPE=2x2] [SIZE=16M] [ITERS=20] [BIN=build/meshrun] [NS=name] bench/wide_prof.sh OP [KEY=VALUE ...]
set -eu
cd "$(dirname "$0")/.."
op=$1; shift
shape=${SHAPE:-2x2}; h=${shape%x*}; d=${shape#*x}
iters=${ITERS:-20}
ns=()
[ -z "${NS:-}" ] || ns=(ip netns exec "$NS")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "# load $(cat /proc/loadavg)"
read -r _ u0 n0 s0 i0 w0 _ < /proc/stat
t0=$EPOCHREALTIME
"${ns[@]}" perf record -q -F 999 -e cpu-clock -o "$tmp/p.data" -- "${BIN:-build/meshrun}" bench collectives \
  --hosts "$h" --devices-per-host "$d" --op "$op" --sizes "${SIZE:-16M}" --iters "$iters" --warmup 3 "$@" \
  2>&1 | grep -E '^(# (threads|cpu)| +[0-9]+ +[0-9]+ )'
read -r _ u1 n1 s1 i1 w1 _ < /proc/stat
awk -v i="$(( i1 + w1 - i0 - w0 ))" -v t0="$t0" -v t1="$EPOCHREALTIME" -v c="$(nproc)" -v hz="$(getconf CLK_TCK)" \
  'BEGIN { printf "# machine idle during the run (whole run, set-up included): %.2f of %d cores\n", i / hz / (t1 - t0), c }'
echo "# load $(cat /proc/loadavg)"
perf report -i "$tmp/p.data" --no-children --sort pid,sym --stdio -g none 2>/dev/null > "$tmp/r.txt" || true
n=$(perf script -i "$tmp/p.data" -F comm 2>/dev/null | wc -l)
/usr/bin/python3 - "$tmp/r.txt" "$((iters + 3))" "$n" <<'PY'
import sys, re, collections as C
ops, tot = int(sys.argv[2]), float(sys.argv[3])
by_comm, by_sym = C.Counter(), C.defaultdict(C.Counter)
for l in open(sys.argv[1]):
    m = re.match(r"\s+([\d.]+)%\s+\s*(\d+:\S+)\s+\[.\]\s+(.*\S)", l)
    if not m: continue
    c = m.group(2); k = float(m.group(1)) / 100 * tot
    by_comm[c] += k; by_sym[c][m.group(3)] += k
ms = lambda n: n / 999 * 1000 / ops
print(f"# CPU ms per op (perf samples of all agents / {ops} ops incl. warm-up): {ms(tot):.2f}")
for c, n in by_comm.most_common(10):
    print(f"{c:<11} {ms(n):6.2f} ms: " + ", ".join(f"{s} {ms(k):.2f}" for s, k in by_sym[c].most_common(9)))
allsym = C.Counter()
for c in by_sym:
    allsym.update(by_sym[c])
print("# all threads, top symbols, ms per op: " + ", ".join(f"{s} {ms(k):.2f}" for s, k in allsym.most_common(30)))
PY
