#!/usr/bin/env bash
# Where the CPU of a 2x1 collective goes, meshrun (TLS) against Open MPI
# (TCP, bench/mpi_coll.c run as bench/peers_lib.sh runs it), in the same
# run: `perf record -g` (cpu-clock, F Hz, every process of each) of N and
# of 2N iterations, ROUNDS rounds interleaved; bench/cpu_vs_mpi.py
# itemises the difference per op: the cipher (its AES-GCM kernels:
# libcrypto's pages `openssl speed` runs, or Intel ipsec-mb's; and the
# rest of libcrypto) against the hot 16 KiB rate of the cipher the run
# uses (measured in the same run: `meshrun bench cipher`'s seal and open
# for the implementation tls_cipher_impl=auto picks, or `openssl speed`'s
# for a build without that command), the kernel's socket copies, the rest of its
# TCP, page faults, scheduling (futex, epoll, switches), polling (our
# spin: xport_wait/op_poll/recv_poll and sched_yield; Open MPI's
# opal_progress and poll()), user-space copies (with their callers), the
# sums, the rest. Counts samples, not clocks; prints the load. The
# cipher's rate is measured at the start and before each round; the
# median is used.
# BASE=PATH adds another meshrun build (e.g. /work/bin/meshrun-23a) as a
# column (BASE_KEYS="k=v ..." adds settings to that column only, e.g.
# BASE=build/meshrun BASE_KEYS=poll_spin_us=0 weighs the spin); MESHRUN=PATH measures that build instead of build/meshrun (the
# callers of memcpy are named only in a frame-pointer build: make
# B=/tmp/fp CFLAGS=-fno-omit-frame-pointer /tmp/fp/meshrun). SIZE
# defaults to 16M. ~1 min per op and round on 2 cores. KEEP=DIR keeps
# the perf scripts (DIR/OP/IMPL.ROUND.{1,2}.txt, with pid and tid) for
# bench/cpu_sides.py, which splits them per process (a broadcast's root
# and receiver) and thread.
# usage: [BASE=bin] [MESHRUN=bin] [ROUNDS=3] [F=999] bench/cpu_vs_mpi.sh N OP... [-- key=value ...]
set -eu
cd "$(dirname "$0")/.."
n=$1; shift
ops=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do ops+=("$1"); shift; done
[ $# -gt 0 ] && shift
F=${F:-999}
rounds=${ROUNDS:-3}
size=${SIZE:-16M}
bytes=$(numfmt --from=iec "$size")
[ -x build/mpi_coll ] || mpicc -O2 -o build/mpi_coll bench/mpi_coll.c
if [ -n "${KEEP:-}" ]; then
  tmp=$KEEP; mkdir -p "$tmp"
else
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
fi
echo "# load $(cat /proc/loadavg)"
# openssl speed's AES-128-GCM at 16 KiB, encrypt and decrypt (user CPU, hot)
# and the code it runs
perf record -q -g -F 2999 -o "$tmp/sp.data" -- openssl speed -seconds 1 -evp aes-128-gcm \
  -bytes 16384 >"$tmp/enc" 2>/dev/null
openssl speed -decrypt -seconds 1 -evp aes-128-gcm -bytes 16384 >"$tmp/dec" 2>/dev/null
perf script -i "$tmp/sp.data" -F comm,ip,sym,dso 2>/dev/null >"$tmp/speed.txt"
gbs() { awk '/^AES-128-GCM/ {sub(/k$/, "", $2); print $2 * 1000 / 1e9}' "$1"; }
# "SEAL OPEN" GB/s of AES-128-GCM as the measured build seals its records
# by default: its `bench cipher` line for auto's implementation, else
# openssl speed's (in $tmp/enc and $tmp/dec)
rates() {
  local r
  r=$("${MESHRUN:-build/meshrun}" bench cipher --ms 1000 2>/dev/null | awk '
    /^cipher auto:/ { auto = $3 }
    /^cipher AES-128-GCM / { name = $3; sub(/:$/, "", name); s[name] = $(NF - 6); o[name] = $(NF - 3) }
    END { if (auto in s) print s[auto], o[auto] }')
  [ -n "$r" ] && echo "$r" || echo "$(gbs "$tmp/enc") $(gbs "$tmp/dec")"
}
rates >"$tmp/speed.gbs"
wire() { case $1 in all_reduce) echo 2;; permute) echo 2;; *) echo 1;; esac; }
impls="meshrun openmpi"
[ -z "${BASE:-}" ] || impls="base meshrun openmpi"
for op in "${ops[@]}"; do
  mkdir -p "$tmp/$op"
  cp "$tmp/speed.txt" "$tmp/speed.gbs" "$tmp/$op/"
  for r in $(seq 1 "$rounds"); do
    # openssl speed once more each round: the median is what the op is weighed against
    openssl speed -seconds 1 -evp aes-128-gcm -bytes 16384 >"$tmp/enc" 2>/dev/null
    openssl speed -decrypt -seconds 1 -evp aes-128-gcm -bytes 16384 >"$tmp/dec" 2>/dev/null
    rates >>"$tmp/$op/speed.gbs"
    for impl in $impls; do
      for k in 1 2; do
        it=$((n * k))
        case $impl in
          openmpi) cmd=(env MPI_COLL_OP="$op" mpirun --allow-run-as-root --oversubscribe -np 2
                        --mca btl tcp,self --mca btl_tcp_if_include lo --mca pml ob1
                        build/mpi_coll "$it" 0 0);;
          base) cmd=("$BASE" bench collectives --hosts 2 --op "$op" --sizes "$size" --iters "$it"
                     --warmup 3 "$@" ${BASE_KEYS:-});;
          *) cmd=("${MESHRUN:-build/meshrun}" bench collectives --hosts 2 --op "$op" --sizes "$size" --iters "$it"
                  --warmup 3 "$@");;
        esac
        perf record -q -g -F "$F" -o "$tmp/p.data" -- "${cmd[@]}" >"$tmp/out" 2>&1 ||
          { cat "$tmp/out"; exit 1; }
        perf script -i "$tmp/p.data" -F comm,pid,tid,ip,sym,dso 2>/dev/null >"$tmp/$op/$impl.$r.$k.txt"
        cp "$tmp/out" "$tmp/$op/$impl.$r.$k.out"
      done
    done
  done
  /usr/bin/python3 bench/cpu_vs_mpi.py "$tmp/$op" "$rounds" "$n" "$F" "$op" "$bytes" \
    "$(wire "$op")" $impls
  echo "# load $(cat /proc/loadavg)"
done
