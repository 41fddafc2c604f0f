#!/usr/bin/env bash
# Prints the path of the server binary to test against: `redis` (Debian's redis-server, 7.0),
# `valkey` (Valkey 9, scripts/valkey.sh) or `redis74` (Redis 7.4, scripts/redis74.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-redis}" in
  redis) command -v redis-server ;;
  valkey) bash scripts/valkey.sh ;;
  redis74) bash scripts/redis74.sh ;;
  *) echo "server.sh: unknown server '$1' (redis, valkey or redis74)" >&2; exit 2 ;;
esac
