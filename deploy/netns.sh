#!/usr/bin/env bash
# netns.sh — a private test network of N hosts on this machine, each host a
# network namespace on one bridge, for running meshrun agents on real
# (virtual) interfaces with their own addresses and, with --rate, a shaped
# link each.
#
#   deploy/netns.sh up N [--rate RATE] [--prefix NAME] [--subnet A.B.C]
#   deploy/netns.sh down [--prefix NAME]
#   deploy/netns.sh list [--prefix NAME]
#
# up: bridge NAME-br holding A.B.C.1/24 in this (root) namespace; namespaces
# NAME-h0..NAME-h<N-1>, host i at A.B.C.(10+i)/24 on its eth0, a veth whose
# other end NAME-v<i> is a port of the bridge. The hosts get no default
# route: they reach the subnet and nothing else. --rate RATE (tc units:
# 100mbit, 1gbit, ...) puts a tbf on both ends of every host's veth, so
# each host sends and receives at most RATE. Defaults: --prefix mr,
# --subnet 10.231.0. Prints one line per host: `host<i> <namespace> <addr>`
# (and the rest on stderr). Before that it checks, for every host address,
# that `ip route get` in this namespace leaves through the new bridge; if
# any does not, it takes everything down again and fails.
# down: removes exactly what up recorded in /run/meshrun-netns/NAME.state
# (namespaces, their veths, the bridge) and nothing else.
# list: prints the host lines of a network that is up.
# Run as root. Run an agent in host i with: ip netns exec NAME-h<i> CMD.
set -euo pipefail

state_dir=/run/meshrun-netns
prog=${0##*/}

die() {
  echo "$prog: $*" >&2
  exit 1
}

usage() {
  echo "usage: $prog up N [--rate RATE] [--prefix NAME] [--subnet A.B.C]" >&2
  echo "       $prog down [--prefix NAME]" >&2
  echo "       $prog list [--prefix NAME]" >&2
  exit 2
}

[ $# -ge 1 ] || usage
cmd=$1
shift
n="" rate="" prefix=mr subnet=10.231.0
if [ "$cmd" = up ]; then
  [ $# -ge 1 ] || usage
  n=$1
  shift
fi
while [ $# -gt 0 ]; do
  case $1 in
    --rate) [ $# -ge 2 ] || usage; rate=$2; shift 2 ;;
    --prefix) [ $# -ge 2 ] || usage; prefix=$2; shift 2 ;;
    --subnet) [ $# -ge 2 ] || usage; subnet=$2; shift 2 ;;
    *) usage ;;
  esac
done
[[ "$prefix" =~ ^[a-z][a-z0-9]{0,7}$ ]] ||
  die "prefix '$prefix' must be 1-8 lower-case letters and digits, starting with a letter"
state=$state_dir/$prefix.state
bridge=$prefix-br

# ---- down ----

# Removes what the state file lists, newest first, then the file.
teardown() {
  local kind name
  [ -f "$state" ] || return 0
  tac "$state" | while read -r kind name; do
    case $kind in
      ns) ip netns del "$name" 2>/dev/null || true ;;          # takes its veth end along
      veth | bridge) ip link del "$name" 2>/dev/null || true ;;
    esac
  done
  rm -f "$state"
}

record() {
  echo "$1 $2" >>"$state"
}

host_lines() {
  local kind name addr i=0
  while read -r kind name addr; do
    if [ "$kind" = host ]; then
      echo "host$i $name $addr"
      i=$((i + 1))
    fi
  done <"$state"
}

mkdir -p "$state_dir"
exec 9>"$state_dir/lock"
flock 9

case $cmd in
  down)
    [ -f "$state" ] || die "no network '$prefix' is up (no $state)"
    teardown
    echo "$prog: network '$prefix' is down" >&2
    exit 0
    ;;
  list)
    [ -f "$state" ] || die "no network '$prefix' is up (no $state)"
    host_lines
    exit 0
    ;;
  up) ;;
  *) usage ;;
esac

# ---- up ----

[[ "$n" =~ ^[1-9][0-9]*$ ]] && [ "$n" -le 200 ] || die "N must be 1..200, got '$n'"
[[ "$subnet" =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] &&
  [ "${BASH_REMATCH[1]}" -le 255 ] && [ "${BASH_REMATCH[2]}" -le 255 ] &&
  [ "${BASH_REMATCH[3]}" -le 255 ] || die "subnet must be A.B.C (a /24), got '$subnet'"
[ "$(id -u)" = 0 ] || die "run as root (network namespaces and bridges need CAP_NET_ADMIN)"
[ -f "$state" ] && die "network '$prefix' is already up ($state): run '$prog down --prefix $prefix' first"
ip link show "$bridge" >/dev/null 2>&1 && die "interface '$bridge' exists but is not ours: choose another --prefix"
have_ns=$(ip netns list | awk '{print $1}')
for ((i = 0; i < n; i++)); do
  grep -qx -- "$prefix-h$i" <<<"$have_ns" && die "namespace '$prefix-h$i' exists but is not ours: choose another --prefix"
  ip link show "$prefix-v$i" >/dev/null 2>&1 && die "interface '$prefix-v$i' exists but is not ours: choose another --prefix"
done
# the /24 must be unused here: no address in it, no route to it or inside it
if [ -n "$(ip -4 addr show to "$subnet.0/24")" ] || [ -n "$(ip -4 route show root "$subnet.0/24")" ]; then
  die "subnet $subnet.0/24 is already in use on this machine: choose another --subnet"
fi

# tbf's burst: 10 ms at RATE, at least 64 KiB (a GSO packet on a veth)
burst_for() {
  local bits
  bits=$(awk -v r="$1" 'BEGIN {
    if (!match(r, /^[0-9]+(\.[0-9]+)?/)) exit 1
    v = substr(r, 1, RLENGTH); u = tolower(substr(r, RLENGTH + 1))
    m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
    m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9
    m["kibit"] = 1024; m["mibit"] = 1048576; m["gibit"] = 1073741824
    if (!(u in m)) exit 1
    printf "%.0f\n", v * m[u] }') || return 1
  [ "$bits" -gt 0 ] || return 1
  local b=$((bits / 8 / 100))
  [ $b -lt 65536 ] && b=65536
  echo $b
}
burst=""
if [ -n "$rate" ]; then
  burst=$(burst_for "$rate") || die "rate '$rate' is not a tc rate like 100mbit or 1gbit"
fi

: >"$state"
trap 'rc=$?; if [ $rc -ne 0 ]; then echo "$prog: up failed; taking down what was made" >&2; teardown; fi' EXIT

echo "subnet $subnet.0/24" >>"$state"
ip link add "$bridge" type bridge
record bridge "$bridge"
ip addr add "$subnet.1/24" dev "$bridge"
ip link set "$bridge" up
for ((i = 0; i < n; i++)); do
  ns=$prefix-h$i veth=$prefix-v$i addr=$subnet.$((10 + i))
  ip netns add "$ns"
  record ns "$ns"
  ip link add "$veth" type veth peer name "$prefix-p$i"
  record veth "$veth"
  ip link set "$prefix-p$i" netns "$ns"
  ip -n "$ns" link set "$prefix-p$i" name eth0
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  ip link set "$veth" master "$bridge"
  ip link set "$veth" up
  if [ -n "$rate" ]; then
    # host -> bridge on eth0, bridge -> host on the bridge's port
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms
    tc qdisc add dev "$veth" root tbf rate "$rate" burst "$burst" latency 50ms
  fi
  record host "$ns $addr"
done

# Safety: every host address must route through the new bridge from here
# (not through some existing interface that owns an overlapping range).
while read -r kind name addr; do
  [ "$kind" = host ] || continue
  route=$(ip -4 route get "$addr" 2>&1) || die "no route to $addr ($route)"
  dev=$(sed -n 's/.* dev \([^ ]*\).*/\1/p' <<<"$route" | head -1)
  [ "$dev" = "$bridge" ] || die "$addr routes via '${dev:-?}', not the new bridge $bridge: $route"
done <"$state"

trap - EXIT
echo "$prog: network '$prefix' is up: bridge $bridge $subnet.1/24 in the root namespace${rate:+, tbf $rate each way per host}" >&2
host_lines
