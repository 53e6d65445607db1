#!/usr/bin/env bash
# Issue 19's goals in one run (2 hosts x 1 device, loopback): every op at
# 64 KiB and 16 MiB, meshrun (TLS) against Open MPI (TCP) and gloo
# (torch.distributed), interleaved, ROUNDS rounds (each round runs every
# implementation once, and measures AES-128-GCM as the run seals it:
# `meshrun bench cipher`'s seal rate for the implementation the run's
# settings pick, ipsec-mb or OpenSSL, or `openssl speed` for a build
# without that command);
# prints medians of busbw, the ratios the goals name (meshrun/Open MPI at
# 64 KiB, meshrun/gloo at 16 MiB), CPU us per op of each, CPU per wire
# byte beyond AES-GCM against Open MPI's and gloo's CPU per byte, the load
# average, one line per goal: met / not met, and at 16 MiB the ceilings
# this machine puts on any encrypted transport (AES-GCM's CPU, and that
# plus Open MPI's CPU per op, spread over the cores both hosts share:
# see bench/peers_summary.py `ceilings`). The parts are
# bench/peers_lib.sh's (shared with bench/peers.sh), the summary
# bench/peers_summary.py --goals. Raw output: build/goals19.log.
# MESHRUN_KEYS adds key=value settings to every meshrun run. AB_KEYS
# runs meshrun a second time each round with those settings added (e.g.
# AB_KEYS=tls_records=openssl; AB_KEYS=cpu_bind=none: agents bound, as
# by default, against floating) and prints a second summary for them, the
# peers' runs and AES figure shared (raw: build/goals19-b.log); the two
# take turns running first, round by round. BASE=PATH runs another build
# (e.g. /work/bin/meshrun-s11) as that second run instead, with the same
# settings (AB_KEYS, if given, go to BASE's runs).
# Every meshrun run goes under `perf record -F 999` (cpu-clock, when perf
# is there; CIPHER_SAMPLES=0 turns it off): its libcrypto and libIPSec_MB
# samples give the
# cipher's CPU as the run pays it ("# cipher-samples" lines), so the
# summary prints CPU per wire byte beyond AES twice: beyond `openssl
# speed`'s hot 16 KiB figure (the goal's measure) and beyond the run's own
# cipher samples (what the cipher cost in the run, cache misses and EVP
# calls included).
# ~50 s a round on an idle 2-vCPU machine.
# usage: [MESHRUN_KEYS="k=v ..."] [AB_KEYS="k=v ..."] [BASE=bin] bench/goals19.sh [ROUNDS]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-4}
keys=${MESHRUN_KEYS:-}
small=500    # 64 KiB iterations (~0.1 ms each: a mean over ~50 ms)
big=10       # 16 MiB iterations
. bench/peers_lib.sh
peers_setup
log=build/goals19.log
logb=build/goals19-b.log
ab=${AB_KEYS:-}
base=${BASE:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: > "$log"
[ -z "$ab$base" ] || : > "$logb"
csamp=${CIPHER_SAMPLES:-1}
command -v perf >/dev/null || csamp=0
# peers_meshrun, under perf when csamp=1: then a line "# cipher-samples OP
# BYTES SAMPLES HZ ITERS WARMUP" (libcrypto's samples over the whole run,
# on the threads that seal and open, mr-dev* and mr-stream*, of both
# agents: the handshakes' samples, on the main and mr-net threads, about
# 13 ms a run, are left out) follows the bench's output
meshrun_one() {
  local op=$1 size=$2 iters=$3 warm=$4
  shift 4
  if [ "$csamp" != 1 ]; then
    peers_meshrun 2 1 "$op" "$size" "$iters" "$warm" "$@"
    return
  fi
  perf record -q -F 999 -o "$tmp/c.data" -- "${MR_BIN:-build/meshrun}" bench collectives --hosts 2 \
    --devices-per-host 1 --op "$op" --sizes "$size" --iters "$iters" --warmup "$warm" "$@"
  echo "# cipher-samples $op $(numfmt --from=iec "$size") $(perf script -i "$tmp/c.data" \
    -F comm,ip,dso 2>/dev/null | grep -c -E '^ *mr-(dev|stream).*(libcrypto|libIPSec_MB)') 999 $iters $warm"
}
# meshrun's six ops at 64 KiB and 16 MiB with the given key=value settings
meshrun_ops() {
  for op in all_gather reduce_scatter all_reduce all_to_all permute broadcast; do
    echo "# meshrun $op"
    meshrun_one "$op" 64K "$small" 20 "$@"
    meshrun_one "$op" 16M "$big" 3 "$@"
  done
}
# "# aes-128-gcm R GB/s": AES-128-GCM's CPU-time rate on 16 KiB records
# as build BIN seals them with key=value settings KEYS: its `bench cipher`
# line for the implementation those settings pick (tls_cipher_impl,
# tls_records), or `openssl speed`'s when BIN has no such command or the
# records are OpenSSL's
aes_line() {
  local bin=$1 impl=auto r=
  shift
  for kv in "$@"; do
    case $kv in
      tls_cipher_impl=*) impl=${kv#*=} ;;
      tls_records=openssl) impl=openssl-records ;;
    esac
  done
  if [ "$impl" != openssl-records ]; then
    r=$("$bin" bench cipher --ms 1000 2>/dev/null | awk -v want="$impl" '
      /^cipher auto:/ { auto = $3 }
      /^cipher AES-128-GCM / { name = $3; sub(/:$/, "", name); rate[name] = $(NF - 6) }
      END { if (want == "auto") want = auto; if (want in rate) print rate[want] }')
  fi
  [ -n "$r" ] || r=$(openssl speed -seconds 1 -evp aes-128-gcm -bytes 16384 2>/dev/null |
    awk '/^AES-128-GCM/ {sub(/k$/, "", $2); print $2 * 1000 / 1e9}')
  echo "# aes-128-gcm $r GB/s"
}
for round in $(seq 1 "$rounds"); do
  {
    echo "# round $round"
    echo "# load $(cat /proc/loadavg)"
    echo "# shape 2x1"
  } > "$tmp/head"
  # user CPU time per byte, as the CPU figures of the rest
  aes_line build/meshrun $keys > "$tmp/aes"
  [ -z "$ab$base" ] || aes_line "${base:-build/meshrun}" $keys $ab > "$tmp/aesb"
  # AB_KEYS: meshrun once more with those settings too, in the same round,
  # first in even rounds (so neither side always runs first)
  if [ -n "$ab$base" ] && [ $((round % 2)) = 0 ]; then
    MR_BIN=${base:-build/meshrun} meshrun_ops $keys $ab > "$tmp/b" 2>&1
    meshrun_ops $keys > "$tmp/a" 2>&1
  else
    meshrun_ops $keys > "$tmp/a" 2>&1
    [ -z "$ab$base" ] || MR_BIN=${base:-build/meshrun} meshrun_ops $keys $ab > "$tmp/b" 2>&1
  fi
  {
    peers_mpi 2 "$big" "$small" 0
    peers_gloo 2 "$big" "$small" 0
  } > "$tmp/peers" 2>&1
  cat "$tmp/head" "$tmp/aes" "$tmp/a" "$tmp/peers" >> "$log"
  [ -z "$ab$base" ] || cat "$tmp/head" "$tmp/aesb" "$tmp/b" "$tmp/peers" >> "$logb"
  grep -E '^(# (round|load|aes)|openmpi|gloo)' "$tmp/head" "$tmp/aes" "$tmp/peers" -h || true
done
echo "# end of run, load $(cat /proc/loadavg)" >> "$log"
[ -z "$ab$base" ] || echo "# meshrun settings: ${keys:-(defaults)}"
/usr/bin/python3 bench/peers_summary.py --goals "$log"
if [ -n "$ab$base" ]; then
  echo "# end of run, load $(cat /proc/loadavg)" >> "$logb"
  echo
  echo "# meshrun ${base:+build $base, }settings: ${keys:+$keys }${ab:-(defaults)} (the same rounds; Open MPI and gloo the same runs)"
  /usr/bin/python3 bench/peers_summary.py --goals "$logb"
fi
