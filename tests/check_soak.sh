#!/usr/bin/env bash
# The chaos run's short version for make test (tests/soak.sh, which
# `make soak` runs over 2,000 steps): 200 steps of llama-tiny on 3 hosts,
# 10 link faults of every kind (reset, drop, corrupt, delay, half-open)
# and one SIGKILLed agent under --max-restarts, losses bit-identical to
# the clean run. About 1.5 minutes on a loaded 2-core machine.
exec "$(dirname "$0")/soak.sh" --steps 200 --kills 1 --faults 10 --seed "${SOAK_SEED:-1}"
