#!/usr/bin/env bash
# The longest queue of unsent bytes on host 0's sockets (ss -tin, every 0.1 s)
# while 3 hosts on 8 Mbit/s links (deploy/netns.sh, tbf) run a 16 MiB
# pingpong ring, for each tcp_notsent_lowat_bytes given: what a control
# frame may queue behind. Root and network namespaces; run under
# flock /tmp/meshrun-netns.lock like the namespace suites.
# usage: flock /tmp/meshrun-netns.lock bench/notsent_netns.sh [BYTES ...]
set -u
root=$(cd "$(dirname "$0")/.." && pwd); netns=$root/deploy/netns.sh; meshrun=${MESHRUN:-$root/build/meshrun}
prefix=mrnl subnet=10.231.97
tmp=$(mktemp -d "${TMPDIR:-/tmp}/notsent_netns.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; "$netns" down --prefix $prefix >/dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
"$root/deploy/gen-certs.sh" "$tmp/certs" 3 >/dev/null 2>&1 || exit 1
"$netns" down --prefix $prefix >/dev/null 2>&1
"$netns" up 3 --rate 8mbit --prefix $prefix --subnet $subnet >"$tmp/hosts" 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
for a in 10 11 12; do ip -4 route get $subnet.$a | grep -q " dev $prefix-br " || { echo "bad route"; exit 1; }; done
cat >"$tmp/cfg.yml" <<YML
coordinator_address: $subnet.10:7400
hosts: [$subnet.10:7401, $subnet.11:7401, $subnet.12:7401]
certs_dir: $tmp/certs
heartbeat_interval_s: 0.25
heartbeat_timeout_s: 3
YML
for lw in ${@:-0 262144}; do
  pids=()
  for h in 0 1 2; do
    ip netns exec $prefix-h$h timeout 150 "$meshrun" agent --config "$tmp/cfg.yml" --host-id $h \
      --job pingpong --size 16M --rounds 1 tcp_notsent_lowat_bytes=$lw >"$tmp/$lw.$h.log" 2>&1 &
    pids+=($!)
  done
  max=0; samples=0
  while kill -0 "${pids[0]}" 2>/dev/null; do
    v=$(ip netns exec $prefix-h0 ss -tin state established 2>/dev/null | grep -o 'notsent:[0-9]*' | cut -d: -f2 | sort -n | tail -1)
    v=${v:-0}; [ "$v" -gt "$max" ] && max=$v; samples=$((samples+1))
    sleep 0.1
  done
  for p in "${pids[@]}"; do wait "$p"; done
  pids=()
  ok=$(grep -c "rounds of 16777216 bytes: ok" "$tmp/$lw.0.log")
  echo "tcp_notsent_lowat_bytes=$lw: most unsent on host 0: $max bytes ($samples samples, 0.1 s apart), ring checked: $ok, that is $(( max / 1000 )) ms at 8 Mbit/s"
done
