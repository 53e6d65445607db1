#!/usr/bin/env bash
# A/B of meshrun builds or settings by where their CPU goes, without
# Open MPI: for each variant, `perf record` (cpu-clock, F Hz, every
# thread of both agents) of N and of 2N iterations of `bench collectives
# --hosts 2` on OP, variants taking turns within each of ROUNDS rounds
# (the first variant first in odd rounds, last in even ones);
# bench/cpu_vs_mpi.py sorts the difference per op into its categories
# (the cipher's AES-GCM kernels against the rest of libcrypto, socket
# copies, TCP, polling, ...). Counts samples, not clocks; prints the load.
# A variant is BIN[,key=value,...] (commas between settings); the
# columns are named v1, v2, ... in the order given.
# usage: [ROUNDS=3] [F=999] [SIZE=16M] bench/rec_ab.sh N OP VARIANT...
# e.g.   bench/rec_ab.sh 20 broadcast /work/bin/meshrun-s9 build/meshrun
#        bench/rec_ab.sh 20 permute build/meshrun build/meshrun,max_send_bytes=262144
set -eu
cd "$(dirname "$0")/.."
n=$1 op=$2
shift 2
vars=("$@")
F=${F:-999}
rounds=${ROUNDS:-3}
size=${SIZE:-16M}
bytes=$(numfmt --from=iec "$size")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# load $(cat /proc/loadavg)"
wire() { case $1 in all_reduce) echo 2;; permute) echo 2;; *) echo 1;; esac; }
speed() {
  local e d
  e=$(openssl speed -seconds 1 -evp aes-128-gcm -bytes 16384 2>/dev/null |
      awk '/^AES-128-GCM/ {sub(/k$/, "", $2); print $2 * 1000 / 1e9}')
  d=$(openssl speed -decrypt -seconds 1 -evp aes-128-gcm -bytes 16384 2>/dev/null |
      awk '/^AES-128-GCM/ {sub(/k$/, "", $2); print $2 * 1000 / 1e9}')
  echo "$e $d" >>"$tmp/speed.gbs"
}
perf record -q -g -F 2999 -o "$tmp/sp.data" -- openssl speed -seconds 1 -evp aes-128-gcm \
  -bytes 16384 >/dev/null 2>&1
perf script -i "$tmp/sp.data" -F comm,ip,sym,dso 2>/dev/null >"$tmp/speed.txt"
names=()
for i in "${!vars[@]}"; do names+=("v$((i + 1))"); done
for r in $(seq 1 "$rounds"); do
  speed
  order=("${!vars[@]}")
  if [ $((r % 2)) = 0 ]; then order=(); for ((i = ${#vars[@]} - 1; i >= 0; i--)); do order+=("$i"); done; fi
  for i in "${order[@]}"; do
    IFS=, read -r -a v <<<"${vars[$i]}"
    for k in 1 2; do
      perf record -q -g -F "$F" -o "$tmp/p.data" -- "${v[0]}" bench collectives --hosts 2 \
        --op "$op" --sizes "$size" --iters $((n * k)) --warmup 3 "${v[@]:1}" >"$tmp/out" 2>&1 ||
        { cat "$tmp/out"; exit 1; }
      perf script -i "$tmp/p.data" -F comm,ip,sym,dso 2>/dev/null >"$tmp/v$((i + 1)).$r.$k.txt"
      cp "$tmp/out" "$tmp/v$((i + 1)).$r.$k.out"
    done
  done
  echo "# round $r load $(cat /proc/loadavg)"
done
for i in "${!vars[@]}"; do echo "# v$((i + 1)) = ${vars[$i]}"; done
/usr/bin/python3 bench/cpu_vs_mpi.py "$tmp" "$rounds" "$n" "$F" "$op" "$bytes" "$(wire "$op")" \
  "${names[@]}"
echo "# load $(cat /proc/loadavg)"
