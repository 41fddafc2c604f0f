#!/usr/bin/env bash
# Runs the fault-injection harness: the `always` profile, then the `failover` profile, each for
# SECONDS (default: $CHAOS_SECONDS, else 60; CHAOS_ALWAYS_SECONDS / CHAOS_FAILOVER_SECONDS set
# one profile's), seeded from $CHAOS_SEED (default 1). With
# `--self-check` it first runs the harness against deliberately unfenced SQL writes and fails
# unless the checkers catch them. CHAOS_BUILD=release builds optimised (the default is debug,
# which shares the test build).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${CHAOS_SECONDS:-60}
seed=${CHAOS_SEED:-1}
self_check=no
for arg in "$@"; do
  case "$arg" in
    --self-check) self_check=yes ;;
    *) seconds=$arg ;;
  esac
done
build=${CHAOS_BUILD:-debug}
if [ "$build" = release ]; then
  cargo build --release -p dlock -p dlock-chaos
else
  cargo build -p dlock -p dlock-chaos
fi
export DLOCK_MODULE="$PWD/target/$build/libdlock.so"
chaos="target/$build/dlock-chaos"

if [ "$self_check" = yes ]; then
  echo "chaos: self-check (unfenced SQL writes must be caught)"
  "$chaos" --seconds 8 --seed "$seed" --unfenced-sql > target/chaos-self-check.log 2>&1 || true
  caught=$(grep -c 'VIOLATION (state-order)' target/chaos-self-check.log || true)
  if [ "$caught" -eq 0 ]; then
    cat target/chaos-self-check.log
    echo "chaos: the self-check caught no stale SQL write: the checkers (or the run) are broken" >&2
    exit 1
  fi
  echo "chaos: self-check caught $caught stale SQL writes"
fi
"$chaos" --seconds "${CHAOS_ALWAYS_SECONDS:-$seconds}" --seed "$seed" --profile always
"$chaos" --seconds "${CHAOS_FAILOVER_SECONDS:-$seconds}" --seed "$seed" --profile failover
