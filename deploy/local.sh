#!/usr/bin/env bash
# local.sh N [meshrun local args...] — N agents on this machine over
# loopback TLS (throwaway certificates, free ports), e.g.
#   deploy/local.sh 2 --job pingpong --rounds 100 --size 16M
#   deploy/local.sh 4 --devices-per-host 2 --config configs/base.yml
# MESHRUN overrides the binary (default: build/meshrun next to this script).
set -euo pipefail
if [ $# -lt 1 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 N [--devices-per-host D] [--config FILE] [key=value ...]" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
bin=${MESHRUN:-$here/../build/meshrun}
n=$1
shift
exec "$bin" local --hosts "$n" "$@"
