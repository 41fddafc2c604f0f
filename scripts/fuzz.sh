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
# An assignment, so that `set -e` stops the script if the list cannot be built.
targets=$(cargo +nightly fuzz list)
[ -n "$targets" ] || { echo "fuzz: no fuzz targets found" >&2; exit 1; }
for target in $targets; do
  mkdir -p "$corpus/$target"
  echo "fuzz: $target for ${seconds}s"
  log="$corpus/$target.log"
  # A crash, a failed build or any other non-zero exit of the fuzzer fails the script.
  if ! cargo +nightly fuzz run "$target" "$corpus/$target" "seeds/$target" -- \
      -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "fuzz: $target failed; a crash leaves its input in fuzz/artifacts/$target" >&2
    exit 1
  fi
  grep -E '^(Done|stat::number_of_executed_units)' "$log"
done
