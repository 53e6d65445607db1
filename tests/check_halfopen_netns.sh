#!/usr/bin/env bash
# Half-open links for real: deploy/netns.sh brings up 2 hosts on a bridge,
# one meshrun agent per namespace trains llama-tiny on 2 hosts x 2 devices
# (FSDP across the hosts, then a pipeline of 2 stages), and once training
# runs an nftables rule inside a namespace drops every packet of the one
# established link connection, found by its port pair: host 0 -> host 1
# only, then both ways. No RST, no error: only silence. The host that
# hears nothing for link_silence_s drops the connection, host 0 redials
# (a new port pair: it passes), the link resumes with replay, and the
# per-step losses are bit-identical to an undisturbed run. Then host 1 is
# SIGSTOPped (its kernel still accepts connections, nothing answers the
# TLS handshake): host 0 fails cleanly, naming host 1, within
# heartbeat_timeout_s + 2 s. Needs root, nft and working network
# namespaces (tests/check_netns.sh --probe); otherwise it prints
# "0 passed, 0 failed" and exits 0. Run it under
# `flock /tmp/meshrun-netns.lock` (fixed namespace names).
# Closes with "N passed, M failed"; exits non-zero on a failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$here/..
netns=$root/deploy/netns.sh
meshrun=${MESHRUN:-$root/build/meshrun}
prefix=mrho subnet=10.231.97
hb_timeout=4

if ! "$here/check_netns.sh" --probe >/dev/null 2>&1 || ! command -v nft >/dev/null; then
  echo "check_halfopen_netns: skipped: network namespaces or nft do not work here"
  echo "0 passed, 0 failed"
  exit 0
fi

passed=0 failed=0
ok() { echo "ok: $1"; passed=$((passed + 1)); }
fail() { echo "FAILED: $1"; failed=$((failed + 1)); }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/check_halfopen_netns.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  # the rules live in the namespaces, which go with them
  "$netns" down --prefix $prefix >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$root/deploy/gen-certs.sh" "$tmp/certs" 2 >/dev/null 2>&1 || { fail "gen-certs"; echo "$passed passed, $failed failed"; exit 1; }
"$netns" down --prefix $prefix >/dev/null 2>&1
if ! "$netns" up 2 --prefix $prefix --subnet $subnet >"$tmp/hosts" 2>"$tmp/netns.err"; then
  cat "$tmp/netns.err"
  fail "netns up"
  echo "$passed passed, $failed failed"
  exit 1
fi
for a in 10 11; do
  if ! ip -4 route get $subnet.$a | grep -q " dev $prefix-br "; then
    fail "route to $subnet.$a is not through $prefix-br"
    echo "$passed passed, $failed failed"
    exit 1
  fi
done

common=(coordinator_address=$subnet.10:7400 hosts=$subnet.10:7401,$subnet.11:7401
  certs_dir=$tmp/certs heartbeat_interval_s=0.25 heartbeat_timeout_s=$hb_timeout
  openblas_threads=1 per_device_batch_size=2)
fsdp=(dcn_fsdp_parallelism=2 ici_data_parallelism=2 steps=30)
pipe=(dcn_pipeline_parallelism=2 ici_data_parallelism=2 num_pipeline_microbatches=4
  base_num_decoder_layers=4 steps=30)

# start NAME KEYS...: the 2 agents in the background (pids), metrics of
# host 0 in $tmp/NAME.jsonl, logs in $tmp/NAME.H.log
start() {
  local name=$1 h
  shift
  pids=()
  for h in 0 1; do
    local m=()
    [ $h -eq 0 ] && m=(--metrics "$tmp/$name.jsonl")
    ip netns exec $prefix-h$h "$meshrun" agent --config "$root/configs/llama-tiny.yml" \
      --host-id $h --hosts 2 --devices-per-host 2 "${m[@]}" "${common[@]}" "$@" \
      >"$tmp/$name.$h.log" 2>&1 &
    pids+=($!)
  done
}

# finish SECONDS: waits for both agents (killed after SECONDS); the exit
# codes in rcs
finish() {
  local end=$((SECONDS + $1)) h
  rcs=()
  for h in 0 1; do
    while kill -0 "${pids[$h]}" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.2; done
    kill -KILL "${pids[$h]}" 2>/dev/null
    wait "${pids[$h]}"
    rcs+=($?)
  done
  pids=()
}

losses() { grep -o '"loss_hex":"[^"]*"' "$1"; }

# wait_step FILE N: true once host 0's metrics have step N (60 s at most)
wait_step() {
  local end=$((SECONDS + 60))
  while [ $SECONDS -lt $end ]; do
    grep -q "\"step\":$2," "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# cut WAY: drops every packet of host 0's established link connection to
# host 1's listener (7401), found by its port pair, inside host 1's
# namespace: host 0 -> 1 ("out"), and 1 -> 0 too ("both"). New
# connections (another source port) pass.
cut() {
  local port
  port=$(ip netns exec $prefix-h0 ss -tnH state established "( dst $subnet.11:7401 )" |
    awk '{ n = split($3, a, ":"); print a[n]; exit }')
  [ -n "$port" ] || return 1
  echo "$port" >"$tmp/port"
  ip netns exec $prefix-h1 nft -f - <<NFT || return 1
table inet mrho {
  chain in { type filter hook input priority 0; ip saddr $subnet.10 tcp sport $port tcp dport 7401 drop; }
  chain out { type filter hook output priority 0; }
}
NFT
  if [ "$1" = both ]; then
    ip netns exec $prefix-h1 nft add rule inet mrho out ip daddr $subnet.10 tcp dport "$port" tcp sport 7401 drop || return 1
  fi
}
uncut() { ip netns exec $prefix-h1 nft delete table inet mrho 2>/dev/null; }

# halfopen MESH WAY: an undisturbed run, then one cut WAY at step 3
halfopen() {
  local mesh=$1 way=$2 what="half-open ($2) under $1: reconnects, losses bit-identical"
  local -n keys=$mesh
  start "$mesh.plain" "${keys[@]}"
  finish 200
  if [ "${rcs[*]}" != "0 0" ] || [ -z "$(losses "$tmp/$mesh.plain.jsonl")" ]; then
    fail "$what: the undisturbed run failed (${rcs[*]})"
    tail -n 5 "$tmp/$mesh.plain.0.log" "$tmp/$mesh.plain.1.log"
    return
  fi
  start "$mesh.$way" "${keys[@]}"
  local cutok=1
  wait_step "$tmp/$mesh.$way.jsonl" 3 && cut "$way" || cutok=0
  finish 200
  uncut
  if [ $cutok -eq 1 ] && [ "${rcs[*]}" = "0 0" ] &&
    [ "$(losses "$tmp/$mesh.plain.jsonl")" = "$(losses "$tmp/$mesh.$way.jsonl")" ] &&
    grep -q "taken for half-open" "$tmp/$mesh.$way.0.log" "$tmp/$mesh.$way.1.log" &&
    grep -q "resumed after" "$tmp/$mesh.$way.0.log"; then
    ok "$what (port $(cat "$tmp/port"))"
  else
    fail "$what (cut: $cutok, exits: ${rcs[*]})"
    tail -n 8 "$tmp/$mesh.$way.0.log" "$tmp/$mesh.$way.1.log"
  fi
}

halfopen fsdp out
halfopen fsdp both
halfopen pipe out
halfopen pipe both

# A stopped peer: its kernel accepts, nothing answers. Host 0 must fail
# with exit 5 (peer lost) naming host 1 within heartbeat_timeout_s + 2 s.
what="SIGSTOPped host 1: host 0 fails naming it within heartbeat_timeout_s + 2 s"
fsdp_long=("${fsdp[@]}" steps=400)
start stop "${fsdp_long[@]}"
if wait_step "$tmp/stop.jsonl" 3; then
  kill -STOP "${pids[1]}"
  t0=$SECONDS
  while kill -0 "${pids[0]}" 2>/dev/null && [ $((SECONDS - t0)) -lt 30 ]; do sleep 0.1; done
  dt=$((SECONDS - t0))
  kill -KILL "${pids[0]}" 2>/dev/null
  wait "${pids[0]}"
  rc=$?
  kill -CONT "${pids[1]}" 2>/dev/null
  kill -KILL "${pids[1]}" 2>/dev/null
  wait "${pids[1]}" 2>/dev/null
  pids=()
  if [ $rc -eq 5 ] && [ $dt -le $((hb_timeout + 2)) ] &&
    grep -q "lost host 1 ($subnet.11:7401)" "$tmp/stop.0.log"; then
    ok "$what (exit $rc after ${dt} s)"
  else
    fail "$what (exit $rc after ${dt} s)"
    tail -n 8 "$tmp/stop.0.log"
  fi
else
  finish 5
  fail "$what: training never reached step 3"
  tail -n 5 "$tmp/stop.0.log" "$tmp/stop.1.log"
fi

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
