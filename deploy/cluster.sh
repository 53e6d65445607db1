#!/usr/bin/env bash
# cluster.sh — a test cluster of N machines on this one machine, for testing
# the ssh launcher and the Slurm script against a real sshd and a real Slurm.
# A machine is a network namespace from netns.sh (its own address on one
# bridge, no route anywhere else) plus a holder process that owns the
# machine's own hostname (UTS namespace) and its own disk (mount namespace:
# private tmpfs on /tmp, /var/tmp, /root, /run and /var/log). Every daemon
# of a machine is started inside the holder's namespaces, so what lands on
# machine 1's /tmp is invisible from machine 0 and from this namespace.
#
#   deploy/cluster.sh up N [--ssh] [--slurm] [--dir DIR] [--prefix NAME] [--subnet A.B.C] [--rate RATE]
#   deploy/cluster.sh down [--dir DIR]
#   deploy/cluster.sh run [--dir DIR] -- CMD [ARG...]
#   deploy/cluster.sh exec [--dir DIR] nodeI -- CMD [ARG...]
#   deploy/cluster.sh list [--dir DIR]
#
# up: machines node0..node<N-1> in namespaces NAME-h<i> at A.B.C.(10+i).
#   --ssh: one sshd per machine on <addr>:22 with throwaway keys; from this
#   namespace `ssh -F DIR/ssh/ssh_config node1 CMD` logs in as root.
#   --slurm: munged and slurmctld on node0 (the control machine), one slurmd
#   per machine; clients need SLURM_CONF=DIR/slurm/slurm.conf (`run` sets it).
#   --rate RATE shapes each machine's link both ways (netns.sh --rate).
#   Prints `node<i> <namespace> <addr>` per machine and writes DIR/hostfile
#   (one machine name a line). If anything fails, up takes down everything
#   it made before it exits.
# down: stops exactly the processes up started (by their pid files, checked
#   against name and namespace), then anything still running inside the
#   machines, removes the namespaces (netns.sh down) and DIR.
# run: CMD in this (root) network namespace as a cluster client: SLURM_CONF
#   set, /etc/hosts naming the machines and a loopback-only resolver, so a
#   name lookup never leaves the machine (srun, sbatch, a launcher, ...).
# exec: CMD inside machine nodeI (its network, hostname and disk).
# list: the `node<i> <namespace> <addr>` lines of a cluster that is up.
#
# Defaults: --dir /var/lib/meshrun-cluster/NAME, --prefix mrc, --subnet
# 10.232.0 (the other commands take --prefix too, to find the default DIR).
# MESHRUN_NETNS_SH overrides netns.sh; MESHRUN_CLUSTER_FAIL=machines|ssh
# makes up fail after that step (tests/check-cluster checks the clean-up).
# Safety: every machine address must route through the new bridge
# (checked with `ip route get` before any daemon starts), the machines have
# no default route and an nftables guard that drops any packet leaving them
# for an address outside the subnet, and the client configs name only the
# machines' addresses. Run as root.
set -euo pipefail

prog=${0##*/}
here=$(cd "$(dirname "$0")" && pwd)
netns_sh=${MESHRUN_NETNS_SH:-$here/netns.sh}
ctld_port=16817
slurmd_port=16818
ready_timeout=30

die() {
  echo "$prog: $*" >&2
  exit 1
}

usage() {
  echo "usage: $prog up N [--ssh] [--slurm] [--dir DIR] [--prefix NAME] [--subnet A.B.C] [--rate RATE]" >&2
  echo "       $prog down [--dir DIR]" >&2
  echo "       $prog run [--dir DIR] -- CMD [ARG...]" >&2
  echo "       $prog exec [--dir DIR] nodeI -- CMD [ARG...]" >&2
  echo "       $prog list [--dir DIR]" >&2
  exit 2
}

# ---- processes: identified by pid, checked by name and namespace ----

# alive PID: the process exists and is not a zombie
alive() {
  local st
  [[ "$1" =~ ^[0-9]+$ ]] || return 1
  st=$(sed -n 's/^[0-9]* (.*) \([A-Z]\) .*/\1/p' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

# is_ours PID COMM NETNS: PID is a live COMM inside network namespace NETNS
# (as `readlink /proc/PID/ns/net` prints it), so a recycled pid is never hit
is_ours() {
  alive "$1" &&
    [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ] &&
    [ "$(readlink "/proc/$1/ns/net" 2>/dev/null)" = "$3" ]
}

# stop_pids GRACE PID...: SIGTERM, up to GRACE seconds to exit, then SIGKILL
stop_pids() {
  local grace=$1 p left i
  shift
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  for ((i = 0; i < grace * 10; i++)); do
    left=()
    for p in "$@"; do alive "$p" && left+=("$p"); done
    [ ${#left[@]} -eq 0 ] && return 0
    sleep 0.1
  done
  echo "$prog: pids ${left[*]} ignored SIGTERM for $grace s; sending SIGKILL" >&2
  kill -KILL "${left[@]}" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    for p in "${left[@]}"; do alive "$p" && continue 2; done
    return 0
  done
  echo "$prog: pids ${left[*]} survived SIGKILL" >&2
}

# launch RECORD LOG CMD...: starts CMD in its own session, detached from
# this shell; the pid CMD will have is in RECORD before CMD runs
launch() {
  local rec=$1 log=$2
  shift 2
  # shellcheck disable=SC2016
  (cd / && exec setsid sh -c 'echo $$ >"$0"; exec "$@"' "$rec" "$@" </dev/null >>"$log" 2>&1) &
}

# wait_for SECONDS WHAT CMD...: polls CMD every 0.1 s until it succeeds
wait_for() {
  local secs=$1 what=$2 i
  shift 2
  for ((i = 0; i < secs * 10; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  die "$what not ready after ${secs}s"
}

# ---- state in DIR ----

# DIR/state holds key=value lines; DIR/daemons one line per started
# process, in start order: `<machine> <comm> <launch record> <pid file>`
state_get() {
  sed -n "s/^$1=//p" "$dir/state" 2>/dev/null | tail -1
}

state_set() {
  echo "$1=$2" >>"$dir/state"
}

machine_names() {
  [ -f "$dir/machines" ] && awk '{print $1}' "$dir/machines"
  return 0
}

machine_ns() { awk -v m="$1" '$1 == m {print $2}' "$dir/machines"; }
machine_addr() { awk -v m="$1" '$1 == m {print $3}' "$dir/machines"; }

# namespace of machine M as recorded when its holder started
netns_of() { cat "$dir/$1/netns" 2>/dev/null || true; }
mntns_of() { cat "$dir/$1/mntns" 2>/dev/null || true; }

# ---- down ----

# teardown: everything DIR records, newest first, then DIR itself. Safe on
# a half-built cluster (used by up's trap) and idempotent.
teardown() {
  local m comm rec pidf f p pids ns jobs i
  [ -f "$dir/.meshrun-cluster" ] || return 0
  set +e # best effort: one step failing must not leave the rest standing
  # jobs first, while slurmctld can still end them (a slurmstepd ignores
  # SIGTERM); KillWait=1 gives their steps a second
  if [ "$(state_get slurm)" = 1 ] && [ -f "$dir/slurm/slurm.conf" ] &&
    jobs=$(client timeout 10 squeue -h -o %A 2>/dev/null) && [ -n "$jobs" ]; then
    # shellcheck disable=SC2086
    client timeout 10 scancel $jobs 2>/dev/null
    for ((i = 0; i < 50; i++)); do
      [ -z "$(client timeout 10 squeue -h -o %A 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  # the daemons, newest first: slurmd before slurmctld before munged
  if [ -f "$dir/daemons" ]; then
    while read -r m comm rec pidf; do
      ns=$(netns_of "$m")
      pids=()
      for f in "$pidf" "$rec"; do
        [ "$f" = - ] || [ ! -f "$f" ] && continue
        p=$(head -c 32 "$f" | tr -dc 0-9)
        [ -n "$ns" ] && is_ours "$p" "$comm" "$ns" && pids+=("$p")
      done
      [ ${#pids[@]} -eq 2 ] && [ "${pids[0]}" = "${pids[1]}" ] && pids=("${pids[0]}")
      stop_pids 10 "${pids[@]}"
    done < <(tac "$dir/daemons")
  fi
  # whatever else runs inside a machine (ssh sessions, job steps, the
  # holders): every process whose network or mount namespace is a machine's
  local -A inside=()
  for m in $(machine_names); do
    ns=$(netns_of "$m") && [ -n "$ns" ] && inside[$ns]=$m
    ns=$(mntns_of "$m") && [ -n "$ns" ] && inside[$ns]=$m
  done
  if [ ${#inside[@]} -gt 0 ]; then
    local -A hit=() holder=()
    for m in $(machine_names); do
      [ -f "$dir/$m/holder.launch" ] && holder[$(cat "$dir/$m/holder.launch")]=1
    done
    # one find lists every process's namespaces: "/proc/PID/ns net:[N]"
    while read -r p ns; do
      p=${p#/proc/} p=${p%/ns}
      [ -n "$ns" ] && [ -n "${inside[$ns]:-}" ] && [ -z "${hit[$p]:-}" ] && alive "$p" || continue
      hit[$p]=1
      [ -n "${holder[$p]:-}" ] ||
        echo "$prog: stopping pid $p ($(cat "/proc/$p/comm" 2>/dev/null)) still running in ${inside[$ns]}" >&2
    done < <(find /proc -mindepth 3 -maxdepth 3 \( -path '/proc/[0-9]*/ns/net' -o -path '/proc/[0-9]*/ns/mnt' \) \
      -printf '%h %l\n' 2>/dev/null)
    stop_pids 3 "${!hit[@]}"
  fi
  case $(state_get net) in
    1) "$netns_sh" down --prefix "$(state_get prefix)" || echo "$prog: netns.sh down failed" >&2 ;;
    pending)
      if "$netns_sh" list --prefix "$(state_get prefix)" >/dev/null 2>&1; then
        "$netns_sh" down --prefix "$(state_get prefix)" || echo "$prog: netns.sh down failed" >&2
      fi
      ;;
  esac
  rm -rf -- "$dir"
  [ "${dir%/*}" = /var/lib/meshrun-cluster ] && rmdir /var/lib/meshrun-cluster 2>/dev/null
  return 0
}

# ---- up: the machines ----

# start_machine M NS: the holder of M's hostname and disk, inside NS
start_machine() {
  local m=$1 ns=$2 h
  mkdir -p "$dir/$m"
  # shellcheck disable=SC2016
  launch "$dir/$m/holder.launch" "$dir/$m/holder.log" \
    nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private -- sh -c '
      set -e
      echo "$1" >/proc/sys/kernel/hostname
      for d in /tmp /var/tmp /root /run /var/log; do
        mount -t tmpfs -o size=2g,mode=0755 "meshrun-$1" "$d"
      done
      chmod 1777 /tmp /var/tmp
      chmod 0700 /root
      mkdir -m 0755 /run/sshd
      mount --bind "$2/hosts" /etc/hosts
      mount --bind "$2/resolv.conf" /etc/resolv.conf
      : >"$2/$1/ready"
      exec sleep infinity' holder "$m" "$dir"
  echo "$m sleep $dir/$m/holder.launch -" >>"$dir/daemons"
  wait_for 10 "machine $m" test -f "$dir/$m/ready"
  h=$(cat "$dir/$m/holder.launch")
  readlink "/proc/$h/ns/net" >"$dir/$m/netns"
  readlink "/proc/$h/ns/mnt" >"$dir/$m/mntns"
  [ "$(cat "$dir/$m/netns")" = "net:[$(stat -L -c %i "/run/netns/$ns")]" ] ||
    die "machine $m's holder is not in namespace $ns"
}

# in_machine M CMD...: CMD inside machine M's namespaces
in_machine() {
  local m=$1
  shift
  nsenter --target "$(cat "$dir/$m/holder.launch")" --uts --mount \
    --net="/run/netns/$(machine_ns "$m")" -- "$@"
}

# guard NS: the machine speaks IPv4 only and drops anything it would send
# to an address outside the subnet (there is no route out either); the
# "blocked" counter says whether anything tried
guard() {
  nsenter --net="/run/netns/$1" sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 \
    net.ipv6.conf.default.disable_ipv6=1
  nsenter --net="/run/netns/$1" nft -f - <<EOF
table inet meshrun_guard {
  chain out {
    type filter hook output priority 0; policy drop;
    oif lo accept
    ip daddr $subnet.0/24 accept
    meta nfproto ipv6 counter drop comment "ipv6 is off"
    counter comment "blocked: outside the cluster"
  }
}
EOF
}

# check_routes: every machine address leaves this namespace by the bridge,
# and no machine has a route beyond its subnet
check_routes() {
  local m ns addr route dev bridge=$prefix-br
  while read -r m ns addr; do
    route=$(ip -4 route get "$addr" 2>&1) || die "no route to $addr ($route)"
    dev=$(sed -n 's/.* dev \([^ ]*\).*/\1/p' <<<"$route" | head -1)
    [ "$dev" = "$bridge" ] || die "$addr routes via '${dev:-?}', not the bridge $bridge: $route"
    [ -z "$(ip -n "$ns" -4 route show default)" ] || die "$ns has a default route"
    case $addr in "$subnet".*) ;; *) die "$addr is outside $subnet.0/24" ;; esac
  done <"$dir/machines"
}

# ---- up: ssh ----

setup_ssh() {
  local m ns addr
  mkdir -m 0700 "$dir/ssh"
  ssh-keygen -q -t ed25519 -N '' -C "meshrun-cluster" -f "$dir/ssh/id_ed25519"
  cp "$dir/ssh/id_ed25519.pub" "$dir/ssh/authorized_keys"
  : >"$dir/ssh/known_hosts"
  : >"$dir/ssh/ssh_config"
  while read -r m ns addr; do
    ssh-keygen -q -t ed25519 -N '' -C "$m" -f "$dir/$m/ssh_host_ed25519_key"
    echo "$m,$addr $(cut -d' ' -f1,2 "$dir/$m/ssh_host_ed25519_key.pub")" >>"$dir/ssh/known_hosts"
    cat >"$dir/$m/sshd_config" <<EOF
# sshd of machine $m, made by $prog: only $addr, only the cluster's key
ListenAddress $addr:22
HostKey $dir/$m/ssh_host_ed25519_key
PidFile $dir/$m/sshd.pid
AuthorizedKeysFile $dir/ssh/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
AllowTcpForwarding no
AllowAgentForwarding no
Subsystem sftp internal-sftp
EOF
    cat >>"$dir/ssh/ssh_config" <<EOF
Host $m $addr
  HostName $addr
  ProxyCommand none
EOF
  done <"$dir/machines"
  # anything not a machine gets a ProxyCommand that fails, so a typo never
  # dials out; the rest holds for every machine
  cat >>"$dir/ssh/ssh_config" <<EOF
Host *
  ProxyCommand /bin/false
  User root
  Port 22
  IdentityFile $dir/ssh/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $dir/ssh/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  CheckHostIP no
  BatchMode yes
  ConnectTimeout 5
  ControlMaster no
  ForwardAgent no
  ForwardX11 no
  LogLevel ERROR
EOF
  while read -r m ns addr; do
    launch "$dir/$m/sshd.launch" "$dir/$m/sshd.log" \
      nsenter --target "$(cat "$dir/$m/holder.launch")" --uts --mount --net="/run/netns/$ns" -- \
      /usr/sbin/sshd -D -f "$dir/$m/sshd_config" -E "$dir/$m/sshd.log"
    echo "$m sshd $dir/$m/sshd.launch $dir/$m/sshd.pid" >>"$dir/daemons"
  done <"$dir/machines"
  while read -r m ns addr; do
    wait_for "$ready_timeout" "sshd of $m (see $dir/$m/sshd.log)" \
      ssh -F "$dir/ssh/ssh_config" -n "$m" true
  done <"$dir/machines"
}

# ---- up: Slurm ----

write_slurm_conf() {
  local m ns addr cpus
  cpus=$(nproc)
  mkdir -p "$dir/slurm/ctld"
  cat >"$dir/slurm/slurm.conf" <<EOF
# Slurm of the test cluster in $dir, made by $prog
ClusterName=meshrun
SlurmctldHost=node0($(machine_addr node0))
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/slurm/ctld
SlurmctldPidFile=$dir/slurm/ctld/slurmctld.pid
SlurmctldLogFile=$dir/slurm/ctld/slurmctld.log
SlurmdSpoolDir=$dir/%n/slurmd
SlurmdPidFile=$dir/%n/slurmd.pid
SlurmdLogFile=$dir/%n/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/linear
SchedulerType=sched/builtin
ReturnToService=2
MinJobAge=600
KillWait=1
MailProg=/bin/true
SlurmdParameters=config_overrides
EOF
  while read -r m ns addr; do
    echo "NodeName=$m NodeAddr=$addr NodeHostname=$m CPUs=$cpus State=UNKNOWN" >>"$dir/slurm/slurm.conf"
  done <"$dir/machines"
  echo "PartitionName=mesh Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$dir/slurm/slurm.conf"
}

# client CMD...: CMD as a cluster client in this namespace (see `run`)
client() {
  SLURM_CONF=$dir/slurm/slurm.conf unshare --mount --propagation private -- sh -c '
    mount --bind "$0/hosts" /etc/hosts && mount --bind "$0/resolv.conf" /etc/resolv.conf &&
    exec "$@"' "$dir" "$@"
}

all_idle() {
  local states
  states=$(client timeout 10 sinfo -h -N -o '%N %t') || return 1
  [ "$(grep -c ' idle$' <<<"$states")" -eq "$n" ]
}

setup_slurm() {
  local m ns addr ctl=node0
  mkdir -m 0755 "$dir/munge"
  head -c 1024 /dev/urandom >"$dir/munge/munge.key"
  chmod 0600 "$dir/munge/munge.key"
  launch "$dir/munge/munged.launch" "$dir/munge/munged.log" \
    nsenter --target "$(cat "$dir/$ctl/holder.launch")" --uts --mount --net="/run/netns/$(machine_ns $ctl)" -- \
    /usr/sbin/munged -F --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
    --seed-file="$dir/munge/munged.seed" --origin="$(machine_addr $ctl)"
  echo "$ctl munged $dir/munge/munged.launch $dir/munge/munged.pid" >>"$dir/daemons"
  wait_for 10 "munged (see $dir/munge/munged.log)" test -S "$dir/munge/munge.socket"

  write_slurm_conf
  launch "$dir/slurm/ctld/slurmctld.launch" "$dir/slurm/ctld/slurmctld.out" \
    env SLURM_CONF="$dir/slurm/slurm.conf" \
    nsenter --target "$(cat "$dir/$ctl/holder.launch")" --uts --mount --net="/run/netns/$(machine_ns $ctl)" -- \
    /usr/sbin/slurmctld -D -i
  echo "$ctl slurmctld $dir/slurm/ctld/slurmctld.launch $dir/slurm/ctld/slurmctld.pid" >>"$dir/daemons"
  wait_for "$ready_timeout" "slurmctld (see $dir/slurm/ctld/slurmctld.log)" client timeout 10 scontrol ping
  while read -r m ns addr; do
    mkdir -p "$dir/$m/slurmd"
    launch "$dir/$m/slurmd.launch" "$dir/$m/slurmd.out" \
      env SLURM_CONF="$dir/slurm/slurm.conf" \
      nsenter --target "$(cat "$dir/$m/holder.launch")" --uts --mount --net="/run/netns/$ns" -- \
      /usr/sbin/slurmd -D -N "$m"
    echo "$m slurmd $dir/$m/slurmd.launch $dir/$m/slurmd.pid" >>"$dir/daemons"
  done <"$dir/machines"
  wait_for "$ready_timeout" "all $n slurmd idle (see $dir/node*/slurmd.log)" all_idle
}

# ---- command line ----

[ $# -ge 1 ] || usage
cmd=$1
shift
n="" ssh=0 slurm=0 dir="" prefix=mrc subnet=10.232.0 rate="" target=""
[ "$cmd" = up ] && { [ $# -ge 1 ] || usage; n=$1; shift; }
while [ $# -gt 0 ]; do
  case $1 in
    --ssh) ssh=1; shift ;;
    --slurm) slurm=1; shift ;;
    --dir) [ $# -ge 2 ] || usage; dir=$2; shift 2 ;;
    --prefix) [ $# -ge 2 ] || usage; prefix=$2; shift 2 ;;
    --subnet) [ $# -ge 2 ] || usage; subnet=$2; shift 2 ;;
    --rate) [ $# -ge 2 ] || usage; rate=$2; shift 2 ;;
    --) shift; break ;;
    *) [ "$cmd" = exec ] && [ -z "$target" ] && [[ "$1" != -* ]] && { target=$1; shift; continue; }
       usage ;;
  esac
done
case $cmd in
  up) [ $# -eq 0 ] || usage ;;
  down | list) [ $# -eq 0 ] || usage ;;
  run) [ $# -ge 1 ] || usage ;;
  exec) [ $# -ge 1 ] && [ -n "$target" ] || usage ;;
  *) usage ;;
esac
[[ "$prefix" =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "prefix '$prefix' must be 1-8 lower-case letters and digits"
dir=${dir:-/var/lib/meshrun-cluster/$prefix}
[[ "$dir" = /* ]] || dir=$PWD/$dir
dir=${dir%/}
[ "$(id -u)" = 0 ] || die "run as root (namespaces, mounts and daemons need it)"

if [ "$cmd" != up ]; then
  [ -f "$dir/.meshrun-cluster" ] || die "no cluster in '$dir'"
  n=$(state_get n) prefix=$(state_get prefix) subnet=$(state_get subnet)
  case $cmd in
    down)
      teardown
      echo "$prog: cluster in $dir is down" >&2
      ;;
    list) cat "$dir/machines" ;;
    run) client "$@" ;;
    exec)
      [ -n "$(machine_ns "$target")" ] || die "no machine '$target' in $dir"
      in_machine "$target" "$@"
      ;;
  esac
  exit
fi

# ---- up ----

[[ "$n" =~ ^[1-9][0-9]*$ ]] && [ "$n" -le 64 ] || die "N must be 1..64, got '$n'"
for p in /tmp /var/tmp /root /run /var/log; do
  case $dir/ in "$p"/*) die "--dir must not be under $p (each machine has its own $p)" ;; esac
done
need=(ip nsenter unshare setsid nft "$netns_sh")
[ $ssh = 1 ] && need+=(/usr/sbin/sshd ssh ssh-keygen)
[ $slurm = 1 ] && need+=(/usr/sbin/munged /usr/sbin/slurmctld /usr/sbin/slurmd sinfo scontrol)
for c in "${need[@]}"; do
  command -v "$c" >/dev/null || die "'$c' is missing (make cluster-deps installs the packages)"
done
if [ -e "$dir" ]; then
  [ -d "$dir" ] && [ -z "$(ls -A "$dir")" ] || die "'$dir' exists and is not empty: is a cluster up there? ($prog down --dir $dir)"
fi

start=$EPOCHREALTIME
mkdir -p "${dir%/*}"
[ -d "$dir" ] || mkdir -m 0755 "$dir"
: >"$dir/.meshrun-cluster"
on_exit() {
  local rc=$?
  [ $rc -eq 0 ] && return
  echo "$prog: up failed; taking down what was made" >&2
  teardown
}
trap on_exit EXIT
trap 'exit 130' INT TERM HUP
state_set n "$n"
state_set prefix "$prefix"
state_set subnet "$subnet"
state_set ssh "$ssh"
state_set slurm "$slurm"

# netns.sh runs in its own session so that a ^C meant for up cannot stop
# it half-way; "pending" tells teardown to ask netns.sh whether it got up
"$netns_sh" list --prefix "$prefix" >/dev/null 2>&1 && die "network '$prefix' is already up: choose another --prefix"
state_set net pending
hosts=$(setsid -w "$netns_sh" up "$n" --prefix "$prefix" --subnet "$subnet" ${rate:+--rate "$rate"})
state_set net 1
: >"$dir/machines"
while read -r h ns addr; do
  echo "node${h#host} $ns $addr" >>"$dir/machines"
done <<<"$hosts"
[ "$(wc -l <"$dir/machines")" -eq "$n" ] || die "netns.sh printed $(wc -l <"$dir/machines") hosts, not $n"
awk '{print $1}' "$dir/machines" >"$dir/hostfile"
check_routes

{
  echo "127.0.0.1 localhost"
  awk '{print $3, $1}' "$dir/machines"
} >"$dir/hosts"
printf '# made by %s: lookups go to loopback only\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n' "$prog" >"$dir/resolv.conf"
: >"$dir/daemons"
while read -r m ns addr; do
  guard "$ns"
  start_machine "$m" "$ns"
done < <(cat "$dir/machines")
[ "${MESHRUN_CLUSTER_FAIL:-}" = machines ] && die "failing on purpose after the machines (MESHRUN_CLUSTER_FAIL)"

[ $ssh = 1 ] && setup_ssh
[ "${MESHRUN_CLUSTER_FAIL:-}" = ssh ] && die "failing on purpose after sshd (MESHRUN_CLUSTER_FAIL)"
[ $slurm = 1 ] && setup_slurm

trap - EXIT INT TERM HUP
echo "$prog: $n machines up in $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')s, state in $dir" >&2
[ $ssh = 1 ] && echo "$prog: ssh -F $dir/ssh/ssh_config node0 CMD" >&2
[ $slurm = 1 ] && echo "$prog: export SLURM_CONF=$dir/slurm/slurm.conf, or: $prog run --dir $dir -- srun -N $n hostname" >&2
cat "$dir/machines"
