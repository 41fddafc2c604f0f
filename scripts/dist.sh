#!/usr/bin/env bash
# Release artifacts an operator installs without Rust, into target/dist/ (or --out):
#   dlock-<version>-linux-<arch>.tar.gz   the module, redis.conf.example, dlock.conf (the lines
#                                         to include), README.md, docs/, and SHA256SUMS
#   redis-dlock_<version>_<arch>.deb      the module in /usr/lib/redis/modules/libdlock.so and
#                                         /etc/redis/dlock.conf, the lines a redis.conf includes
#   SHA256SUMS                            of both
# The version is the crate's (Cargo.toml), the one place it is written.
#   bash scripts/dist.sh                          builds the release module first
#   bash scripts/dist.sh --module path --out dir  packages that module into dir (the tests)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

module=""
out="$repo/target/dist"
while [ $# -gt 0 ]; do
  case "$1" in
    --module) module=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--module path/to/libdlock.so] [--out dir]" >&2; exit 2 ;;
  esac
done
if [ -z "$module" ]; then
  cargo build --release -p dlock >&2
  module="$repo/target/release/libdlock.so"
fi
[ -f "$module" ] || { echo "dist: no module at $module" >&2; exit 1; }

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
name="dlock-$version-linux-$arch"
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The lines that load dlock with the settings locks need; the package installs them as
# /etc/redis/dlock.conf, and a redis.conf takes them with `include /etc/redis/dlock.conf`.
conf() {
  cat <<CONF
# dlock $version: include this file from redis.conf (include $1/dlock.conf).
loadmodule $2
# Every acknowledged grant survives a crash (see docs/operations.md, "Recommended settings").
appendonly yes
appendfsync always
aof-use-rdb-preamble yes
# An eviction would end a live lease: refuse writes at maxmemory instead.
maxmemory-policy noeviction
CONF
}

# The tarball.
mkdir -p "$work/$name"
install -m 0755 "$module" "$work/$name/libdlock.so"
install -m 0644 redis.conf.example README.md "$work/$name/"
conf "/path/to" "/path/to/$name/libdlock.so" >"$work/$name/dlock.conf"
cp -r docs "$work/$name/docs"
(cd "$work/$name" && find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum >SHA256SUMS)
tar -C "$work" -czf "$out/$name.tar.gz" "$name"

# The Debian package.
deb="$work/deb"
mkdir -p "$deb/DEBIAN" "$deb/usr/lib/redis/modules" "$deb/etc/redis" "$deb/usr/share/doc/redis-dlock"
install -m 0755 "$module" "$deb/usr/lib/redis/modules/libdlock.so"
conf "/etc/redis" "/usr/lib/redis/modules/libdlock.so" >"$deb/etc/redis/dlock.conf"
install -m 0644 README.md redis.conf.example "$deb/usr/share/doc/redis-dlock/"
cat >"$deb/DEBIAN/control" <<CONTROL
Package: redis-dlock
Version: $version
Architecture: $arch
Maintainer: dlock developers <dlock@users.noreply.github.com>
Depends: libc6
Recommends: redis-server (>= 5:7.0)
Section: database
Priority: optional
Description: lease locks with fencing tokens for Redis and Valkey
 dlock is a Redis module: exclusive, shared and counted leases with a fencing token minted
 with every grant, fair waiting, claim windows, queue tickets and fenced writes. Add
 "include /etc/redis/dlock.conf" to redis.conf and restart the server.
CONTROL
echo "/etc/redis/dlock.conf" >"$deb/DEBIAN/conffiles"
dpkg-deb --root-owner-group -Zgzip --build "$deb" "$out/redis-dlock_${version}_$arch.deb" >&2

(cd "$out" && sha256sum "$name.tar.gz" "redis-dlock_${version}_$arch.deb" >SHA256SUMS)
echo "dist: $out/$name.tar.gz, $out/redis-dlock_${version}_$arch.deb, $out/SHA256SUMS" >&2
