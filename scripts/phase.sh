#!/usr/bin/env bash
# One phase of `make test`: prints its number and name, runs it, then whether it passed and how
# long it took (and how long since `make test` started, when TEST_STARTED holds that time).
#   bash scripts/phase.sh <i/n> <name> <command> [<argument>...]
set -uo pipefail
step=$1
name=$2
shift 2
started=$(date +%s)
echo "== make test [$step] $name"
"$@"
status=$?
now=$(date +%s)
verdict=passed
[ "$status" -eq 0 ] || verdict="FAILED (exit $status)"
since=""
[ -n "${TEST_STARTED:-}" ] && since=" ($((now - TEST_STARTED)) s since make test started)"
echo "== make test [$step] $name: $verdict in $((now - started)) s$since"
exit "$status"
