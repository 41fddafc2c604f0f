#!/usr/bin/env bash
# The integration tests of the module and of the Rust client against the server DLOCK_SERVER
# names (make test runs them on Valkey 9 and Redis 7.4 after the whole workspace on Redis 7.0):
# every test file of both crates but those that test nothing of the server's own and run on Redis
# 7.0 only: the docs' redis-cli transcripts (written as Redis 7.0 prints them; tests/examples.rs),
# the redis-py and node-redis snippets (tests/clients.rs), the release packages (tests/dist.rs)
# and the Rust client's examples (client/tests/examples.rs).
# The test files are named on a `--workspace` build, so it reuses the build of the first run
# (naming packages instead would resolve their features anew and compile everything again).
#   DLOCK_SERVER=/path/to/server bash scripts/integration.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# Four tests at a time within each file: they spend most of their time waiting on servers and
# leases (a run uses about a quarter of two cores), so twice the cores' count of threads
# shortens the phase by a fifth.
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-4}
[ -n "${DLOCK_SERVER:-}" ] || { echo "integration.sh: set DLOCK_SERVER" >&2; exit 2; }
names=$(for file in tests/*.rs client/tests/*.rs; do basename "$file" .rs; done | sort -u)
targets=()
for name in $names; do
  case "$name" in
    examples | clients | dist) ;;
    *) targets+=(--test "$name") ;;
  esac
done
cargo test --workspace "${targets[@]}"
