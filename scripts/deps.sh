#!/usr/bin/env bash
# Installs what building and testing dlock needs on Debian/Ubuntu, and only what is missing:
# redis-server and redis-cli (the tests start real servers), PostgreSQL (a protected resource in
# end-to-end tests), libclang (redis-module's bindgen), valgrind (instruction counts of `make
# bench`), and the rustfmt/clippy components.
set -euo pipefail

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
# The cross-client tests install redis-py and node-redis into .deps/ with pip and npm.
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
command -v npm >/dev/null 2>&1 || missing+=(npm)
# The clock tests build a small preload library (testkit/clockshim) with the C compiler.
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
# `make bench` and scripts/instructions*.sh count instructions with valgrind's callgrind.
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
# The client's end-to-end tests and the chaos harness start a throwaway PostgreSQL server.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
# bindgen needs libclang and clang's own headers (stddef.h).
if ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 \
   || ! ls /usr/lib/llvm-*/lib/clang/*/include/stddef.h >/dev/null 2>&1; then
  if apt-cache show libclang1-14 >/dev/null 2>&1; then
    missing+=(libclang1-14 libclang-common-14-dev)
  else
    missing+=(libclang-dev)
  fi
fi

if [ "${#missing[@]}" -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq
  as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "deps: cargo not found; install Rust (https://rustup.rs) first" >&2
  exit 1
fi
if command -v rustup >/dev/null 2>&1; then
  for component in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$component" \
      || rustup component add "$component"
  done
fi

# The Go client's modules (go/, go/prometheus, go/examples), when a Go toolchain is there.
if command -v go >/dev/null 2>&1; then
  bash "$(dirname "$0")/go.sh" download
fi

# The Java client's dependencies (java/), when Maven is there.
if command -v mvn >/dev/null 2>&1; then
  bash "$(dirname "$0")/java.sh" download
fi

# The TypeScript client's packages (node/, from its package-lock.json), when Node.js is there.
if command -v npm >/dev/null 2>&1; then
  bash "$(dirname "$0")/node.sh" install
fi
