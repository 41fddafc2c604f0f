#!/usr/bin/env bash
# Builds the module of the last version-1 commit (before FENCE, CLAIM, QUEUE, SHARED and the
# resources' channels landed) once, into target/v1/, and prints the path of its libdlock.so:
#   BENCH_V1_MODULE=$(bash scripts/v1-module.sh) BENCH_ONLY=versions ./target/release/dlock-bench
#   bash scripts/instructions.sh "$(bash scripts/v1-module.sh)" target/release/libdlock.so
# The sources come from `git archive` into a temporary directory (no worktree is left behind);
# the build has a target directory of its own, so this repository's target/ is untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
V1_COMMIT=${V1_COMMIT:-4a315d5}
out="$PWD/target/v1"
if [[ ! -f "$out/libdlock.so" || "$(cat "$out/commit" 2>/dev/null)" != "$V1_COMMIT" ]]; then
  src=$(mktemp -d)
  trap 'rm -rf "$src"' EXIT
  git archive "$V1_COMMIT" | tar -x -C "$src"
  (cd "$src" && CARGO_TARGET_DIR="$out/build" cargo build --release -p dlock >&2)
  cp "$out/build/release/libdlock.so" "$out/libdlock.so"
  echo "$V1_COMMIT" >"$out/commit"
fi
echo "$out/libdlock.so"
