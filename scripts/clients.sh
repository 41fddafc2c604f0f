#!/usr/bin/env bash
# Installs the client libraries most users already have, for the cross-client tests, into .deps/:
# redis-py (PyPI) and node-redis (npm). Nothing is installed system-wide. Prints nothing on success.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f .deps/python/redis/__init__.py ]; then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target .deps/python "redis==5.*" >&2
fi
if [ ! -f .deps/node/node_modules/redis/package.json ]; then
  mkdir -p .deps/node
  (cd .deps/node && npm install --silent --no-audit --no-fund --no-save "redis@4" >&2)
fi
