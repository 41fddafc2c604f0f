#!/usr/bin/env bash
# Installs Redis 8.0 into .deps/ unless it is there, and prints the path of a redis-server that
# runs it. Nothing is installed system-wide.
#
# The server is Debian 13 (trixie)'s redis-tools package (the newest open-source Redis a new
# deployment picks), with the libraries it needs from trixie too, since the machine's own are
# older (Debian 12): apt reads trixie's package lists with a private sources list (signed by the
# Debian archive keys the machine already trusts, so every package is checked), `apt-get
# download` fetches the packages, and `dpkg -x` unpacks them into .deps/redis-8/root. The printed
# redis-server is a small wrapper that starts the server through trixie's own loader, on trixie's
# libraries (same PID, so signals reach the server).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(pwd)/.deps/redis-8
root=$dir/root
wrapper=$dir/redis-server
# redis-tools holds the one Redis binary; the rest is what it links (and theirs).
packages=(redis-tools libc6 libatomic1 libjemalloc2 liblzf1 libssl3t64 libstdc++6 libgcc-s1
  libsystemd0 libcap2 libzstd1 liblz4-1 liblzma5 libgcrypt20 libgpg-error0)
if [ ! -x "$wrapper" ]; then
  rm -rf "$dir" && mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial" \
    "$dir/apt/preferences.d" "$dir/debs"
  echo "deb http://deb.debian.org/debian trixie main" >"$dir/apt/sources.list"
  apt_options=(
    -o "Dir::Etc::SourceList=$dir/apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::Etc::Preferences=/dev/null" -o "Dir::Etc::PreferencesParts=$dir/apt/preferences.d"
    -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt/cache"
    -o "APT::Sandbox::User=root"
  )
  apt-get "${apt_options[@]}" update -qq >&2
  for package in "${packages[@]}"; do
    # The version trixie has (the machine's own lists are not read, but its status may be).
    version=$(apt-cache "${apt_options[@]}" madison "$package" \
      | awk -F'|' '$3 ~ /trixie/ { gsub(/ /, "", $2); print $2; exit }')
    [ -n "$version" ] || { echo "redis8: trixie has no $package" >&2; exit 1; }
    (cd "$dir/debs" && apt-get "${apt_options[@]}" download -qq "$package=$version" >&2)
  done
  for deb in "$dir"/debs/*.deb; do
    dpkg -x "$deb" "$root"
  done
  # Redis runs as the check tools when called by their names: the server needs its own.
  ln -sf redis-check-rdb "$root/usr/bin/redis-server"
  cat >"$wrapper" <<WRAPPER
#!/bin/sh
exec "$root/usr/lib64/ld-linux-x86-64.so.2" --library-path "$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu" "$root/usr/bin/redis-server" "\$@"
WRAPPER
  chmod +x "$wrapper"
  rm -rf "$dir/debs" "$dir/apt/cache"
fi
"$wrapper" --version >&2
"$wrapper" --version | grep -q ' v=8\.' || { echo "redis8: not Redis 8" >&2; exit 1; }
echo "$wrapper"
