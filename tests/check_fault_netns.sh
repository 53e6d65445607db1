#!/usr/bin/env bash
# Liveness on slow links, for real: deploy/netns.sh brings up 3 hosts on a
# bridge with a tbf of 8 Mbit/s each way per host, and one meshrun agent
# per namespace runs the pingpong ring with 16 MiB messages (16 s of
# sending per round at that rate) under heartbeat_timeout_s=3 (a round takes 16 s; the machine may be loaded, so not 1): a heartbeat
# must never wait behind data long enough to look like a dead peer, and a
# receiver counts every byte as a sign of life. Then the same with an
# injected black hole (host 0 stops reading and writing its link to host 1
# for 0.5 s, under the timeout): the job still completes, and the fault is
# logged. Needs root and working network namespaces (tests/check_netns.sh
# --probe); otherwise it prints "0 passed, 0 failed" and exits 0.
# Closes with "N passed, M failed"; exits non-zero on a failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$here/..
netns=$root/deploy/netns.sh
meshrun=${MESHRUN:-$root/build/meshrun}
prefix=mrfl subnet=10.231.93

if ! "$here/check_netns.sh" --probe >/dev/null 2>&1; then
  echo "check_fault_netns: skipped: network namespaces do not work here"
  echo "0 passed, 0 failed"
  exit 0
fi

passed=0 failed=0
ok() { echo "ok: $1"; passed=$((passed + 1)); }
fail() { echo "FAILED: $1"; failed=$((failed + 1)); }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/check_fault_netns.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  "$netns" down --prefix $prefix >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$root/deploy/gen-certs.sh" "$tmp/certs" 3 >/dev/null 2>&1 || { fail "gen-certs"; echo "$passed passed, $failed failed"; exit 1; }
# a network this script left behind when it was killed (netns.sh removes
# only what its state file records)
"$netns" down --prefix $prefix >/dev/null 2>&1
if ! "$netns" up 3 --rate 8mbit --prefix $prefix --subnet $subnet >"$tmp/hosts" 2>"$tmp/netns.err"; then
  cat "$tmp/netns.err"
  fail "netns up"
  echo "$passed passed, $failed failed"
  exit 1
fi
# the same safety check as netns.sh: every host address is reached through
# the new bridge from here, so no traffic can leave this machine
for a in 10 11 12; do
  if ! ip -4 route get $subnet.$a | grep -q " dev $prefix-br "; then
    fail "route to $subnet.$a is not through $prefix-br"
    echo "$passed passed, $failed failed"
    exit 1
  fi
done
cat >"$tmp/cfg.yml" <<YML
coordinator_address: $subnet.10:7400
hosts: [$subnet.10:7401, $subnet.11:7401, $subnet.12:7401]
certs_dir: $tmp/certs
heartbeat_interval_s: 0.25
heartbeat_timeout_s: 3
YML

# run NAME [agent flags...]: the 3 agents, 16 MiB pingpong, one round;
# every agent must exit 0 and host 0 must report the ring checked
run() {
  local name=$1 h rc bad=0
  shift
  pids=()
  for h in 0 1 2; do
    ip netns exec $prefix-h$h timeout 150 "$meshrun" agent --config "$tmp/cfg.yml" --host-id $h \
      --job pingpong --size 16M --rounds 1 "$@" >"$tmp/$name.$h.log" 2>&1 &
    pids+=($!)
  done
  for h in 0 1 2; do
    wait "${pids[$h]}"
    rc=$?
    if [ $rc -ne 0 ]; then
      echo "host $h exited with $rc:"
      sed 's/^/  /' "$tmp/$name.$h.log"
      bad=1
    fi
  done
  pids=()
  grep -q "rounds of 16777216 bytes: ok" "$tmp/$name.0.log" || bad=1
  return $bad
}

if run plain; then ok "16 MiB ring at 8 Mbit/s, heartbeat_timeout_s=3"; else fail "16 MiB ring at 8 Mbit/s, heartbeat_timeout_s=3"; fi
if run hole --fault blackhole:link=0-1:frame=3:s=0.5 &&
  grep -q "fault: injected blackhole on link 0-1 at frame 3" "$tmp/hole.0.log"; then
  ok "black hole of 0.5 s on link 0-1 at 8 Mbit/s: completes, logged"
else
  fail "black hole of 0.5 s on link 0-1 at 8 Mbit/s: completes, logged"
fi
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
