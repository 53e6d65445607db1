#!/usr/bin/env bash
# 16 MiB on the four-rank shapes (2 x 2 and 4 x 1) against gloo: BASE (a
# build before the change) and this build take turns going first, round
# by round, then gloo's run of the same ops on the same rank count; prints
# the load each round, then medians of busbw and CPU us per op, each
# build's ratio to gloo's busbw and this build's time and CPU against
# BASE's. NS=name runs everything inside that network namespace (made by
# the caller, e.g. with cubic as its default: the fair setting).
# VARIANTS="name:VAR=VAL ..." adds build/meshrun runs with an environment
# variable set (upper case) or a config key=value (lower case, e.g.
# ls2:link_streams=2). Raw output: build/wide_ab.log.
# GLOO=0 leaves gloo out. MPI=0 leaves Open MPI out (its CPU per op is one of the ceilings).
# usage: BASE=PATH [SHAPES="2x2 4x1"] [OPS="..."] [ITERS=10] [NS=name] bench/wide_ab.sh [ROUNDS]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-4}
: "${BASE:?BASE=PATH of the build to compare against}"
shapes=${SHAPES:-"2x2 4x1"}
ops=${OPS:-"all_gather all_reduce all_to_all permute"}
iters=${ITERS:-10}
ns=()
[ -z "${NS:-}" ] || ns=(ip netns exec "$NS")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
make -s all
[ "${MPI:-1}" != 1 ] || mpicc -O2 -o build/mpi_coll bench/mpi_coll.c
# AES-128-GCM's CPU rate as this build seals and opens (GB/s, the mean of the two)
aes=$(build/meshrun bench cipher --ms 1000 2>/dev/null | awk '
  /^cipher auto:/ { auto = $3 }
  /^cipher AES-128-GCM / { name = $3; sub(/:$/, "", name); s[name] = $(NF - 6); o[name] = $(NF - 3) }
  END { print (s[auto] + o[auto]) / 2 }')
echo "# aes-128-gcm $aes GB/s (seal and open, CPU time)"
impls="base:$BASE new:$PWD/build/meshrun"
for v in ${VARIANTS:-}; do
  name=${v%%:*}; env=${v#*:}
  case $env in
    [a-z]*) printf '#!/bin/sh\nexec %s "$@" %s\n' "$PWD/build/meshrun" "$env" > "$tmp/$name" ;;
    *) printf '#!/bin/sh\n%s exec %s "$@"\n' "$env" "$PWD/build/meshrun" > "$tmp/$name" ;;
  esac
  chmod +x "$tmp/$name"
  impls="$impls $name:$tmp/$name"
done
log=build/wide_ab.log
: > "$log"
set -- $impls
for r in $(seq 1 "$rounds"); do
  echo "# round $r load $(cat /proc/loadavg)" | tee -a "$log"
  for shape in $shapes; do
    h=${shape%x*}; d=${shape#*x}
    for op in $ops; do
      for i in "$@"; do
        "${ns[@]}" "${i#*:}" bench collectives --hosts "$h" --devices-per-host "$d" --op "$op" \
          --sizes 16M --iters "$iters" --warmup 3 2>&1 |
          awk -v impl="${i%%:*}" -v op="$op" -v sh="$shape" '
            /^ +[0-9]+ +[0-9]+ +[0-9.]+ / { t = $3; bw = $5 }
            /^# cpu [0-9]+:/ { c = $4 }
            /^# dcn [0-9]+:/ { printf "R %s %s %s %s %s %s %s\n", sh, impl, op, t, bw, c, $(NF - 4) }'
      done
    done
    [ "${GLOO:-1}" != 1 ] || OMP_NUM_THREADS=1 "${ns[@]}" /usr/bin/python3 bench/gloo_coll.py $(( 20000 + RANDOM % 20000 )) \
      "$iters" 0 "$(echo $ops | tr ' ' ,)" $(( h * d )) 0 2>&1 |
      awk -v sh="$shape" '/^gloo/ { printf "R %s gloo %s %s %s %s\n", sh, $2, $5, $9, $11 }'
    if [ "${MPI:-1}" = 1 ]; then
      "${ns[@]}" mpirun --allow-run-as-root --oversubscribe -np $(( h * d )) --mca btl tcp,self \
        --mca btl_tcp_if_include lo --mca pml ob1 build/mpi_coll "$iters" 0 0 2>&1 |
        awk -v sh="$shape" -v ops=" $ops " 'index(ops, " " $2 " ") && /^openmpi/ { printf "R %s openmpi %s %s %s %s\n", sh, $2, $5, $9, $11 }'
    fi
  done >> "$log"
  set -- "${@:2}" "$1"
done
echo "# end load $(cat /proc/loadavg)" | tee -a "$log"
/usr/bin/python3 - "$log" "$aes" "$(nproc)" <<'PY'
import sys, statistics as st
aes, cores = float(sys.argv[2]), int(sys.argv[3])
dcn = {}
d = {}
for l in open(sys.argv[1]):
    f = l.split()
    if f and f[0] == "R":
        d.setdefault((f[1], f[2], f[3]), []).append((float(f[4]), float(f[5]), float(f[6])))
        if len(f) > 7: dcn[(f[1], f[3])] = float(f[7])
shapes = sorted({k[0] for k in d}, reverse=True)
impls = sorted({k[1] for k in d}, key=lambda s: (s != "gloo", s != "openmpi", s != "base", s))
ops = []
for k in d:
    if k[2] not in ops: ops.append(k[2])
med = lambda v, i: st.median(x[i] for x in v)
for sh in shapes:
    print(f"# {sh}: median busbw GB/s (ratio to gloo) / CPU us per op; time and CPU vs base")
    for op in ops:
        g = d.get((sh, "gloo", op))
        b = d.get((sh, "base", op))
        row = f"{sh} {op:<11}"
        for im in impls:
            v = d.get((sh, im, op))
            if not v: continue
            bw = med(v, 1)
            row += f" | {im} {bw:.3f}" + (f" ({bw / med(g, 1):.2f}x)" if g and im != "gloo" else "") + f" {med(v, 2):.0f}us"
            if b and im not in ("base", "gloo", "openmpi"):
                row += f" t {med(v, 0) / med(b, 0):.2f} cpu {med(v, 2) / med(b, 2):.2f}"
                wins = sum(1 for x, y in zip(v, b) if x[0] < y[0])
                row += f" won {wins}/{min(len(v), len(b))}"
        print(row)
    # the ceiling: the cores both hosts share, busy with AES-GCM (every
    # byte that crosses hosts sealed once and opened once) plus a
    # plaintext peer's CPU per op for moving the bytes
    print(f"# {sh} ceilings: busbw at (AES-GCM's CPU for the bytes across hosts + a peer's CPU per op) / {cores} cores")
    for op in ops:
        g, m, x = d.get((sh, "gloo", op)), d.get((sh, "openmpi", op)), d.get((sh, "new", op))
        if not (g and x and (sh, op) in dcn): continue
        aes_us = 2 * dcn[(sh, op)] / aes / 1e3
        bw_per_us = med(x, 1) * med(x, 0)   # busbw x time: the op's bus bytes / 1e3
        row = f"{sh} {op:<11} cross {dcn[(sh, op)] / 2**20:.0f} MiB, AES {aes_us:.0f} us; gloo busbw {med(g, 1):.3f}"
        for name, v in (("openmpi", m), ("gloo", g)):
            if v:
                t = (aes_us + med(v, 2)) / cores
                row += f" | AES + {name}'s CPU ({med(v, 2):.0f} us): {bw_per_us / t:.3f} ({bw_per_us / t / med(g, 1):.2f}x gloo)"
        print(row)
PY
