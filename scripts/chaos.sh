#!/usr/bin/env bash
# Runs the fault-injection harness: the `always` profile, then the `failover` profile, each for
# SECONDS (default: $CHAOS_SECONDS, else 60; CHAOS_ALWAYS_SECONDS / CHAOS_FAILOVER_SECONDS set
# one profile's), seeded from $CHAOS_SEED (default 1). With `--self-check` it first runs the
# harness against deliberately broken workers (unfenced SQL writes; mixed workers that ignore the
# semaphore limit, take shared leases as writers, abandon waiters without a claim window and
# refresh tickets under new tokens; a harness that deletes a live lock key on the replica before
# each mirror comparison and loads a stale copy of the AOF; servers whose monotonic clock steps
# with their wall clock; sets that let a member go) and fails unless every checker meant to catch
# them does; then shows the
# one admitted weakness (a clock stepped back across a restart without persistence) and fails
# unless fence-order reports it and nothing else does.
# CHAOS_BUILD=release builds optimised (the default is debug, which shares the test build).
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
  echo "chaos: self-check (broken workers must be caught)"
  # One resource of each kind for the mixed workers: more of them meet there.
  "$chaos" --seconds 8 --seed "$seed" --unfenced-sql --broken-mixed --broken-mirror --rw 1 --sem 1 \
    > target/chaos-self-check.log 2>&1 || true
  caught=""
  for finding in 'state-order): sql' permit-limit writer-overlap reader-overlap claim-window ticket-fifo; do
    n=$(grep -c "^VIOLATION ($finding" target/chaos-self-check.log || true)
    if [ "$n" -eq 0 ]; then
      cat target/chaos-self-check.log
      echo "chaos: the self-check found no '$finding' violation: that checker (or the run) is broken" >&2
      exit 1
    fi
    label=${finding%%)*}
    [ "$label" = "$finding" ] || label="$label (sql)"
    caught="$caught${caught:+, }$label $n"
  done
  for copy in replica aof; do
    case "$copy" in
      replica) pattern='the replica differs' ;;
      aof) pattern="a server loaded from the primary's AOF differs" ;;
    esac
    n=$(grep -c "^VIOLATION (mirror): $pattern" target/chaos-self-check.log || true)
    if [ "$n" -eq 0 ]; then
      cat target/chaos-self-check.log
      echo "chaos: the self-check found no 'mirror' violation of $copy: the mirror checker is broken" >&2
      exit 1
    fi
    caught="$caught, mirror ($copy) $n"
  done
  # Runs chaos for SECONDS with the arguments after the first three into
  # target/chaos-self-check-NAME.log and fails unless the checker CHECKER reported a violation
  # there; adds the count to $caught. A run that saw none is tried twice more, longer and with the
  # next seeds (a loaded machine may run too few operations to break anything): a broken checker
  # misses every time.
  expect_caught() { # NAME CHECKER SECONDS ARGS…
    local name=$1 checker=$2 base=$3 log n attempt
    shift 3
    log="target/chaos-self-check-$name.log"
    for attempt in 1 2 3; do
      "$chaos" --seconds $((base * attempt)) --seed $((seed + attempt - 1)) "$@" >"$log" 2>&1 || true
      n=$(grep -c "^VIOLATION ($checker)" "$log" || true)
      [ "$n" -gt 0 ] && break
      echo "chaos: self-check '$name' run $attempt saw no '$checker' violation" >&2
    done
    if [ "$n" -eq 0 ]; then
      cat "$log"
      echo "chaos: the self-check found no '$checker' violation: that checker is broken" >&2
      exit 1
    fi
    caught="$caught, $checker $n"
  }
  # Sets that let a member go (broken mixed workers on three read-write resources, no
  # semaphore): the mirror checker's set-atomicity must see one in part.
  expect_caught sets set-atomicity 6 --broken-mixed --rw 3 --sem 0
  # The servers' monotonic clock stepping with their wall clock (every fault a clock step):
  # leases end early, which the clock checker must see.
  expect_caught clock clock-lease 8 --broken-clock --rw 1 --sem 1
  # The one admitted weakness, shown: a primary without persistence whose clock steps back while
  # it is down mints fences below those it granted before. fence-order must report it, and no
  # checker may report anything else (what such a restart loses is excused, as any restart's).
  "$chaos" --seconds 10 --seed "$seed" --clock-weakness \
    > target/chaos-self-check-weakness.log 2>&1 || true
  n=$(grep -c "^VIOLATION (fence-order)" target/chaos-self-check-weakness.log || true)
  others=$(grep "^VIOLATION" target/chaos-self-check-weakness.log | grep -vc "^VIOLATION (fence-order)" || true)
  if [ "$n" -eq 0 ] || [ "$others" -ne 0 ]; then
    grep -v "^excused" target/chaos-self-check-weakness.log
    echo "chaos: the clock-weakness run must show fence-order violations ($n) and nothing else ($others)" >&2
    exit 1
  fi
  caught="$caught; the clock weakness: fence-order $n and nothing else"
  echo "chaos: self-check caught $caught"
fi
"$chaos" --seconds "${CHAOS_ALWAYS_SECONDS:-$seconds}" --seed "$seed" --profile always
"$chaos" --seconds "${CHAOS_FAILOVER_SECONDS:-$seconds}" --seed "$seed" --profile failover
