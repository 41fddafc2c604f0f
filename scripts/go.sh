#!/usr/bin/env bash
# The Go client (go/ and its modules go/prometheus and go/examples): downloads their modules,
# checks formatting (gofmt -l), runs go vet, then go test -race against redis-server and, when
# DLOCK_GO_VALKEY is not 0, again against Valkey 9.
#   bash scripts/go.sh             all of it
#   bash scripts/go.sh download    only go mod download
# The tests start their own servers with the module: DLOCK_MODULE, else the newest of
# target/release and target/debug (build it first: cargo build -p dlock). redis-server,
# redis-cli (it creates the test Cluster) and PostgreSQL (the invoice example's end-to-end test)
# are installed with apt-get if missing, Valkey into .deps/ (scripts/valkey.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
modules=(go go/prometheus go/examples)

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v go >/dev/null 2>&1; then
  echo "go: no Go toolchain on PATH (Go 1.22 or later is needed)" >&2
  exit 1
fi

download() {
  local module
  for module in "${modules[@]}"; do
    (cd "$module" && go mod download)
  done
}

need_servers() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
  if [ -z "${DLOCK_PG_BIN:-}" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    missing+=(postgresql)
  fi
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "go: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq
    as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
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
    echo "go: no libdlock.so found; run 'cargo build -p dlock' or set DLOCK_MODULE" >&2
    exit 1
  fi
  echo "$repo/$newest"
}

run_tests() {
  local module
  for module in "${modules[@]}"; do
    (cd "$module" && go test -race -count=1 ./...)
  done
}

case "${1:-test}" in
  download)
    download
    ;;
  test)
    download
    unformatted=$(gofmt -l go)
    if [ -n "$unformatted" ]; then
      echo "go: not gofmt'ed:" >&2
      echo "$unformatted" >&2
      exit 1
    fi
    for module in "${modules[@]}"; do
      (cd "$module" && go vet ./...)
    done
    DLOCK_MODULE=$(find_module)
    export DLOCK_MODULE DLOCK_REQUIRE_POSTGRES=1
    need_servers
    echo "go: module $DLOCK_MODULE; go test -race against $(redis-server --version | cut -d' ' -f1-3)" >&2
    run_tests
    if [ "${DLOCK_GO_VALKEY:-1}" != 0 ]; then
      DLOCK_SERVER=$(bash scripts/valkey.sh)
      echo "go: go test -race against Valkey ($DLOCK_SERVER)" >&2
      DLOCK_SERVER=$DLOCK_SERVER run_tests
    fi
    ;;
  *)
    echo "usage: $0 [test|download]" >&2
    exit 2
    ;;
esac
