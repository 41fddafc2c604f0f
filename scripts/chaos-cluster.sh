#!/usr/bin/env bash
# Runs the fault-injection harness's `cluster` profile (3 primaries + 3 replicas, each node in a
# network namespace of its own: needs root) for SECONDS (default: $CHAOS_CLUSTER_SECONDS, else
# $CHAOS_SECONDS, else 60), seeded from $CHAOS_SEED (default 1), on $DLOCK_SERVER (default
# redis-server). With `--self-check` it first runs the harness with broken workers (a stale SQL
# write without the fence condition, a fence no grant gave, a fenced write to a key of another
# slot) and a harness that drops acknowledged appends, and fails unless every cluster checker
# catches them. CHAOS_BUILD=release builds optimised (the default is debug, which shares the
# test build).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${CHAOS_CLUSTER_SECONDS:-${CHAOS_SECONDS:-60}}
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
  echo "chaos: cluster self-check (broken workers and a harness that drops writes must be caught)"
  "$chaos" --profile cluster --seconds 20 --seed "$seed" --broken-cluster \
    > target/chaos-cluster-self-check.log 2>&1 || true
  caught=""
  for finding in 'state-order): sql' store-fence double-holders lost-writes client-errors; do
    n=$(grep -c "^VIOLATION ($finding" target/chaos-cluster-self-check.log || true)
    if [ "$n" -eq 0 ]; then
      grep -v '^    ' target/chaos-cluster-self-check.log | tail -40
      echo "chaos: the cluster self-check found no '$finding' violation: that checker (or the run) is broken" >&2
      exit 1
    fi
    label=${finding%%)*}
    [ "$label" = "$finding" ] || label="$label (sql)"
    caught="$caught${caught:+, }$label $n"
  done
  echo "chaos: cluster self-check caught $caught"
fi
"$chaos" --profile cluster --seconds "$seconds" --seed "$seed"
