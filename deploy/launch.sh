#!/usr/bin/env bash
# launch.sh HOSTFILE [meshrun launch args...] — one agent per machine of
# HOSTFILE over ssh (`meshrun launch`), e.g.
#   deploy/launch.sh hosts.txt --config configs/llama-tiny.yml --metrics m.jsonl
#   deploy/launch.sh hosts.txt --ssh-config ~/.ssh/cluster --devices-per-host 2 --config FILE
# HOSTFILE: one machine a line, [user@]host[:sshport] [slots=1], # comments.
# MESHRUN overrides the binary (default: build/meshrun next to this script).
set -euo pipefail
if [ $# -lt 1 ] || [[ "$1" == -* ]]; then
  echo "usage: $0 HOSTFILE [--ssh-config FILE] [--devices-per-host D] --config FILE [key=value ...]" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
bin=${MESHRUN:-$here/../build/meshrun}
hostfile=$1
shift
exec "$bin" launch --hostfile "$hostfile" "$@"
