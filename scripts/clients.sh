#!/usr/bin/env bash
# Installs the client libraries most users already have, for the cross-client tests, into .deps/:
# redis-py (PyPI) and node-redis (npm). Nothing is installed system-wide. Prints nothing on success.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d .deps/python/redis ]; then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target .deps/python "redis==5.*" >&2
fi
if [ ! -d .deps/node/node_modules/redis ]; then
  mkdir -p .deps/node
  (cd .deps/node && npm install --silent --no-audit --no-fund --no-save "redis@4" >&2)
fi
