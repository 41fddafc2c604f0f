#!/usr/bin/env bash
# The TypeScript client (node/): npm ci from the committed package-lock.json, the ESM and
# CommonJS builds, tsc --noEmit (strict), eslint, node --test against redis-server and, when
# DLOCK_NODE_VALKEY is not 0, again against Valkey 9; then the npm pack tarball installed and
# imported in throwaway ESM and CommonJS projects.
#   bash scripts/node.sh             all of it
#   bash scripts/node.sh install     only npm ci
# The tests start their own servers with the module: DLOCK_MODULE, else the newest of
# target/release and target/debug (build it first: cargo build -p dlock), and a throwaway
# PostgreSQL for the invoice example (DLOCK_PG_BIN, else /usr/lib/postgresql/*/bin; Debian's
# postgresql package is installed with apt-get if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "node: Node.js 20 or later with npm is needed" >&2
  exit 1
fi

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

need_postgres() {
  if [ -z "${DLOCK_PG_BIN:-}" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "node: installing postgresql" >&2
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq
    as_root apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  fi
}

install() {
  (cd node && npm ci --no-audit --no-fund --silent)
}

find_module() {
  if [ -n "${DLOCK_MODULE:-}" ]; then
    echo "$DLOCK_MODULE"
    return
  fi
  local candidate newest=""
  for candidate in target/release/libdlock.so target/debug/libdlock.so; do
    if [ -f "$candidate" ] && { [ -z "$newest" ] || [ "$candidate" -nt "$newest" ]; }; then
      newest=$candidate
    fi
  done
  if [ -z "$newest" ]; then
    echo "node: no libdlock.so found; run 'cargo build -p dlock' or set DLOCK_MODULE" >&2
    exit 1
  fi
  echo "$repo/$newest"
}

case "${1:-test}" in
  install)
    install
    ;;
  test)
    install
    need_postgres
    cd node
    npm run --silent build
    npm run --silent typecheck
    npm run --silent lint
    DLOCK_MODULE=$(cd "$repo" && find_module)
    # The invoice example's test fails, rather than skips, without PostgreSQL.
    export DLOCK_MODULE DLOCK_REQUIRE_POSTGRES=1
    echo "node: module $DLOCK_MODULE; node --test against $(redis-server --version | cut -d' ' -f1-3)" >&2
    node --test --test-concurrency=4 build/test/*.test.js
    if [ "${DLOCK_NODE_VALKEY:-1}" != 0 ]; then
      DLOCK_SERVER=$(bash "$repo/scripts/valkey.sh")
      echo "node: node --test against Valkey ($DLOCK_SERVER)" >&2
      DLOCK_SERVER=$DLOCK_SERVER node --test --test-concurrency=4 build/test/lease.test.js build/test/driver.test.js \
        build/test/sets.test.js
    fi
    node --test test-pack/pack.test.mjs
    ;;
  *)
    echo "usage: $0 [test|install]" >&2
    exit 2
    ;;
esac
