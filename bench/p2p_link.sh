#!/bin/bash
# One pipeline message's time on the link (issue 21/19): `meshrun bench link
# --pingpong` (one message at a time, each receive posted before its send,
# half a round = send call to woken receiver), 256 KiB and 2 MiB, for a set
# of variants run in alternation in the same run, with medians and the
# ratio of each variant to the first. Prints the load average before and
# after. Usage (from the worktree root):
#   [ROUNDS=5] [SIZES=262144,2097152] [BIN=build/meshrun] bash bench/p2p_link.sh \
#       'name|ENV=.. key=value ..' ...
# A variant is a name, '|', then words: BIN=PATH runs that binary for the
# variant (e.g. main's build as the baseline), any other NAME=VALUE with an
# upper-case NAME is put in the environment, anything else goes to meshrun
# as key=value.
# Default variants: base, and the waiter not spinning (poll_spin_us=0).
set -u
BIN=${BIN:-build/meshrun}
ROUNDS=${ROUNDS:-5}
SIZES=${SIZES:-262144,2097152}
[ $# -gt 0 ] || set -- 'base|' 'nospin|poll_spin_us=0'
echo "# load before: $(cat /proc/loadavg)"
out=$(mktemp)
for r in $(seq 1 "$ROUNDS"); do
	for v in "$@"; do
		name=${v%%|*}
		envs=() keys=() bin=$BIN
		for w in ${v#*|}; do
			if [[ $w =~ ^BIN= ]]; then bin=${w#BIN=}
			elif [[ $w =~ ^[A-Z_][A-Z0-9_]*= ]]; then envs+=("$w"); else keys+=("$w"); fi
		done
		env "${envs[@]}" "$bin" bench link --hosts 2 --sizes "$SIZES" --pingpong "${keys[@]}" 2>&1 |
			awk -v n="$name" '/^[0-9]/ { print n, $1, $2 } /^# cpu/ { sub(":", "", $3); print n "-cpu", $3, $4 }' >>"$out"
	done
done
echo "# load after: $(cat /proc/loadavg)"
/usr/bin/python3 - "$out" "$@" <<'PY'
import sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    n, size, us = line.split()
    rows.setdefault((n, int(size)), []).append(float(us))
names = [v.split('|')[0] for v in sys.argv[2:]]
sizes = sorted({s for (_, s) in rows})
print("%-14s %9s %12s %8s %14s %8s" % ("variant", "size", "oneway_us", "x base", "cpu_us/msg h0", "x base"))
for s in sizes:
    b = st.median(rows.get((names[0], s), [float('nan')]))
    bc = st.median(rows.get((names[0] + "-cpu", s), [float('nan')]))
    for n in names:
        w = st.median(rows.get((n, s), [float('nan')]))
        c = st.median(rows.get((n + "-cpu", s), [float('nan')]))
        print("%-14s %9d %12.1f %8.2f %14.1f %8.2f" % (n, s, w, w / b, c, c / bc))
print("# medians of %d rounds; oneway_us = half a ping-pong round" % len(rows[(names[0], sizes[0])]))
PY
rm -f "$out"
