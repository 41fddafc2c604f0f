#!/usr/bin/env bash
# What a new user does, client by client: in a fresh temporary directory, a copy of this
# repository at dlock/ (the working tree's files, no build output) and a new project beside it;
# the install line of docs/clients.md's table "Installing a client", as printed there; the quick
# start of the client's README, unchanged; built and run against a redis-server with the module.
#   bash scripts/install-check.sh [rust|python|go|typescript|java ...]   (default: all five)
# One line per client with its result and time; on the first failure, that client's output and a
# non-zero exit. The registries' caches (~/.cargo, ~/.m2, ~/.npm, the Go module cache) are used as
# they are; the Rust projects build into $INSTALL_CHECK_CACHE/cargo-target (default
# ~/.cache/dlock-install-check) so that a second run does not compile the dependencies again.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

clients=("$@")
[ "${#clients[@]}" -gt 0 ] || clients=(rust python go typescript java)
cache=${INSTALL_CHECK_CACHE:-$HOME/.cache/dlock-install-check}

# The module: DLOCK_MODULE, else a debug build of this tree.
if [ -n "${DLOCK_MODULE:-}" ]; then
  module=$DLOCK_MODULE
else
  cargo build -q -p dlock
  module=$repo/target/debug/libdlock.so
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/dlock-install-check.XXXXXX")
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# The repository as a clone of it holds it: the tracked and untracked files that git does not
# ignore, as they are in the working tree (uncommitted changes too); no target/, node_modules/.
mkdir "$work/dlock"
git ls-files -z --cached --others --exclude-standard \
  | grep -zv '^\.deps$' \
  | tar -cf - --null --ignore-failed-read -T - 2>/dev/null \
  | tar -xf - -C "$work/dlock"

# One server with the module for every quick start, on a free port.
port=""
for _ in 1 2 3 4 5; do
  candidate=$((20000 + RANDOM % 20000))
  mkdir -p "$work/server"
  redis-server --port "$candidate" --bind 127.0.0.1 --dir "$work/server" --save "" \
    --appendonly no --loadmodule "$module" >"$work/server/log" 2>&1 &
  server_pid=$!
  for _ in $(seq 50); do
    if redis-cli -p "$candidate" ping >/dev/null 2>&1; then
      port=$candidate
      break 2
    fi
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill "$server_pid" 2>/dev/null || true
  server_pid=""
done
if [ -z "$port" ]; then
  echo "install-check: redis-server with $module did not start" >&2
  cat "$work/server/log" >&2
  exit 1
fi
export REDIS_URL=redis://127.0.0.1:$port

# install_line CLIENT: the code spans of the client's "install" cell in docs/clients.md, one a
# line, leaving out those inside a parenthetical remark (an alternative, not a step).
install_line() {
  python3 - "$work/dlock/docs/clients.md" "$1" <<'PY'
import re, sys

page, client = open(sys.argv[1]).read(), sys.argv[2]
section = page.split("### Installing a client", 1)
rows = [line for line in section[-1].splitlines() if line.startswith(f"| {client} |")] if len(section) == 2 else []
if not rows:
    sys.exit(f'docs/clients.md: no "{client}" row in the table "Installing a client"')
cell = rows[0].split(" | ")[1]
spans = re.findall(r"`([^`]+)`", cell)
prose = re.sub(r"\([^()`]*`[^`]+`[^()`]*\)", "", re.sub(r"`([^`]+)`", lambda m: f"`{spans.index(m.group(1))}`", cell))
kept = [spans[int(i)] for i in re.findall(r"`(\d+)`", prose)]
if not kept:
    sys.exit(f"docs/clients.md: the {client} install cell has no code")
print("\n".join(kept))
PY
}

# quick_start README LANGUAGE [HEADING]: the first ```LANGUAGE block of README (after the line
# HEADING, if given), as printed.
quick_start() {
  python3 - "$work/dlock/$1" "$2" "${3:-}" <<'PY'
import re, sys

path, language, heading = sys.argv[1:]
text = open(path).read()
if heading:
    if f"\n{heading}\n" not in text:
        sys.exit(f"{path}: no heading {heading!r}")
    text = text.split(f"\n{heading}\n", 1)[1]
block = re.search(rf"^```{language}\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
if block is None:
    sys.exit(f"{path}: no {language} block" + (f" after {heading!r}" if heading else ""))
sys.stdout.write(block.group(1))
PY
}

# expect LOG PATTERN: the quick start's output (LOG) has a line matching PATTERN.
expect() {
  if ! grep -Eq "$2" "$1"; then
    echo "the quick start printed no line matching /$2/" >&2
    return 1
  fi
}

# run_lines LINES: each line (an install command) run in turn by bash, echoed first.
run_lines() {
  local line
  while IFS= read -r line; do
    echo "\$ $line"
    bash -c "$line"
  done <<<"$1"
}

check_rust() {
  local lines
  lines=$(install_line Rust)
  cargo new -q --vcs none app
  cd app
  run_lines "$lines"
  quick_start client/README.md rust "## Quick start" >src/main.rs
  grep -q "fn main" src/main.rs || { echo "client/README.md's quick start has no fn main" >&2; return 1; }
  CARGO_TARGET_DIR=$cache/cargo-target cargo run -q >out.txt
  cat out.txt
  expect out.txt "written under fence [0-9]+"
}

check_python() {
  local lines
  lines=$(install_line Python)
  mkdir app
  cd app
  python3 -m venv .venv
  # An activated virtual environment: its pip and python first on the PATH.
  export VIRTUAL_ENV=$PWD/.venv PATH=$PWD/.venv/bin:$PATH
  PIP_DISABLE_PIP_VERSION_CHECK=1 run_lines "$lines"
  quick_start python/README.md python >quickstart.py
  python quickstart.py >out.txt
  cat out.txt
  expect out.txt "under fence [0-9]+"
}

check_go() {
  local lines
  lines=$(install_line Go)
  mkdir app
  cd app
  go mod init example.com/app
  # The code first: the line's `go mod tidy` keeps what the code imports.
  quick_start go/README.md go "## Quick start" >main.go
  run_lines "$lines"
  go run . >out.txt
  cat out.txt
  expect out.txt "under fence [0-9]+"
}

check_typescript() {
  local lines
  lines=$(install_line TypeScript)
  mkdir app
  cd app
  npm init -y >/dev/null
  run_lines "$lines"
  quick_start node/README.md ts >quickstart.ts
  # What node/README.md says to run it with.
  npm pkg set type=module
  npm install --no-audit --no-fund ioredis tsx
  npx tsx quickstart.ts >out.txt
  cat out.txt
  expect out.txt "under fence [0-9]+"
}

check_java() {
  local lines command dependency="" class
  lines=$(install_line Java)
  mkdir -p app/src/main/java
  cd app
  # The cell's Maven coordinates are the dependency; its other code, commands.
  command=""
  while IFS= read -r line; do
    if [[ $line =~ ^([A-Za-z0-9_.-]+):([A-Za-z0-9_.-]+):([A-Za-z0-9_.-]+)$ ]]; then
      dependency="<dependency><groupId>${BASH_REMATCH[1]}</groupId><artifactId>${BASH_REMATCH[2]}</artifactId><version>${BASH_REMATCH[3]}</version></dependency>"
    else
      command+=$line$'\n'
    fi
  done <<<"$lines"
  [ -n "$dependency" ] || { echo "docs/clients.md's Java cell names no groupId:artifactId:version" >&2; return 1; }
  cat >pom.xml <<XML
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>com.example</groupId>
  <artifactId>app</artifactId>
  <version>1.0</version>
  <properties>
    <maven.compiler.release>17</maven.compiler.release>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <dependencies>$dependency</dependencies>
  <build>
    <plugins>
      <plugin><artifactId>maven-compiler-plugin</artifactId><version>3.14.0</version></plugin>
      <plugin><artifactId>maven-resources-plugin</artifactId><version>3.3.1</version></plugin>
    </plugins>
  </build>
</project>
XML
  run_lines "${command%$'\n'}"
  quick_start java/README.md java >Quickstart.java
  class=$(sed -n 's/^public class \([A-Za-z0-9_]*\).*/\1/p' Quickstart.java)
  [ -n "$class" ] || { echo "java/README.md's quick start is no public class" >&2; return 1; }
  mv Quickstart.java "src/main/java/$class.java"
  mvn -q compile dependency:build-classpath -Dmdep.outputFile=classpath.txt
  java -cp "target/classes:$(cat classpath.txt)" "$class" >out.txt
  cat out.txt
  expect out.txt "under fence [0-9]+"
}

status=0
for client in "${clients[@]}"; do
  case $client in
    rust | python | go | typescript | java) ;;
    *)
      echo "install-check: unknown client $client (rust, python, go, typescript, java)" >&2
      exit 2
      ;;
  esac
  # A new project, app/, beside dlock/ (the install lines say ../dlock).
  rm -rf "$work/app"
  started=$(date +%s)
  set +e
  (
    set -e
    cd "$work"
    "check_$client"
  ) >"$work/$client.log" 2>&1
  status=$?
  set -e
  if [ "$status" -eq 0 ]; then
    printf 'install-check: %-10s ok      %3d s\n' "$client" $(($(date +%s) - started))
  else
    printf 'install-check: %-10s FAILED  %3d s; its output:\n' "$client" $(($(date +%s) - started))
    sed 's/^/  /' "$work/$client.log"
    exit 1
  fi
done
