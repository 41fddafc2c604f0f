#!/usr/bin/env bash
# Installs the client libraries the cross-client tests and the snippets in docs/clients.md run
# with, at the versions they were tested with, into .deps/: redis-py (PyPI) and node-redis (npm).
# Nothing is installed system-wide. Prints nothing on success.
set -euo pipefail
cd "$(dirname "$0")/.."
# Tests call this in parallel: one install at a time, or two npm runs corrupt one node_modules.
mkdir -p .deps
exec 9>.deps/clients.lock
flock 9
REDIS_PY=8.1.0
NODE_REDIS=6.3.1
if [ "$(PYTHONPATH=.deps/python python3 -c 'import redis; print(redis.__version__)' 2>/dev/null)" != "$REDIS_PY" ]; then
  rm -rf .deps/python
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target .deps/python "redis==$REDIS_PY" >&2
fi
if [ "$(node -p 'require("./.deps/node/node_modules/redis/package.json").version' 2>/dev/null)" != "$NODE_REDIS" ]; then
  mkdir -p .deps/node
  (cd .deps/node && npm install --silent --no-audit --no-fund --no-save "redis@$NODE_REDIS" >&2)
fi
