#!/usr/bin/env bash
# Runs every fuzz target for SECONDS seconds each (default 60) from the committed seeds, with a
# throwaway corpus: cargo-fuzz and the nightly toolchain are installed first if missing.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-60}
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
for target in $(cargo +nightly fuzz list); do
  mkdir -p "$corpus/$target"
  echo "fuzz: $target for ${seconds}s"
  cargo +nightly fuzz run "$target" "$corpus/$target" "seeds/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1 2>&1 | grep -E '^(Done|stat::number_of_executed_units|.*ERROR|.*panicked)' || true
  # A crash leaves an artifact: fail loudly.
  if ls artifacts/"$target"/crash-* >/dev/null 2>&1; then
    echo "fuzz: $target crashed; see fuzz/artifacts/$target" >&2
    exit 1
  fi
done
