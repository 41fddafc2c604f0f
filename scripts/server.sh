#!/usr/bin/env bash
# Prints the path of the server binary to test against: `redis` (Debian's redis-server, 7.0),
# `valkey` (Valkey 9, scripts/valkey.sh), `redis74` (Redis 7.4, scripts/redis74.sh) or `redis8`
# (Redis 8.0, scripts/redis8.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-redis}" in
  redis) command -v redis-server ;;
  valkey) bash scripts/valkey.sh ;;
  redis74) bash scripts/redis74.sh ;;
  redis8) bash scripts/redis8.sh ;;
  *) echo "server.sh: unknown server '$1' (redis, valkey, redis74 or redis8)" >&2; exit 2 ;;
esac
