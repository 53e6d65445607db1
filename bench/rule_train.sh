#!/usr/bin/env bash
# Issue 19 (float20): a real-compute job under two builds or settings,
# floating (cpu_bind=none): bench/bind_train.sh's pipe41 shape (4 hosts x
# 1 device, a 4-stage interleaved 1F1B pipeline, configs/llama-bench.yml,
# one OpenBLAS thread a device), the variants alternating, the order
# swapped each round; bind_train.sh prints per run the mean step seconds,
# comm_exposed_s and CPU s per step, then the medians and whether every
# run gave the same last loss_hex. A variant is NAME|ENV|BIN (ENV:
# VAR=VALUE ...; BIN: default build/meshrun), e.g.
#   bench/rule_train.sh 3 5 'old|MESHRUN_YIELD_RULE=old|' 'new||'
# usage: bench/rule_train.sh ROUNDS STEPS VARIANT VARIANT
set -eu
cd "$(dirname "$0")/.."
SHAPE=pipe41 A="$3|cpu_bind=none" B="$4|cpu_bind=none" exec bash bench/bind_train.sh "$1" "$2"
