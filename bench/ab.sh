#!/usr/bin/env bash
# bench/ab.sh OLD_TREE [ROUNDS]: interleaved rounds of the same commands with
# OLD_TREE/build/meshrun (run in OLD_TREE, with its own configs/) and this
# tree's build/meshrun: 16 MiB bench link, 16 MiB all_reduce on 2 hosts,
# llama-bench training (mean seconds of steps 2-5). Build both first, e.g.
#   git worktree add /tmp/old 72ac185 && make -C /tmp/old
set -u
OLD=$(cd "$1" && pwd); R=${2:-3}
NEW=$(cd "$(dirname "$0")/.." && pwd)
for r in $(seq "$R"); do
	for v in old new; do
		if [ $v = old ]; then D=$OLD; else D=$NEW; fi
		cd "$D" || exit 1
		B=$D/build/meshrun
		l=$($B bench link --hosts 2 --sizes 16M --iters 30 2>&1 | awk '/^16777216/ {print $3}')
		a=$($B bench collectives --hosts 2 --op all_reduce --sizes 16M --iters 30 2>&1 |
		    awk '$1 == 16777216 {print $5}')
		t=$($B train --config configs/llama-bench.yml steps=6 2>&1 |
		    awk -F'seconds: ' '/completed step: [2-5],/ {split($2, x, ","); s += x[1]; n++}
				       END {printf "%.3f", s / n}')
		echo "round $r $v: link $l GB/s, all_reduce busbw $a GB/s, llama-bench $t s/step"
	done
done
