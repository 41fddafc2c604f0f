#!/usr/bin/env bash
# One version for the module and every client: the module's, in Cargo.toml (the one place it is
# written; `INFO dlock` and `MODULE LIST` print it). Each client states it where its ecosystem
# looks (Cargo.toml, pyproject.toml and dlock.__version__, package.json and VERSION, the Go
# constant Version, the Maven poms with -SNAPSHOT until a release).
#   bash scripts/versions.sh check      fails naming every file whose version differs (make lint)
#   bash scripts/versions.sh set X.Y.Z  writes X.Y.Z everywhere, Cargo.toml included
set -euo pipefail
cd "$(dirname "$0")/.."

module() { sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1; }

# Each place: the file, then the text before and after the version on its line (the first such
# line is the one).
places=(
  'client/Cargo.toml@version = "@"'
  'proto/Cargo.toml@version = "@"'
  'python/pyproject.toml@version = "@"'
  'python/src/dlock/__init__.py@__version__ = "@"'
  'node/package.json@  "version": "@",'
  'node/package-lock.json@  "version": "@",'
  'node/src/version.ts@export const VERSION = "@";'
  'go/version.go@const Version = "@"'
  'java/pom.xml@  <version>@-SNAPSHOT</version>'
)

field() { # place n → the n-th @-separated part
  echo "$1" | cut -d@ -f"$2"
}

found() { # place → the version on its line
  sed -n "s#^$(field "$1" 2)\(.*\)$(field "$1" 3)\$#\1#p" "$(field "$1" 1)" | head -n1
}

case "${1:-check}" in
  check)
    want=$(module)
    status=0
    for place in "${places[@]}"; do
      got=$(found "$place")
      if [ "$got" != "$want" ]; then
        echo "versions: $(field "$place" 1) says ${got:-nothing}, the module (Cargo.toml) $want" >&2
        status=1
      fi
    done
    # The Maven modules name their parent's version.
    for pom in java/*/pom.xml; do
      if ! grep -q "<version>$want-SNAPSHOT</version>" "$pom"; then
        echo "versions: $pom does not name its parent $want-SNAPSHOT" >&2
        status=1
      fi
    done
    exit "$status"
    ;;
  set)
    new=${2:?usage: $0 set X.Y.Z}
    old=$(module)
    sed -i "0,/^version = \"$old\"$/s//version = \"$new\"/" Cargo.toml
    for place in "${places[@]}"; do
      before=$(field "$place" 2) after=$(field "$place" 3)
      sed -i "0,\#^$before.*$after\$#s##$before$new$after#" "$(field "$place" 1)"
    done
    sed -i "s/dlock-proto = { path = \"..\/proto\", version = \"[^\"]*\" }/dlock-proto = { path = \"..\/proto\", version = \"$new\" }/" client/Cargo.toml
    for pom in java/*/pom.xml; do
      sed -i "0,/<version>[^<]*-SNAPSHOT<\/version>/s//<version>$new-SNAPSHOT<\/version>/" "$pom"
    done
    bash "$0" check
    ;;
  *)
    echo "usage: $0 [check | set X.Y.Z]" >&2
    exit 2
    ;;
esac
