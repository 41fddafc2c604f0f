#!/usr/bin/env bash
# Instructions the server spends per uncontended DLOCK.ACQUIRE (a fresh key each), counted by
# valgrind's callgrind: repeatable whatever else the machine does. Runs 10,000 and 30,000
# acquires through `redis-cli --pipe` and divides the difference by 20,000, so start-up and
# shutdown cancel out. First the same count for `SET k tok NX PX 60000`, the baseline.
#   bash scripts/instructions.sh [module.so …]   (default: target/release/libdlock.so)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "instructions: valgrind is not installed" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import sys
for name, command in (("acquire", ["DLOCK.ACQUIRE", "tok", "60000"]), ("set", ["SET", "tok", "NX", "PX", "60000"])):
    for n in (10000, 30000):
        with open(f"{sys.argv[1]}/{name}{n}.resp", "w") as out:
            for i in range(n):
                args = [command[0], f"k{i}", *command[1:]]
                out.write(f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args))
PY
total() { # module n [commands] → total instructions
  local port out dir
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  out="$work/cg.$port" dir="$work/dir.$port"; mkdir -p "$dir"
  valgrind --tool=callgrind --callgrind-out-file="$out" redis-server --port "$port" --dir "$dir" \
    --save "" --appendonly no --loadmodule "$1" >/dev/null 2>&1 &
  local pid=$!
  for _ in $(seq 1 300); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  redis-cli -p "$port" --pipe <"$work/${3:-acquire}$2.resp" >/dev/null
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" || true
  awk '/^summary:/ {print $2}' "$out"
}
first=$(realpath "${1:-target/release/libdlock.so}")
echo "SET NX PX (baseline): $(( ($(total "$first" 30000 set) - $(total "$first" 10000 set)) / 20000 )) instructions per SET"
for module in "${@:-target/release/libdlock.so}"; do
  module=$(realpath "$module")
  small=$(total "$module" 10000)
  large=$(total "$module" 30000)
  echo "$module: $(( (large - small) / 20000 )) instructions per ACQUIRE"
done
