#!/usr/bin/env python3
"""Instructions per command, dlock against what Redis does for the same job, as ratios.

Counted by valgrind's callgrind (repeatable whatever else the machine does) on a redis-server with
the module, alone, with a replica attached, and with the AOF on (`appendfsync everysec`):

  ACQUIRE (a fresh key)      against  SET k v NX PX 60000
  RENEW (of a held lease)    against  PEXPIRE k 60000
  RELEASE (of a held lease)  against  DEL k
  a lease's expiry           against  a key's expiry (Redis's own active expiry)

A second table: Redis's commands on a server with the module loaded against one without it
(what loading dlock costs every other command: its keyspace subscription and command filter see
each one), and dlock's commands against Redis's on a server without dlock.

Each figure is the difference between two runs divided by the number of commands: the run with
the commands and the run with only what they need first (the leases or keys to renew, release or
let expire), so the server's start and shutdown cancel out. Expiry compares leases and keys made
with a 200 ms ttl, waited for until none is left, with the same made with a 60 s ttl and waited
for as long.

With `--v1 old.so` (the last version-1 module, `scripts/v1-module.sh`), one more row: this
module's ACQUIRE with no option against version 1's, what the version 2 options cost when absent.

    python3 scripts/instructions-matrix.py [module.so] [--count N] [--out results.md] [--v1 old.so]

Prints a markdown table (and appends it to --out). Needs valgrind, redis-server, redis-cli.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def resp(args: list[str]) -> bytes:
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def commands(kind: str, n: int) -> bytes:
    """`n` commands of one kind, each on its own key."""
    make: Callable[[int], list[str]] = {
        "acquire": lambda i: ["DLOCK.ACQUIRE", f"k{i}", "tok", "60000"],
        "acquire-short": lambda i: ["DLOCK.ACQUIRE", f"k{i}", "tok", "200"],
        "renew": lambda i: ["DLOCK.RENEW", f"k{i}", "tok", "60000"],
        "release": lambda i: ["DLOCK.RELEASE", f"k{i}", "tok"],
        "set": lambda i: ["SET", f"k{i}", "tok", "NX", "PX", "60000"],
        "set-short": lambda i: ["SET", f"k{i}", "tok", "NX", "PX", "200"],
        "pexpire": lambda i: ["PEXPIRE", f"k{i}", "60000"],
        "del": lambda i: ["DEL", f"k{i}"],
    }[kind]
    return b"".join(resp(make(i)) for i in range(n))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(port: int, *args: str) -> str:
    out = subprocess.run(
        ["redis-cli", "-p", str(port), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()


def wait_for(check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def total(
    module: str | None,
    config: str,
    steps: list[tuple[str, int]],
    work: Path,
    wait_empty: bool | None,
) -> int:
    """Instructions of one server run under callgrind (with `module` loaded, or none):
    `steps` piped in order, then, when `wait_empty` is true, a wait until no key is left; when
    false, a wait as long as the last such wait took (`WAITED`); when None, none."""
    port = free_port()
    run = Path(tempfile.mkdtemp(dir=work))
    out = run / "callgrind.out"
    server = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        "redis-server",
        "--port",
        str(port),
        "--dir",
        str(run),
        "--save",
        "",
    ]
    server += ["--loadmodule", module] if module else []
    server += (
        ["--appendonly", "yes", "--appendfsync", "everysec"]
        if config == "aof"
        else ["--appendonly", "no"]
    )
    primary = subprocess.Popen(
        server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    replica = None
    try:
        if not wait_for(lambda: cli(port, "PING") == "PONG", 60):
            raise RuntimeError("the server under callgrind did not start")
        if config == "replica":
            rport = free_port()
            rdir = Path(tempfile.mkdtemp(dir=work))
            replica = subprocess.Popen(
                [
                    "redis-server",
                    "--port",
                    str(rport),
                    "--dir",
                    str(rdir),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    *(["--loadmodule", module] if module else []),
                    "--replicaof",
                    "127.0.0.1",
                    str(port),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if not wait_for(
                lambda: "master_link_status:up" in cli(rport, "INFO", "replication"), 60
            ):
                raise RuntimeError("the replica did not connect")
        for kind, n in steps:
            subprocess.run(
                ["redis-cli", "-p", str(port), "--pipe"],
                input=commands(kind, n),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=True,
            )
        if wait_empty is not None:
            started = time.monotonic()
            if wait_empty:
                if not wait_for(lambda: cli(port, "DBSIZE") == "0", 300):
                    raise RuntimeError("the keys did not expire")
                WAITED.append(time.monotonic() - started)
            else:
                time.sleep(WAITED[-1] if WAITED else 2.0)
        cli(port, "SHUTDOWN", "NOSAVE")
        primary.wait(timeout=120)
    finally:
        for process in (primary, replica):
            if process and process.poll() is None:
                process.kill()
                process.wait()
    for line in out.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError("no total in the callgrind output")


WAITED: list[float] = []

# (label, dlock's runs, Redis's runs); each run is (steps before, steps measured, expiry wait).
Run = tuple[list[tuple[str, int]], list[tuple[str, int]], str | None]
CASES: list[tuple[str, Run, Run]] = [
    ("ACQUIRE / `SET NX PX`", ([], [("acquire", 0)], None), ([], [("set", 0)], None)),
    (
        "RENEW / `PEXPIRE`",
        ([("acquire", 0)], [("renew", 0)], None),
        ([("set", 0)], [("pexpire", 0)], None),
    ),
    (
        "RELEASE / `DEL`",
        ([("acquire", 0)], [("release", 0)], None),
        ([("set", 0)], [("del", 0)], None),
    ),
    ("expiry / Redis's expiry", ([], [], "expiry"), ([], [], "expiry")),
]


def per_command(
    module: str | None, config: str, n: int, work: Path, case: Run, dlock: bool
) -> float:
    before, measured, expiry = case

    def sized(steps: list[tuple[str, int]]) -> list[tuple[str, int]]:
        return [(kind, n) for kind, _ in steps]

    if expiry:
        short, lasting = ("acquire-short", "acquire") if dlock else ("set-short", "set")
        with_expiry = total(module, config, [(short, n)], work, True)
        without = total(module, config, [(lasting, n)], work, False)
        return (with_expiry - without) / n
    base = total(module, config, sized(before), work, None)
    full = total(module, config, sized(before) + sized(measured), work, None)
    return (full - base) / n


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("module", nargs="?", default="target/release/libdlock.so")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--out")
    parser.add_argument(
        "--v1", help="the last version-1 module: one more row, ACQUIRE against it"
    )
    args = parser.parse_args()
    for tool in ("valgrind", "redis-server", "redis-cli"):
        if not shutil.which(tool):
            print(f"instructions-matrix: {tool} is not installed", file=sys.stderr)
            return 1
    module = os.path.realpath(args.module)
    rows = []
    # (label, baseline module, baseline case, whether the baseline is dlock's own command)
    rows_to_measure = [
        (label, module, redis_case, False, dlock_case)
        for label, dlock_case, redis_case in CASES
    ]
    if args.v1:
        acquire = CASES[0][1]
        rows_to_measure.append(
            (
                "ACQUIRE, no option / version 1's ACQUIRE",
                os.path.realpath(args.v1),
                acquire,
                True,
                acquire,
            )
        )
    # Alone, for the second table: (dlock's, Redis's with the module loaded) per command.
    alone: dict[str, tuple[float, float]] = {}
    unloaded_rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for label, baseline, base_case, base_is_dlock, dlock_case in rows_to_measure:
            cells = []
            for config in ("alone", "replica", "aof"):
                ours = per_command(module, config, args.count, work, dlock_case, True)
                theirs = per_command(
                    baseline, config, args.count, work, base_case, base_is_dlock
                )
                if config == "alone" and not base_is_dlock:
                    alone[label] = (ours, theirs)
                cells.append(f"{ours:,.0f} / {theirs:,.0f} = {ours / theirs:.2f}×")
                print(f"  {label} ({config}): {cells[-1]}", file=sys.stderr)
            rows.append(f"| {label} | " + " | ".join(cells) + " |")
        # What loading the module costs Redis's own commands (its keyspace subscription and
        # command filter see every one), and dlock against a server without it.
        for label, _, redis_case in CASES:
            ours, loaded = alone[label]
            without = per_command(None, "alone", args.count, work, redis_case, False)
            ours_name, theirs_name = label.split(" / ")
            unloaded_rows.append(
                f"| {theirs_name} | {loaded:,.0f} | {without:,.0f} | "
                f"{loaded / without - 1:+.1%} | {ours_name}: {ours / without:.2f}× |"
            )
            print(f"  {unloaded_rows[-1]}", file=sys.stderr)
    table = "\n".join(
        [
            f"### Instructions per command (callgrind, {args.count:,} commands, {time.strftime('%Y-%m-%d')})",
            "",
            "dlock / baseline = ratio, per command, on one redis-server with the module loaded.",
            "",
            "| command | alone | with a replica | with the AOF (`everysec`) |",
            "|---|---|---|---|",
            *rows,
            "",
            "Redis's commands on a server with the module loaded and on one without it (alone):",
            "what loading dlock costs every other command, and dlock's command against Redis's",
            "on a server without dlock.",
            "",
            "| Redis's command | with dlock loaded | without | cost of loading dlock | dlock's / Redis's without dlock |",
            "|---|---|---|---|---|",
            *unloaded_rows,
            "",
        ]
    )
    print(table)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as out:
            out.write("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
