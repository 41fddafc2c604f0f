#!/usr/bin/env bash
# The Python client (python/): installs its tools into .deps/venv (only what is missing) and checks it.
#   bash scripts/python.sh test     ruff, ruff format --check, mypy --strict, pytest (against
#                                   redis-server, and at the same time the server-dependent files
#                                   on Valkey 9), python -m build (sdist and wheel),
#                                   then ./python and the wheel installed into throwaway venvs
#                                   under .deps/ and imported from there
#   bash scripts/python.sh venv     only create/update the virtual environment; prints its python
# The tests start their own redis-server with the module: DLOCK_MODULE, else target/release, else
# target/debug (build it first: cargo build --release). PostgreSQL is installed with apt-get if
# missing (the PostgreSQL example's test), Valkey into .deps/ (scripts/valkey.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
venv=.deps/venv
py=$venv/bin/python

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

make_venv() {
  if [ ! -x "$py" ]; then
    mkdir -p .deps
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
      # Debian ships venv (and ensurepip) separately.
      rm -rf "$venv"
      echo "python: installing python3-venv" >&2
      export DEBIAN_FRONTEND=noninteractive
      as_root apt-get update -qq
      as_root apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
      python3 -m venv "$venv"
    fi
  fi
  # Install (or update) only when the requirements changed since the last install.
  local stamp=$venv/.dlock-requirements
  local wanted
  wanted=$(cat python/requirements-dev.txt python/pyproject.toml | sha256sum | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
    "$py" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
    "$py" -m pip install --quiet --disable-pip-version-check -r python/requirements-dev.txt >&2
    "$py" -m pip install --quiet --disable-pip-version-check -e ./python >&2
    echo "$wanted" >"$stamp"
  fi
}

find_module() {
  if [ -n "${DLOCK_MODULE:-}" ]; then
    echo "$DLOCK_MODULE"
    return
  fi
  # The newest of the builds there are: `make test` runs `cargo test` first, which leaves a fresh
  # target/debug/libdlock.so (and deps/) beside a target/release one that may be older.
  local candidate newest=""
  for candidate in target/release/libdlock.so target/debug/libdlock.so target/debug/deps/libdlock.so; do
    if [ -f "$candidate" ] && { [ -z "$newest" ] || [ "$candidate" -nt "$newest" ]; }; then
      newest=$candidate
    fi
  done
  if [ -z "$newest" ]; then
    echo "python: no libdlock.so found; run 'cargo build --release' or set DLOCK_MODULE" >&2
    exit 1
  fi
  echo "$repo/$newest"
}

# What the tests start, from Debian's packages, if missing: redis-server, redis-cli (it creates
# the test Cluster) and PostgreSQL (the example's end-to-end test).
need_servers() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
  if [ -z "${DLOCK_PG_BIN:-}" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    missing+=(postgresql)
  fi
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "python: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq
    as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# The packaging check: `pip install ./python` (not editable) and the built wheel, each into a
# throwaway venv under .deps/, and dlock imported from there with every file of src/dlock
# (py.typed too) beside it. What they install (redis, and hatchling for the build from source)
# comes from .deps/wheelhouse, downloaded when pyproject.toml changed: offline after that.
smoke_install() {
  local wheel=$1 wheels=.deps/wheelhouse smoke=.deps/smoke-venv
  local stamp=$wheels/.dlock-pyproject wanted
  wanted=$(sha256sum python/pyproject.toml | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
    rm -rf "$wheels"
    local requirements
    # The build system's requirements and the package's dependencies, as pyproject.toml says.
    mapfile -t requirements < <("$py" - <<'PY'
try:
    import tomllib
except ImportError:  # Python before 3.11: hatchling's own dependency
    import tomli as tomllib
with open("python/pyproject.toml", "rb") as file:
    project = tomllib.load(file)
print("\n".join(project["build-system"]["requires"] + project["project"]["dependencies"]))
PY
)
    "$py" -m pip download --quiet --disable-pip-version-check --dest "$wheels" \
      "${requirements[@]}" >&2
    echo "$wanted" >"$stamp"
  fi
  local source
  for source in ./python "$wheel"; do
    rm -rf "$smoke"
    # No pip of its own (faster): the tools venv's pip installs into it.
    "$py" -m venv --without-pip "$smoke"
    "$py" -m pip --python "$smoke/bin/python" install --quiet --disable-pip-version-check \
      --no-index --find-links "$wheels" "$source" >&2
    (cd "$smoke" && bin/python - "$repo/python/src/dlock" <<'PY')
import os, sys
import dlock, dlock.asyncio

here = os.path.dirname(dlock.__file__)
assert here.startswith(os.path.abspath(".")), f"dlock imported from {here}, not the venv"
wanted = {name for name in os.listdir(sys.argv[1]) if name != "__pycache__"}
missing = wanted - set(os.listdir(here))
assert not missing, f"not installed: {sorted(missing)}"
PY
    echo "python: installed and imported dlock from $source" >&2
  done
  rm -rf "$smoke"
}

# The tests mostly wait: for leases to run out, renewals, failovers (a run's CPU time is a fraction
# of its wall time). So each run spreads its test files over WORKERS pytest-xdist workers, and the
# Redis and Valkey runs go at the same time. --dist loadfile: a file's tests run on one worker, in
# order, so a module-scoped fixture (test_cluster.py's two Clusters, test_postgres.py's PostgreSQL)
# starts once, as without workers; each worker has its own session server (shared_server), and
# every server is on a port of its own (free_port). test_cluster.py is the longest file (about 85
# of the 145 s of test time on Redis): the other files share the other worker meanwhile.
WORKERS=2

# pytest in python/: its exit status (5 when it collected no test: a failure here too), output to
# stdout. PYTHONPATH puts this checkout's sources first: the venv's editable install may point at
# another checkout sharing .deps.
run_pytest() {
  (cd python && PYTHONPATH="$repo/python/src" "$repo/$py" -m pytest -q -p no:cacheprovider \
    -n "$WORKERS" --dist loadfile "$@")
}

# Waits for the pytest run in the background with pid $2, prints its output ($out/$1.log) and
# returns its exit status.
finish_pytest() {
  local status=0
  wait "$2" || status=$?
  cat "$out/$1.log"
  if [ "$status" -ne 0 ]; then
    [ "$status" -eq 5 ] && echo "python: pytest collected no tests ($1)" >&2
    echo "python: pytest ($1) failed with exit status $status" >&2
  fi
  return "$status"
}

case "${1:-test}" in
  venv)
    make_venv
    echo "$repo/$py"
    ;;
  test)
    make_venv
    DLOCK_MODULE=$(find_module)
    export DLOCK_MODULE
    echo "python: module $DLOCK_MODULE" >&2
    need_servers
    (cd python && "$repo/$venv/bin/ruff" check . && "$repo/$venv/bin/ruff" format --check .)
    (cd python && "$repo/$venv/bin/mypy" --strict src tests examples)
    export DLOCK_REQUIRE_POSTGRES=1
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
    # valkey.sh downloads with `python3 -m pip`: the venv's python has pip even where the
    # system's has none.
    valkey=$(PATH="$repo/$venv/bin:$PATH" bash scripts/valkey.sh)
    # The two runs at once (see WORKERS), each printed whole when it is over; either failing fails
    # the phase. On Valkey, what depends on the server: Cluster (its own slot migration and
    # failover), sets, channels and tickets, the commands' replies, election, revocation. The
    # lifecycle and client-side tests (renewal timing, errors, metrics, the PostgreSQL example)
    # run on Redis; they meet the same replies on Valkey.
    redis_name=$(redis-server --version | cut -d' ' -f1-3)
    echo "python: pytest against $redis_name and Valkey ($valkey) at once" >&2
    run_pytest >"$out/redis.log" 2>&1 &
    redis_pid=$!
    DLOCK_SERVER=$valkey run_pytest tests/test_cluster.py tests/test_tickets.py \
      tests/test_commands.py tests/test_election.py tests/test_revoke.py tests/test_asyncio_shared.py \
      tests/test_sets.py >"$out/valkey.log" 2>&1 &
    valkey_pid=$!
    redis_status=0 valkey_status=0
    echo "python: pytest against $redis_name" >&2
    finish_pytest redis "$redis_pid" || redis_status=$?
    echo "python: pytest against Valkey ($valkey)" >&2
    finish_pytest valkey "$valkey_pid" || valkey_status=$?
    if [ "$redis_status" -ne 0 ]; then exit "$redis_status"; fi
    if [ "$valkey_status" -ne 0 ]; then exit "$valkey_status"; fi
    # The build backend (hatchling) is in the venv: the build itself needs no network.
    "$py" -m build --no-isolation --outdir "$out/dist" python >/dev/null
    ls "$out/dist"
    smoke_install "$(ls "$out"/dist/*.whl)"
    ;;
  *)
    echo "usage: $0 [test|venv]" >&2
    exit 2
    ;;
esac
