#!/usr/bin/env bash
# deploy/netns.sh for real: up 3 hosts, ping between them and from the root
# namespace, the route check, refusals (up twice, a bad rate, a subnet whose
# route does not reach the bridge), tbf shaping, a 2-host meshrun pingpong
# inside two namespaces (when MESHRUN names a binary), down, and nothing
# left behind. Needs root and working network namespaces:
#   tests/check_netns.sh --probe   exit 0 if it can run here, else says why
# Closes with "N passed, M failed"; exits non-zero on a failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
netns=$here/../deploy/netns.sh
prefix=mrt subnet=10.231.77
# a second network for the refusal and shaping cases
prefix2=mrs subnet2=10.231.78
rule_table=231

probe() {
  local why=""
  if [ "$(id -u)" != 0 ]; then
    why="not root"
  elif ! command -v ip >/dev/null || ! command -v ping >/dev/null || ! command -v tc >/dev/null; then
    why="ip, tc or ping missing"
  elif ! ip netns add mrt-probe 2>/dev/null; then
    why="ip netns add fails"
  else
    ip netns del mrt-probe
    if ! ip link add mrt-probe-br type bridge 2>/dev/null; then
      why="cannot create a bridge"
    else
      ip link del mrt-probe-br
    fi
  fi
  if [ -n "$why" ]; then
    echo "check_netns: skipped: network namespaces do not work here ($why)"
    return 1
  fi
  return 0
}

if [ "${1:-}" = --probe ]; then
  probe >/dev/null || { probe; exit 1; }
  exit 0
fi
probe || { echo "0 passed, 0 failed"; exit 0; }

passed=0 failed=0
ok() {
  echo "ok: $1"
  passed=$((passed + 1))
}
fail() {
  echo "FAILED: $1"
  failed=$((failed + 1))
}
check() { # check NAME CMD... (the command's output is dropped)
  local name=$1
  shift
  if "$@" >/dev/null 2>&1; then ok "$name"; else fail "$name"; fi
}

work=$(mktemp -d "${TMPDIR:-/tmp}/meshrun-netns.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  "$netns" down --prefix $prefix >/dev/null 2>&1
  "$netns" down --prefix $prefix2 >/dev/null 2>&1
  ip rule del to $subnet2.11/32 table $rule_table 2>/dev/null
  ip route flush table $rule_table 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# a run that died before its cleanup left its network: ours to remove
"$netns" down --prefix $prefix >/dev/null 2>&1
"$netns" down --prefix $prefix2 >/dev/null 2>&1

# ---- up ----
if "$netns" up 3 --prefix $prefix --subnet $subnet >"$work/up.out" 2>"$work/up.err"; then
  ok "up 3"
else
  fail "up 3: $(cat "$work/up.err")"
fi
expect=$(printf 'host0 %s-h0 %s.10\nhost1 %s-h1 %s.11\nhost2 %s-h2 %s.12\n' \
  $prefix $subnet $prefix $subnet $prefix $subnet)
check "up prints host<i> <namespace> <addr>" [ "$(cat "$work/up.out")" = "$expect" ]
check "list prints the same" [ "$("$netns" list --prefix $prefix 2>/dev/null)" = "$expect" ]

if "$netns" up 3 --prefix $prefix --subnet $subnet >/dev/null 2>"$work/again.err"; then
  fail "up twice is refused"
else
  check "up twice is refused, saying so" grep -q "already up" "$work/again.err"
fi

# ---- reachability ----
pings=0
for pair in "0 11" "1 12" "2 10"; do
  set -- $pair
  ip netns exec $prefix-h$1 ping -c1 -W2 $subnet.$2 >/dev/null 2>&1 && pings=$((pings + 1))
done
check "hosts ping each other (h0->h1, h1->h2, h2->h0)" [ $pings = 3 ]
pings=0
for a in 10 11 12; do ping -c1 -W2 $subnet.$a >/dev/null 2>&1 && pings=$((pings + 1)); done
check "the root namespace pings every host" [ $pings = 3 ]
check "a host pings the root namespace's address" \
  ip netns exec $prefix-h1 ping -c1 -W2 $subnet.1

# ---- routes ----
routes=0
for a in 10 11 12; do
  ip -4 route get $subnet.$a | grep -q " dev $prefix-br " && routes=$((routes + 1))
done
check "every host address routes via the bridge" [ $routes = 3 ]
check "hosts have no default route" [ -z "$(ip -n $prefix-h0 route show default)" ]
check "a host cannot reach beyond the subnet" \
  bash -c "! ip netns exec $prefix-h0 ip -4 route get 198.51.100.1"

# ---- refusals ----
if "$netns" up 2 --prefix $prefix2 --subnet $subnet --rate 10mbit >/dev/null 2>"$work/overlap.err"; then
  fail "a subnet in use is refused"
else
  check "a subnet in use is refused, saying so" grep -q "already in use" "$work/overlap.err"
fi
if "$netns" up 2 --prefix $prefix2 --subnet $subnet2 --rate fast >/dev/null 2>"$work/rate.err"; then
  fail "a bad rate is refused"
else
  check "a bad rate is refused before anything is made" \
    bash -c "grep -q 'not a tc rate' '$work/rate.err' && ! ip link show $prefix2-br >/dev/null 2>&1"
fi
# the safety check: a policy rule sends one host address elsewhere
# (unreachable), which the pre-checks of the main table cannot see
ip route add unreachable $subnet2.11/32 table $rule_table
ip rule add to $subnet2.11/32 table $rule_table pref 100
if "$netns" up 2 --prefix $prefix2 --subnet $subnet2 >/dev/null 2>"$work/route.err"; then
  fail "up fails when a host address does not route via the bridge"
else
  check "up fails when a host address does not route via the bridge, and says which" \
    grep -q "$subnet2.11" "$work/route.err"
  check "... and leaves nothing behind" \
    bash -c "! ip link show $prefix2-br >/dev/null 2>&1 && ! ip netns list | grep -q '^$prefix2-' && [ ! -e /run/meshrun-netns/$prefix2.state ]"
fi
ip rule del to $subnet2.11/32 table $rule_table
ip route flush table $rule_table

# ---- shaping ----
if "$netns" up 2 --prefix $prefix2 --subnet $subnet2 --rate 20mbit >/dev/null 2>"$work/rate2.err"; then
  check "--rate puts a tbf on both ends of each host's veth" bash -c "
    tc qdisc show dev $prefix2-v0 | grep -q 'tbf.*rate 20Mbit' &&
    ip netns exec $prefix2-h1 tc qdisc show dev eth0 | grep -q 'tbf.*rate 20Mbit'"
  check "shaped hosts still ping" ip netns exec $prefix2-h0 ping -c1 -W2 $subnet2.11
  "$netns" down --prefix $prefix2 >/dev/null 2>&1
else
  fail "up --rate 20mbit: $(cat "$work/rate2.err")"
fi

# ---- meshrun between two namespaces ----
if [ -n "${MESHRUN:-}" ] && [ -x "$MESHRUN" ]; then
  "$here/../deploy/gen-certs.sh" "$work/certs" 2 >/dev/null 2>&1
  cat >"$work/mesh.yml" <<EOF
base_config: $here/../configs/base.yml
coordinator_address: "$subnet.10:7300"
hosts: ["$subnet.10:7301", "$subnet.11:7301"]
certs_dir: "$work/certs"
connect_timeout_s: 20
EOF
  for h in 0 1; do
    ip netns exec $prefix-h$h "$MESHRUN" agent --config "$work/mesh.yml" --host-id $h --hosts 2 \
      --devices-per-host 1 --job pingpong --rounds 20 --size 256K >"$work/agent$h.log" 2>&1 &
    pids+=($!)
  done
  rcs=""
  for p in "${pids[@]}"; do
    for ((t = 0; t < 600 && $(kill -0 "$p" 2>/dev/null && echo 1 || echo 0); t++)); do
      sleep 0.1
    done
    kill "$p" 2>/dev/null   # still running after 60 s: a failure
    wait "$p"
    rcs+="$? "
  done
  pids=()
  if [ "$rcs" = "0 0 " ] && grep -q "pingpong: 2 hosts.*ok" "$work/agent0.log" "$work/agent1.log"; then
    ok "meshrun agent pingpong between $prefix-h0 and $prefix-h1 over TLS"
  else
    fail "meshrun agent pingpong (exits: $rcs)"
    tail -n 5 "$work/agent0.log" "$work/agent1.log"
  fi
else
  echo "skip: meshrun pingpong (MESHRUN not set)"
fi

# ---- down ----
check "down" "$netns" down --prefix $prefix
check "down removes the namespaces, veths, bridge and state" bash -c "
  ! ip netns list | grep -q '^$prefix-' && ! ip link show $prefix-br >/dev/null 2>&1 &&
  ! ip -br link | grep -q '^$prefix-v' && [ ! -e /run/meshrun-netns/$prefix.state ]"
check "no route into the subnet is left" [ -z "$(ip -4 route show root $subnet.0/24)" ]
if "$netns" down --prefix $prefix >/dev/null 2>"$work/down2.err"; then
  fail "down twice is refused"
else
  check "down twice is refused, saying so" grep -q "no network" "$work/down2.err"
fi

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
