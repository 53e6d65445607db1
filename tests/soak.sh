#!/usr/bin/env bash
# The chaos run: llama-tiny data parallel on 3 hosts (`meshrun local`, the
# ring 0 -> 1 -> 2 -> 0 on loopback) for STEPS steps, once undisturbed and
# once under a seeded random mix of faults: link resets (close, which
# with recovery is a reset), dropped frames, corrupted records, delays and
# half-open connections, injected at random data frames of random ring
# links (--fault; they fire again after a restart, whose frame counts
# start over), and SIGKILLs of random agents at random steps, survived
# through --max-restarts from the newest checkpoint. Every step's loss in
# the chaos run (steps a restart ran again included) must be bit-identical
# to the clean run's, and every step must be there.
#
#   tests/soak.sh [--steps N] [--seed S] [--kills K] [--faults F]
#
# Defaults: 2000 steps, seed 1, 3 kills, 12 link faults (`make soak`).
# Prints what it injected and "N passed, M failed"; exits non-zero on a
# failure. Loopback only; kills only the agents it started (children of
# its own launcher, by pid).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$here/..
meshrun=${MESHRUN:-$root/build/meshrun}
steps=2000 seed=1 kills=3 nfaults=12
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --kills) kills=$2; shift 2 ;;
    --faults) nfaults=$2; shift 2 ;;
    *) echo "usage: $0 [--steps N] [--seed S] [--kills K] [--faults F]" >&2; exit 2 ;;
  esac
done

passed=0 failed=0
ok() { echo "ok: $1"; passed=$((passed + 1)); }
fail() { echo "FAILED: $1"; failed=$((failed + 1)); }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/meshrun-soak.XXXXXX")
lp=
cleanup() {
  [ -n "$lp" ] && kill -KILL -- "-$lp" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
keys=(per_device_batch_size=2 dcn_data_parallelism=3 steps=$steps openblas_threads=1
  heartbeat_interval_s=0.25 heartbeat_timeout_s=3 certs_dir=$tmp/certs)
"$root/deploy/gen-certs.sh" "$tmp/certs" 3 >/dev/null 2>&1 || { fail "gen-certs"; echo "$passed passed, $failed failed"; exit 1; }

# launch NAME ARGS...: `meshrun local` in a process group of its own (lp)
launch() {
  local name=$1
  shift
  setsid "$meshrun" local --hosts 3 --config "$root/configs/llama-tiny.yml" "${keys[@]}" \
    coordinator_address=127.0.0.1:$(port) --metrics "$tmp/$name.jsonl" "$@" \
    >"$tmp/$name.out" 2>"$tmp/$name.err" &
  lp=$!
}

# the agent of host H: the launcher's child with --host-id H
agent_pid() {
  local c
  for c in $(cat /proc/$lp/task/*/children 2>/dev/null); do
    if tr '\0' ' ' <"/proc/$c/cmdline" 2>/dev/null | grep -q -- "--host-id $1 "; then
      echo "$c"
      return
    fi
  done
}

# the highest step in a metrics file
last_step() { grep -o '"step":[0-9]*' "$1" 2>/dev/null | tail -n 1 | cut -d: -f2; }

# step -> loss_hex, one line each: "STEP HEX"
step_losses() { sed -n 's/.*"step":\([0-9]*\),.*"loss_hex":"\([^"]*\)".*/\1 \2/p' "$1"; }

t0=$SECONDS
launch clean
wait $lp
rc=$?
lp=
if [ $rc -ne 0 ] || [ "$(step_losses "$tmp/clean.jsonl" | wc -l)" -ne "$steps" ]; then
  fail "the clean run (exit $rc)"
  tail -n 5 "$tmp/clean.err"
  echo "$passed passed, $failed failed"
  exit 1
fi
clean_s=$((SECONDS - t0))

# the faults, from the seed: kinds in turn, links and frames at random
# over the data frames a stretch between kills sends (about 35 per step
# and ring link; the agents a restart starts count from 1 again)
RANDOM=$seed
kinds=(close drop corrupt delay halfopen)
links=(0-1 1-2 2-0)
frames=$((steps * 35 / (kills + 1)))
faults=()
for ((i = 0; i < nfaults; i++)); do
  k=${kinds[$((i % 5))]}
  l=${links[$((RANDOM % 3))]}
  f=$(( (RANDOM * 32768 + RANDOM) % frames + 1 ))
  case $k in
    delay) faults+=(--fault "delay:link=$l:ms=0.$((RANDOM % 5 + 1)):from=$f") ;;
    halfopen) d=(out both); faults+=(--fault "halfopen:link=$l:frame=$f:dir=${d[$((RANDOM % 2))]}") ;;
    *) faults+=(--fault "$k:link=$l:frame=$f") ;;
  esac
done
kill_at=()
for ((i = 0; i < kills; i++)); do
  kill_at+=($(( steps * (i + 1) / (kills + 1) + RANDOM % (steps / (4 * (kills + 1)) + 1) )))
done
specs=()
for ((i = 1; i < ${#faults[@]}; i += 2)); do specs+=("${faults[$i]}"); done
echo "soak: seed $seed, $steps steps, faults: ${specs[*]}"
echo "soak: SIGKILL a random agent at steps ${kill_at[*]}"

t0=$SECONDS
launch chaos "${faults[@]}" --max-restarts $((kills + 2)) --checkpoint-dir "$tmp/ck" \
  checkpoint_period=$((steps / 25 > 1 ? steps / 25 : 2))
killed=0
for s in "${kill_at[@]}"; do
  while kill -0 $lp 2>/dev/null && [ -z "$(last_step "$tmp/chaos.jsonl")" ]; do sleep 0.2; done
  while kill -0 $lp 2>/dev/null && [ "$(last_step "$tmp/chaos.jsonl")" -lt "$s" ]; do sleep 0.2; done
  h=$((RANDOM % 3))
  a=$(agent_pid $h)
  if [ -n "$a" ]; then
    kill -KILL "$a" && killed=$((killed + 1))
    echo "soak: killed host $h (pid $a) at step $(last_step "$tmp/chaos.jsonl")"
    # the next kill after the restart has trained a step
    n=$(grep -c . "$tmp/chaos.jsonl")
    while kill -0 $lp 2>/dev/null && [ "$(grep -c . "$tmp/chaos.jsonl")" -le "$n" ]; do sleep 0.2; done
  fi
done
wait $lp
rc=$?
lp=
chaos_s=$((SECONDS - t0))

step_losses "$tmp/clean.jsonl" | sort -n -u >"$tmp/clean.l"
step_losses "$tmp/chaos.jsonl" | sort -n -u >"$tmp/chaos.l"
fired=$(grep -c "fault: injected" "$tmp/chaos.err")
resumed=$(grep -c "resumed after" "$tmp/chaos.err")
restarts=$(grep -c "; restart [0-9]* of" "$tmp/chaos.err")
what="chaos: $steps steps, $fired faults fired, $resumed link resumes, $killed kills, $restarts restarts (clean ${clean_s} s, chaos ${chaos_s} s)"
# every (step, loss) line of the chaos run is the clean run's, and no step
# is missing: the sorted unique lines are the same
if [ $rc -eq 0 ] && cmp -s "$tmp/clean.l" "$tmp/chaos.l" && [ "$restarts" -ge "$killed" ] &&
  [ "$fired" -ge 1 ]; then
  ok "$what: losses bit-identical"
else
  fail "$what: exit $rc"
  diff "$tmp/clean.l" "$tmp/chaos.l" | head -n 5
  grep -v "fault: injected\|broke:\|resumed after" "$tmp/chaos.err" | tail -n 10
fi
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
