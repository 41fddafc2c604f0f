#!/usr/bin/env bash
# Installs the client libraries the cross-client tests and the snippets in docs/clients.md run
# with, at the versions they were tested with, into .deps/: redis-py (PyPI), and node-redis, ioredis
# and valkey-glide (npm; glide's native core comes as its platform's package from npm too).
# Nothing is installed system-wide. Prints nothing on success.
set -euo pipefail
cd "$(dirname "$0")/.."
# Tests call this in parallel: one install at a time, or two npm runs corrupt one node_modules.
mkdir -p .deps
exec 9>.deps/clients.lock
flock 9
REDIS_PY=8.1.0
NODE_REDIS=6.3.1
IOREDIS=6.1.0
GLIDE=2.5.2
if [ "$(PYTHONPATH=.deps/python python3 -c 'import redis; print(redis.__version__)' 2>/dev/null)" != "$REDIS_PY" ]; then
  rm -rf .deps/python
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target .deps/python "redis==$REDIS_PY" >&2
fi
node_version() {
  node -p "require('./.deps/node/node_modules/$1/package.json').version" 2>/dev/null || true
}
if [ "$(node_version redis)" != "$NODE_REDIS" ] || [ "$(node_version ioredis)" != "$IOREDIS" ] \
  || [ "$(node_version @valkey/valkey-glide)" != "$GLIDE" ]; then
  mkdir -p .deps/node
  # One npm run for all three: a later `npm install --no-save` of one would prune the others.
  (cd .deps/node && npm install --silent --no-audit --no-fund --no-save \
    "redis@$NODE_REDIS" "ioredis@$IOREDIS" "@valkey/valkey-glide@$GLIDE" >&2)
fi
